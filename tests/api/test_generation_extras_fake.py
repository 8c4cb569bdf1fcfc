"""vLLM's per-token extras on chat and batch as on completions (one mapping,
kiln/api/handlers/extras.generation_extras): logprob_token_ids, repetition_detection and
session_id through the HTTP edge on the engine double, priority and cache_salt, and the
stop_reason chat and batch now report. (Values from a real model: tests/e2e/test_chat_batch_extras_tiny.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.contract import contract
from kiln.engine.repetition import RepetitionDetection
from kiln.scale.routing import routing_key
from tests.api.fake_backend import FakeBackend
from tests.api.test_chat_fake import sse_events

MSG = [{"role": "user", "content": "hi"}]
CHAT, BATCH = "/v1/chat/completions", "/v1/completions/batch"
BODY: dict[str, dict[str, Any]] = {CHAT: {"messages": MSG}, BATCH: {"prompts": [MSG]}}
SCHEMA = {CHAT: "ChatCompletionResponse", BATCH: "BatchCompletionResponse"}
CODE = {CHAT: "chat_invalid_request", BATCH: "batch_invalid_request"}
ROUTES = pytest.mark.parametrize("route", [CHAT, BATCH])


def post(client: TestClient, route: str, **fields: Any) -> dict[str, Any]:
    r = client.post(route, json={**BODY[route], **fields})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    assert contract().first_violation(SCHEMA[route], data) is None, data
    return data


def first(route: str, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = body["choices" if route == CHAT else "completions"][0]
    return out


def refused(client: TestClient, route: str, **fields: Any) -> dict[str, Any]:
    r = client.post(route, json={**BODY[route], **fields})
    assert r.status_code == 400, r.text
    error: dict[str, Any] = r.json()["error"]
    return error


@ROUTES
def test_logprob_token_ids_are_the_alternatives(client: TestClient, backend: FakeBackend,
                                                route: str) -> None:
    """The named ids reach the engine (duplicates once, in order) and come back as each
    position's top_logprobs, in that order (the double reports what the engine is asked)."""
    body = post(client, route, max_tokens=2, logprobs=True, logprob_token_ids=[7, 5, 7])
    sent = backend.submitted[-1].sampling
    assert (sent.logprob_token_ids, sent.logprobs) == ((7, 5), 0)
    content = first(route, body)["logprobs"]["content"]
    assert len(content) == 2
    tok = backend.tokenizer
    for entry in content:
        assert [(t["token"], t["logprob"]) for t in entry["top_logprobs"]] == [
            (tok.decode([7]), -0.07), (tok.decode([5]), -0.05)]
    post(client, route, max_tokens=2, logprobs=True, top_logprobs=2)
    assert backend.submitted[-1].sampling.logprob_token_ids is None


@ROUTES
@pytest.mark.parametrize("fields", [
    {"logprob_token_ids": [3]},  # needs logprobs: true
    {"logprob_token_ids": [3], "logprobs": False},
    {"logprob_token_ids": [1000], "logprobs": True},  # outside the double's vocabulary
    {"logprob_token_ids": [], "logprobs": True},
    {"logprob_token_ids": list(range(257)), "logprobs": True},
])
def test_logprob_token_ids_refusals_name_the_field(client: TestClient, route: str,
                                                   fields: dict[str, Any]) -> None:
    error = refused(client, route, **fields)
    assert (error["param"], error["code"]) == ("logprob_token_ids", CODE[route])


@ROUTES
def test_repetition_detection_reaches_the_engine(client: TestClient, backend: FakeBackend,
                                                 route: str) -> None:
    post(client, route, max_tokens=2, repetition_detection={"max_pattern_size": 4, "min_count": 3})
    assert backend.submitted[-1].sampling.repetition_detection == RepetitionDetection(4, 3, 1)
    post(client, route, max_tokens=2, repetition_detection={
        "max_pattern_size": 6, "min_pattern_size": 2, "min_count": 2})
    assert backend.submitted[-1].sampling.repetition_detection == RepetitionDetection(6, 2, 2)
    post(client, route, max_tokens=2, repetition_detection=None)
    assert backend.submitted[-1].sampling.repetition_detection is None


