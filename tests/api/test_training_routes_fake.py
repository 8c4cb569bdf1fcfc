"""The training loop's routes at the edge: off (a 404 that says how to turn them on) unless
--enable-weight-updates, guarded by --api-key, modes checked."""

from __future__ import annotations

from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.contract import contract
from kiln.config import ServerConfig
from tests.api.fake_backend import FakeBackend


def test_off_by_default(client: TestClient) -> None:
    for method, path in (("POST", "/pause"), ("POST", "/resume"), ("GET", "/is_paused"),
                         ("POST", "/reset_prefix_cache")):
        r = client.request(method, path)
        assert r.status_code == 404 and "--enable-weight-updates" in r.json()["error"]["message"]


def test_pause_resume_and_reset() -> None:
    backend = FakeBackend()
    app = build_app(ServerConfig(enable_weight_updates=True, api_keys=("k",)), backend)
    auth = {"authorization": "Bearer k"}
    with TestClient(app) as c:
        assert c.post("/pause").status_code == 401
        assert c.post("/pause?mode=sometimes", headers=auth).status_code == 400
        r = c.post("/pause?mode=keep", headers=auth)
        assert r.status_code == 200 and r.json()["mode"] == "keep" and r.json()["paused"]
        assert contract().first_violation("TrainingPauseResponse", r.json()) is None
        assert backend.paused == "keep"
        assert c.get("/is_paused", headers=auth).json() == {"is_paused": True}
        r = c.post("/resume", headers=auth)
        assert r.json()["paused"] is False and backend.paused is None
        assert c.get("/is_paused", headers=auth).json() == {"is_paused": False}
        assert c.post("/pause", headers=auth).json()["mode"] == "abort"  # vLLM's default
        r = c.post("/reset_prefix_cache", headers=auth)
        assert contract().first_violation("TrainingResetPrefixCacheResponse", r.json()) is None


def test_sleep_and_wake_up() -> None:
    backend = FakeBackend()
    with TestClient(build_app(ServerConfig(enable_weight_updates=True), backend)) as c:
        assert c.post("/sleep?level=3").status_code == 400
        r = c.post("/sleep")
        assert r.status_code == 200 and r.json()["sleeping"] is True and r.json()["level"] == 1
        assert contract().first_violation("TrainingSleepResponse", r.json()) is None
        assert c.post("/sleep").status_code == 409
        assert c.post("/pause").status_code == 409 and c.post("/resume").status_code == 409
        assert c.get("/is_sleeping").json() == {"is_sleeping": True}
        assert c.get("/health").json()["scheduler"] == "sleeping"
        r = c.post("/wake_up")
        assert r.json() == {"sleeping": False, "level": None, "aborted": 0, "released_bytes": 0}
        assert c.post("/wake_up").status_code == 409
        assert backend.paused is None and c.get("/health").json()["scheduler"] == "serving"
        r = c.post("/sleep?level=2")
        assert r.status_code == 200 and r.json()["level"] == 2
        assert contract().first_violation("TrainingSleepResponse", r.json()) is None
        assert c.post("/wake_up").json()["level"] is None
