"""vLLM's request fields on batch as on chat and completions (the same code,
kiln/api/requests/extras.py): request_id, thinking_token_budget, truncate_prompt_tokens with
truncation_side, return_tokens_as_token_ids and prompt_logprobs, applied to every item, through
the HTTP edge on the engine double; bad values are a 400 naming the field. Until issue 25's
fourth pass batch accepted and ignored all of them as unknown fields."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.api.fake_backend import FakeBackend
from tests.api.test_generation_extras_fake import post, refused

BATCH = "/v1/completions/batch"
SHORT = [{"role": "user", "content": "hi"}]
LONG = [{"role": "user", "content": "a longer question"}]
THINK = {"chat_template_kwargs": {"enable_thinking": True}}  # the prompts end inside <think>
CODE = "batch_invalid_request"


def batch(client: TestClient, **fields: Any) -> dict[str, Any]:
    return post(client, BATCH, **{"prompts": [SHORT, LONG], **fields})


def test_request_id_is_the_response_id(client: TestClient) -> None:
    assert batch(client, max_tokens=2, request_id="group-3")["id"] == "batchcmpl-group-3"
    assert batch(client, max_tokens=2)["id"] != "batchcmpl-group-3"
    error = refused(client, BATCH, request_id="")
    assert (error["param"], error["code"]) == ("request_id", CODE)


@pytest.mark.parametrize(("fields", "limit"), [
    ({"thinking_token_budget": 3}, 3),
    ({"thinking_token_budget": -1, "thinking_budget_tokens": None}, None),
])
def test_thinking_token_budget_applies_to_every_item(client: TestClient, backend: FakeBackend,
                                                     fields: dict[str, Any],
                                                     limit: int | None) -> None:
    body = batch(client, max_tokens=16, **THINK, **fields)
    for request in backend.submitted[-2:]:
        spec = request.sampling.thinking
        assert (spec.max_tokens if spec is not None else None) == limit
    assert body["metadata"]["thinking_budget"].get("max_tokens") == limit


def test_inconsistent_thinking_budgets_are_refused(client: TestClient) -> None:
    error = refused(client, BATCH, thinking_token_budget=3, thinking_budget_tokens=4)
    assert (error["param"], error["code"]) == ("thinking_token_budget", CODE)


def test_truncate_prompt_tokens_cuts_every_prompt(client: TestClient,
                                                  backend: FakeBackend) -> None:
    batch(client, max_tokens=2)
    whole = [r.prompt_token_ids for r in backend.submitted[-2:]]
    assert all(len(ids) > 5 for ids in whole)
    body = batch(client, max_tokens=2, truncate_prompt_tokens=5)
    assert [r.prompt_token_ids for r in backend.submitted[-2:]] == [ids[-5:] for ids in whole]
    assert [i["usage"]["prompt_tokens"] for i in body["completions"]] == [5, 5]
    batch(client, max_tokens=2, truncate_prompt_tokens=5, truncation_side="right")
    assert [r.prompt_token_ids for r in backend.submitted[-2:]] == [ids[:5] for ids in whole]
    for bad in (0, -2):
        error = refused(client, BATCH, truncate_prompt_tokens=bad)
        assert (error["param"], error["code"]) == ("truncate_prompt_tokens", CODE)


def test_return_tokens_as_token_ids(client: TestClient) -> None:
    body = batch(client, max_tokens=3, logprobs=True, top_logprobs=1,
                 return_tokens_as_token_ids=True, return_token_ids=True)
    for item in body["completions"]:
        content = item["logprobs"]["content"]
        assert [e["token"] for e in content] == [f"token_id:{t}" for t in item["token_ids"]]
        assert all(t["token"].startswith("token_id:") for e in content
                   for t in e["top_logprobs"])


def test_prompt_logprobs_on_every_item(client: TestClient, backend: FakeBackend) -> None:
    body = batch(client, max_tokens=2, prompt_logprobs=1, n=2)
    items = body["completions"]
    assert len(items) == 4
    for item in items:
        lists = item["prompt_logprobs"]
        assert len(lists) == item["usage"]["prompt_tokens"] and lists[0] is None
    assert items[0]["prompt_logprobs"] != items[2]["prompt_logprobs"]  # each its own prompt
    assert "prompt_logprobs" not in batch(client, max_tokens=2)["completions"][0]
    error = refused(client, BATCH, prompt_logprobs=21)  # over --max-logprobs (20)
    assert (error["param"], error["code"]) == ("prompt_logprobs", CODE)


def test_add_special_tokens_on_every_item(client: TestClient, backend: FakeBackend) -> None:
    batch(client, max_tokens=2)
    whole = [r.prompt_token_ids for r in backend.submitted[-2:]]
    batch(client, max_tokens=2, add_special_tokens=True)
    assert [r.prompt_token_ids for r in backend.submitted[-2:]] == [[1, *ids] for ids in whole]
