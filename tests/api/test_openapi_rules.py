"""The served document's `x-kiln-rules` (docs/openapi-extensions.md): the server refuses a body
where a rule says so, with the rule's param and code, and accepts it where none does; the fuzz
filter that evaluates them (kiln/fuzz_filter.py) names no route and no field."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.contract import MAX_BATCH_ITEMS
from kiln.api.requests import completions_gen
from kiln.config import ServerConfig
from kiln.engine.errors import NOTHING_ALLOWED
from kiln.fuzz_filter import TOKEN_SLACK, operand, refusal, resolve, rules_of
from tests.api.fake_backend import VOCAB, FakeBackend

ROOT = Path(__file__).resolve().parents[2]
CHAT, COMP, BATCH = "/v1/chat/completions", "/v1/completions", "/v1/completions/batch"
M = [{"role": "user", "content": "hi"}]
FINAL = [*M, {"role": "assistant", "content": "Once upon"}]
LEN = FakeBackend.max_model_len
FN = [{"type": "function", "function": {"name": "f"}}]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    adapters = tmp_path_factory.mktemp("adapters")
    for name in ("style", "math"):
        (adapters / name).mkdir()
        (adapters / name / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    with TestClient(build_app(ServerConfig(), FakeBackend(reply="ok", adapter_dir=adapters)),
                    raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def doc(client: TestClient) -> dict[str, Any]:
    body: dict[str, Any] = client.get("/openapi.json").json()
    return body


# (path, body, refused): bodies on either side of one rule each
CASES: list[tuple[str, dict[str, Any], bool]] = [
    (CHAT, {"messages": M}, False),
    (CHAT, {"messages": M, "stream": True, "echo": True}, False),
    (CHAT, {"messages": M, "stream": True, "return_token_ids": True}, False),
    (CHAT, {"messages": M, "min_tokens": 5, "max_tokens": 3}, True),
    (CHAT, {"messages": M, "min_tokens": 5, "max_completion_tokens": 3}, True),
    (CHAT, {"messages": M, "min_tokens": 3, "max_tokens": 5}, False),
    (CHAT, {"messages": M, "min_tokens": 2, "stop": "x"}, True),
    (CHAT, {"messages": M, "continue_final_message": True, "add_generation_prompt": False},
     True),
    (CHAT, {"messages": FINAL, "continue_final_message": True}, True),
    (CHAT, {"messages": M, "tool_choice": "required"}, True),
    (CHAT, {"messages": M, "tools": FN, "tool_choice": {"type": "function",
                                                        "function": {"name": "g"}}}, True),
    (CHAT, {"messages": M, "response_format": {"type": "json_object"},
            "structured_outputs": {"json_object": True}}, True),
    (CHAT, {"messages": M, "ignore_eos": True, "response_format": {"type": "json_object"}},
     True),
    # the fake tokenizer exposes no vocabulary to llguidance: no constraint at all
    (CHAT, {"messages": M, "response_format": {"type": "json_object"}}, True),
    (CHAT, {"messages": M, "response_format": {"type": "text"}}, False),
    (CHAT, {"messages": M, "structured_outputs": {"choice": ["a"], "json_object": True}}, True),
    (CHAT, {"messages": M, "structured_outputs": {"regex": "a{2,1}"}}, True),
    (CHAT, {"messages": M, "model": "style", "adapter": "math"}, True),
    (CHAT, {"messages": M, "model": "fake-alias", "adapter": "math"}, False),
    (CHAT, {"messages": M, "rollout_provenance": True, "temperature": -0.5}, True),
    (CHAT, {"messages": M, "rollout_provenance": True, "max_completion_tokens": 0}, True),
    (CHAT, {"messages": M, "rollout_provenance": True, "tool_choice": "auto"}, True),
    (CHAT, {"messages": [{"role": "user", "content": "x" * LEN}]}, True),
    (BATCH, {"prompts": [M] * 9, "n": 8}, True),
    # vLLM's request fields on chat and batch (kiln.api.requests.extras)
    *((route, {body_key: body_val, **fields}, refused)
      for route, body_key, body_val in ((CHAT, "messages", M), (BATCH, "prompts", [M]))
      for fields, refused in (
          ({"min_tokens": 5, "max_tokens": 3}, True),
          ({"min_tokens": 2, "stop": ["x"]}, True),
          ({"min_tokens": 2, "max_tokens": 3}, False),
          ({"truncate_prompt_tokens": 0}, True),
          ({"truncate_prompt_tokens": -1, "max_tokens": LEN}, True),
          ({"truncate_prompt_tokens": 3}, False),
          ({"thinking_token_budget": 3, "thinking_budget_tokens": 4}, True),
          ({"thinking_token_budget": 4, "thinking_budget_tokens": 3}, True),
          ({"thinking_token_budget": -1, "thinking_budget_tokens": 3}, True),
          ({"thinking_token_budget": 3, "thinking_budget_tokens": None}, True),
          ({"thinking_token_budget": -1, "thinking_budget_tokens": None}, False),
          ({"prompt_logprobs": 2}, False),
      )),
    (CHAT, {"messages": M, "prompt_logprobs": 2, "stream": True}, True),
    (CHAT, {"messages": M, "use_beam_search": True}, True),
    (CHAT, {"messages": M, "chat_template": "{{ 'x' }}"}, True),
    (CHAT, {"messages": M, "chat_template": None}, False),
    (CHAT, {"messages": M, "include_reasoning": False, "fold_reasoning_into_content": True},
     True),
    (CHAT, {"messages": M, "include_reasoning": False, "fold_reasoning_into_content": False},
     False),
    (CHAT, {"messages": M, "logits_processors": ["pkg:P"]}, True),
    (CHAT, {"messages": M, "logits_processors": [], "mm_processor_kwargs": {}}, False),
    (CHAT, {"messages": M, "documents": [{"text": "a"}], "chat_template_kwargs": {"documents": []}},
     True),
    (CHAT, {"messages": M, "documents": [{"text": "a"}], "reasoning_effort": "low",
            "chat_template_kwargs": {"x": 1}}, False),
    (BATCH, {"prompts": [M], "reasoning_effort": "high",
             "chat_template_kwargs": {"reasoning_effort": None}}, True),
    (BATCH, {"prompts": [M], "mm_processor_kwargs": {"a": 1}}, True),
    (BATCH, {"prompts": [M], "length_penalty": 2.0}, True),
    (BATCH, {"prompts": [M], "length_penalty": 1.0, "vllm_xargs": None}, False),
    (BATCH, {"prompts": [M] * 8, "n": 8}, False),
    (COMP, {"prompt": "hi"}, False),
    (COMP, {"prompt": "hi", "suffix": "x"}, True),
    (COMP, {"prompt": "hi", "suffix": None, "length_penalty": 1}, False),
    (COMP, {"prompt": ["a", "b"], "n": 40}, True),
    (COMP, {"prompt": ["a", "b"], "n": 32}, False),
    (COMP, {"prompt": "a", "n": 3, "best_of": 2}, True),
    (COMP, {"prompt": "a", "n": 2, "best_of": 3, "stream": True}, True),
    (COMP, {"prompt": "a", "prompt_logprobs": 3, "n": 2}, True),
    (COMP, {"prompt": "ab", "prompt_logprobs": 3, "logprobs": 0}, False),
    (COMP, {"prompt": "ab", "prompt_logprobs": 3, "echo": True}, True),
    (COMP, {"prompt": ["a", "b"], "prompt_logprobs": 3}, True),
    (COMP, {"prompt": "ab", "prompt_logprobs": 3, "thinking_token_budget": 4}, True),
    (COMP, {"prompt": "ab", "prompt_logprobs": 3, "structured_outputs": {"json_object": True}},
     True),
    (COMP, {"prompt": "a", "prompt_logprobs": 30, "max_tokens": 5}, True),
    (COMP, {"prompt": "a", "min_tokens": 17}, True),
    (COMP, {"prompt": "a", "min_tokens": 16}, False),
    (COMP, {"prompt": "a", "repetition_detection": {}}, True),
    (COMP, {"prompt": "a", "repetition_detection": {"max_pattern_size": 3, "min_count": 2,
                                                    "min_pattern_size": 4}}, True),
    (COMP, {"prompt": "a", "repetition_detection": {"max_pattern_size": 3, "min_count": 2.0,
                                                    "min_pattern_size": 3}}, False),
    (COMP, {"prompt": "a", "truncate_prompt_tokens": -1, "max_tokens": LEN}, True),
    (COMP, {"prompt": "a", "truncate_prompt_tokens": 0}, True),
    (COMP, {"prompt": "a" * LEN}, True),
    (COMP, {"prompt": [5] * 3200, "echo": True, "logprobs": 20, "max_tokens": 0}, True),
    (COMP, {"prompt": [5] * 3000, "echo": True, "logprobs": 20, "max_tokens": 0}, False),
]


@pytest.mark.parametrize(("path", "body", "refused"), CASES)
def test_server_refuses_where_a_rule_says(client: TestClient, doc: dict[str, Any], path: str,
                                          body: dict[str, Any], refused: bool) -> None:
    rule = refusal(rules_of(doc["paths"][path]["post"]), body)
    r = client.post(path, json=body)
    if not refused:
        assert rule is None, rule
        assert r.status_code == 200, r.text
        return
    assert rule is not None, "no rule states this refusal"
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith(rule["param"]) and error["code"] == rule["code"], (rule, r.text)


@pytest.mark.parametrize(("path", "body", "param"), [
    (CHAT, {"messages": M, "chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
    (CHAT, {"messages": M, "tool_choice": "bogus"}, "tool_choice"),
    (COMP, {"prompt": "a", "logprob_token_ids": [3]}, "logprob_token_ids"),
    (COMP, {"prompt": "a", "logprobs": 1, "logprob_token_ids": [3] * 257}, "logprob_token_ids"),
    # the served document bounds TokenId by the vocabulary; the contract by uint32
    (COMP, {"prompt": "a", "logprobs": 1, "logprob_token_ids": [VOCAB]}, "logprob_token_ids"),
])
def test_contract_rules_name_the_field(client: TestClient, path: str, body: dict[str, Any],
                                       param: str) -> None:
    """The rules JSON Schema can state are the contract's, and still name the field."""
    r = client.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_continue_final_message_with_the_final_assistant_message(client: TestClient) -> None:
    body = {"messages": FINAL, "continue_final_message": True, "add_generation_prompt": False}
    assert client.post(CHAT, json=body).status_code == 200


