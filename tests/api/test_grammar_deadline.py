"""The grammar compile deadline (--grammar-compile-timeout-s, kiln/api/structured/constraints.py):
a constraint whose compilation overruns it is a 400 naming the field, compilation runs in a
grammar worker thread so the server answers other requests meanwhile, and a request that finds
every grammar worker busy past the deadline is a 503. The compiler is replaced by one that blocks
on an Event, so no verdict depends on the machine's speed: it overruns any deadline until the
test releases it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.structured.constraints import COMPILE_WORKERS
from kiln.config import ConfigError, ServerConfig, setting
from kiln.engine.grammar import GrammarCompiler
from tests.api.fake_backend import FakeBackend

HANG = 120.0  # a generous bound on waiting for a condition (never reached when all is well)
REGEX = {"prompt": "x", "max_tokens": 2, "structured_outputs": {"regex": "[0-9]+"}}


class StuckCompiler:
    """GrammarCompiler.check replaced: every call blocks until released."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.calls = 0
        self.left = threading.Semaphore(0)

    def check(self, _compiler: GrammarCompiler, _grammar: str) -> None:
        self.calls += 1
        self.entered.release()
        self.release.wait(HANG)
        self.left.release()


@pytest.fixture
def stuck(monkeypatch: pytest.MonkeyPatch) -> Iterator[StuckCompiler]:
    compiler = StuckCompiler()
    monkeypatch.setattr(GrammarCompiler, "check",
                        lambda self, grammar: compiler.check(self, grammar))
    try:
        yield compiler
    finally:
        compiler.release.set()
        for _ in range(compiler.calls):  # the grammar workers are free again for other tests
            compiler.left.acquire(timeout=HANG)


@pytest.fixture
def client() -> Iterator[TestClient]:
    app = build_app(ServerConfig(grammar_compile_timeout_s=0.5), FakeBackend())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def in_thread(client: TestClient, body: dict[str, Any]) -> tuple[threading.Thread,
                                                                  dict[str, Any]]:
    out: dict[str, Any] = {}

    def post() -> None:
        out["r"] = client.post("/v1/completions", json=body)
    thread = threading.Thread(target=post)
    thread.start()
    return thread, out


def test_an_overrunning_compile_is_a_400_and_the_server_stays_responsive(
        client: TestClient, stuck: StuckCompiler) -> None:
    thread, out = in_thread(client, REGEX)
    assert stuck.entered.acquire(timeout=HANG)  # the compile is running, and stays stuck
    assert client.get("/health").status_code == 200
    plain = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert plain.status_code == 200, plain.text  # unconstrained requests never wait on it
    thread.join(HANG)
    r = out["r"]
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "structured_outputs.regex"
    assert "did not compile within" in err["message"] and "0.5 s" in err["message"]
    assert not stuck.release.is_set()  # the verdict came while the compile was still stuck


def test_every_worker_busy_is_a_503(client: TestClient, stuck: StuckCompiler) -> None:
    for _ in range(COMPILE_WORKERS):  # each stays stuck in a worker after its 400
        r = client.post("/v1/completions", json=REGEX)
        assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs.regex"
    for _ in range(COMPILE_WORKERS):
        assert stuck.entered.acquire(timeout=HANG)
    r = client.post("/v1/completions", json=REGEX)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "server_overloaded"
    assert r.headers["retry-after"] == "1"


def test_the_deadline_is_a_setting() -> None:
    s = setting("grammar_compile_timeout_s")
    assert s.flag == "--grammar-compile-timeout-s" and s.env == "KILN_GRAMMAR_COMPILE_TIMEOUT_S"
    assert ServerConfig().grammar_compile_timeout_s == s.default == 10.0
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ConfigError):
            ServerConfig(grammar_compile_timeout_s=bad)
