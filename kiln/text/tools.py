"""Tool-call parsing: text -> OpenAI ``tool_calls`` (docs/behavior.md §12, docs/decisions.md).

Every ``<tool_call>…</tool_call>`` block in the output is parsed (no one-call limit), in either
Qwen format:

* Qwen3/Hermes JSON: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (arguments may
  also be a JSON string holding an object);
* Qwen3.5 XML: ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>…</function>
  </tool_call>``; values are text, converted to JSON only where the tool's JSON-schema type for
  that parameter asks for it (local ``$ref``s followed).

``tool_format`` says which of the two a chat template teaches its model (forced tool calls are
constrained to that one, kiln/api/structured/constraints.py).

Kiln's fallback: when no block parses and the whole answer is a JSON object
``{"name": <declared tool>, "arguments": {...}}``, that object is the call.

Content is the text outside parsed calls. When at least one call parsed, the text just before
each parsed block is right-trimmed, and so is the final content; with no calls the text is
returned verbatim. A closed block that does not parse (bad JSON, no name) stays in the content
exactly as written; parsing never raises.

A trailing block with no closing tag (``max_tokens`` cut the call short, or the model ended
inside it) never reaches the content (issue 52): it is the call as far as it was written
(``partial_call``: the XML form's parameters so far, or the JSON form's name with its arguments
text as it stands, as OpenAI reports a cut call), or nothing when not even a name was written.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_FUNC_OPEN = "<function="
_FUNC_CLOSE = "</function>"
_PARAM_OPEN = "<parameter="
_PARAM_CLOSE = "</parameter>"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON-encoded object, as OpenAI sends it

    @classmethod
    def create(cls, name: str, arguments: Mapping[str, Any]) -> ToolCall:
        """A call with a fresh ``call_<32 hex>`` id and JSON-encoded arguments."""
        encoded = json.dumps(dict(arguments), ensure_ascii=False)
        return cls(id="call_" + uuid.uuid4().hex, name=name, arguments=encoded)

    def wire(self, index: int | None = None) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry (with ``index`` for stream deltas)."""
        out: dict[str, Any] = {} if index is None else {"index": index}
        out["id"] = self.id
        out["type"] = "function"
        out["function"] = {"name": self.name, "arguments": self.arguments}
        return out


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    tool_calls: list[ToolCall]


def _as_mapping(obj: Any) -> Mapping[str, Any] | None:
    if isinstance(obj, Mapping):
        return obj
    dump = getattr(obj, "model_dump", None)  # pydantic request models
    if callable(dump):
        dumped = dump()
        return dumped if isinstance(dumped, Mapping) else None
    return None


def _function_defs(tools: list[Any] | None) -> list[Mapping[str, Any]]:
    """The ``function`` objects of OpenAI tool definitions (a bare function object is accepted)."""
    out: list[Mapping[str, Any]] = []
    for tool in tools or []:
        entry = _as_mapping(tool)
        if entry is None:
            continue
        func = _as_mapping(entry.get("function")) if "function" in entry else entry
        if func is not None and isinstance(func.get("name"), str) and func["name"]:
            out.append(func)
    return out


def tool_names(tools: list[Any] | None) -> set[str]:
    """Names declared in OpenAI tool definitions."""
    return {str(f["name"]) for f in _function_defs(tools)}


def _follow(schema: Any, root: Any) -> Any:
    """``schema`` with a local ``$ref`` (``#/$defs/..``, ``#/definitions/..``) followed."""
    for _ in range(32):
        prop = _as_mapping(schema)
        ref = None if prop is None else prop.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        if target is None:
            return schema
        schema = target
    return schema


def schema_types(schema: Any, root: Any = None) -> list[str]:
    """JSON-schema types of one property (``type`` string or list, or ``anyOf``/``oneOf``),
    following local ``$ref``s into ``root`` (the tool's ``parameters``)."""
    prop = _as_mapping(_follow(schema, root))
    if prop is None:
        return []
    kind = prop.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        variants = prop.get(key)
        if isinstance(variants, list):
            for variant in variants:
                out.extend(t for t in schema_types(variant, root) if t not in out)
    return out


def tool_format(template_source: str | None) -> str:
    """The tool-call format a chat template teaches its model: ``"xml"`` (Qwen3.5's
    ``<function=NAME><parameter=KEY>``) when the template writes ``<function=`` and
    ``<parameter=``, else ``"json"`` (Hermes/Qwen3 JSON inside ``<tool_call>``)."""
    source = template_source or ""
    return "xml" if _FUNC_OPEN in source and _PARAM_OPEN in source else "json"


