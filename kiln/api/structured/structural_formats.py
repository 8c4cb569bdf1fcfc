"""Structural tags in xgrammar's nested ``format`` form (the one vLLM passes on):
``{"type": "structural_tag", "format": {...}}`` -> one llguidance grammar (a Lark grammar, with a
side grammar for each ``grammar`` format).

A format matches a piece of text:

* ``const_string`` (``value``): exactly that string; ``json_schema`` (``json_schema``): JSON valid
  against it (the JSON defaults of docs/structured-outputs.md); ``regex`` (``pattern``);
  ``grammar`` (``grammar``: Lark or GBNF text); ``any_text`` (``excludes``): any text;
* ``sequence`` / ``or`` (``elements``): one after another / one of them;
* ``tag`` (``begin``, ``content``, ``end``: a string or a list of strings): begin, content, end;
* ``triggered_tags`` (``triggers``, ``tags``, ``at_least_one``, ``stop_after_first``,
  ``excludes``): free text in which each trigger starts one of the tags whose ``begin`` starts
  with it; ``tags_with_separator`` (``tags``, ``separator``, ``at_least_one``,
  ``stop_after_first``): tags separated by ``separator``, nothing else.

As in xgrammar, ``any_text``, ``triggered_tags`` and ``tags_with_separator`` are *unlimited*
(they have no end of their own), and so is a ``sequence`` whose last element is and an ``or``
whose elements all are (an ``or`` of both kinds is refused, as is an unlimited element before the
last of a sequence). An unlimited format runs until the ``end`` of the nearest ``tag`` around it
(its text cannot contain that end), or, at the top, until the output ends. Free text is one
lexeme that cannot contain any of the strings that end it (triggers, the enclosing ends,
``excludes``) followed by the string that does, so the lexer ends it exactly there (as in
kiln/api/structured/structural_tags.py). A trigger that starts with a tag the tokenizer holds as
one token, and a tag ``end`` that ends with one, may also be that token.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from kiln.api.structured.structural_tags import (
    LEAD_TAG,
    TAIL_TAG,
    StructuralTagError,
    lit,
    regex_escape,
)

_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # type -> (required, optional)
    "const_string": (("value",), ()),
    "json_schema": (("json_schema",), ("style",)),
    "regex": (("pattern",), ()),
    "grammar": (("grammar",), ()),
    "any_text": ((), ("excludes",)),
    "sequence": (("elements",), ()),
    "or": (("elements",), ()),
    "tag": (("begin", "content", "end"), ()),
    "triggered_tags": (("triggers", "tags"), ("at_least_one", "stop_after_first", "excludes")),
    "tags_with_separator": (("tags", "separator"), ("at_least_one", "stop_after_first")),
}
MAX_DEPTH = 100  # JSON levels in a format (its formats, their lists and schemas)
_UNLIMITED = ("any_text", "triggered_tags", "tags_with_separator")
_ANY = "(.|\\n)"


def nested_grammar(spec: dict[str, Any], param: str,
                   schema_grammar: Callable[[Any, str], str],
                   token_id: Callable[[str], int | None]) -> str:
    """The llguidance grammar (JSON text) of a nested structural tag ``spec`` (the object that
    holds ``format``). ``schema_grammar(schema, param)``: the ``%json`` expansion of a schema;
    ``token_id(text)``: the id of ``text`` when the tokenizer holds it as one token."""
    if _depth(spec.get("format")) > MAX_DEPTH:
        raise StructuralTagError(f"{param}.format", f"formats nested more than {MAX_DEPTH} "
                                                    "levels of JSON deep")
    extra = sorted(set(spec) - {"type", "format"})
    if extra:
        raise StructuralTagError(f"{param}.{extra[0]}", "a structural tag in the `format` form "
                                                        "takes only `type` and `format`")
    builder = _Builder(schema_grammar, token_id)
    start = builder.expand(spec.get("format"), f"{param}.format", ())
    main = "\n".join([f"start: {start or lit('')}", *builder.rules])
    return json.dumps({"grammars": [{"name": "structural_tag", "lark_grammar": main},
                                    *builder.side]})


def _depth(value: Any) -> int:
    """How many levels of JSON ``value`` nests (without recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in
                         (node.values() if isinstance(node, dict) else node))
    return deepest