@ROUTES
@pytest.mark.parametrize("rule", [{}, {"min_count": 2}, {"max_pattern_size": 3},
                                  {"max_pattern_size": 2, "min_count": 2, "min_pattern_size": 3},
                                  {"max_pattern_size": "2", "min_count": 2}])
def test_repetition_detection_that_detects_nothing_is_a_400(client: TestClient, route: str,
                                                            rule: dict[str, Any]) -> None:
    error = refused(client, route, max_tokens=2, repetition_detection=rule)
    assert error["param"] == "repetition_detection"


@ROUTES
def test_session_id_is_a_routing_key_that_changes_nothing(client: TestClient,
                                                          backend: FakeBackend, route: str) -> None:
    a = post(client, route, max_tokens=3, seed=5)
    sent = backend.submitted[-1]
    b = post(client, route, max_tokens=3, seed=5, session_id="chat-42")
    assert backend.submitted[-1].sampling == sent.sampling
    assert backend.submitted[-1].prompt_token_ids == sent.prompt_token_ids
    assert first(route, a) == first(route, b)
    raw = json.dumps({**BODY[route], "session_id": "chat-42"}).encode()
    assert routing_key(route, (), raw) == "session:chat-42"
    error = refused(client, route, session_id=42)
    assert error["param"] == "session_id"


@ROUTES
def test_priority_and_cache_salt_reach_the_engine(client: TestClient, backend: FakeBackend,
                                                  route: str) -> None:
    post(client, route, max_tokens=2, n=2, priority=-3, cache_salt="tenant-a")
    assert [(r.priority, r.cache_salt) for r in backend.submitted[-2:]] == [(-3, "tenant-a")] * 2
    post(client, route, max_tokens=2)
    assert (backend.submitted[-1].priority, backend.submitted[-1].cache_salt) == (0, None)
    if route == CHAT:  # the streaming path submits on its own
        r = client.post(route, json={**BODY[route], "stream": True, "priority": 7,
                                     "cache_salt": "s"})
        assert r.status_code == 200, r.text
        assert (backend.submitted[-1].priority, backend.submitted[-1].cache_salt) == (7, "s")
    assert refused(client, route, cache_salt="")["param"] == "cache_salt"
    assert refused(client, route, priority=1.5)["param"] == "priority"


@ROUTES
def test_stop_reason_is_reported(client: TestClient, backend: FakeBackend, route: str) -> None:
    """What ended a choice, as on completions: here the double's stop reason for a detected
    repetition; none when the length ended it."""
    backend.stop_string = "repetition_detected"
    done = first(route, post(client, route, max_tokens=64))
    assert (done["finish_reason"], done["stop_reason"]) == ("stop", "repetition_detected")
    cut = first(route, post(client, route, max_tokens=2))
    assert cut["finish_reason"] == "length" and "stop_reason" not in cut


def test_chat_stream_reports_stop_reason_on_the_finishing_chunk(client: TestClient,
                                                                backend: FakeBackend) -> None:
    backend.stop_string = "repetition_detected"
    r = client.post(CHAT, json={"messages": MSG, "stream": True})
    assert r.status_code == 200, r.text
    chunks = [e for e in sse_events(r.text) if e != "[DONE]"]
    for chunk in chunks:
        assert contract().first_violation("ChatCompletionChunk", chunk) is None, chunk
    finishing = [c["choices"][0] for c in chunks if c["choices"][0].get("finish_reason")]
    assert [(c["finish_reason"], c["stop_reason"]) for c in finishing] == [
        ("stop", "repetition_detected")]
    assert all("stop_reason" not in c["choices"][0] for c in chunks
               if not c["choices"][0].get("finish_reason"))
