"""Every keyword of JSON Schema draft 2020-12 (read from the draft's own meta-schemas, so that
none is left out) is enforced by the grammar, an annotation, or refused with a 400 naming it —
never dropped (kiln/api/structured/schema_keywords.py). An enforced keyword is checked by
llguidance's own matcher on the tiny test tokenizer: the grammar must refuse an instance the
keyword forbids, so a later llguidance that ignored one would fail here."""

from __future__ import annotations

from typing import Any

import llguidance
import pytest
from jsonschema_specifications import REGISTRY
from starlette.testclient import TestClient

from kiln.api.structured import schema_keywords
from kiln.api.structured.constraints import from_response_format, from_tool_choice
from tests.tiny_models import tiny_tokenizer

DRAFT = "https://json-schema.org/draft/2020-12/"
SCHEMA_PARAM = "response_format.json_schema.schema"


def vocabulary() -> set[str]:
    """Every keyword the 2020-12 meta-schemas define (its vocabularies, and the deprecated
    keywords its top-level meta-schema still lists)."""
    words: set[str] = set()
    for uri in REGISTRY:
        if uri.startswith(DRAFT) and (uri.startswith(DRAFT + "meta/") or uri == DRAFT + "schema"):
            words |= set(REGISTRY[uri].contents.get("properties", {}))
    return words


