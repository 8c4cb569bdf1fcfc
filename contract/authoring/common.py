"""Shared constants and the field-table helpers every definition module builds with."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]
Field = tuple[str, bool, Schema]

BASE_URI = "https://ericflo.github.io/kiln/contracts/"
MAIN_FILE = "kiln-inference-v1.schema.json"
TB_FILE = "thinking-budget-v1.schema.json"
DIALECT = "https://json-schema.org/draft/2020-12/schema"

UINT32_MAX = 4294967295
# 2**64 - 1 written exactly. The seed prints 18446744073709552000 (2**64 - 1 rounded through a
# binary64 float), which would admit seeds that no u64 can hold. See CHANGELOG.md.
UINT64_MAX = 18446744073709551615
# Chat `n` and batch `n` are bounded; see CHANGELOG.md.
MAX_CHOICES = 64
# /v1/completions scores at most 4096 prompt tokens (seed: "capped at 4096").
MAX_PROMPT_TOKENS = 4096
# Regex escape (not literal control characters): no C0 control character and no DEL.
CONTROL_FREE = "^[^\\u0000-\\u001f\\u007f]+$"
ACCEPTED = "accepted_and_ignored"

_MISSING: Any = object()


def ref(name: str) -> Schema:
    """A reference to a definition of the main file."""
    return {"$ref": f"#/$defs/{name}"}


def tb(name: str) -> Schema:
    """A reference to a definition of the thinking-budget file (relative to the main file)."""
    return {"$ref": f"{TB_FILE}#/$defs/{name}"}


def nullable(schema: Schema) -> Schema:
    """``null`` or ``schema``, written the way the seed's Nullable* helpers are."""
    return {"oneOf": [{"type": "null"}, schema]}


def F(
    name: str, required: bool, schema: Schema, description: str, *, default: Any = _MISSING
) -> Field:
    """One row of a field table: the property schema with its description (and default)."""
    prop = {**schema, "description": description}
    if default is not _MISSING:
        prop["default"] = default
    return name, required, prop


def obj(
    description: str,
    fields: list[Field],
    *,
    closed: bool,
    rules: Schema | None = None,
    annotations: Schema | None = None,
    examples: list[Any] | None = None,
) -> Schema:
    """An object definition.

    Closed objects ("Unknown fields rejected") get ``additionalProperties: false``. Open request
    objects get no ``additionalProperties`` (JSON Schema's default already accepts unknown fields)
    and carry the seed's ``x-kiln-unknown-field-policy`` annotation instead.
    """
    schema: Schema = {"description": description, "type": "object"}
    required = [name for name, req, _ in fields if req]
    if required:
        schema["required"] = required
    if fields:
        schema["properties"] = {name: prop for name, _, prop in fields}
    if closed:
        schema["additionalProperties"] = False
    if rules:
        schema.update(rules)
    if annotations:
        schema.update(annotations)
    if examples:
        schema["examples"] = examples
    return schema


def leaf(
    description: str,
    schema: Schema,
    *,
    annotations: Schema | None = None,
    examples: list[Any] | None = None,
) -> Schema:
    """A non-object definition (scalar, union, array)."""
    out: Schema = {"description": description, **schema}
    if annotations:
        out.update(annotations)
    if examples:
        out["examples"] = examples
    return out


def n_choices(description: str) -> Field:
    """Chat and batch ``n``: null or 1..64 (the seed leaves it unbounded; see CHANGELOG.md)."""
    return F(
        "n",
        False,
        nullable({"type": "integer", "minimum": 1, "maximum": MAX_CHOICES}),
        description,
        default=1,
    )


# Added (CHANGELOG): OpenAI's parallel_tool_calls on chat and batch requests.
PARALLEL_TOOL_CALLS: Field = F(
    "parallel_tool_calls",
    False,
    {"$ref": "#/$defs/NullableBoolean"},
    "OpenAI-compatible: false keeps only the first tool call of each choice; missing, null or "
    "true keeps every tool call.",
)


# Per-field sampling overrides shared, word for word, by chat and batch requests.
SAMPLING_FIELDS: list[Field] = [
    F(
        "temperature",
        False,
        {"$ref": "#/$defs/NullableSamplingNumber"},
        "Sampling temperature. Null uses the selected preset or runtime default.",
    ),
    F(
        "top_p",
        False,
        {"$ref": "#/$defs/NullableSamplingNumber"},
        "Nucleus-sampling probability mass. Null uses the selected preset or runtime default.",
    ),
    F(
        "top_k",
        False,
        nullable({"type": "integer", "minimum": -1, "maximum": UINT32_MAX}),
        "Maximum candidate count for top-k filtering; 0 and -1 (vLLM's spelling) turn it off. Null uses the selected preset or runtime default.",
    ),
    F(
        "min_p",
        False,
        {"$ref": "#/$defs/NullableSamplingNumber"},
        "Minimum probability relative to the most likely token. Null uses the selected preset or runtime default.",
    ),
    F(
        "presence_penalty",
        False,
        {"$ref": "#/$defs/NullableSamplingNumber"},
        "OpenAI-style presence penalty. Null uses the selected preset or runtime default.",
    ),
    F(
        "frequency_penalty",
        False,
        {"$ref": "#/$defs/NullableSamplingNumber"},
        "OpenAI-style frequency penalty. Null uses the selected preset or runtime default.",
    ),
    F(
        "repetition_penalty",
        False,
        {"$ref": "#/$defs/NullableSamplingNumber"},
        "Token repetition penalty. Null uses the selected preset or runtime default.",
    ),
    F(
        "sampling_preset",
        False,
        {"$ref": "#/$defs/SamplingPreset"},
        "Named group of sampling defaults; explicit sampling fields take precedence.",
    ),
]
