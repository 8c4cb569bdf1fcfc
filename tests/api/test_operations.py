"""Operating statuses, each with its envelope: 401, 408, 429, 500 (engine failure), 503."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.contract import contract
from kiln.config import ServerConfig, from_env
from tests.api.fake_backend import FakeBackend
from tests.api.test_chat_fake import sse_events
from tests.api.test_edge import assert_envelope

CHAT = "/v1/chat/completions"
MSG = {"messages": [{"role": "user", "content": "hi"}]}


def make(backend: FakeBackend | None = None, **config: object) -> TestClient:
    return TestClient(build_app(ServerConfig(**config), backend or FakeBackend()))  # type: ignore[arg-type]


def test_api_keys() -> None:
    with make(api_keys=("k1", "k2")) as c:
        assert_envelope(c.post(CHAT, json=MSG), 401, "missing_api_key")
        r = c.post(CHAT, json=MSG, headers={"authorization": "Bearer nope"})
        assert_envelope(r, 401, "invalid_api_key")
        assert r.headers["www-authenticate"] == "Bearer" and r.headers["x-request-id"]
        for key in ("k1", "k2"):
            ok = c.post(CHAT, json=MSG, headers={"authorization": f"Bearer {key}"})
            assert ok.status_code == 200
        assert c.get("/v1/models", headers={"x-api-key": "k2"}).status_code == 200
        assert_envelope(c.get("/v1/models"), 401, "missing_api_key")
        assert c.get("/health").status_code == 200
        assert c.get("/metrics").status_code == 200
    with make(api_keys=("k1",), metrics_require_auth=True) as c:
        assert_envelope(c.get("/metrics"), 401, "missing_api_key")
        assert c.get("/metrics", headers={"authorization": "Bearer k1"}).status_code == 200


def test_an_api_key_variable_with_no_key_in_it_is_an_error() -> None:
    """KILN_API_KEY="," had silently turned authentication off."""
    import pytest

    from kiln.config import ConfigError

    for raw in (",", " , ,"):
        with pytest.raises(ConfigError, match="KILN_API_KEY"):
            from_env({"KILN_API_KEY": raw})


def test_api_keys_from_env_and_never_in_repr() -> None:
    cfg = from_env({"KILN_API_KEY": "secret-one, secret-two"})
    assert cfg.api_keys == ("secret-one", "secret-two")
    assert "secret" not in repr(cfg)


def test_429_when_at_capacity() -> None:
    with make(max_num_seqs=1, max_waiting_requests=0) as c:
        c.app.state.kiln.gate.active = 1  # type: ignore[attr-defined]  # one request in flight
        r = c.post(CHAT, json=MSG)
        assert_envelope(r, 429, "rate_limit_exceeded")
        assert r.headers["retry-after"] == "1"
        c.app.state.kiln.gate.active = 0  # type: ignore[attr-defined]
        assert c.post(CHAT, json=MSG).status_code == 200


def test_gate_slots_are_returned() -> None:
    backend = FakeBackend()
    with make(backend, max_num_seqs=2, max_waiting_requests=0) as c:
        for _ in range(5):
            assert c.post(CHAT, json={**MSG, "n": 2}).status_code == 200
            assert c.post(CHAT, json={**MSG, "stream": True}).status_code == 200
        # more than the gate ever holds: a 400 (test_edge), and nothing stays admitted
        assert_envelope(c.post(CHAT, json={**MSG, "n": 3}), 400, "chat_invalid_request")
        assert c.app.state.kiln.gate.active == 0  # type: ignore[attr-defined]


def test_408_request_timeout() -> None:
    backend = FakeBackend()
    backend.delay = 0.05
    with make(backend, request_timeout_s=0.2) as c:
        assert_envelope(c.post(CHAT, json=MSG), 408, "request_timeout")
        assert c.app.state.kiln.gate.active == 0  # type: ignore[attr-defined]
    assert backend.aborted  # the engine request was aborted, not left running


def test_engine_failure_is_500_and_stream_error_event() -> None:
    backend = FakeBackend()
    backend.fail = True
    with make(backend) as c:
        assert_envelope(c.post(CHAT, json=MSG), 500, "generation_error")
        events = sse_events(c.post(CHAT, json={**MSG, "stream": True}).text)
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["code"] == "generation_error"
        backend.fail = False
        assert c.post(CHAT, json=MSG).status_code == 200  # still serving


@pytest.mark.parametrize("status", ["loading", "error"])
def test_health_503(status: str) -> None:
    backend = FakeBackend()
    backend.status = status
    with make(backend) as c:
        r = c.get("/health")
        assert r.status_code == 503
        assert r.json()["status"] == status and r.json()["detail"]


def test_health_shows_the_compute_plan() -> None:
    """/health carries the backend's compute plan once serving (absent without one)."""
    plan = {"device": "cpu", "dtype": "float32", "weights": "packed", "step": "c",
            "attention": "c", "sampler": "c", "lora": "c", "grammar_mask": "numpy",
            "kv_layout": "heads-major",
            "kv_dtype": "float32"}
    backend = FakeBackend()
    with make(backend) as c:
        assert "compute_plan" not in c.get("/health").json()
    backend.plan = plan
    with make(backend) as c:
        body = c.get("/health").json()
    assert body == {"status": "ok", "model": "fake-model", "compute_plan": plan,
                    "scheduler": "serving", "weight_version": "default"}


def test_batch_item_failure_keeps_others() -> None:
    class FlakyBackend(FakeBackend):
        def submit(self, request):
            self.fail = request.request_id.endswith("-1-0")
            return super().submit(request)

    with make(FlakyBackend()) as c:
        body = {"prompts": [MSG["messages"]] * 3, "n": 2, "seed": 5}
        r = c.post("/v1/completions/batch", json=body)
        assert r.status_code == 200, r.text
        items = r.json()["completions"]
        assert [i["finish_reason"] for i in items] == ["stop", "stop", "error", "stop", "stop", "stop"]
        assert items[2]["text"] == "" and items[3]["text"]
        # the response with an errored item still satisfies the contract
        assert contract().first_violation("BatchCompletionResponse", r.json()) is None


def test_metrics_series() -> None:
    with make() as c:
        c.post(CHAT, json=MSG)
        c.post(CHAT, json={**MSG, "stream": True})
        c.delete("/v1/adapters/x")
        text = c.get("/metrics").text
    for series in (
        'kiln_http_requests_total{method="POST",route="/v1/chat/completions",status="200"}',
        'route="/v1/adapters/{name}"',
        "kiln_tokens_total{kind=\"generation\"}",
        "kiln_time_to_first_token_seconds_bucket",
        "kiln_inter_token_latency_seconds_bucket",
        "kiln_request_queue_seconds_bucket",
        "kiln_request_e2e_seconds_bucket",
        'vllm:num_requests_running{model_name="fake-model"}',
        'vllm:num_requests_waiting{model_name="fake-model"}',
        'vllm:kv_cache_usage_perc{model_name="fake-model"}',
        "vllm:lora_requests_info{",
        "kiln_prefix_cache_hit_rate",
    ):
        assert series in text, series
