"""Forced tool calls in the Qwen3.5 XML format: a function's ``parameters`` schema -> Lark rules
(llguidance) for ``<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n…</function>``, as
the chat template writes a call and kiln/text/tools.py reads one back.

A value is decoded by the parameter's JSON-schema types (``kiln.text.tools.schema_types``):

* a ``string`` parameter (or one without a type) is raw text up to the first ``</parameter>``:
  the grammar allows any text without ``</parameter>`` in it, or exactly the ``enum``/``const``
  strings, within ``minLength``/``maxLength``; ``"null"`` also decodes as null when the
  parameter may be null. Raw text has an end (issue 52): without ``maxLength`` a value is
  capped at ``RAW_VALUE_MAX_TOKENS`` tokens (llguidance's ``max_tokens``), after which the only
  continuation is ``\\n</parameter>``, so a forced call that drifts into prose still ends as
  a call; with ``maxLength`` the character bound ends it. A parameter name of a tool without
  ``parameters`` is capped at ``KEY_MAX_TOKENS`` tokens;
* any other parameter is the JSON of its schema (``%json``, the same whitespace as JSON
  outputs), which the parser decodes back to that type.

What raw text cannot express is refused (``_Refused``, a 400 naming the tool), never dropped:
``pattern``/``format`` on a string parameter, a parameter that may be a string or a number
(raw text such as ``5`` would decode as the number), non-string enums without a type, extra
keys checked by a schema, and object keywords beyond ``properties``/``required``/
``additionalProperties``.
"""

from __future__ import annotations

import json
from typing import Any

from kiln.text.tools import schema_types

_PARAM_CLOSE = "</parameter>"
# Raw text: anything without "</parameter>" in it (llguidance lexemes take & and ~).
_RAW_BODY = r"/(.|\n)*/ & ~/(.|\n)*<\/parameter>(.|\n)*/"
# The token cap on a raw-text value without maxLength. A forced call must end as a call: a
# model that drifts into prose inside a parameter had filled max_tokens there and the call was
# lost (issue 52). 2048 tokens is ~8 KB of text, far past a name, query or path. A token cap
# (llguidance's max_tokens on a rule) costs the lexer nothing; a character bound {0,N} on the
# raw-text lexeme grows it with N (llguidance 1.9.1 gives up past N of a few dozen).
RAW_VALUE_MAX_TOKENS = 2048
# The tokens a raw value's own newlines and closing tag may take beyond its cap (one a byte).
_TAG_TOKENS = len("\n\n" + _PARAM_CLOSE)
# The token cap on a parameter name of a tool without ``parameters`` (names are short).
KEY_MAX_TOKENS = 64
_KEY = r"/[A-Za-z0-9_.\-]+/"
_ROOT_KEYS = {"type", "properties", "required", "additionalProperties", "$defs", "definitions",
              "title", "description", "$schema", "$id", "$comment"}
_NOTE_KEYS = {"title", "description", "default", "examples", "$comment", "deprecated",
              "readOnly", "writeOnly"}
_STRING_KEYS = _NOTE_KEYS | {"type", "enum", "const", "minLength", "maxLength"}


class Refused(ValueError):
    """A parameters schema the XML format cannot enforce; the message says which keyword."""


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _resolve(schema: Any, root: dict[str, Any]) -> Any:
    """``schema`` with a local ``$ref`` (``#/$defs/..``) followed."""
    seen = 0
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and seen < 32:
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        if target is None:
            raise Refused(f"unresolvable $ref {schema['$ref']!r}")
        schema, seen = target, seen + 1
    return schema