def _check(spec: Any, path: str) -> str:
    """The format's type, after checking its fields (400 naming the first bad one)."""
    if not isinstance(spec, dict):
        raise StructuralTagError(path, "a format must be an object with a `type`")
    kind = spec.get("type")
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise StructuralTagError(f"{path}.type", f"unknown format type {kind!r}; one of "
                                                 f"{', '.join(_FIELDS)}")
    required, optional = _FIELDS[kind]
    for name in required:
        if name not in spec:
            raise StructuralTagError(f"{path}.{name}", f"a {kind} format needs `{name}`")
    for name in spec:
        if name != "type" and name not in required + optional:
            raise StructuralTagError(f"{path}.{name}", f"a {kind} format has no `{name}`")
    for name in ("at_least_one", "stop_after_first"):
        if not isinstance(spec.get(name, False), bool):
            raise StructuralTagError(f"{path}.{name}", "must be a boolean")
    return str(kind)


def _strings(value: Any, path: str, *, nonempty_items: bool, nonempty: bool = False
             ) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value) or \
            (nonempty and not value) or (nonempty_items and not all(value)):
        raise StructuralTagError(path, "must be a list of " + ("non-empty " if nonempty_items
                                                                else "") + "strings")
    return list(value)


def _unlimited(spec: dict[str, Any], path: str) -> bool:
    """Whether ``spec`` (checked) has no end of its own (see the module doc)."""
    kind = spec["type"]
    if kind in _UNLIMITED:
        return True
    if kind in ("sequence", "or"):
        elements = spec["elements"]
        if not isinstance(elements, list) or not elements:
            raise StructuralTagError(f"{path}.elements", "must be a non-empty list of formats")
        flags = [_unlimited_at(e, f"{path}.elements[{i}]") for i, e in enumerate(elements)]
        if kind == "sequence":
            for i, flag in enumerate(flags[:-1]):
                if flag:
                    raise StructuralTagError(
                        f"{path}.elements[{i}]", "only the last element of a sequence may be "
                        "unlimited (any_text, triggered_tags, tags_with_separator)")
            return flags[-1]
        if any(flags) and not all(flags):
            raise StructuralTagError(f"{path}.elements", "the elements of an `or` must be all "
                                                         "unlimited or all limited")
        return flags[0]
    return False


def _unlimited_at(spec: Any, path: str) -> bool:
    _check(spec, path)
    return _unlimited(spec, path)


