"""Structured outputs and forced tool calls: request fields -> an llguidance grammar, compiled
(off the event loop, cached) before any token so that a bad one is a 400 naming its field.

* ``response_format`` (OpenAI): ``text``, ``json_object``, ``json_schema``, ``structural_tag``
  (vLLM's ``structures``/``triggers`` form, kiln/api/structured/structural_tags.py, or xgrammar's
  nested ``format`` form, kiln/api/structured/structural_formats.py);
* ``structured_outputs`` (vLLM): ``json``, ``regex``, ``choice``, ``grammar``, ``json_object``,
  ``structural_tag`` (the same, as JSON text);
* ``tool_choice`` ``"required"`` or a named function: calls in the model's tool-call format,
  arguments valid against the tool's ``parameters``: the Hermes/Qwen3 JSON format
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, or, when the chat template
  writes Qwen3.5's XML, ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>
  \\n</function>\\n</tool_call>`` (kiln/api/structured/xml_tools.py).

JSON defaults (docs/structured-outputs.md): an object schema without ``additionalProperties``
admits no extra keys, and whitespace is bounded (one space after ``,`` and ``:``, nothing else) so a model
cannot spin whitespace until ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import llguidance

from kiln.api.errors import ApiError
from kiln.api.structured import schema_keywords, structural_formats, structural_tags, xml_tools
from kiln.api.structured.schema_keywords import closed
from kiln.api.wire_values import plain
from kiln.config import DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S as DEFAULT_COMPILE_DEADLINE_S
from kiln.engine.grammar import GrammarError, compiler_for
from kiln.engine.request import GrammarSpec
from kiln.text.tools import CLOSE_TAG, OPEN_TAG

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ",
                                "key_separator": ": "}
SO_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def enforceable(schema: Any, param: str) -> None:
    """A 400 naming ``param`` for a keyword the grammar cannot enforce (schema_keywords)."""
    try:
        schema_keywords.check(schema)
    except schema_keywords.Unenforceable as e:
        raise _bad(param, str(e)) from None


def json_grammar(schema: Any, param: str,
                 options: JsonCompileOptions | None = None) -> str:
    if not isinstance(schema, dict):
        raise _bad(param, "a JSON Schema must be a JSON object")
    enforceable(schema, param)
    try:
        return str(llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(closed(schema)), overrides=options or JSON_OPTIONS))
    except (ValueError, TypeError) as e:
        raise _bad(param, str(e)) from None


def _no_token(text: str) -> int | None:
    return None


def _schema_expansion(schema: Any, param: str) -> str:
    """``%json {...}``: a Lark expansion of JSON valid against ``schema`` (closed, bounded
    whitespace, as JSON outputs); ``param``: the schema's path."""
    if not isinstance(schema, dict):
        raise _bad(param, "a JSON Schema must be a JSON object")
    enforceable(schema, param)
    return f"%json {json.dumps({**closed(schema), 'x-guidance': JSON_OPTIONS})}"


def from_structural_tag(spec: Any, param: str,
                        token_id: Callable[[str], int | None] = _no_token) -> tuple[str, str]:
    """(grammar, param) of a structural tag: the legacy ``structures``/``triggers`` form or
    xgrammar's nested ``format`` form (kiln/api/structured/structural_formats.py)."""
    try:
        if isinstance(spec, dict) and "format" in spec:
            if "structures" in spec or "triggers" in spec:
                raise structural_tags.StructuralTagError(
                    f"{param}.format", "give either `format` or `structures` and `triggers`")
            return structural_formats.nested_grammar(spec, param, _schema_expansion,
                                                     token_id), param
        lark = structural_tags.legacy_grammar(spec, param, _schema_expansion, token_id)
    except structural_tags.StructuralTagError as e:
        raise _bad(e.param, str(e)) from None
    try:
        return str(llguidance.LLMatcher.grammar_from_lark(lark)), param
    except ValueError as e:
        raise _bad(param, str(e)) from None


