"""A chat response parses and dumps cleanly in the OpenAI SDK's types (issue 52, 6): Kiln's
metadata object travels as `kiln_metadata`, since the SDK's `ChatCompletion.metadata` is a
string map (openai >= 3.2) and Kiln's booleans and objects under that name made pydantic
warn on every `model_dump()` (and fail a re-validation)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from starlette.testclient import TestClient

from tests.api.test_chat_fake import sse_events

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


class StringMetadataCompletion(ChatCompletion):
    """``ChatCompletion`` as openai >= 3.2 declares it: OpenAI's stored-completion labels."""

    metadata: dict[str, str] | None = None


class StringMetadataChunk(ChatCompletionChunk):
    metadata: dict[str, str] | None = None


def _round_trip(model: Any, body: dict[str, Any]) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parsed = model.model_validate(body)
        dumped: dict[str, Any] = parsed.model_dump()
        parsed.model_dump_json()
    assert [str(w.message) for w in caught] == []
    return dumped


@pytest.mark.parametrize("model", [ChatCompletion, StringMetadataCompletion])
def test_a_chat_response_round_trips_without_warnings(client: TestClient, model: Any) -> None:
    r = client.post(CHAT, json={"messages": MSG, "include_performance": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert "metadata" not in body
    assert body["kiln_metadata"]["thinking_enabled"] is False  # the information is kept
    assert "performance" in body["kiln_metadata"]
    dumped = _round_trip(model, body)
    assert dumped["choices"][0]["message"]["content"] == body["choices"][0]["message"]["content"]


@pytest.mark.parametrize("model", [ChatCompletionChunk, StringMetadataChunk])
def test_the_stream_round_trips_without_warnings(client: TestClient, model: Any) -> None:
    r = client.post(CHAT, json={"messages": MSG, "stream": True})
    chunks = [e for e in sse_events(r.text) if isinstance(e, dict)]
    assert chunks and all("metadata" not in c for c in chunks)
    assert "thinking_budget" in chunks[-1]["kiln_metadata"]  # the finishing chunk's
    for chunk in chunks:
        _round_trip(model, chunk)
