"""TextCompletionRequest carries every property of vLLM's completions request (the seed
``shared/seeds/vllm-completion-request.schema.json``): its JSON types, defaults and bounds, except
the differences listed here and in ``contract/CHANGELOG.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.contract.contract_files import (
    flat_main_schema,
    included_groups,
    main_schema,
)

REPO = Path(__file__).resolve().parents[2]
SEED_PATH = next((p for p in (REPO.parent / "shared" / "seeds" / "vllm-completion-request.schema.json",
                              REPO / "shared" / "seeds" / "vllm-completion-request.schema.json")
                  if p.is_file()), None)
pytestmark = pytest.mark.skipif(SEED_PATH is None, reason="vLLM seed schema not found")

# JSON types that differ from the seed's, with the reason (CHANGELOG.md).
TYPES = {
    "prompt": {"array", "string"},  # null (prompt_embeds instead) cannot apply: no embeddings input
    "n": {"integer", "null"},  # null is 1, as Kiln's scoring request always allowed
}
# Defaults that differ (none so far; a missing key must match the seed exactly).
DEFAULTS: dict[str, Any] = {}
# Added beside the seed's properties (CHANGELOG.md).
ADDED = ["sampling_preset", "best_of",
         # vLLM's former guided_* fields, refused naming structured_outputs
         *(f"guided_{k}" for k in ("json", "regex", "choice", "grammar", "whitespace_pattern"))]


def seed() -> dict[str, Any]:
    assert SEED_PATH is not None
    data: dict[str, Any] = json.loads(SEED_PATH.read_text(encoding="utf-8"))
    return data


def contract_props() -> dict[str, Any]:
    """TextCompletionRequest's properties, the field groups it includes flattened in, a property
    that is a local `$ref` (SamplingFields' `temperature`: NullableTemperature) read through."""
    defs = flat_main_schema()["$defs"]
    props: dict[str, Any] = {}
    for name, prop in defs["TextCompletionRequest"]["properties"].items():
        ref = prop.get("$ref", "")
        if ref.startswith("#/$defs/"):
            prop = {**defs[ref.removeprefix("#/$defs/")], **{k: v for k, v in prop.items()
                                                            if k != "$ref"}}
        props[name] = prop
    return props


def branches(schema: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for key in ("anyOf", "oneOf"):
        for b in schema.get(key, []):
            out.extend(branches(b))
    if not out:
        out = [schema]
    return out


def types(schema: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    for b in branches(schema):
        if "$ref" in b:
            found.add("object")
        elif "type" in b:
            found.add(str(b["type"]))
    return found


def bounds(schema: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per JSON type, the widest (minimum, maximum) any branch allows."""
    out: dict[str, tuple[float, float]] = {}
    for b in branches(schema):
        kind = str(b.get("type", "object"))
        lo, hi = float(b.get("minimum", float("-inf"))), float(b.get("maximum", float("inf")))
        if kind in out:
            lo, hi = min(lo, out[kind][0]), max(hi, out[kind][1])
        out[kind] = (lo, hi)
    return out


def test_every_seed_property_in_the_seeds_order() -> None:
    """Every seed property and the additions, the request's own properties in the seed's order.
    The fields it shares with chat and batch (issue 45) are in field groups, in the order of the
    Kiln seed's chat request (tests/contract/test_seed_coverage.py)."""
    names = [*seed()["properties"], *ADDED]
    assert len(names) == 55 + len(ADDED)
    assert sorted(contract_props()) == sorted(names)
    own = list(main_schema()["$defs"]["TextCompletionRequest"]["properties"])
    assert own == [n for n in names if n in own]
    assert included_groups("TextCompletionRequest") == ["SamplingFields", "OpenAiRequestFields"]


@pytest.mark.parametrize("name", list(seed()["properties"]) if SEED_PATH else [])
def test_types_defaults_and_bounds(name: str) -> None:
    sprop, cprop = seed()["properties"][name], contract_props()[name]
    assert types(cprop) == TYPES.get(name, types(sprop)), name
    assert cprop.get("default") == DEFAULTS.get(name, sprop.get("default")), name
    sb, cb = bounds(sprop), bounds(cprop)
    for kind in ("integer", "number"):
        if kind in sb and kind in cb:
            # the contract keeps the seed's bounds or tightens them (float32 seed bounds such as
            # 9.223372036854776e+18 are 2**63 rounded: compare as floats)
            assert cb[kind][0] >= sb[kind][0] and cb[kind][1] <= sb[kind][1], (name, sb, cb)


def test_the_bounds_this_server_enforces() -> None:
    props = contract_props()
    assert bounds(props["logprobs"])["integer"][0] == 0  # the top: --max-logprobs, at run time
    assert bounds(props["top_k"])["integer"] == (-1, 4294967295)
    assert props["max_tokens"]["default"] == 16
