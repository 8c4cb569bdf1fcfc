"""The agent routes at the edge, over the engine double: auth and error shapes per API, the
refusals that name their field, the stop reasons, the stored response's routes and their query
parameters, a path's 405 naming every method it has."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.contract import contract
from kiln.config import ServerConfig
from tests.api.fake_backend import FakeBackend
from tests.e2e.named_sse import named_events

MSG: dict[str, Any] = {"model": "fake-model", "max_tokens": 200,
                       "messages": [{"role": "user", "content": "Hi"}]}
RESP: dict[str, Any] = {"input": "Hi", "max_output_tokens": 200}


def check(definition: str, body: Any) -> None:
    assert contract().first_violation(definition, body) is None, body


@pytest.fixture
def keyed() -> Iterator[TestClient]:
    app = build_app(ServerConfig(api_keys=("sekrit",)), FakeBackend())
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_auth_per_api(keyed: TestClient) -> None:
    r = keyed.post("/v1/messages", json=MSG)
    assert r.status_code == 401 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "authentication_error"
    check("MessagesErrorResponse", r.json())
    r = keyed.post("/v1/messages", json=MSG,
                   headers={"x-api-key": "sekrit", "anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    check("MessagesResponse", r.json())
    r = keyed.post("/v1/responses", json=RESP)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    r = keyed.post("/v1/responses", json=RESP, headers={"authorization": "Bearer sekrit"})
    assert r.status_code == 200 and r.json()["status"] == "completed"


def test_messages_refusals_name_the_field(client: TestClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"mcp_servers": [{"type": "url", "url": "https://x.example", "name": "x"}]},
         "mcp_servers"),
        ({"speed": "fast"}, "speed"),
        ({"tools": [{"name": "t", "input_schema": {"type": "object"}, "defer_loading": True}]},
         "tools[0].defer_loading"),
        ({"thinking": {"type": "between_tools"}}, "thinking.type"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"messages": [{"role": "assistant", "content": [
            {"type": "redacted_thinking", "data": "x"}]}]}, "messages[0].content[0]"),
    ]
    for extra, param in cases:
        r = client.post("/v1/messages", json={**MSG, **extra})
        assert r.status_code == 400, (extra, r.text)
        check("MessagesErrorResponse", r.json())
        assert r.json()["error"]["message"].startswith(param), r.text


def test_stop_sequence_and_max_tokens(client: TestClient, backend: FakeBackend) -> None:
    backend.stop_string = "!"
    r = client.post("/v1/messages", json={**MSG, "stop_sequences": ["!"]})
    body = r.json()
    check("MessagesResponse", body)
    assert body["stop_reason"] == "stop_sequence" and body["stop_sequence"] == "!"
    r = client.post("/v1/messages", json={**MSG, "max_tokens": 2})
    assert r.json()["stop_reason"] == "max_tokens"
    r = client.post("/v1/responses", json={**RESP, "max_output_tokens": 2})
    assert r.json()["status"] == "incomplete"
    assert r.json()["incomplete_details"] == {"reason": "max_output_tokens"}


def test_count_tokens_counts_the_prompt(client: TestClient, backend: FakeBackend) -> None:
    r = client.post("/v1/messages/count_tokens", json={k: v for k, v in MSG.items()
                                                        if k != "max_tokens"})
    assert r.status_code == 200, r.text
    check("MessagesCountTokensResponse", r.json())
    run = client.post("/v1/messages", json=MSG).json()["usage"]
    assert r.json()["input_tokens"] == run["input_tokens"] + run["cache_read_input_tokens"]


def test_streams_follow_the_contract(client: TestClient) -> None:
    with client.stream("POST", "/v1/messages", json={**MSG, "stream": True}) as r:
        events = named_events(r.read().decode())
    for _, data in events:
        check("MessagesStreamEvent", data)
    with client.stream("POST", "/v1/responses", json={**RESP, "stream": True}) as r:
        events = named_events(r.read().decode())
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    for _, data in events:
        check("ResponsesStreamEvent", data)
    assert events[-1][0] == "response.completed"


def test_stored_response_routes(client: TestClient) -> None:
    made = client.post("/v1/responses", json={**RESP, "metadata": {"run": "7"}}).json()
    assert made["metadata"] == {"run": "7"}
    rid = made["id"]
    assert client.get(f"/v1/responses/{rid}").json() == made
    for query in ("stream=maybe", "starting_after=3", "stream=true&starting_after=-1"):
        assert client.get(f"/v1/responses/{rid}?{query}").status_code == 400, query
    items = client.get(f"/v1/responses/{rid}/input_items?order=asc&limit=1").json()
    check("ResponsesInputItemList", items)
    assert items["data"][0]["content"] == [{"type": "input_text", "text": "Hi"}]
    assert client.get(f"/v1/responses/{rid}/input_items?limit=0").status_code == 400
    r = client.options(f"/v1/responses/{rid}")
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) >= {"GET", "DELETE"}
    assert client.head(f"/v1/responses/{rid}").status_code == 200
    deleted = client.delete(f"/v1/responses/{rid}")
    check("ResponsesDeleted", deleted.json())
    assert client.get(f"/v1/responses/{rid}").status_code == 404
    assert client.delete(f"/v1/responses/{rid}").status_code == 404


def test_a_final_assistant_message_is_continued(client: TestClient, backend: FakeBackend) -> None:
    """Anthropic's prefill: the answer continues the final assistant message (chat's
    continue_final_message), with no new assistant turn opened."""
    body = {**MSG, "messages": [{"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": "Well,"}]}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    prompt = backend.tokenizer.decode(backend.submitted[-1].prompt_token_ids)
    assert prompt.endswith("Well,")


def test_what_the_coding_agents_send(client: TestClient, backend: FakeBackend) -> None:
    """Claude Code's system turn inside messages and its clear-thinking edit; Codex CLI's
    client_metadata and developer messages (bench/agent_clients.md records what each sent)."""
    body = {**MSG, "messages": [{"role": "user", "content": "Hi"},
                                {"role": "system", "content": "Agents: claude, Explore."}],
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"}, "thinking": {"type": "adaptive"}}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    prompt = backend.tokenizer.decode(backend.submitted[-1].prompt_token_ids)
    assert "Agents: claude, Explore." in prompt
    edits = {"edits": [{"type": "clear_tool_uses_20250919"}]}
    r = client.post("/v1/messages", json={**MSG, "context_management": edits})
    assert r.status_code == 400 and "context_management.edits[0]" in r.json()["error"]["message"]
    r = client.post("/v1/responses", json={**RESP, "client_metadata": {"turn_id": "7"},
                                           "input": [{"type": "message", "role": "developer",
                                                      "content": [{"type": "input_text",
                                                                   "text": "Be terse."}]},
                                                     {"role": "user", "content": "Hi"}],
                                           "reasoning": {"summary": "auto"}, "store": False,
                                           "include": ["reasoning.encrypted_content"]})
    assert r.status_code == 200, r.text
