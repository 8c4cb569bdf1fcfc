"""Examples validate, the contract is a valid 2020-12 schema, and the CHANGELOG fixes hold."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests.contract.contract_files import (
    CONTRACT_DIR,
    MAIN_FILE,
    TB_FILE,
    api_defs,
    flat_main_schema,
    main_schema,
    py_validator,
    routes,
    rs_validator,
    tb_schema,
)

UINT64_MAX = 18446744073709551615


# The seed's examples carry chat's Kiln metadata as `metadata`; the contract names it
# `kiln_metadata` (CHANGELOG.md, issue 52, tests/contract/test_seed_coverage.py RENAMED).
RENAMED_IN_EXAMPLES = {"ChatCompletionResponse": ("metadata", "kiln_metadata"),
                       "ChatCompletionChunk": ("metadata", "kiln_metadata")}


def as_contract_example(name: str, example: Any) -> Any:
    old, new = RENAMED_IN_EXAMPLES.get(name, ("", ""))
    if not isinstance(example, dict) or old not in example:
        return example
    return {(new if k == old else k): v for k, v in example.items()}


def example_cases() -> list[tuple[str, int, Any]]:
    """Root ``x-kiln-examples`` (from the seed, with ``RENAMED_IN_EXAMPLES``) plus ``examples``
    of the added definitions."""
    cases = [
        (name, i, as_contract_example(name, example))
        for name, examples in main_schema()["x-kiln-examples"].items()
        for i, example in enumerate(examples)
    ]
    for name, schema in main_schema()["$defs"].items():
        cases += [(name, i, example) for i, example in enumerate(schema.get("examples", []))]
    return cases


def test_there_are_examples_for_every_entrypoint() -> None:
    named = {name for name, _, _ in example_cases()}
    for entry in main_schema()["x-kiln-entrypoints"]:
        if entry != "ChatCompletionChunkStream":
            assert entry in named
    assert {"ChatCompletionChunk", "ErrorResponse", "ModelList"} <= named


@pytest.mark.parametrize(("name", "index", "example"), example_cases(), ids=lambda v: str(v)[:40])
def test_example_validates(name: str, index: int, example: Any) -> None:
    errors = [e.message for e in rs_validator(name).iter_errors(example)]
    assert errors == [], (name, index)
    py_errors = [e.message for e in py_validator(name).iter_errors(example)]
    assert py_errors == [], (name, index)


@pytest.mark.parametrize("schema", [main_schema(), tb_schema()], ids=[MAIN_FILE, TB_FILE])
def test_contract_is_a_valid_2020_12_schema(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    for sub in schema["$defs"].values():
        Draft202012Validator.check_schema(sub)


def test_ids() -> None:
    base = "https://ericflo.github.io/kiln/contracts/"
    assert main_schema()["$id"] == base + MAIN_FILE
    assert tb_schema()["$id"] == base + TB_FILE


def test_every_internal_ref_resolves() -> None:
    text = (CONTRACT_DIR / MAIN_FILE).read_text() + (CONTRACT_DIR / TB_FILE).read_text()
    for line in text.splitlines():
        if '"$ref": "#/$defs/' in line:
            target = line.split("#/$defs/")[1].split('"')[0]
            assert target in main_schema()["$defs"] or target in tb_schema()["$defs"], target
    assert set(tb_schema()["$defs"]) == {
        "limitOverride",
        "source",
        "trigger",
        "request",
        "serverDefaults",
        "effective",
        "outcome",
        "record",
        "recentRecord",
    }


def test_uint64_maximum_is_exact() -> None:
    text = (CONTRACT_DIR / MAIN_FILE).read_text()
    assert "18446744073709552000" not in text
    assert text.count("18446744073709551615") == 2  # NullableUint64, RolloutProvenanceV1.seed
    nullable = main_schema()["$defs"]["NullableUint64"]["oneOf"][1]["maximum"]
    assert type(nullable) is int and nullable == 2**64 - 1
    seed = main_schema()["$defs"]["RolloutProvenanceV1"]["properties"]["seed"]["maximum"]
    assert type(seed) is int and seed == 2**64 - 1
    chat = rs_validator("ChatCompletionRequest")
    assert chat.is_valid({"messages": [{"role": "user", "content": "hi"}], "seed": UINT64_MAX})
    assert not chat.is_valid({"messages": [{"role": "user", "content": "hi"}], "seed": UINT64_MAX + 1})
    assert not chat.is_valid({"messages": [{"role": "user", "content": "hi"}], "seed": -1})
    assert py_validator("ChatCompletionRequest").is_valid({"messages": [{"role": "user", "content": "hi"}], "seed": UINT64_MAX})
    assert not py_validator("ChatCompletionRequest").is_valid(
        {"messages": [{"role": "user", "content": "hi"}], "seed": UINT64_MAX + 1}
    )


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("ChatCompletionRequest", {"messages": [{"role": "user", "content": "hi"}]}),
        ("BatchCompletionRequest", {"prompts": [[{"role": "user", "content": "hi"}]]}),
    ],
)
def test_n_is_bounded(name: str, base: dict[str, Any]) -> None:
    n = flat_main_schema()["$defs"][name]["properties"]["n"]
    assert n["oneOf"][1] == {"type": "integer", "minimum": 1, "maximum": 64}
    assert n["default"] == 1
    validator = rs_validator(name)
    for ok in (None, 1, 64):
        assert validator.is_valid({**base, "n": ok}), ok
    for bad in (0, -1, 65, 1.5, "2"):
        assert not validator.is_valid({**base, "n": bad}), bad


def test_text_completion_rules_from_descriptions() -> None:
    validator = rs_validator("TextCompletionRequest")
    base: dict[str, Any] = {"prompt": "hi", "prompt_logprobs": 1}
    ok: dict[str, Any]
    bad: dict[str, Any]
    for ok in (
        {},
        {"max_tokens": None},
        {"max_tokens": 0},
        {"max_tokens": 1},
        {"n": 1},
        {"n": None},
        {"stream": False},
        {"prompt": [0, 5]},
        # vLLM's generation request (issue 25): the same definition
        {"max_tokens": 2},
        {"n": 2},
        {"stream": True},
        {"prompt": ["a", "b"]},
        {"prompt": [[1, 2], [3]]},
        {"logprobs": 20, "echo": True, "top_k": -1},
        {"logprobs": 21},  # the server's --max-logprobs bounds it, not the schema
    ):
        assert validator.is_valid({**base, **ok}), ok
    for bad in (
        {"n": 0},
        {"n": 65},
        {"logprobs": -1},
        {"prompt": [[]]},
        {"prompt": None},
        {"prompt": [1, "a"]},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"prompt": []},
        {"prompt": [-1]},
        {"prompt": [0] * 4097},
        {"prompt_logprobs": 257},
    ):
        assert not validator.is_valid({**base, **bad}), bad


def test_error_response() -> None:
    validator = rs_validator("ErrorResponse")
    full = {"error": {"message": "m", "type": "t", "param": None, "code": "c"}}
    assert validator.is_valid(full)
    assert validator.is_valid({"error": {"message": "m", "type": "t"}})
    assert not validator.is_valid({"error": {"message": "m"}})
    assert not validator.is_valid({"error": {"message": "m", "type": "t", "hint": "h"}})
    assert not validator.is_valid({**full, "extra": 1})
    assert not validator.is_valid({})


def test_unknown_fields_policy() -> None:
    assert rs_validator("ChatCompletionRequest").is_valid({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {}})
    assert rs_validator("TextCompletionRequest").is_valid(
        {"prompt": "x", "prompt_logprobs": 0, "echo": True}
    )
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    assert rs_validator("Usage").is_valid(usage)
    assert not rs_validator("Usage").is_valid({**usage, "cached_tokens": 0})


def test_root_one_of_is_the_six_entrypoints() -> None:
    refs = [branch["$ref"].rsplit("/", 1)[1] for branch in main_schema()["oneOf"]]
    assert refs == [
        "BatchCompletionRequest",
        "BatchCompletionResponse",
        "ChatCompletionRequest",
        "ChatCompletionResponse",
        "TextCompletionRequest",
        "TextCompletionResponse",
    ]


def test_routes() -> None:
    table = routes()
    defs = {**main_schema()["$defs"], **api_defs()}
    seen = set()
    for route in table:
        assert set(route) - {"path_parameters"} == {
            "operation_id",
            "method",
            "path",
            "request",
            "responses",
            "streaming",
            "tag",
            "summary",
        }
        assert (route["method"], route["path"]) not in seen
        seen.add((route["method"], route["path"]))
        assert route["request"] is None or route["request"] in defs
        assert "200" in route["responses"]
        for status, response in route["responses"].items():
            for media_type, name in response["media_types"].items():
                assert name is None or name in defs, (route["path"], status, media_type)
            if status.startswith(("4", "5")) and route["path"] != "/health":
                # Anthropic's routes answer errors in Anthropic's shape
                error = "MessagesErrorResponse" if route["path"].startswith("/v1/messages") \
                    else "ErrorResponse"
                assert response["media_types"] == {"application/json": error}
        assert route["streaming"] == (
            "text/event-stream" in route["responses"]["200"]["media_types"]
        )
    assert seen == {
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/completions/batch"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/{model}"),
        ("GET", "/health"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/v1/adapters"),
        ("POST", "/v1/adapters/load"),
        ("POST", "/v1/adapters/unload"),
        ("DELETE", "/v1/adapters/{name}"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("GET", "/tokenizer_info"),
        ("POST", "/v1/completions/render"),
        ("POST", "/v1/chat/completions/render"),
        ("POST", "/v1/responses"),
        ("GET", "/v1/responses/{response_id}"),
        ("DELETE", "/v1/responses/{response_id}"),
        ("GET", "/v1/responses/{response_id}/input_items"),
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/pause"),
        ("POST", "/resume"),
        ("GET", "/is_paused"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/sleep"),
        ("POST", "/wake_up"),
        ("GET", "/is_sleeping"),
        ("POST", "/update_weights_from_disk"),
        ("POST", "/inference/v1/generate"),
        ("GET", "/v1/conversations"),
        ("POST", "/v1/conversations"),
        ("GET", "/v1/conversations/{conversation_id}"),
        ("PATCH", "/v1/conversations/{conversation_id}"),
        ("DELETE", "/v1/conversations/{conversation_id}"),
        ("GET", "/v1/conversations/{conversation_id}/export"),
        ("GET", "/ui"),
        ("GET", "/ui/{asset}"),
    }
    chat = next(r for r in table if r["path"] == "/v1/chat/completions")
    assert chat["responses"]["200"]["media_types"] == {
        "application/json": "ChatCompletionResponse",
        "text/event-stream": "ChatCompletionChunkStream",
    }


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    duplicated = sorted({k for k in keys if keys.count(k) > 1})
    assert not duplicated, f"duplicate keys {duplicated}"
    return dict(pairs)


@pytest.mark.parametrize("name", sorted(p.name for p in CONTRACT_DIR.glob("*.json")))
def test_contract_files_are_hand_editable_json(name: str) -> None:
    """The JSON files are the source people edit: a duplicated key (json silently keeps the last
    one) would hide an edit, so it is refused here."""
    text = (CONTRACT_DIR / name).read_text(encoding="utf-8")
    assert json.loads(text, object_pairs_hook=_no_duplicate_keys) is not None
