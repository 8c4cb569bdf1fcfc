"""What a JSON schema constraint becomes: ``closed`` (no extra keys unless the schema says
so, docs/structured-outputs.md JSON defaults), and which keywords it can carry: every keyword
of draft 2020-12's vocabulary (and the older drafts' assertions clients still send) is either
enforced by the
grammar llguidance compiles, an annotation that asserts nothing, or refused here with a 400
naming it (docs/structured-outputs.md). Nothing is dropped: a keyword llguidance would ignore
is refused before llguidance sees the schema, whatever its version does with it.

``tests/api/test_schema_keywords.py`` walks the whole vocabulary (read from the draft's own
meta-schemas) and checks each keyword against these tables: an enforced one must make the
grammar refuse an instance the keyword forbids, a refused one must be a 400 naming it.
"""

from __future__ import annotations

from typing import Any

# The grammar enforces them (llguidance compiles each into the token mask; it refuses some
# combinations itself, e.g. minProperties beside optional properties, which is a 400 too).
ENFORCED = frozenset({
    "$ref", "$anchor", "$defs", "definitions", "prefixItems", "items", "additionalProperties",
    "properties", "patternProperties", "allOf", "anyOf", "oneOf", "type", "const", "enum",
    "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength",
    "minLength", "pattern", "maxItems", "minItems", "maxProperties", "minProperties",
    "required", "format",
})
# They say nothing about which instances are valid (meta-data, identifiers, comments).
ANNOTATIONS = frozenset({
    "$schema", "$id", "$comment", "$vocabulary", "title", "description", "default",
    "deprecated", "readOnly", "writeOnly", "examples",
})
_CANNOT = "the grammar cannot enforce it"
# Keyword -> why it is refused.
REFUSED: dict[str, str] = {
    **{k: _CANNOT for k in ("contains", "minContains", "maxContains", "uniqueItems",
                            "propertyNames", "dependentRequired", "dependentSchemas",
                            "unevaluatedItems", "unevaluatedProperties", "not", "if", "then",
                            "else", "$dynamicRef", "$dynamicAnchor")},
    "contentEncoding": "the grammar cannot check an encoded string's content",
    "contentMediaType": "the grammar cannot check a string's media type",
    "contentSchema": "the grammar cannot check a JSON document held in a string",
    # older drafts' keywords that still assert something there
    "dependencies": "draft 7's keyword; the grammar cannot enforce it",
    "$recursiveRef": "draft 2019-09's keyword; the grammar cannot enforce it",
    "$recursiveAnchor": "draft 2019-09's keyword; the grammar cannot enforce it",
}
# `format` values the grammar enforces; every other format (draft 2020-12 defines more) is
# refused rather than left unchecked.
FORMATS = frozenset({"date-time", "date", "time", "duration", "email", "hostname", "ipv4",
                     "ipv6", "uuid", "uri"})

# Keywords whose value is a map of name -> schema, a schema or a list of schemas, a schema.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("prefixItems", "allOf", "anyOf", "oneOf", "items")
_SCHEMAS = ("additionalProperties", "items", "contains", "propertyNames", "not", "if", "then",
            "else", "unevaluatedItems", "unevaluatedProperties", "contentSchema")


_OBJECT_KEYWORDS = ("additionalProperties", "unevaluatedProperties", "patternProperties")


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that lists
    ``properties`` and says nothing about extra keys (not inside ``allOf``, where closing each
    part would refuse the other parts' keys)."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "allOf":
            out[key] = value
        elif key in ("properties", "$defs", "definitions", "patternProperties",
                     "dependentSchemas"):
            out[key] = {k: closed(v) for k, v in value.items()} if isinstance(value, dict) \
                else value
        elif key in ("enum", "const", "default", "examples", "required"):
            out[key] = value
        else:
            out[key] = closed(value)
    if "properties" in out and not any(k in out for k in _OBJECT_KEYWORDS):
        out["additionalProperties"] = False
    return out


class Unenforceable(ValueError):
    """A schema keyword the grammar cannot enforce; the message names it and where it is."""


def check(schema: Any, where: str = "") -> None:
    """Raise Unenforceable for the first refused keyword (or unenforced ``format``) in
    ``schema``, naming it and its JSON pointer; keywords outside every draft's vocabulary are
    left alone, as JSON Schema itself ignores them."""
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        here = f"{where}/{key}"
        if key in REFUSED:
            raise Unenforceable(f"{key} (at {here or '/'}) cannot be honoured: {REFUSED[key]}; "
                                "remove it or check the output yourself")
        if key == "format" and value not in FORMATS:
            raise Unenforceable(f"format {value!r} (at {here}) cannot be enforced; the formats "
                                f"enforced are {', '.join(sorted(FORMATS))}")
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                check(sub, f"{here}/{_escape(name)}")
        if key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                check(sub, f"{here}/{i}")
        elif key in _SCHEMAS:
            check(value, here)


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