def from_response_format(value: Any, param: str = "response_format",
                         token_id: Callable[[str], int | None] = _no_token
                         ) -> tuple[str, str] | None:
    """(grammar, param) for a response_format, None for text / null."""
    fmt = plain(value)
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":  # llama-server's form may carry a schema
        schema = fmt.get("schema")
        if schema is None:
            return json_grammar({"type": "object"}, param), param
        return json_grammar(schema, f"{param}.schema"), f"{param}.schema"
    if kind == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema")
        where = f"{param}.json_schema.schema"
        return json_grammar({} if schema is None else schema, where), where
    if kind == "structural_tag":
        return from_structural_tag(fmt, param, token_id)
    raise _bad(f"{param}.type", f"unknown response format type {kind!r}")


def from_structured_outputs(value: Any, param: str = "structured_outputs",
                            token_id: Callable[[str], int | None] = _no_token
                            ) -> tuple[str, str] | None:
    so = {k: v for k, v in (plain(value) or {}).items() if v is not None}
    kinds = [k for k in SO_KINDS if k in so and so[k] is not False]
    if not kinds:
        return None
    if len(kinds) > 1:
        raise _bad(param, f"exactly one of {', '.join(SO_KINDS)} may be set, got "
                          f"{', '.join(kinds)}")
    kind = kinds[0]
    where = f"{param}.{kind}"
    if kind == "structural_tag":
        tag = so["structural_tag"]
        if isinstance(tag, str):
            try:
                tag = json.loads(tag)
            except ValueError as e:
                raise _bad(where, f"not valid JSON: {e}") from None
        return from_structural_tag(tag, where, token_id)
    if kind in ("json", "json_object"):
        options: JsonCompileOptions = JSON_OPTIONS
        if so.get("disable_any_whitespace"):
            options = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
        elif so.get("whitespace_pattern") is not None:
            options = {"whitespace_flexible": True, "whitespace_pattern": so["whitespace_pattern"]}
        schema = so["json"] if kind == "json" else {"type": "object"}
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise _bad(where, f"not valid JSON: {e}") from None
        return json_grammar(schema, where, options), where
    if kind == "regex":
        return str(llguidance.LLMatcher.grammar_from_regex(so["regex"])), where
    if kind == "choice":
        lark = "start: " + " | ".join(json.dumps(c) for c in so["choice"])
        return str(llguidance.LLMatcher.grammar_from_lark(lark)), where
    try:
        return str(llguidance.grammar_from("grammar", so["grammar"])), where
    except ValueError as e:
        raise _bad(where, str(e)) from None


def from_llama_fields(grammar: Any, json_schema: Any) -> tuple[str, str] | None:
    """llama-server's top-level ``grammar`` (GBNF or Lark) and ``json_schema``, as
    ``structured_outputs.grammar`` and a ``json_schema`` response format; both is a 400."""
    if grammar is not None and json_schema is not None:
        raise _bad("json_schema", "grammar and json_schema cannot be combined: a request takes "
                                  "one constraint")
    if json_schema is not None:
        return json_grammar(json_schema, "json_schema"), "json_schema"
    if grammar is not None:
        try:
            return str(llguidance.grammar_from("grammar", grammar)), "grammar"
        except ValueError as e:
            raise _bad("grammar", str(e)) from None
    return None