def test_rules_carry_the_handlers_constants(doc: dict[str, Any]) -> None:
    batch = rules_of(doc["paths"][BATCH]["post"])
    assert next(r["max"] for r in batch if r["kind"] == "product_max") == MAX_BATCH_ITEMS
    comp = rules_of(doc["paths"][COMP]["post"])
    choices = [r for r in comp if r["kind"] == "product_max" and r["param"] == "n"]
    assert choices[0]["max"] == completions_gen.MAX_CHOICES
    cfg = ServerConfig()
    assert choices[1]["max"] == cfg.max_num_seqs + cfg.max_waiting_requests
    assert all(not rules_of(op) for path, item in doc["paths"].items() for op in item.values()
               if path.startswith("/v1/adapters"))


def test_operands_and_paths() -> None:
    n = {"fields": ["best_of", "n"], "if_absent": 1, "if_null": 7}
    assert operand(n, {}) == (1, True)
    assert operand(n, {"best_of": None}) == (7, True)
    assert operand(n, {"best_of": None, "n": 3}) == (3, True)
    assert operand({"fields": ["x"]}, {"x": None}) is None
    tokens = {"fields": ["p"], "measure": "text_tokens", "add": -1}
    assert operand(tokens, {"p": [1, 2, 3]}) == (2, True)
    assert operand(tokens, {"p": ["ab", "é"]}) == (2 + TOKEN_SLACK - 1, False)
    body = {"tools": [{"function": {"name": "a"}}, {"function": {}}, {"function": {"name": "b"}}]}
    assert resolve(body, "tools[*].function.name") == ["a", "b"]
    assert resolve(body, "tools[*].missing") == []


