"""vLLM's logits extras on chat and batch as on completions (one mapping,
kiln/api/handlers/extras.chat_extras): logit_bias, allowed_token_ids, min_tokens and
stop_token_ids reach every engine request a chat or batch request makes, and bad values are a
400 naming the field. Until issue 25's second pass, chat had ignored allowed_token_ids and batch
all four as unknown fields. (Their effect on a real model: tests/e2e/test_chat_batch_logits_extras_tiny.py.)
The seed fields vLLM's chat request also has but this server cannot apply are refused when set."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.api.fake_backend import EOS, FakeBackend
from tests.api.test_generation_extras_fake import BODY, CODE, ROUTES, post, refused

CHAT, BATCH = "/v1/chat/completions", "/v1/completions/batch"


def _bodies(route: str) -> dict[str, Any]:
    """Two prompts on batch, two choices on chat: every engine request gets the fields."""
    return {"n": 2} if route == CHAT else {"prompts": BODY[BATCH]["prompts"] * 2}


@ROUTES
def test_logits_extras_reach_every_engine_request(client: TestClient, backend: FakeBackend,
                                                  route: str) -> None:
    post(client, route, max_tokens=4, logit_bias={"7": 250, "9": -3.5},
         allowed_token_ids=[9, 7, 9], min_tokens=2, stop_token_ids=[11], **_bodies(route))
    sent = [r.sampling for r in backend.submitted[-2:]]
    assert len(backend.submitted) == 2
    for s in sent:
        assert s.logit_bias == ((7, 100.0), (9, -3.5))  # clamped to ±100, sorted
        assert s.allowed_token_ids == (7, 9)
        assert (s.min_tokens, s.min_tokens_ids) == (2, (EOS, 11))  # EOS and the stop ids
        assert s.stop_token_ids == (11,)


@ROUTES
def test_defaults_leave_the_logits_alone(client: TestClient, backend: FakeBackend,
                                         route: str) -> None:
    post(client, route, max_tokens=2)
    s = backend.submitted[-1].sampling
    assert (s.logit_bias, s.allowed_token_ids, s.min_tokens, s.stop_token_ids) == (
        (), None, 0, ())


@ROUTES
@pytest.mark.parametrize(("fields", "param"), [
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [1000]}, "allowed_token_ids"),  # outside the double's vocabulary
    ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
    ({"logit_bias": {"1000": 1}}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"3": "big"}}, "logit_bias"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids"),
])
def test_bad_logits_extras_name_the_field(client: TestClient, route: str,
                                          fields: dict[str, Any], param: str) -> None:
    error = refused(client, route, **fields)
    assert error["param"] == param, error
    assert error["code"] == CODE[route], error


@ROUTES
def test_min_tokens_with_stop_strings_is_refused(client: TestClient, route: str) -> None:
    error = refused(client, route, min_tokens=2, stop=["x"], max_tokens=4)
    assert (error["param"], error["code"]) == ("min_tokens", "unsupported_parameter")


@ROUTES
@pytest.mark.parametrize(("name", "on", "neutral"), [
    ("use_beam_search", True, False),
    ("length_penalty", 0.5, 1.0),
    ("kv_transfer_params", {"do_remote_prefill": True}, None),
    ("vllm_xargs", {"k": 1}, None),
    ("chat_template", "{{ messages[0].content }}", None),  # vLLM refuses an untrusted one too
    # vLLM's former guided_* fields (it ignores them now): the 400 names their replacement
    ("guided_json", {"type": "object"}, None),
    ("guided_regex", "[0-9]+", None),
    ("guided_choice", ["a", "b"], None),
    ("guided_grammar", "root ::= \"a\"", None),
    ("guided_whitespace_pattern", " ", None),
    # vLLM's chat-only fields that had been unknown (accepted and ignored)
    ("logits_processors", ["my.module:Processor"], []),
    ("mm_processor_kwargs", {"num_crops": 4}, {}),
])
def test_seed_fields_this_server_cannot_apply_are_refused(
        client: TestClient, route: str, name: str, on: Any, neutral: Any) -> None:
    """vLLM's chat request has them too; set, a 400 naming them (they had been ignored as
    unknown fields); at their default, accepted."""
    error = refused(client, route, **{name: on})
    assert (error["param"], error["code"]) == (name, "unsupported_parameter")
    post(client, route, max_tokens=2, **{name: neutral})


@ROUTES
@pytest.mark.parametrize("kind", ["json", "regex", "choice", "grammar", "whitespace_pattern"])
def test_a_guided_field_is_refused_naming_its_replacement(client: TestClient, route: str,
                                                          kind: str) -> None:
    error = refused(client, route, **{f"guided_{kind}": "x"})
    assert f"structured_outputs.{kind}" in error["message"]
