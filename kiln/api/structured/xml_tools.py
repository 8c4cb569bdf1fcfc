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
  a call; with ``maxLength`` the character bound ends it (bounds are held to what llguidance
  can count: ``BOUND_CHARS``). A parameter name of a tool without ``parameters`` is capped at
  ``KEY_MAX_TOKENS`` tokens;
* any other parameter is the JSON of its schema (``%json``, the same whitespace as JSON
  outputs), which the parser decodes back to that type.

What raw text cannot express is refused (``Refused``, a 400 naming the tool), never dropped:
``pattern``/``format`` on a string parameter, length bounds past ``BOUND_CHARS``/
``MIN_LENGTH_CHARS``, a parameter that may be a string or a number (raw text such as ``5``
would decode as the number), non-string enums without a type, extra keys checked by a schema,
and object keywords beyond ``properties``/``required``/``additionalProperties``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kiln.text.tools import schema_types

_PARAM_CLOSE = "</parameter>"
# Raw text: anything without "</parameter>" in it (llguidance lexemes take & and ~).
_RAW_BODY = r"/(.|\n)*/ & ~/(.|\n)*<\/parameter>(.|\n)*/"
# The token cap on a raw-text value without maxLength. A forced call must end as a call: a
# model that drifts into prose inside a parameter had filled max_tokens there and the call was
# lost (issue 52). 2048 tokens is ~8 KB of text, far past a name, query or path. A token cap
# (llguidance's max_tokens on a rule) costs the lexer nothing; a character bound costs it
# states as the value is written (BOUND_CHARS).
RAW_VALUE_MAX_TOKENS = 2048
# The tokens a raw value's own newlines and closing tag may take beyond its cap (one a byte).
_TAG_TOKENS = len("\n\n" + _PARAM_CLOSE)
# What llguidance 1.9.1 can count of raw-text length bounds. A bounded value is one lexeme,
# ``/(.|\n){min,max}/ & /_NO_CLOSE/`` (the closing tag excluded by a regex written out: with
# ``~`` as in _RAW_BODY the lexer's step fuel ran out a few dozen characters into a bound), whose
# lexer states are built as the value is written: about 13 a bounded character on a 250k-token
# vocabulary (7 on 49k; each parameter its own), of LIMITS.max_lexer_states = 250_000 for the
# whole grammar. Checking at compile time that a minLength value can exist spends about 200 of
# LIMITS.initial_lexer_fuel = 1_000_000 a minLength character. So a request's raw-text
# parameters may bound (maxLength, else minLength) BOUND_CHARS characters in all, and ask for
# MIN_LENGTH_CHARS (minLength) in all; past either the bound is refused, naming it, rather than
# failing at compile time or mid-generation (tests/api/test_xml_tool_cap.py).
BOUND_CHARS = 12_000
MIN_LENGTH_CHARS = 3_000
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


class LengthBudget:
    """The raw-text length bounds of one request's tools so far (``BOUND_CHARS``,
    ``MIN_LENGTH_CHARS``): one budget for every ``call_rules`` of a grammar."""

    def __init__(self) -> None:
        self.bound = 0  # characters bounded (maxLength, else minLength)
        self.minimum = 0  # characters required (minLength)
        self.seen: set[str] = set()  # the lexemes counted (llguidance builds one lexer for each)

    def spend(self, where: str, low: int, high: int | None, lexeme: str) -> None:
        """Count a parameter's bounds (once a ``lexeme``: the same bounds on other parameters
        share its lexer states), or raise Refused naming the one past the budget."""
        if lexeme in self.seen:
            return
        bound, minimum = self.bound + (low if high is None else high), self.minimum + low
        if minimum > MIN_LENGTH_CHARS:
            raise Refused(f"{where}: minLength {low} cannot be enforced on a raw-text parameter: "
                          f"the tools' minLength values may add up to {MIN_LENGTH_CHARS} "
                          f"characters (here {minimum})")
        if bound > BOUND_CHARS:
            keyword = "minLength" if high is None else "maxLength"
            raise Refused(f"{where}: {keyword} {low if high is None else high} cannot be "
                          "enforced on a raw-text parameter: the tools' raw-text length bounds "
                          f"(maxLength, else minLength) may add up to {BOUND_CHARS} characters "
                          f"(here {bound})")
        self.bound, self.minimum = bound, minimum
        self.seen.add(lexeme)