def test_the_filter_knows_no_route_and_no_field() -> None:
    """kiln/fuzz_filter.py holds no path and no request field name of its own."""
    tree = ast.parse((ROOT / "kiln" / "fuzz_filter.py").read_text())
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str)}
    contract = json.loads((ROOT / "contract" / "kiln-inference-v1.schema.json").read_text())
    names = {p for d in contract["$defs"].values() for p in d.get("properties", {})}
    routes = {r["path"] for r in json.loads((ROOT / "contract" / "routes.json").read_text())}
    assert not strings & (names | routes), strings & (names | routes)


@pytest.mark.parametrize(("path", "body"), [
    (CHAT, {"messages": M, "min_tokens": 3}),
    (COMP, {"prompt": "a", "allowed_token_ids": [2], "min_tokens": 1}),
])
def test_nothing_to_sample_is_a_400(tmp_path: Path, path: str, body: dict[str, Any]) -> None:
    """The engine's "no token allowed" (the request's own processors and constraint) had been a
    500 generation_error (found by the live schemathesis run: allowed_token_ids [0] beside a
    JSON constraint); any other generation failure stays a 500."""
    backend = FakeBackend()
    backend.fail = True
    with TestClient(build_app(ServerConfig(), backend), raise_server_exceptions=False) as c:
        assert c.post(path, json=body).status_code == 500
        backend.fail_error = NOTHING_ALLOWED
        r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] in ("chat_invalid_request", "completion_invalid_request")