# keyword -> (schema, an instance it allows, an instance it forbids)
ENFORCED: dict[str, tuple[dict[str, Any], str, str]] = {
    "$ref": ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"}, "1", '"x"'),
    "$anchor": ({"$defs": {"a": {"$anchor": "A", "type": "integer"}}, "$ref": "#A"}, "1", '"x"'),
    "$defs": ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"}, "1", "true"),
    "definitions": ({"definitions": {"a": {"type": "integer"}}, "$ref": "#/definitions/a"},
                    "1", "true"),
    "prefixItems": ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False},
                    "[1]", '["x"]'),
    "items": ({"type": "array", "items": {"type": "integer"}}, "[1, 2]", '[1, "x"]'),
    "additionalProperties": ({"type": "object", "additionalProperties": {"type": "integer"}},
                             '{"a": 1}', '{"a": "x"}'),
    "properties": ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a": 1}',
                   '{"a": "x"}'),
    "patternProperties": ({"type": "object", "patternProperties": {"^a": {"type": "integer"}},
                           "additionalProperties": False}, '{"ab": 1}', '{"b": 1}'),
    "allOf": ({"allOf": [{"type": "integer"}, {"minimum": 1}]}, "1", "0"),
    "anyOf": ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "1", "true"),
    "oneOf": ({"type": "object", "properties": {"k": {"oneOf": [
        {"type": "integer"}, {"type": "string"}]}}}, '{"k": 1}', '{"k": true}'),
    "type": ({"type": "integer"}, "1", '"1"'),
    "const": ({"const": 3}, "3", "4"),
    "enum": ({"enum": [3, "x"]}, '"x"', "4"),
    "multipleOf": ({"type": "integer", "multipleOf": 3}, "6", "4"),
    "maximum": ({"type": "integer", "maximum": 3}, "3", "4"),
    "exclusiveMaximum": ({"type": "integer", "exclusiveMaximum": 3}, "2", "3"),
    "minimum": ({"type": "integer", "minimum": 3}, "3", "2"),
    "exclusiveMinimum": ({"type": "integer", "exclusiveMinimum": 3}, "4", "3"),
    "maxLength": ({"type": "string", "maxLength": 2}, '"ab"', '"abc"'),
    "minLength": ({"type": "string", "minLength": 2}, '"ab"', '"a"'),
    "pattern": ({"type": "string", "pattern": "^a+$"}, '"aa"', '"b"'),
    "maxItems": ({"type": "array", "maxItems": 1}, "[1]", "[1, 2]"),
    "minItems": ({"type": "array", "minItems": 2}, "[1, 2]", "[1]"),
    "maxProperties": ({"type": "object", "maxProperties": 1}, '{"a": 1}', '{"a": 1, "b": 2}'),
    "minProperties": ({"type": "object", "minProperties": 2}, '{"a": 1, "b": 2}', '{"a": 1}'),
    "required": ({"type": "object", "properties": {"a": {}}, "required": ["a"]}, '{"a": 1}',
                 "{}"),
    "format": ({"type": "string", "format": "email"}, '"a@b.co"', '"x"'),
}
ANNOTATIONS: dict[str, dict[str, Any]] = {
    "$schema": {"$schema": DRAFT + "schema"},
    "$id": {"$id": "https://example.com/s"},
    "$comment": {"$comment": "c"},
    "$vocabulary": {"$vocabulary": {DRAFT + "vocab/core": True}},
    "title": {"title": "t"},
    "description": {"description": "d"},
    "default": {"default": 1},
    "deprecated": {"deprecated": True},
    "readOnly": {"readOnly": True},
    "writeOnly": {"writeOnly": True},
    "examples": {"examples": [1]},
}
REFUSED: dict[str, dict[str, Any]] = {
    "contains": {"type": "array", "contains": {"type": "integer"}},
    "minContains": {"type": "array", "minContains": 2},
    "maxContains": {"type": "array", "maxContains": 2},
    "uniqueItems": {"type": "array", "uniqueItems": True},
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^a"}},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
    "dependentSchemas": {"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}},
    "unevaluatedItems": {"type": "array", "unevaluatedItems": False},
    "unevaluatedProperties": {"type": "object", "properties": {"a": {}},
                              "unevaluatedProperties": False},
    "not": {"not": {"type": "string"}},
    "if": {"if": {"type": "integer"}, "then": {"minimum": 1}},
    "then": {"then": {"minimum": 1}},
    "else": {"else": {"minimum": 1}},
    "$dynamicRef": {"$dynamicRef": "#n"},
    "$dynamicAnchor": {"$dynamicAnchor": "n", "type": "integer"},
    "contentEncoding": {"type": "string", "contentEncoding": "base64"},
    "contentMediaType": {"type": "string", "contentMediaType": "application/json"},
    "contentSchema": {"type": "string", "contentSchema": {"type": "integer"}},
    "dependencies": {"type": "object", "dependencies": {"a": ["b"]}},
    "$recursiveRef": {"$recursiveRef": "#"},
    "$recursiveAnchor": {"$recursiveAnchor": True, "type": "integer"},
}
# Draft 2020-12's formats (its section 7.3): (an instance of it, a string that is not one)
FORMATS: dict[str, tuple[str, str]] = {
    "date-time": ("2020-01-01T00:00:00Z", "x"), "date": ("2020-01-01", "x"),
    "time": ("12:00:00Z", "x"), "duration": ("P1D", "x"), "email": ("a@b.co", "x"),
    "idn-email": ("a@b.co", "x"), "hostname": ("a.b", "-"), "idn-hostname": ("a.b", "-"),
    "ipv4": ("1.2.3.4", "x"), "ipv6": ("::1", "x"), "uri": ("http://a.b/c", "x"),
    "uri-reference": ("/c", "\\"), "iri": ("http://a.b/c", "x"), "iri-reference": ("/c", "\\"),
    "uuid": ("123e4567-e89b-12d3-a456-426614174000", "x"), "uri-template": ("/{a}", "{"),
    "json-pointer": ("/a", "a"), "relative-json-pointer": ("0/a", "/a"), "regex": ("a+", "("),
}


def _accepts(grammar: str, text: str) -> bool:
    tiny = tiny_tokenizer()
    tok = llguidance.LLTokenizer(tiny.to_str(), eos_token=tiny.token_to_id("<|im_end|>"))
    m = llguidance.LLMatcher(tok, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m.consume_tokens(tok.tokenize_str(text)) and m.is_accepting()


def _grammar(schema: dict[str, Any]) -> str:
    built = from_response_format({"type": "json_schema", "json_schema": {"name": "s",
                                                                         "schema": schema}})
    assert built is not None and built[1] == SCHEMA_PARAM
    return built[0]


def _refusal(schema: dict[str, Any]) -> Exception:
    with pytest.raises(Exception) as info:
        _grammar(schema)
    assert getattr(info.value, "param", None) == SCHEMA_PARAM
    return info.value


def test_the_walk_covers_the_whole_vocabulary() -> None:
    """Each 2020-12 keyword has a case here and a class in the server's tables, and no keyword
    is in two classes: a new draft keyword, or one moved between classes, shows up here."""
    words = vocabulary()
    assert {"minProperties", "unevaluatedProperties", "contentSchema", "$dynamicRef"} <= words
    cases = ENFORCED.keys() | ANNOTATIONS.keys() | REFUSED.keys()
    assert words <= cases, sorted(words - cases)
    assert ENFORCED.keys() == schema_keywords.ENFORCED
    assert ANNOTATIONS.keys() == schema_keywords.ANNOTATIONS
    assert REFUSED.keys() == schema_keywords.REFUSED.keys()
    assert not (schema_keywords.ENFORCED & schema_keywords.ANNOTATIONS)
    assert not (schema_keywords.REFUSED.keys() & (schema_keywords.ENFORCED
                                                   | schema_keywords.ANNOTATIONS))


@pytest.mark.parametrize("keyword", sorted(ENFORCED))
def test_an_enforced_keyword_forbids_what_it_forbids(keyword: str) -> None:
    schema, allowed, forbidden = ENFORCED[keyword]
    grammar = _grammar(schema)
    assert _accepts(grammar, allowed)
    assert not _accepts(grammar, forbidden), f"{keyword} was dropped"


@pytest.mark.parametrize("keyword", sorted(ANNOTATIONS))
def test_an_annotation_compiles_and_asserts_nothing(keyword: str) -> None:
    grammar = _grammar({"type": "integer", **ANNOTATIONS[keyword]})
    assert _accepts(grammar, "7") and not _accepts(grammar, '"7"')


@pytest.mark.parametrize("keyword", sorted(REFUSED))
def test_a_keyword_the_grammar_cannot_enforce_is_a_400_naming_it(keyword: str) -> None:
    assert keyword in str(_refusal(REFUSED[keyword]))
    nested = {"type": "object", "properties": {"deep": {"type": "array",
                                                        "items": REFUSED[keyword]}}}
    message = str(_refusal(nested))
    assert keyword in message and "/properties/deep/items" in message


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_format_is_enforced_or_refused(fmt: str) -> None:
    good, bad = FORMATS[fmt]
    schema = {"type": "string", "format": fmt}
    if fmt not in schema_keywords.FORMATS:
        assert repr(fmt) in str(_refusal(schema))
        return
    grammar = _grammar(schema)
    assert _accepts(grammar, f'"{good}"') and not _accepts(grammar, f'"{bad}"')


def test_an_unknown_format_is_refused() -> None:
    """llguidance 1.9 ignores the format "unknown" (and refuses other unknown names)."""
    assert "'unknown'" in str(_refusal({"type": "string", "format": "unknown"}))


def test_tool_parameters_and_structural_tags_take_the_same_rule() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}]
    for fmt in ("json", "xml"):
        with pytest.raises(Exception) as info:
            from_tool_choice(tools, "required", True, fmt=fmt)
        assert getattr(info.value, "param", None) == "tools"
        assert "uniqueItems" in str(info.value)
    legacy = {"type": "structural_tag", "triggers": ["<f>"], "structures": [
        {"begin": "<f>", "end": "</f>", "schema": {"type": "string", "contentEncoding": "base64"}}]}
    with pytest.raises(Exception) as info:
        from_response_format(legacy)
    assert getattr(info.value, "param", None) == "response_format.structures[0].schema"
    nested = {"type": "structural_tag", "format": {"type": "json_schema", "json_schema": {
        "type": "object", "propertyNames": {"maxLength": 2}}}}
    with pytest.raises(Exception) as info:
        from_response_format(nested)
    assert getattr(info.value, "param", None) == "response_format.format.json_schema"
    assert "propertyNames" in str(info.value)


def test_over_http_the_refusal_is_a_400_before_any_token(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
            "type": "object", "properties": {"blob": {"type": "string",
                                                      "contentMediaType": "image/png"}}}}}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == SCHEMA_PARAM and "contentMediaType" in error["message"]