class ToolSet:
    """What the parser needs from the request's ``tools``: names and parameter types."""

    def __init__(self, tools: list[Any] | None) -> None:
        self.enabled = bool(tools)
        self.names: set[str] = set()
        self._types: dict[str, dict[str, list[str]]] = {}
        for func in _function_defs(tools):
            name = str(func["name"])
            self.names.add(name)
            params = _as_mapping(func.get("parameters")) or {}
            props = _as_mapping(params.get("properties")) or {}
            self._types[name] = {str(k): schema_types(v, params) for k, v in props.items()}

    def param_types(self, function: str, param: str) -> list[str]:
        return self._types.get(function, {}).get(param, [])


_NO_VALUE = object()


def _convert(value: str, kind: str) -> Any:
    """``value`` as JSON type ``kind``, or ``_NO_VALUE`` when it is not one."""
    text = value.strip()
    if kind == "boolean":
        lowered = text.lower()
        return lowered == "true" if lowered in ("true", "false") else _NO_VALUE
    if kind == "null":
        return None if text in ("null", "None") else _NO_VALUE
    try:
        parsed = json.loads(text)
    except ValueError:
        return _NO_VALUE
    if kind == "integer":
        if isinstance(parsed, float) and parsed.is_integer():
            return int(parsed)
        ok = isinstance(parsed, int) and not isinstance(parsed, bool)
        return parsed if ok else _NO_VALUE
    if kind == "number":
        ok = isinstance(parsed, int | float) and not isinstance(parsed, bool)
        return parsed if ok else _NO_VALUE
    if kind == "object":
        return parsed if isinstance(parsed, dict) else _NO_VALUE
    if kind == "array":
        return parsed if isinstance(parsed, list) else _NO_VALUE
    return _NO_VALUE


def coerce_param(value: str, types: list[str]) -> Any:
    """An XML parameter value typed by its schema; the string itself when no type fits."""
    for kind in types:
        if kind != "string":
            converted = _convert(value, kind)
            if converted is not _NO_VALUE:
                return converted
    return value


def _trim_value(value: str) -> str:
    """Drop one leading and one trailing newline (the template puts the value on its own line)."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _parse_xml(body: str, toolset: ToolSet) -> ToolCall | None:
    text = body.strip()
    name_end = text.find(">")
    if not text.startswith(_FUNC_OPEN) or name_end < 0:
        return None
    name = text[len(_FUNC_OPEN):name_end].strip()
    if not name or "\n" in name or "<" in name:
        return None
    rest = text[name_end + 1:]
    # the last </function>: a value may hold the text (code, markup); the grammar allows it
    func_close = rest.rfind(_FUNC_CLOSE)
    if func_close >= 0:
        if rest[func_close + len(_FUNC_CLOSE):].strip():
            return None  # a second function or stray text in one block
        rest = rest[:func_close]
    args: dict[str, Any] = {}
    pos = 0
    while True:
        while pos < len(rest) and rest[pos].isspace():
            pos += 1
        if pos == len(rest):
            break
        key_end = rest.find(">", pos)
        if not rest.startswith(_PARAM_OPEN, pos) or key_end < 0:
            return None
        key = rest[pos + len(_PARAM_OPEN):key_end].strip()
        if not key or "\n" in key:
            return None
        close = rest.find(_PARAM_CLOSE, key_end + 1)
        if close >= 0:
            raw, pos = rest[key_end + 1:close], close + len(_PARAM_CLOSE)
        else:  # tolerate a missing </parameter>: the value runs to the next parameter or the end
            nxt = rest.find(_PARAM_OPEN, key_end + 1)
            end = len(rest) if nxt < 0 else nxt
            raw, pos = rest[key_end + 1:end], end
        args[key] = coerce_param(_trim_value(raw), toolset.param_types(name, key))
    return ToolCall.create(name, args)


def _arguments(value: Any) -> dict[str, Any] | None:
    """Arguments as an object: an object, a JSON string holding one, or absent/null (-> {})."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _call_from_json(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # OpenAI-style {"type": "function", "function": ..}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    raw = obj.get("arguments", obj.get("parameters"))
    args = _arguments(raw)
    return None if args is None else ToolCall.create(name.strip(), args)


def parse_block(body: str, toolset: ToolSet) -> ToolCall | None:
    """The call in the text between ``<tool_call>`` and ``</tool_call>``; None if malformed."""
    if body.strip().startswith(_FUNC_OPEN):
        return _parse_xml(body, toolset)
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return _call_from_json(obj)


_JSON_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)+)"'
                        r'(\s*,\s*"(?:arguments|parameters)"\s*:\s*)?', re.DOTALL)