def _tool_functions(tools: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tool in plain(tools) or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.setdefault(fn["name"], fn.get("parameters") or {"type": "object"})
    return out


def from_tool_choice(tools: Any, tool_choice: Any, parallel: bool,
                     tag_ids: tuple[int | None, int | None] = (None, None),
                     fmt: str = "json") -> tuple[str, str] | None:
    """The grammar of a forced tool call: ``"required"`` (one or more calls of any tool; one
    when ``parallel`` is false) or a named function (exactly one call of it), in the model's
    format ``fmt`` (``kiln.text.tools.tool_format``: ``"json"`` or Qwen3.5 ``"xml"``).
    ``tag_ids``: the tokenizer's own tokens for ``<tool_call>`` / ``</tool_call>`` (Qwen3 has
    them as added tokens, which llguidance keeps apart from text), allowed beside the
    spelled-out tags."""
    choice = plain(tool_choice)
    if choice in (None, "auto", "none"):
        return None
    functions = _tool_functions(tools)
    if choice == "required":
        names, many = sorted(functions), parallel
        if not names:
            raise _bad("tools", 'tool_choice "required" needs at least one function tool')
    else:
        fn = choice.get("function") if isinstance(choice, dict) else None
        if not (isinstance(choice, dict) and choice.get("type") == "function"
                and isinstance(fn, dict) and isinstance(fn.get("name"), str)):
            raise _bad("tool_choice", 'tool_choice must be "none", "auto", "required" or '
                                      '{"type": "function", "function": {"name": ...}}, got '
                                      f"{json.dumps(choice)}")
        name = fn["name"]
        if name not in functions:
            raise _bad("tool_choice.function.name",
                       f"tool_choice names function {name!r}, which is not among the tools")
        names, many = [name], False
    rules = []
    budget = xml_tools.LengthBudget()  # the length bounds of all the tools, one lexer
    for i, name in enumerate(names):
        schema = closed(functions[name])
        if not isinstance(schema, dict):
            raise _bad("tools", f"function {name!r}: parameters must be a JSON Schema object")
        try:
            schema_keywords.check(schema)
        except schema_keywords.Unenforceable as e:
            raise _bad("tools", f"function {name!r}: {e}") from None
        if fmt == "xml":
            try:
                rules.extend(xml_tools.call_rules(i, name, schema, dict(JSON_OPTIONS), budget))
            except xml_tools.Refused as e:
                raise _bad("tools", str(e)) from None
            continue
        call = {"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
                "required": ["name", "arguments"], "additionalProperties": False}
        for key in ("$defs", "definitions"):  # "#/$defs/.." refs point at the call's root now
            if key in schema:
                call[key] = schema[key]
        options = json.dumps({**call, "x-guidance": JSON_OPTIONS})
        rules.append(f"call{i}: %json {options}")
    alternatives = " | ".join(f"call{i}" for i in range(len(names)))
    newline = json.dumps("\n")  # the Lark literal "\n"
    tags = [json.dumps(tag) if tid is None else f"({json.dumps(tag)} | <[{tid}]>)"
            for tag, tid in zip((OPEN_TAG, CLOSE_TAG), tag_ids, strict=True)]
    block = f"{tags[0]} {newline} ({alternatives}) {newline} {tags[1]}"
    start = f"start: block ({newline} block)*" if many else "start: block"
    lark = "\n".join([start, f"block: {block}", *rules])
    return str(llguidance.LLMatcher.grammar_from_lark(lark)), "tool_choice"


COMPILE_WORKERS = 4  # grammar compilations at once; more wait for a free worker
_COMPILE_POOL = ThreadPoolExecutor(COMPILE_WORKERS, thread_name_prefix="kiln-grammar")


async def constraint(tokenizer: Any, *, code: str, response_format: Any = None,
                     structured_outputs: Any = None, tools: Any = None, tool_choice: Any = None,
                     parallel_tool_calls: bool = True, after: tuple[int, ...] = (),
                     ignore_eos: bool = False, tool_format: str = "json",
                     deadline_s: float = DEFAULT_COMPILE_DEADLINE_S,
                     llama: tuple[Any, Any] = (None, None)) -> GrammarSpec | None:
    """The request's one constraint as a GrammarSpec (None: unconstrained), built and compiled
    once in a grammar worker thread, off the event loop; a malformed field, or a grammar
    llguidance refuses (a bad regex, a schema keyword it cannot enforce), is a 400 naming the
    field and saying why. Compilation that has not finished ``deadline_s`` seconds after it was
    asked for is a 400 naming the field (docs/structured-outputs.md, compile deadline); the
    thread runs on to llguidance's own limits, and its grammar lands in the cache. When every
    grammar worker is busy past the deadline the request is a 503 ``server_overloaded``.
    ``llama``: llama-server's top-level ``grammar`` and ``json_schema`` (``from_llama_fields``)."""
    field = _constrained_field(response_format, structured_outputs, tool_choice, llama)
    if field is None:
        return None
    where = [field]  # the field the deadline names: its full path once the grammar is built
    started = threading.Event()

    def work() -> GrammarSpec | None:
        started.set()
        built = _build(tokenizer, code, response_format, structured_outputs, tools,
                       tool_choice, parallel_tool_calls, ignore_eos, tool_format, llama)
        if built is None:
            return None
        grammar, param = built
        where[0] = param
        try:
            compiler_for(tokenizer).check(grammar)
        except GrammarError as e:
            raise ApiError(400, code, f"{param}: {e}", param=param) from None
        return GrammarSpec(grammar, after, param.split(".")[0])

    job = asyncio.get_running_loop().run_in_executor(_COMPILE_POOL, work)
    try:
        return await asyncio.wait_for(job, deadline_s)
    except TimeoutError:
        if not started.is_set():
            raise ApiError(503, "server_overloaded", "every grammar compiler is busy; retry "
                                                     "later", headers={"Retry-After": "1"}
                           ) from None
        raise ApiError(400, code, f"{where[0]}: the grammar did not compile within the "
                                  f"server's {deadline_s:g} s deadline "
                                  "(--grammar-compile-timeout-s); simplify it",
                       param=where[0]) from None


def _constrained_field(response_format: Any, structured_outputs: Any, tool_choice: Any,
                       llama: tuple[Any, Any] = (None, None)) -> str | None:
    """The first field that asks for a constraint (None: the request is unconstrained)."""
    fmt = plain(response_format)
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        return "response_format"
    so = plain(structured_outputs)
    if isinstance(so, dict) and any(so.get(k) not in (None, False) for k in SO_KINDS):
        return "structured_outputs"
    if plain(tool_choice) not in (None, "auto", "none"):
        return "tool_choice"
    if llama[0] is not None or llama[1] is not None:
        return "grammar" if llama[1] is None else "json_schema"
    return None


def _build(tokenizer: Any, code: str, response_format: Any, structured_outputs: Any,
           tools: Any, tool_choice: Any, parallel_tool_calls: bool, ignore_eos: bool,
           tool_format: str, llama: tuple[Any, Any]) -> tuple[str, str] | None:
    """(grammar, param) of the request's one constraint, or None."""
    try:
        token_id = _token_id(tokenizer)
        built = [b for b in (from_response_format(response_format, token_id=token_id),
                             from_structured_outputs(structured_outputs, token_id=token_id),
                             from_tool_choice(tools, tool_choice, parallel_tool_calls,
                                              _tag_ids(tokenizer), tool_format),
                             from_llama_fields(*llama))
                 if b is not None]
    except _Invalid as e:
        raise ApiError(400, code, f"{e.param}: {e.message}", param=e.param) from None
    if not built:
        return None
    if len(built) > 1:
        names = " and ".join(param.split(".")[0] for _, param in built)
        raise ApiError(400, code, f"{names} cannot be combined: a request takes one constraint",
                       param=built[1][1].split(".")[0])
    if ignore_eos:
        raise ApiError(400, code, f"ignore_eos cannot be combined with {built[0][1]}: a "
                                  "finished constraint ends the output with EOS",
                       param="ignore_eos")
    return built[0]


def _token_id(tokenizer: Any) -> Callable[[str], int | None]:
    """``text`` -> its id when the tokenizer holds it as one token, else None."""
    lookup = getattr(tokenizer, "token_to_id", None)

    def token_id(text: str) -> int | None:
        found = lookup(text) if callable(lookup) else None
        return found if isinstance(found, int) else None
    return token_id


def _tag_ids(tokenizer: Any) -> tuple[int | None, int | None]:
    """The ids of ``<tool_call>`` and ``</tool_call>`` when each is one token of the model's."""
    lookup = getattr(tokenizer, "token_to_id", None)
    if not callable(lookup):
        return None, None
    found = [lookup(tag) for tag in (OPEN_TAG, CLOSE_TAG)]
    return found[0] if isinstance(found[0], int) else None, \
        found[1] if isinstance(found[1], int) else None


class _Invalid(Exception):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


def _bad(param: str, message: str) -> _Invalid:
    return _Invalid(param, message)
