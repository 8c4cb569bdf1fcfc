"""The HTTP edge: error envelope for every failure, request ids, routes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

CHAT = "/v1/chat/completions"
MSG = {"messages": [{"role": "user", "content": "hi"}]}


def assert_envelope(resp, status: int, code: str) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code
    assert err["message"]
    return err


def test_malformed_json_is_400_invalid_json(client: TestClient) -> None:
    r = client.post(CHAT, content=b"{not json", headers={"content-type": "application/json"})
    assert_envelope(r, 400, "invalid_json")


def test_empty_body_is_400(client: TestClient) -> None:
    r = client.post(CHAT, content=b"", headers={"content-type": "application/json"})
    assert_envelope(r, 400, "invalid_json")


def test_wrong_content_type_is_415(client: TestClient) -> None:
    r = client.post(CHAT, content=json.dumps(MSG), headers={"content-type": "text/plain"})
    assert_envelope(r, 415, "unsupported_media_type")


def test_body_over_limit_is_413(client: TestClient) -> None:
    big = {"messages": [{"role": "user", "content": "x" * 70_000}]}
    r = client.post(CHAT, json=big)
    assert_envelope(r, 413, "request_too_large")


def test_unknown_route_is_404(client: TestClient) -> None:
    assert_envelope(client.get("/v1/nope"), 404, "not_found")


def test_wrong_method_is_405(client: TestClient) -> None:
    assert_envelope(client.get(CHAT), 405, "method_not_allowed")


def test_contract_violation_is_400_with_param(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}], "n": 0})
    err = assert_envelope(r, 400, "chat_invalid_request")
    assert err["param"] == "n"


def test_missing_messages_is_empty_array(client: TestClient) -> None:
    err = assert_envelope(client.post(CHAT, json={}), 400, "empty_array")
    assert err["param"] == "messages"


@pytest.mark.parametrize("stream", [False, True])
def test_empty_messages_is_400_empty_array(client: TestClient, stream: bool) -> None:
    err = assert_envelope(client.post(CHAT, json={"messages": [], "stream": stream}), 400,
                          "empty_array")
    assert err["param"] == "messages"


@pytest.mark.parametrize(("prompts", "param", "what"), [
    ([], "prompts", "conversation"), ([[]], "prompts[0]", "message"),
    ([MSG["messages"], []], "prompts[1]", "message")])
def test_empty_batch_conversation_is_400_empty_array(client: TestClient, prompts: list,
                                                     param: str, what: str) -> None:
    r = client.post("/v1/completions/batch", json={"prompts": prompts})
    err = assert_envelope(r, 400, "empty_array")
    assert (err["param"], err["message"]) == (param, f"{param} must hold at least one {what}")


def test_missing_batch_prompts_is_empty_array(client: TestClient) -> None:
    r = client.post("/v1/completions/batch", json={})
    assert assert_envelope(r, 400, "empty_array")["param"] == "prompts"


@pytest.mark.parametrize("route", [CHAT, "/v1/completions/batch", "/v1/completions"])
@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [2.5, -3.75e287])
def test_penalty_past_openais_range_is_400_naming_it(client: TestClient, route: str, field: str,
                                                    value: float) -> None:
    """-3.75e287 overflowed float32 into an infinite logit and a NaN logprob (the live fuzz)."""
    body: dict[str, Any] = ({"prompt": "Hi", "max_tokens": 1} if route == "/v1/completions"
                            else {"prompts": [MSG["messages"]]} if route.endswith("batch")
                            else dict(MSG))
    r = client.post(route, json={**body, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    ok = client.post(route, json={**body, field: -2})
    assert ok.status_code == 200, ok.text


def test_non_object_body(client: TestClient) -> None:
    assert_envelope(client.post(CHAT, json=[1, 2]), 400, "chat_invalid_request")


def test_request_id_echoed_and_generated(client: TestClient) -> None:
    r = client.get("/health", headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r2 = client.get("/health")
    assert len(r2.headers["x-request-id"]) == 32
    r3 = client.get("/nope")
    assert r3.headers["x-request-id"]


def test_a_body_request_id_no_header_can_carry_is_percent_encoded(client: TestClient) -> None:
    """A body's request_id may hold any character (the contract bounds its length only); the
    X-Request-Id header carries it percent-encoded (it had been a 500: the fuzz run found it),
    the response id as it is."""
    rid = "\u00e9\U000f3466\x7f<"
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}],
                                "request_id": rid, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == "%C3%A9%F3%B3%91%A6%7F%3C"
    assert r.json()["id"] == f"chatcmpl-{rid}"


def test_health_models_openapi(client: TestClient) -> None:
    assert client.get("/health").json()["status"] == "ok"
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "fake-model"
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    assert "/v1/chat/completions" in doc["paths"]


def test_metrics_is_prometheus_text(client: TestClient) -> None:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert "kiln_" in r.text


@pytest.mark.parametrize(
    ("model", "status"), [(None, 200), ("fake-model", 200), ("fake-alias", 200), ("other", 404)]
)
def test_model_field(client: TestClient, model: str | None, status: int) -> None:
    r = client.post(CHAT, json={**MSG, "model": model})
    assert r.status_code == status
    if status == 404:
        assert_envelope(r, 404, "model_not_found")
    else:
        assert r.json()["model"] == "fake-model"


@pytest.mark.parametrize(
    ("field", "depth"), [("x", 1000), ("x", 30_000), ("messages", 300), ("messages", 1000)]
)
def test_deeply_nested_json_is_400(client: TestClient, field: str, depth: int) -> None:
    """Past the decoder's or the validator's recursion limit: a 400, never a 500."""
    nested = "[" * depth + "]" * depth
    body = '{"messages":[{"role":"user","content":"hi"}],"x":' + nested + "}"
    if field == "messages":
        body = '{"messages":' + nested + "}"
    r = client.post(CHAT, content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] in {"invalid_json", "chat_invalid_request"}
    assert r.headers["x-request-id"]


def test_violation_message_does_not_copy_a_huge_instance(client: TestClient) -> None:
    r = client.post(CHAT, json={**MSG, "adapters": [{"name": "a" * 100, "scale": 1}] * 300})
    err = assert_envelope(r, 400, "invalid_compose_request")
    assert len(err["message"]) < 600
    assert err["message"].endswith("keyword")  # the tail that says what is wrong is kept


def test_unexpected_exception_is_500_envelope_with_request_id(client: TestClient, backend) -> None:
    def boom() -> str:
        raise RuntimeError("bug")

    backend.health = boom
    r = client.get("/health", headers={"x-request-id": "rid-500"})
    assert_envelope(r, 500, "internal_error")
    assert r.headers["x-request-id"] == "rid-500"
    assert client.get("/v1/models").status_code == 200  # the client still works afterwards


def test_a_prompt_surely_over_the_window_is_refused_before_encoding(client: TestClient,
                                                                    backend) -> None:
    """Encoding holds the GIL, so a huge prompt is refused from its length alone (the fake
    tokenizer gives one token per byte; its window is 4,096)."""
    calls: list[int] = []
    encode = backend.tokenizer.encode

    def counted(text, **kw):
        calls.append(len(text))
        return encode(text, **kw)

    backend.tokenizer.encode = counted
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    err = assert_envelope(client.post(CHAT, json=big), 400, "context_length_exceeded")
    assert "characters" in err["message"] and calls == []
    batch = client.post("/v1/completions/batch", json={"prompts": [big["messages"]]})
    assert_envelope(batch, 400, "context_length_exceeded")
    score = client.post("/v1/completions", json={"prompt": "x" * 5000, "prompt_logprobs": 0})
    assert_envelope(score, 400, "completion_invalid_request")
    assert calls == []
    assert client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    assert calls  # a prompt that may fit is encoded as before


def test_more_choices_than_the_gate_holds_is_400_not_a_retry_forever() -> None:
    """n past --max-num-seqs + --max-waiting-requests can never be admitted: a 400, where a 429
    with Retry-After had sent retrying clients (the OpenAI SDK) round for ever."""
    from kiln.api.app import build_app
    from kiln.config import ServerConfig
    from tests.api.fake_backend import FakeBackend

    app = build_app(ServerConfig(max_num_seqs=2, max_waiting_requests=3), FakeBackend())
    with TestClient(app) as c:
        r = c.post(CHAT, json={**MSG, "n": 6, "max_tokens": 2})
        err = assert_envelope(r, 400, "chat_invalid_request")
        assert "at most 5" in err["message"] and err["param"] == "n"
        assert "retry-after" not in r.headers
        batch = c.post("/v1/completions/batch",
                       json={"prompts": [MSG["messages"]] * 2, "n": 3, "max_tokens": 2})
        assert_envelope(batch, 400, "batch_too_large")
        assert c.post(CHAT, json={**MSG, "n": 5, "max_tokens": 2}).status_code == 200


def test_a_client_gone_during_the_upload_is_499(client: TestClient) -> None:
    """A body cut short (Content-Length larger than what came) was a 500 with a traceback."""
    import asyncio

    from kiln import metrics

    def count(status: str) -> float:
        return metrics.REGISTRY.get_sample_value(
            "kiln_http_requests_total",
            {"route": CHAT, "method": "POST", "status": status}) or 0.0

    before_499, before_500 = count("499"), count("500")
    app = client.app
    sent: list[dict] = []
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"messages": [', "more_body": True},
        {"type": "http.disconnect"}]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": CHAT, "raw_path": CHAT.encode(),
             "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"999")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 499
    assert count("499") == before_499 + 1 and count("500") == before_500


@pytest.mark.parametrize("key", ["tools", "messages"])
def test_chat_template_kwargs_may_not_set_messages_or_tools(client: TestClient, key: str) -> None:
    """They had reached ChatTemplate.render twice: a TypeError shown as invalid_messages."""
    r = client.post(CHAT, json={**MSG, "chat_template_kwargs": {key: 5}})
    err = assert_envelope(r, 400, "chat_invalid_request")
    assert err["param"] == "chat_template_kwargs" and key in err["message"]
    batch = client.post("/v1/completions/batch",
                        json={"prompts": [MSG["messages"]], "chat_template_kwargs": {key: 5}})
    assert_envelope(batch, 400, "batch_invalid_request")
    ok = client.post(CHAT, json={**MSG, "chat_template_kwargs": {"enable_thinking": False}})
    assert ok.status_code == 200


def test_retrieve_one_model(client: TestClient) -> None:
    """GET /v1/models/{model}, which the OpenAI SDK's models.retrieve calls (it had been 404)."""
    from kiln.api.contract import contract

    card = client.get("/v1/models/fake-model").json()
    assert contract().first_violation("ModelCard", card) is None and card["id"] == "fake-model"
    assert client.get("/v1/models/fake-alias").json()["id"] == "fake-model"
    err = assert_envelope(client.get("/v1/models/nope"), 404, "model_not_found")
    assert err["param"] == "model"