def partial_call(body: str, toolset: ToolSet) -> ToolCall | None:
    """The call in an unterminated block (the text after ``<tool_call>``) as far as it was
    written: what ``parse_block`` makes of it, else the JSON form's name with the arguments text
    as it stands (not valid JSON: the call was cut); None without a complete name."""
    whole = parse_block(body, toolset)
    if whole is not None or body.strip().startswith(_FUNC_OPEN):
        return whole
    head = _JSON_NAME.match(body)
    if head is None:
        return None
    try:
        name = json.loads(f'"{head[1]}"')
    except ValueError:
        return None
    rest = body[head.end():].rstrip() if head[2] else ""
    return ToolCall(id="call_" + uuid.uuid4().hex, name=name.strip(), arguments=rest)


# the keys of a whole-answer call: Kiln's, and Llama 3.1-3.3's JSON tool calls (``parameters``)
_BARE_KEYS = ({"name", "arguments"}, {"name", "parameters"})


def bare_call(obj: Any, toolset: ToolSet) -> ToolCall | None:
    """Kiln's fallback: a whole-answer ``{"name": <declared>, "arguments": {...}}`` object, or
    ``"parameters"`` for ``"arguments"`` as Llama 3.1-3.3 write their calls."""
    if not isinstance(obj, dict) or set(obj) not in _BARE_KEYS:
        return None
    if obj["name"] not in toolset.names:
        return None
    args = _arguments(obj.get("arguments", obj.get("parameters")))
    return None if args is None else ToolCall.create(obj["name"], args)


def _parse_bare(text: str, toolset: ToolSet) -> ToolCall | None:
    stripped = text.strip()
    if not toolset.names or not stripped.startswith("{"):
        return None
    try:
        obj = json.loads(stripped)
    except ValueError:
        return None
    return bare_call(obj, toolset)


def parse_with(text: str, toolset: ToolSet, *, partial: bool = True) -> ParsedOutput:
    """:func:`parse_tool_calls` with a prepared :class:`ToolSet`; ``partial=False`` leaves a
    trailing unterminated block as text (reasoning that mentions a call)."""
    if not toolset.enabled:
        return ParsedOutput(text, [])
    pieces: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while True:
        start = text.find(OPEN_TAG, pos)
        if start < 0:
            pieces.append(text[pos:])
            break
        end = text.find(CLOSE_TAG, start + len(OPEN_TAG))
        if end < 0:  # a trailing unterminated block: the call so far, never content
            if not partial:
                pieces.append(text[pos:])
                break
            pieces.append(text[pos:start].rstrip())
            cut = partial_call(text[start + len(OPEN_TAG):], toolset)
            if cut is None:
                return ParsedOutput("".join(pieces).rstrip() if calls else "".join(pieces),
                                    calls)
            calls.append(cut)
            break
        stop = end + len(CLOSE_TAG)
        call = parse_block(text[start + len(OPEN_TAG):end], toolset)
        if call is None:
            pieces.append(text[pos:stop])
        else:
            pieces.append(text[pos:start].rstrip())
            calls.append(call)
        pos = stop
    if calls:
        return ParsedOutput("".join(pieces).rstrip(), calls)
    fallback = _parse_bare(text, toolset)
    if fallback is not None:
        return ParsedOutput("", [fallback])
    return ParsedOutput(text, [])


def closing_stop(finish_reason: str | None, stop_reason: Any) -> str:
    """The matched stop string when it closed a tool call (a client's own `</tool_call>` stop,
    as Hermes clients send): the engine cut it from the text, and parsing needs it back
    (docs/behavior.md §12: removed from content, re-appended for parsing). "" otherwise."""
    if finish_reason == "stop" and isinstance(stop_reason, str) and CLOSE_TAG in stop_reason:
        return stop_reason
    return ""


def parse_closed(text: str, tools: list[Any] | None, stop: str) -> ParsedOutput:
    """``parse_tool_calls`` of ``text`` with ``stop`` (from ``closing_stop``) re-appended when
    that completes a call; else of ``text`` alone, so a stop never reaches the content."""
    if stop:
        parsed = parse_tool_calls(text + stop, tools)
        if parsed.tool_calls:
            return parsed
    return parse_tool_calls(text, tools)


def parse_tool_calls(text: str, tools: list[Any] | None, *, partial: bool = True
                     ) -> ParsedOutput:
    """Split a completion into content and tool calls (no parsing when no tools were offered);
    ``partial``: as in ``parse_with``."""
    return parse_with(text, ToolSet(tools), partial=partial)
