"""vLLM's chat fields that had been accepted and ignored as unknown fields, on chat and batch:
``include_reasoning: false`` leaves the reasoning out of the response (streamed or not, never
folded into content), ``reasoning_effort`` and ``documents`` are template variables (a real
minijinja template that reads them renders them into the prompt), and either one set in
``chat_template_kwargs`` as well is a 400. (``logits_processors`` and ``mm_processor_kwargs``
are refused: tests/api/test_chat_batch_logits_extras_fake.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.text.chat_template import ChatTemplate
from tests.api.fake_backend import FakeBackend
from tests.api.test_chat_fake import sse_events

CHAT, BATCH = "/v1/chat/completions", "/v1/completions/batch"
MSG = [{"role": "user", "content": "hi"}]
# reads the two variables the way gpt-oss's and RAG templates do; opens a reasoning block
TEMPLATE = (
    "{% if documents %}{% for d in documents %}[doc {{ d.title }}: {{ d.text }}]{% endfor %}"
    "{% endif %}{% if reasoning_effort %}[effort {{ reasoning_effort }}]{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant><think>{% endif %}")


@pytest.fixture
def backend() -> FakeBackend:
    fake = FakeBackend(reply="plan</think>answer")
    fake.chat_template = ChatTemplate(TEMPLATE)  # type: ignore[assignment]
    return fake


def _client(backend: FakeBackend, **config: Any) -> TestClient:
    return TestClient(build_app(ServerConfig(**config), backend))


@pytest.fixture
def client(backend: FakeBackend) -> Iterator[TestClient]:
    with _client(backend) as c:
        yield c


def _prompt(backend: FakeBackend) -> str:
    return backend.tokenizer.decode(backend.submitted[-1].prompt_token_ids)


def test_reasoning_is_kept_by_default_and_left_out_with_include_reasoning_false(
        client: TestClient) -> None:
    kept = client.post(CHAT, json={"messages": MSG}).json()["choices"][0]["message"]
    assert (kept["reasoning_content"], kept["content"]) == ("plan", "answer")
    for include in (True, None):
        body = client.post(CHAT, json={"messages": MSG, "include_reasoning": include}).json()
        assert body["choices"][0]["message"]["reasoning_content"] == "plan"
    left = client.post(CHAT, json={"messages": MSG, "include_reasoning": False}).json()
    assert left["choices"][0]["message"] == {"role": "assistant", "content": "answer"}


def test_a_stream_without_reasoning_sends_no_reasoning_delta(client: TestClient) -> None:
    r = client.post(CHAT, json={"messages": MSG, "include_reasoning": False, "stream": True,
                                "logprobs": True})
    chunks = [e for e in sse_events(r.text) if isinstance(e, dict) and e.get("choices")]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert not any("reasoning_content" in d for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas) == "answer"
    # every generated token's logprob is still sent, the reasoning's included
    sent = [t for c in chunks for t in (c["choices"][0].get("logprobs") or {}).get("content", [])]
    assert "".join(t["token"] for t in sent) == "plan</think>answer"


def test_batch_items_leave_the_reasoning_out(client: TestClient) -> None:
    body = {"prompts": [MSG, MSG]}
    items = client.post(BATCH, json=body).json()["completions"]
    assert [i["reasoning_content"] for i in items] == ["plan", "plan"]
    items = client.post(BATCH, json={**body, "include_reasoning": False}).json()["completions"]
    assert [("reasoning_content" in i, i["text"]) for i in items] == [(False, "answer")] * 2


def test_reasoning_left_out_is_never_folded(backend: FakeBackend) -> None:
    with _client(backend, fold_reasoning_into_content=True) as c:
        folded = c.post(CHAT, json={"messages": MSG}).json()["choices"][0]["message"]
        assert folded["content"].startswith("<think>")
        left = c.post(CHAT, json={"messages": MSG, "include_reasoning": False}).json()
        assert left["choices"][0]["message"] == {"role": "assistant", "content": "answer"}
        assert left["kiln_metadata"]["reasoning_folded_into_content"] is False
        r = c.post(CHAT, json={"messages": MSG, "include_reasoning": False,
                               "fold_reasoning_into_content": True})
        assert r.status_code == 400, r.text
        assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (
            "include_reasoning", "chat_invalid_request")


@pytest.mark.parametrize("route", [CHAT, BATCH])
def test_reasoning_effort_and_documents_reach_the_template(client: TestClient,
                                                           backend: FakeBackend,
                                                           route: str) -> None:
    body: dict[str, Any] = {"messages": MSG} if route == CHAT else {"prompts": [MSG]}
    assert client.post(route, json=body).status_code == 200
    assert _prompt(backend) == "<user>hi\n<assistant><think>"
    docs = [{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}]
    r = client.post(route, json={**body, "reasoning_effort": "low", "documents": docs})
    assert r.status_code == 200, r.text
    assert _prompt(backend) == ("[doc A: alpha][doc B: beta][effort low]<user>hi\n"
                                "<assistant><think>")
    # the same variable given only through chat_template_kwargs renders alike
    r = client.post(route, json={**body, "chat_template_kwargs": {"reasoning_effort": "high"}})
    assert r.status_code == 200 and "[effort high]" in _prompt(backend)


@pytest.mark.parametrize("route", [CHAT, BATCH])
@pytest.mark.parametrize(("name", "value"), [("reasoning_effort", "low"),
                                             ("documents", [{"text": "x"}])])
def test_a_template_field_set_twice_is_refused(client: TestClient, route: str, name: str,
                                               value: Any) -> None:
    body: dict[str, Any] = {"messages": MSG} if route == CHAT else {"prompts": [MSG]}
    r = client.post(route, json={**body, name: value, "chat_template_kwargs": {name: value}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == name and "set it once" in error["message"]


@pytest.mark.parametrize(("name", "value"), [
    ("reasoning_effort", "extreme"), ("reasoning_effort", 3), ("documents", [{"title": 1}]),
    ("documents", {"title": "a"}), ("include_reasoning", "no")])
def test_bad_values_are_refused_by_the_contract(client: TestClient, name: str,
                                                value: Any) -> None:
    r = client.post(CHAT, json={"messages": MSG, name: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == name
