"""Chat completions through the HTTP edge, against the engine test double."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.contract import contract
from tests.api.fake_backend import FakeBackend

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def sse_events(text: str) -> list[Any]:
    events = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[6:]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def valid(definition: str, instance: Any) -> bool:
    return contract().first_violation(definition, instance) is None


def test_json_response_is_contract_valid(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": MSG, "max_tokens": 64})
    assert r.status_code == 200, r.text
    body = r.json()
    assert contract().first_violation("ChatCompletionResponse", body) is None
    assert body["choices"][0]["message"]["content"] == "Hello from the fake engine."
    assert body["choices"][0]["finish_reason"] == "stop"
    # usage counts the EOS token
    assert body["usage"]["completion_tokens"] == len("Hello from the fake engine.") + 1


def test_max_tokens_truncates_with_length(client: TestClient) -> None:
    body = client.post(CHAT, json={"messages": MSG, "max_tokens": 5}).json()
    assert body["choices"][0]["message"]["content"] == "Hello"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5


def test_max_tokens_zero(client: TestClient) -> None:
    body = client.post(CHAT, json={"messages": MSG, "max_tokens": 0}).json()
    assert body["choices"][0]["message"]["content"] == ""
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 0
    assert valid("ChatCompletionResponse", body)


def test_n_choices_use_seed_plus_i(client: TestClient, backend: FakeBackend) -> None:
    body = client.post(CHAT, json={"messages": MSG, "n": 3, "seed": 7}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [r.sampling.seed for r in backend.submitted] == [7, 8, 9]


def test_presets_and_overrides(client: TestClient, backend: FakeBackend) -> None:
    client.post(CHAT, json={"messages": MSG})
    client.post(CHAT, json={"messages": MSG, "sampling_preset": "greedy", "top_k": 5})
    client.post(CHAT, json={"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]})
    a, b, c = (r.sampling for r in backend.submitted)
    # no preset named and no generation config: vLLM's neutral values, with tools or without
    assert (a.temperature, a.top_p, a.top_k, a.presence_penalty) == (1.0, 1.0, 0, 0.0)
    assert (b.temperature, b.top_k) == (0.0, 5)
    assert (c.temperature, c.presence_penalty) == (1.0, 0.0)


def test_max_tokens_wins_over_alias_and_clamps(client: TestClient, backend: FakeBackend) -> None:
    client.post(CHAT, json={"messages": MSG, "max_tokens": 3, "max_completion_tokens": 9})
    client.post(CHAT, json={"messages": MSG, "max_tokens": None, "max_completion_tokens": 9})
    client.post(CHAT, json={"messages": MSG})
    a, b, c = (r.sampling.max_tokens for r in backend.submitted)
    assert (a, b, c) == (3, 9, 2048)


def test_context_length_exceeded(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "x" * 5000}]})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_stream_context_length_exceeded_before_any_event(client: TestClient) -> None:
    payload = {"messages": [{"role": "user", "content": "x" * 5000}], "stream": True}
    r = client.post(CHAT, json=payload)
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")


def test_stream_events(client: TestClient) -> None:
    payload = {
        "messages": MSG, "stream": True, "stream_options": {"include_usage": True},
        "include_performance": True,
    }
    r = client.post(CHAT, json=payload)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e.get("object") == "chat.completion.chunk"]
    timings = [e for e in events[:-1] if e.get("object") == "kiln.token_timing"]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Hello from the fake engine."
    finish = [c for c in chunks if c["choices"] and "finish_reason" in c["choices"][0]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "stop"
    assert "thinking_budget" in finish[0]["kiln_metadata"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 28
    assert [t["token_index"] for t in timings] == list(range(len(timings)))
    for e in chunks:
        assert valid("ChatCompletionChunk", e), e
    for t in timings:
        assert valid("StreamingTokenTiming", t), t


def test_thinking_metadata_and_reasoning_split(backend: FakeBackend) -> None:
    from kiln.api.app import build_app
    from kiln.config import ServerConfig

    backend.reply = "plan</think>answer"
    with TestClient(build_app(ServerConfig(), backend)) as c:
        payload = {"messages": MSG, "chat_template_kwargs": {"enable_thinking": True}}
        body = c.post(CHAT, json=payload).json()
        msg = body["choices"][0]["message"]
        assert msg == {"role": "assistant", "content": "answer", "reasoning_content": "plan"}
        meta = body["kiln_metadata"]
        assert meta["thinking_enabled"] is True and meta["thinking_source"] == "request"
        assert meta["thinking_mode"] == "reasoning"
        folded = c.post(CHAT, json={**payload, "fold_reasoning_into_content": True}).json()
        assert folded["choices"][0]["message"]["content"] == "<think>\nplan</think>\n\nanswer"
        assert folded["kiln_metadata"]["reasoning_folded_into_content"] is True
        s = c.post(CHAT, json={**payload, "stream": True})
        chunks = [e for e in sse_events(s.text) if isinstance(e, dict) and e.get("choices")]
        deltas = [e["choices"][0]["delta"] for e in chunks]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "plan"
        assert "".join(d.get("content", "") for d in deltas) == "answer"
        assert all(not ("content" in d and "reasoning_content" in d) for d in deltas)


def test_template_error_is_400_invalid_messages(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": "<explode>"}]})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_messages"


def test_unknown_adapter_is_404(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": MSG, "adapter": "nope"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "adapter_not_found"


def test_config_hashes_and_performance(client: TestClient) -> None:
    payload = {"messages": MSG, "include_config_hashes": True, "include_performance": True}
    body = client.post(CHAT, json=payload).json()
    assert body["kiln_metadata"]["config_hashes"]["effective_config_hash"].startswith("sha256:")
    perf = body["kiln_metadata"]["performance"]
    assert perf["completion_tokens"] == body["usage"]["completion_tokens"]
    assert valid("ChatCompletionResponse", body)


def test_batch(client: TestClient, backend: FakeBackend) -> None:
    payload = {"prompts": [MSG, MSG], "n": 2, "seed": 10, "max_tokens": 4}
    body = client.post("/v1/completions/batch", json=payload).json()
    assert valid("BatchCompletionResponse", body), body
    assert [(i["prompt_index"], i["completion_index"]) for i in body["completions"]] == [
        (0, 0), (0, 1), (1, 0), (1, 1)
    ]
    assert [r.sampling.seed for r in backend.submitted] == [10, 11, 12, 13]
    assert body["usage"]["completion_tokens"] == 16


def test_batch_too_large(client: TestClient) -> None:
    r = client.post("/v1/completions/batch", json={"prompts": [MSG] * 33, "n": 2})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "batch_too_large"


def test_scoring_shape(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "abc", "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert valid("TextCompletionResponse", body), body
    lp = body["choices"][0]["prompt_logprobs"]
    assert lp[0] is None and len(lp) == body["usage"]["prompt_tokens"]


def test_scoring_counts_in_the_token_and_request_metrics(client: TestClient) -> None:
    from kiln import metrics

    def sample(name: str, **labels: str) -> float:
        return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

    prompt, finished = sample("kiln_tokens_total", kind="prompt"), \
        sample("kiln_requests_finished_total", finish_reason="length")
    r = client.post("/v1/completions", json={"prompt": "abcde", "prompt_logprobs": 1})
    assert r.status_code == 200, r.text
    used = r.json()["usage"]["prompt_tokens"]
    assert sample("kiln_tokens_total", kind="prompt") == prompt + used
    assert sample("kiln_requests_finished_total", finish_reason="length") == finished + 1


def test_keepalive_close_while_pending_does_not_raise() -> None:
    """Closing the SSE body while a frame is pending (a client disconnect) cancels it cleanly."""
    import asyncio

    from kiln.api.sse import with_keepalive

    async def slow() -> Any:
        yield b"a"
        await asyncio.sleep(10)
        yield b"b"

    async def run() -> list[bytes]:
        got = []
        stream = with_keepalive(slow(), interval=0.01)
        assert isinstance(stream, AsyncGenerator)  # closed below, as the server closes it
        async for frame in stream:
            got.append(frame)
            if len(got) == 3:
                break
        await stream.aclose()  # raised "aclose(): asynchronous generator is already running"
        return got

    frames = asyncio.run(run())
    assert frames[0] == b"a" and frames[1] == b": keep-alive\n\n"


@pytest.mark.parametrize(("default", "kwargs", "source"), [
    (True, None, "server_default"), (False, {}, "server_default"),
    (True, {"enable_thinking": False}, "request"), (None, None, "template_default"),
    (None, {"enable_thinking": "yes"}, "custom"),
])
def test_thinking_source(default: bool | None, kwargs: dict[str, Any] | None, source: str) -> None:
    """The server default had been merged into the kwargs before the source was read, so a
    server with --default-thinking-enabled reported "request" for every request."""
    from kiln.api.app import build_app
    from kiln.config import ServerConfig
    from tests.api.fake_backend import FakeBackend

    app = build_app(ServerConfig(default_thinking_enabled=default), FakeBackend())
    body: dict[str, Any] = {"messages": MSG, "max_tokens": 4}
    if kwargs is not None:
        body["chat_template_kwargs"] = kwargs
    with TestClient(app) as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["kiln_metadata"]["thinking_source"] == source


def test_a_stream_past_the_request_timeout_ends_in_an_error_event() -> None:
    """--request-timeout-s covers streams too (it had covered only non-streaming requests): an
    error event, no finish chunk, [DONE], and the engine request aborted (docs/behavior.md §10)."""
    from kiln.api.app import build_app
    from kiln.config import ServerConfig

    backend = FakeBackend()
    backend.delay = 0.05  # ~28 tokens: ~1.4 s, against a 0.3 s limit
    with TestClient(build_app(ServerConfig(request_timeout_s=0.3), backend)) as c:
        r = c.post("/v1/chat/completions", json={"messages": MSG, "stream": True})
        quick = c.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2,
                                                     "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    err = events[-2]["error"]
    assert err["code"] == "generation_error" and "timed out after 300 ms" in err["message"]
    assert not any(isinstance(e, dict) and e.get("choices") and e["choices"][0].get("finish_reason")
                   for e in events)
    assert backend.submitted[0].request_id in backend.aborted  # the generator was closed
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events
                      if isinstance(e, dict) and e.get("choices"))
    assert len(content) < len(backend.reply)  # cut short
    assert sse_events(quick.text)[-1] == "[DONE]" and "error" not in quick.text