def _no_close(tag: str) -> str:
    """A regex (Lark ``/…/`` body) of the text without ``tag`` in it, for a tag whose first
    character occurs in it only there (``</parameter>``), written out without ``~``: text where
    each ``<`` is followed by a proper prefix of the rest of the tag and then another ``<``, a
    character that breaks the prefix, or the end."""
    first, rest = tag[0], tag[1:]
    assert first not in rest

    def lit(c: str) -> str:
        return "\\/" if c == "/" else re.escape(c)

    def cls(c: str) -> str:  # a character other than `first` and `c`
        return f"[^{lit(first)}{lit(c)}]"

    prefix = ""  # a proper prefix of `rest` (maybe empty), innermost first
    breaks = cls(rest[-1])  # a proper prefix of `rest`, then a character that breaks it
    for c in reversed(rest[:-1]):
        prefix = f"({lit(c)}{prefix})?"
        breaks = f"({cls(c)}|{lit(c)}{breaks})"
    lt = lit(first)
    return f"([^{lt}]|{lt}({prefix}{lt})*{breaks})*({lt}({prefix}{lt})*{prefix})?"


_NO_CLOSE = _no_close(_PARAM_CLOSE)


def _length(where: str, schema: dict[str, Any], key: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
            or value != int(value):
        raise Refused(f"{where}: {key} must be a non-negative integer, got {json.dumps(value)}")
    return int(value)


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


def _raw_value(where: str, schema: dict[str, Any], nullable: bool, budget: LengthBudget
               ) -> tuple[str, int | None]:
    """(Lark lexeme, token cap or None) of a raw-text value: the text between
    ``<parameter=KEY>\\n`` and ``\\n</parameter>``; its length bounds are spent from
    ``budget``."""
    extra = sorted(set(schema) - _STRING_KEYS)
    if extra:
        raise Refused(f"{where}: {', '.join(extra)} cannot be enforced on a raw-text parameter")
    allowed = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if allowed is not None:
        if not all(isinstance(v, str) and _PARAM_CLOSE not in v for v in allowed) or not allowed:
            raise Refused(f"{where}: enum/const values must be strings without {_PARAM_CLOSE}")
        values = [*allowed, "null"] if nullable else list(allowed)
        return " | ".join(_lit(v) for v in values), None
    low, high = _length(where, schema, "minLength"), _length(where, schema, "maxLength")
    if low is None and high is None:
        return _RAW_BODY, RAW_VALUE_MAX_TOKENS
    low = low or 0
    if high is not None and low > high:
        raise Refused(f"{where}: minLength {low} is above maxLength {high}: no value fits")
    body = f"/(.|\\n){{{low},{'' if high is None else high}}}/ & /{_NO_CLOSE}/"
    if nullable:
        body = f"({body}) | \"null\""
    budget.spend(where, low, high, body)
    if high is not None:  # the character bound ends it (a token is at least one byte)
        return body, None
    # minLength characters take at most 4 tokens each: the cap never cuts a value short of it
    return body, max(RAW_VALUE_MAX_TOKENS, 4 * low)


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
                options: dict[str, Any], budget: LengthBudget) -> tuple[list[str], str]:
    """(rules, Lark expansion) of one parameter's ``\\nVALUE\\n</parameter>``; the rules are
    named from ``name``."""
    resolved = _resolve(prop, root)
    if not isinstance(resolved, dict):
        raise Refused(f"{where}: a parameter schema must be an object")
    types = schema_types(resolved, root)
    if not types:
        if set(resolved) <= _NOTE_KEYS:
            return _raw_rules(name, *_raw_value(where, {}, False, budget))
        if "enum" in resolved or "const" in resolved:
            return _raw_rules(name, *_raw_value(where, resolved, False, budget))
        raise Refused(f"{where}: a parameter without a type is raw text; its "
                      f"{', '.join(sorted(set(resolved) - _NOTE_KEYS))} cannot be enforced")
    if "string" in types:
        if set(types) - {"string", "null"}:
            raise Refused(f"{where}: a parameter that may be a string or a "
                          f"{'/'.join(t for t in types if t not in ('string', 'null'))} is "
                          "ambiguous in the XML format (raw text that reads as the other type "
                          "decodes as it)")
        return _raw_rules(name, *_raw_value(where, _resolve(_string_part(resolved, root), root),
                                            "null" in types, budget))
    sub = dict(prop) if isinstance(prop, dict) else {}
    for key in ("$defs", "definitions"):
        if key in root:
            sub.setdefault(key, root[key])
    sub["x-guidance"] = options
    return [], f'"\\n" %json {json.dumps(sub)} {_lit(chr(10) + _PARAM_CLOSE)}'


def call_rules(index: int, name: str, params: dict[str, Any], options: dict[str, Any],
               budget: LengthBudget | None = None) -> list[str]:
    """Lark rules whose rule ``call{index}`` is one XML call of ``name`` with arguments valid
    against ``params`` (already closed: no extra keys unless it says so). ``budget``: the
    length bounds of the request's other tools (one grammar shares one lexer)."""
    budget = LengthBudget() if budget is None else budget
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
                                             prop, params, options, budget)
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
