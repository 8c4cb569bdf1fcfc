"""--max-logprobs (vLLM's bound, default 20) on completions, chat and batch; batch items carry
their logprobs and token ids."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.contract import contract
from kiln.cli import build_parser, config_from_args
from kiln.config import ConfigError, ServerConfig
from tests.api.fake_backend import EOS, FakeBackend

MSG = [{"role": "user", "content": "hi"}]
ASK = {  # route -> (body asking for k alternatives, its field, the code of its 400)
    "/v1/completions": (lambda k: {"prompt": "hi", "max_tokens": 2, "logprobs": k},
                        "logprobs", "completion_invalid_request"),
    "/v1/chat/completions": (lambda k: {"messages": MSG, "logprobs": True, "top_logprobs": k},
                             "top_logprobs", "chat_invalid_request"),
    "/v1/completions/batch": (lambda k: {"prompts": [MSG], "logprobs": True, "top_logprobs": k},
                              "top_logprobs", "batch_invalid_request"),
}


@pytest.fixture
def five(backend: FakeBackend) -> Iterator[TestClient]:
    app = build_app(ServerConfig(max_body_bytes=64 * 1024, max_logprobs=5), backend)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("route", list(ASK))
def test_more_than_max_logprobs_is_a_400(client: TestClient, five: TestClient, backend: FakeBackend,
                                         route: str) -> None:
    body, param, code = ASK[route]
    for c, limit in ((client, 20), (five, 5)):
        r = c.post(route, json=body(limit + 1))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["code"], err["param"]) == (code, param)
        assert "--max-logprobs" in err["message"]
        r = c.post(route, json=body(limit))
        assert r.status_code == 200, r.text
        assert backend.submitted[-1].sampling.logprobs == limit


def test_the_flag_sets_it() -> None:
    args = build_parser().parse_args(["serve", "--max-logprobs", "40"])
    assert config_from_args(args).max_logprobs == 40
    assert ServerConfig().max_logprobs == 20
    with pytest.raises(ConfigError, match="max_logprobs"):
        ServerConfig(max_logprobs=-1)


def _batch(client: TestClient, **fields: Any) -> dict[str, Any]:
    r = client.post("/v1/completions/batch", json={"prompts": [MSG, MSG], "n": 2, **fields})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert contract().first_violation("BatchCompletionResponse", body) is None
    return body


def test_batch_items_carry_logprobs_and_token_ids(client: TestClient, backend: FakeBackend) -> None:
    backend.reply = "ok"
    body = _batch(client, logprobs=True, top_logprobs=2, return_token_ids=True)
    assert all(r.sampling.logprobs == 2 for r in backend.submitted)
    prompt = backend.submitted[0].prompt_token_ids
    for item in body["completions"]:
        assert item["prompt_token_ids"] == prompt
        assert item["token_ids"] == [ord("o") + 3, ord("k") + 3, EOS]  # byte + 3; then EOS
        content = item["logprobs"]["content"]
        assert [e["logprob"] for e in content] == [-t / 100 for t in item["token_ids"]]
        assert [[t["logprob"] for t in e["top_logprobs"]] for e in content] == [[-0.03, -0.04]] * 3


def test_batch_items_carry_nothing_unless_asked(client: TestClient, backend: FakeBackend) -> None:
    body = _batch(client)
    assert backend.submitted[-1].sampling.logprobs is None
    for item in body["completions"]:
        assert not {"logprobs", "token_ids", "prompt_token_ids"} & item.keys()
    body = _batch(client, logprobs=True)
    assert all(e["top_logprobs"] == [] for e in body["completions"][0]["logprobs"]["content"])


def test_batch_top_logprobs_needs_logprobs(client: TestClient) -> None:
    r = client.post("/v1/completions/batch", json={"prompts": [MSG], "top_logprobs": 2})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "top_logprobs"