def _string_part(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """The string branch of a ``string`` or ``string | null`` parameter."""
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            parts = [_resolve(s, root) for s in schema[key]]
            strings = [p for p in parts if isinstance(p, dict) and "string" in schema_types(p)]
            if len(strings) != 1:
                raise Refused(f"{key} with {len(strings)} string branches")
            return strings[0]
    return schema


def _raw_value(where: str, schema: dict[str, Any], nullable: bool
               ) -> tuple[str, int | None]:
    """(Lark lexeme, token cap or None) of a raw-text value: the text between
    ``<parameter=KEY>\\n`` and ``\\n</parameter>``."""
    extra = sorted(set(schema) - _STRING_KEYS)
    if extra:
        raise Refused(f"{where}: {', '.join(extra)} cannot be enforced on a raw-text parameter")
    allowed = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if allowed is not None:
        if not all(isinstance(v, str) and _PARAM_CLOSE not in v for v in allowed) or not allowed:
            raise Refused(f"{where}: enum/const values must be strings without {_PARAM_CLOSE}")
        values = [*allowed, "null"] if nullable else list(allowed)
        return " | ".join(_lit(v) for v in values), None
    body = _RAW_BODY
    low, high = schema.get("minLength"), schema.get("maxLength")
    if low is not None or high is not None:
        body += f" & /(.|\\n){{{int(low or 0)},{'' if high is None else int(high)}}}/"
        if nullable:
            body = f"({body}) | \"null\""
    if high is not None:  # the character bound ends it (a token is at least one byte)
        return body, None
    # minLength characters take at most 4 tokens each: the cap never cuts a value short of it
    return body, max(RAW_VALUE_MAX_TOKENS, 4 * int(low or 0))


def _raw_rules(name: str, lexeme: str, cap: int | None) -> tuple[list[str], str]:
    """(rules, Lark expansion) of ``\\nVALUE\\n</parameter>`` for a raw-text ``lexeme``.

    Uncapped, the value and its closing tag are one terminal, ``NAME``. Capped, the value is
    either that terminal, which llguidance drops from the lexer ``cap`` tokens into the value
    (plus ``_TAG_TOKENS``, so that a value written within the cap always closes as written),
    or ``NAME_OPEN`` (the value alone, one token longer) and then the closing tag. A value
    closed in time is ``NAME`` (the greedy lexer takes the closing tag into it); one still open
    when ``NAME`` is dropped ends a token later, where only ``\\n</parameter>`` fits. The
    value cannot be a plain terminal before the closing tag on its own: the greedy lexer would
    take ``\\n</parameter`` into the value and fail at ``>``. (llguidance's ``stop=`` would
    end it there, but 1.9.1 panics computing the next mask when a ``stop`` is written again
    after the rule; ``suffix=`` and ``lazy`` end the value at the cap without the tag.)"""
    terminal, close = name.upper(), _lit(chr(10) + _PARAM_CLOSE)
    closed = f'{terminal}: "\\n" ({lexeme}) {close}'
    if cap is None:
        return [closed], terminal
    return ([closed, f"{name}[max_tokens={cap + _TAG_TOKENS}]: {terminal}",
             f'{terminal}_OPEN: "\\n" ({lexeme})',
             f"{name}_open[max_tokens={cap + _TAG_TOKENS + 1}]: {terminal}_OPEN"],
            f"({name} | {name}_open {close})")


def _value_rule(where: str, name: str, prop: Any, root: dict[str, Any],
                options: dict[str, Any]) -> tuple[list[str], str]:
    """(rules, Lark expansion) of one parameter's ``\\nVALUE\\n</parameter>``; the rules are
    named from ``name``."""
    resolved = _resolve(prop, root)
    if not isinstance(resolved, dict):
        raise Refused(f"{where}: a parameter schema must be an object")
    types = schema_types(resolved, root)
    if not types:
        if set(resolved) <= _NOTE_KEYS:
            return _raw_rules(name, *_raw_value(where, {}, False))
        if "enum" in resolved or "const" in resolved:
            return _raw_rules(name, *_raw_value(where, resolved, False))
        raise Refused(f"{where}: a parameter without a type is raw text; its "
                      f"{', '.join(sorted(set(resolved) - _NOTE_KEYS))} cannot be enforced")
    if "string" in types:
        if set(types) - {"string", "null"}:
            raise Refused(f"{where}: a parameter that may be a string or a "
                          f"{'/'.join(t for t in types if t not in ('string', 'null'))} is "
                          "ambiguous in the XML format (raw text that reads as the other type "
                          "decodes as it)")
        return _raw_rules(name, *_raw_value(where, _resolve(_string_part(resolved, root), root),
                                            "null" in types))
    sub = dict(prop) if isinstance(prop, dict) else {}
    for key in ("$defs", "definitions"):
        if key in root:
            sub.setdefault(key, root[key])
    sub["x-guidance"] = options
    return [], f'"\\n" %json {json.dumps(sub)} {_lit(chr(10) + _PARAM_CLOSE)}'


def call_rules(index: int, name: str, params: dict[str, Any],
               options: dict[str, Any]) -> list[str]:
    """Lark rules whose rule ``call{index}`` is one XML call of ``name`` with arguments valid
    against ``params`` (already closed: no extra keys unless it says so)."""
    where = f"function {name!r}"
    if any(c in name for c in "<>\n") or name != name.strip():
        raise Refused(f"{where}: this name cannot be written in the XML tool-call format")
    extra = sorted(set(params) - _ROOT_KEYS)
    if extra:
        raise Refused(f"{where}: parameters keyword(s) {', '.join(extra)} cannot be enforced "
                      "in the XML tool-call format")
    if params.get("type", "object") != "object":
        raise Refused(f"{where}: parameters must be an object schema")
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    additional = params.get("additionalProperties", True)
    rules: list[str] = []
    parts: list[str] = []
    for j, (key, prop) in enumerate(props.items()):
        if ">" in key or "\n" in key or not key.strip() or key != key.strip():
            raise Refused(f"{where}: parameter name {key!r} cannot be written in the XML format")
        value_rules, expansion = _value_rule(f"{where}, parameter {key!r}", f"v{index}_{j}",
                                             prop, params, options)
        rules.extend(value_rules)
        rules.append(f"p{index}_{j}: {_lit(f'<parameter={key}>')} {expansion} \"\\n\"")
        parts.append(f"p{index}_{j}" if key in required else f"p{index}_{j}?")
    if not props and additional is not False:
        if additional is not True and additional != {}:
            raise Refused(f"{where}: additionalProperties with a schema cannot be enforced in "
                          "the XML tool-call format")
        any_rules, any_value = _raw_rules(f"a{index}", _RAW_BODY, RAW_VALUE_MAX_TOKENS)
        rules.extend([f"K{index}: {_KEY}", f"k{index}[max_tokens={KEY_MAX_TOKENS}]: K{index}",
                      *any_rules])
        parts.append(f'("<parameter=" k{index} ">" {any_value} "\\n")*')
    missing = sorted(required - set(props))
    if missing:
        raise Refused(f"{where}: required parameter(s) {', '.join(missing)} not in properties")
    head = _lit(f"<function={name}>\n")
    rules.insert(0, f"call{index}: {head} {' '.join(parts)} \"</function>\"")
    return rules