class _Builder:
    def __init__(self, schema_grammar: Callable[[Any, str], str],
                 token_id: Callable[[str], int | None]) -> None:
        self.schema_grammar = schema_grammar
        self.token_id = token_id
        self.rules: list[str] = []
        self.side: list[dict[str, Any]] = []
        self._n = 0

    def _rule(self, prefix: str, body: str) -> str:
        """A new rule (a lexeme when ``prefix`` is upper case) and its name."""
        self._n += 1
        name = f"{prefix}{self._n}"
        self.rules.append(f"{name}: {body or lit('')}")
        return name

    def expand(self, spec: Any, path: str, ends: Sequence[str]) -> str:
        """A Lark expansion matching ``spec``; an unlimited ``spec`` also writes one of
        ``ends`` (the enclosing tag's ends; none: it runs to the end of the output). Safe to
        concatenate: alternatives come in parentheses."""
        out = self._expand(spec, path, ends)
        return f"({out})" if "|" in out else out

    def _expand(self, spec: Any, path: str, ends: Sequence[str]) -> str:
        kind = _check(spec, path)
        if kind == "const_string":
            if not isinstance(spec["value"], str):
                raise StructuralTagError(f"{path}.value", "must be a string")
            return self._opening(spec["value"])
        if kind == "json_schema":
            if spec.get("style", "json") != "json":
                raise StructuralTagError(f"{path}.style", "only the `json` style is supported")
            schema = {} if spec["json_schema"] is True else spec["json_schema"]
            if not isinstance(schema, dict):
                raise StructuralTagError(f"{path}.json_schema", "must be a JSON Schema object")
            expansion = self.schema_grammar(schema, f"{path}.json_schema")
            _validate(f"start: {expansion}", f"{path}.json_schema")
            return expansion
        if kind == "regex":
            pattern = spec["pattern"]
            if not isinstance(pattern, str) or not pattern:
                raise StructuralTagError(f"{path}.pattern", "must be a non-empty regex")
            expansion = f"/{llguidance.regex_to_lark(pattern, '')}/"
            _validate(f"start: {expansion}", f"{path}.pattern")
            return expansion
        if kind == "grammar":
            return self._grammar(spec["grammar"], f"{path}.grammar")
        if kind == "any_text":
            excludes = _strings(spec.get("excludes", []), f"{path}.excludes",
                                nonempty_items=True)
            return self._ending([*excludes, *ends], ends)
        if kind in ("sequence", "or"):
            _unlimited(spec, path)  # checks where the unlimited elements are
            last = len(spec["elements"]) - 1
            parts = [self.expand(e, f"{path}.elements[{i}]",
                                 ends if kind == "or" or i == last else ())
                     for i, e in enumerate(spec["elements"])]
            if kind == "sequence":
                return " ".join(f"({p})" for p in parts if p)
            return " | ".join(f"({p})" if p else lit("") for p in parts)
        if kind == "tag":
            return _join(self._opening(_string(spec, "begin", path)), self._tag_body(spec, path))
        if kind == "triggered_tags":
            return self._triggered(spec, path, ends)
        return self._separated(spec, path, ends)

    def _grammar(self, text: Any, path: str) -> str:
        """A side grammar (Lark or GBNF text), referenced as ``@name``."""
        if not isinstance(text, str) or not text.strip():
            raise StructuralTagError(path, "must be a non-empty Lark or GBNF grammar")
        try:
            lark = any_to_lark(text)
        except ValueError as e:
            raise StructuralTagError(path, str(e)) from None
        _validate(lark, path)
        name = f"grammar{len(self.side) + 1}"
        self.side.append({"name": name, "lark_grammar": lark})
        return f"@{name}"

    def _tag_body(self, spec: dict[str, Any], path: str) -> str:
        """A tag after its begin: the content, then an end (an unlimited content writes the
        end itself)."""
        end = spec["end"]
        ends = [end] if isinstance(end, str) else _strings(end, f"{path}.end",
                                                           nonempty_items=False, nonempty=True)
        content = f"{path}.content"
        if _unlimited_at(spec["content"], content):
            ends = [e for e in ends if e]
            if not ends:
                raise StructuralTagError(f"{path}.end", "a tag whose content is unlimited needs "
                                                        "a non-empty end")
            return self.expand(spec["content"], content, ends)
        return _join(self.expand(spec["content"], content, ()), self._closing(ends))

    def _opening(self, text: str) -> str:
        """``text``; when it starts with a tag the tokenizer holds as one token, that tag may
        also be the token."""
        lead = LEAD_TAG.match(text)
        lead_id = self.token_id(lead.group(0)) if lead else None
        if lead is None or lead_id is None:
            return lit(text) if text else ""
        rest = text[lead.end():]
        return _join(f"({lit(lead.group(0))} | <[{lead_id}]>)", lit(rest) if rest else "")

    def _closing(self, ends: Sequence[str]) -> str:
        """One of ``ends`` (an empty one: nothing); an end that ends with a tag the tokenizer
        holds as one token may end with that token."""
        options = []
        for end in ends:
            tail = TAIL_TAG.search(end)
            end_id = self.token_id(tail.group(0)) if tail else None
            if tail is None or end_id is None:
                options.append(lit(end))
            else:
                head = end[:tail.start()]
                options.append(_join(lit(head) if head else "",
                                     f"({lit(tail.group(0))} | <[{end_id}]>)"))
        return options[0] if len(options) == 1 else "(" + " | ".join(options) + ")"

    def _text(self, stops: Sequence[str], nonempty: bool = True) -> str:
        """The body of a lexeme: text (non-empty or not) that contains none of ``stops``."""
        body = f"/{_ANY}{'+' if nonempty else '*'}/"
        if stops:
            body += f" & ~/{_ANY}*({'|'.join(regex_escape(s) for s in stops)}){_ANY}*/"
        return body

    def _ending(self, stops: Sequence[str], ends: Sequence[str]) -> str:
        """Text without ``stops``, then one of ``ends`` (none: the end of the output). Text and
        end are one lexeme, so that the lexer ends the text exactly where an end completes; an
        end whose closing tag is one token may also be that token after the text."""
        if not ends:
            return f"{self._rule('TEXT', self._text(stops))}?"
        options = " | ".join(lit(e) for e in ends)
        lexeme = self._rule("END", f"{self._text(stops, nonempty=False)} ({options})")
        closing = self._closing(ends)
        if "<[" not in closing:
            return lexeme
        return f"{lexeme} | ({self._rule('TEXT', self._text(stops))}? {closing})"

    def _tags(self, tags: Any, path: str) -> list[tuple[str, str]]:
        """(begin, the rule of the rest of the tag) of each tag of a triggered_tags /
        tags_with_separator."""
        if not isinstance(tags, list) or not tags:
            raise StructuralTagError(path, "must be a non-empty list of tags")
        out = []
        for i, tag in enumerate(tags):
            where = f"{path}[{i}]"
            if isinstance(tag, dict) and "type" not in tag:
                tag = {"type": "tag", **tag}
            if _check(tag, where) != "tag":
                raise StructuralTagError(f"{where}.type", "must be a tag (begin, content, end)")
            out.append((_string(tag, "begin", where),
                        self._rule("tagbody", self._tag_body(tag, where))))
        return out

    def _triggered(self, spec: dict[str, Any], path: str, ends: Sequence[str]) -> str:
        triggers = _strings(spec["triggers"], f"{path}.triggers", nonempty_items=True,
                            nonempty=True)
        excludes = _strings(spec.get("excludes", []), f"{path}.excludes", nonempty_items=True)
        tags = self._tags(spec["tags"], f"{path}.tags")
        first = " | ".join(f"({_join(self._opening(b), body)})" for b, body in tags)
        closing = self._closing(ends) if ends else ""
        if spec.get("at_least_one") and spec.get("stop_after_first"):
            return _join(f"({first})", closing)
        rests: dict[int, list[str]] = {k: [] for k in range(len(triggers))}
        for i, (begin, body) in enumerate(tags):
            owners = [k for k, t in enumerate(triggers) if begin.startswith(t)]
            if len(owners) != 1:
                raise StructuralTagError(f"{path}.tags[{i}].begin", f"begin {begin!r} starts "
                                         f"with {len(owners)} of the triggers; it must start "
                                         "with exactly one")
            rest = begin[len(triggers[owners[0]]):]
            rests[owners[0]].append(f"({_join(lit(rest) if rest else '', body)})")
        stops = [*triggers, *ends, *excludes]
        text = ""  # the lexeme of non-empty free text, made when needed
        dispatch = []
        for k, trigger in enumerate(triggers):
            if not rests[k]:
                continue
            rest = self._rule("rest", " | ".join(rests[k]))
            pre = self._rule("PRE", f"{self._text(stops, nonempty=False)} {lit(trigger)}")
            dispatch.append(f"{pre} {rest}")
            lead = LEAD_TAG.match(trigger)
            lead_id = self.token_id(lead.group(0)) if lead else None
            if lead is not None and lead_id is not None:
                text = text or self._rule("TEXT", self._text(stops))
                after = trigger[lead.end():]
                dispatch.append(_join(f"{text}? <[{lead_id}]>", lit(after) if after else "",
                                      rest))
        one = " | ".join(f"({d})" for d in dispatch)
        tail = self._ending(stops, ends) if ends or not text else f"{text}?"
        if spec.get("stop_after_first"):
            body = f"(({one}) {closing}) | ({tail})" if ends else f"({one}) | ({tail})"
        else:
            body = f"({one})* ({tail})"
        return f"({first}) ({body})" if spec.get("at_least_one") else body

    def _separated(self, spec: dict[str, Any], path: str, ends: Sequence[str]) -> str:
        separator = spec["separator"]
        if not isinstance(separator, str):
            raise StructuralTagError(f"{path}.separator", "must be a string")
        tags = self._tags(spec["tags"], f"{path}.tags")
        one = "(" + " | ".join(f"({_join(self._opening(b), body)})" for b, body in tags) + ")"
        closing = self._closing(ends) if ends else ""
        if spec.get("stop_after_first") or separator in ends:
            many = one
        else:
            many = _join(one, f"({_join(lit(separator) if separator else '', one)})*")
        body = _join(many, closing)
        if spec.get("at_least_one"):
            return body
        return f"({body}) | {closing}" if closing else f"({body})?"


def _validate(lark: str, path: str) -> None:
    """A 400 naming ``path`` when llguidance refuses the Lark grammar ``lark`` (checked alone,
    so that the error names the format it came from)."""
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        llguidance.LLMatcher.grammar_from_lark(lark))
    if failed:
        raise StructuralTagError(path, messages[0] if messages else "invalid")


def _string(spec: dict[str, Any], name: str, path: str) -> str:
    value = spec[name]
    if not isinstance(value, str):
        raise StructuralTagError(f"{path}.{name}", "must be a string")
    return value


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)
