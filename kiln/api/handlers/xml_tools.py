"""Forced tool calls in the Qwen3.5 XML format: a function's ``parameters`` schema -> Lark rules
(llguidance) for ``<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n…</function>``, as
the chat template writes a call and kiln/text/tools.py reads one back.

A value is decoded by the parameter's JSON-schema types (``kiln.text.tools.schema_types``):

* a ``string`` parameter (or one without a type) is raw text up to the first ``</parameter>``:
  the grammar allows any text without ``</parameter>`` in it, or exactly the ``enum``/``const``
  strings, within ``minLength``/``maxLength``; ``"null"`` also decodes as null when the
  parameter may be null;
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


def _raw_value(where: str, schema: dict[str, Any], nullable: bool) -> str:
    """A Lark lexeme for a raw-text value followed by its closing tag."""
    extra = sorted(set(schema) - _STRING_KEYS)
    if extra:
        raise Refused(f"{where}: {', '.join(extra)} cannot be enforced on a raw-text parameter")
    close = _lit("\n" + _PARAM_CLOSE)
    allowed = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if allowed is not None:
        if not all(isinstance(v, str) and _PARAM_CLOSE not in v for v in allowed) or not allowed:
            raise Refused(f"{where}: enum/const values must be strings without {_PARAM_CLOSE}")
        values = [*allowed, "null"] if nullable else list(allowed)
        return f'"\\n" ({" | ".join(_lit(v) for v in values)}) {close}'
    body = _RAW_BODY
    low, high = schema.get("minLength"), schema.get("maxLength")
    if low is not None or high is not None:
        body += f" & /(.|\\n){{{int(low or 0)},{'' if high is None else int(high)}}}/"
        if nullable:
            body = f"({body}) | \"null\""
    return f'"\\n" ({body}) {close}'


def _value_rule(where: str, prop: Any, root: dict[str, Any], options: dict[str, Any]
                ) -> tuple[str, bool]:
    """(Lark expansion, is a lexeme) of one parameter's ``\\nVALUE\\n</parameter>``."""
    resolved = _resolve(prop, root)
    if not isinstance(resolved, dict):
        raise Refused(f"{where}: a parameter schema must be an object")
    types = schema_types(resolved, root)
    if not types:
        if set(resolved) <= _NOTE_KEYS:
            return _raw_value(where, {}, False), True
        if "enum" in resolved or "const" in resolved:
            return _raw_value(where, resolved, False), True
        raise Refused(f"{where}: a parameter without a type is raw text; its "
                      f"{', '.join(sorted(set(resolved) - _NOTE_KEYS))} cannot be enforced")
    if "string" in types:
        if set(types) - {"string", "null"}:
            raise Refused(f"{where}: a parameter that may be a string or a "
                          f"{'/'.join(t for t in types if t not in ('string', 'null'))} is "
                          "ambiguous in the XML format (raw text that reads as the other type "
                          "decodes as it)")
        return _raw_value(where, _resolve(_string_part(resolved, root), root),
                          "null" in types), True
    sub = dict(prop) if isinstance(prop, dict) else {}
    for key in ("$defs", "definitions"):
        if key in root:
            sub.setdefault(key, root[key])
    sub["x-guidance"] = options
    return f'"\\n" %json {json.dumps(sub)} {_lit(chr(10) + _PARAM_CLOSE)}', False


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
        expansion, lexeme = _value_rule(f"{where}, parameter {key!r}", prop, params, options)
        value = f"V{index}_{j}" if lexeme else f"v{index}_{j}"
        rules.append(f"{value}: {expansion}")
        rules.append(f"p{index}_{j}: {_lit(f'<parameter={key}>')} {value} \"\\n\"")
        parts.append(f"p{index}_{j}" if key in required else f"p{index}_{j}?")
    if not props and additional is not False:
        if additional is not True and additional != {}:
            raise Refused(f"{where}: additionalProperties with a schema cannot be enforced in "
                          "the XML tool-call format")
        rules.append(f'K{index}: {_KEY}')
        rules.append(f'A{index}: "\\n" ({_RAW_BODY}) {_lit(chr(10) + _PARAM_CLOSE)}')
        parts.append(f'("<parameter=" K{index} ">" A{index} "\\n")*')
    missing = sorted(required - set(props))
    if missing:
        raise Refused(f"{where}: required parameter(s) {', '.join(missing)} not in properties")
    head = _lit(f"<function={name}>\n")
    rules.insert(0, f"call{index}: {head} {' '.join(parts)} \"</function>\"")
    return rules
