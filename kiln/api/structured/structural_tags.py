"""Structural tags (vLLM / xgrammar, the "legacy" form both take): free text, in which each
tagged structure ``begin`` + JSON valid against ``schema`` + ``end`` is enforced as soon as the
model writes one of the ``triggers`` -> one llguidance Lark grammar.

``{"structures": [{"begin": "<function=f>", "schema": {...}, "end": "</function>"}],
"triggers": ["<function="]}``: every ``begin`` starts with a trigger; outside structures the
text is free but cannot contain a trigger except as the start of a structure. The grammar
reads ``(PRE_k rest_k)* TEXT?``: ``PRE_k`` is one lexeme, text without any trigger followed by
trigger ``k`` (so the lexer ends it exactly where the trigger completes); ``rest_k`` is the rest
of a structure whose ``begin`` starts with trigger ``k``. A trigger (or an ``end``) that starts
(ends) with a tag the tokenizer holds as one token, such as Qwen's ``<tool_call>``, may also be
that token, which llguidance keeps apart from text.

xgrammar's newer ``format`` form (nested ``triggered_tags``/``sequence``/``or``/...) is not
compiled: it is a 400 ``unsupported_parameter`` naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

LEAD_TAG = re.compile(r"^<[^<>\s]+>")
TAIL_TAG = re.compile(r"<[^<>\s]+>$")
_META = set("\\.+*?()|[]{}^$#&-~/")


class StructuralTagError(ValueError):
    """A structural tag that cannot be compiled; ``param`` says which part."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def regex_escape(text: str) -> str:
    """``text`` as a literal inside a Lark ``/.../`` regex."""
    return "".join("\\" + c if c in _META else c for c in text).replace("\n", "\\n") \
        .replace("\r", "\\r")


def _seq(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _opt_lit(text: str) -> str:
    return lit(text) if text else ""


def legacy_grammar(spec: Any, param: str, schema_grammar: Callable[[Any, str], str],
                   token_id: Callable[[str], int | None]) -> str:
    """The Lark text of a legacy structural tag. ``schema_grammar(schema, param)``: the
    ``%json`` expansion of a structure's schema, ``param`` its path (raises on a bad one);
    ``token_id(text)``: the id of ``text`` when the tokenizer holds it as one token, else None."""
    if not isinstance(spec, dict):
        raise StructuralTagError(param, "a structural tag must be an object")
    structures, triggers = spec.get("structures"), spec.get("triggers")
    if not isinstance(structures, list) or not structures:
        raise StructuralTagError(f"{param}.structures", "at least one structure is required")
    if not isinstance(triggers, list) or not triggers or \
            not all(isinstance(t, str) and t for t in triggers):
        raise StructuralTagError(f"{param}.triggers", "at least one non-empty trigger string "
                                                      "is required")
    for t in triggers:
        for other in triggers:
            if t != other and t in other:
                raise StructuralTagError(f"{param}.triggers", f"trigger {t!r} occurs inside "
                                                              f"trigger {other!r}")
    any_trigger = "|".join(regex_escape(t) for t in triggers)
    body = f"/(.|\\n)*/ & ~/(.|\\n)*({any_trigger})(.|\\n)*/"
    rules = [f"TEXT: /(.|\\n)+/ & ~/(.|\\n)*({any_trigger})(.|\\n)*/"]
    rests: dict[int, list[str]] = {k: [] for k in range(len(triggers))}
    for i, item in enumerate(structures):
        where = f"{param}.structures[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("begin"), str) or \
                not isinstance(item.get("end"), str):
            raise StructuralTagError(where, "a structure needs string begin and end")
        begin, end = item["begin"], item["end"]
        owners = [k for k, t in enumerate(triggers) if begin.startswith(t)]
        if not owners:
            raise StructuralTagError(f"{where}.begin", f"begin {begin!r} starts with none of "
                                                       "the triggers")
        schema = item.get("schema")
        rules.append(f"s{i}: {schema_grammar({} if schema is None else schema, f'{where}.schema')}")
        tail = TAIL_TAG.search(end)
        end_id = token_id(tail.group(0)) if tail else None
        closing = _opt_lit(end) if end_id is None or tail is None else \
            _seq(_opt_lit(end[:tail.start()]), f"({lit(tail.group(0))} | <[{end_id}]>)")
        k = owners[0]
        rests[k].append(_seq(_opt_lit(begin[len(triggers[k]):]), f"s{i}", closing))
    alternatives = []
    for k, trigger in enumerate(triggers):
        if not rests[k]:
            continue
        rules.append(f"PRE{k}: {body} {lit(trigger)}")
        rules.append(f"rest{k}: {' | '.join(f'({r})' for r in rests[k])}")
        alternatives.append(f"PRE{k} rest{k}")
        lead = LEAD_TAG.match(trigger)
        lead_id = token_id(lead.group(0)) if lead else None
        if lead is not None and lead_id is not None:
            alternatives.append(_seq(f"TEXT? <[{lead_id}]>",
                                     _opt_lit(trigger[lead.end():]), f"rest{k}"))
    rules.insert(0, f"start: ({' | '.join(alternatives)})* TEXT?")
    return "\n".join(rules)
