"""Chat templates rendered with minijinja, set up the way transformers renders them.

pycompat on (``.startswith()``, ``.strip()``, ...), ``trim_blocks``/``lstrip_blocks`` on, no
trailing newline kept, a transformers-style ``tojson`` filter (``json.dumps`` with
``ensure_ascii=False``, no HTML escaping), and the ``raise_exception`` / ``strftime_now``
functions. Special tokens (``bos_token``, ``eos_token``) are template variables, as are
``chat_template_kwargs`` (passed as keyword arguments to :meth:`ChatTemplate.render`).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import minijinja
from msgspec import UNSET

# transformers' AssistantTracker tags ({% generation %}): only used for training masks.
_GENERATION_TAGS = re.compile(r"\{%-?\s*(?:end)?generation\s*-?%\}")


class ChatTemplateError(ValueError):
    """The chat template failed to compile or render (the API maps this to HTTP 400)."""


class TemplateRaisedError(ChatTemplateError):
    """The template itself called ``raise_exception(message)``."""


def _raise_exception(message: str) -> None:
    raise TemplateRaisedError(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False,
            separators: Any = None, sort_keys: bool = False) -> str:
    seps = tuple(separators) if separators is not None else None
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=seps,
                      sort_keys=sort_keys)


class ChatTemplate:
    """One compiled chat template."""

    _NAME = "chat_template"

    def __init__(self, source: str, *, bos_token: str | None = None,
                 eos_token: str | None = None, special_tokens: dict[str, str] | None = None
                 ) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._specials = dict(special_tokens or {})
        env = minijinja.Environment()
        env.pycompat = True
        env.trim_blocks = True
        env.lstrip_blocks = True
        env.keep_trailing_newline = False
        env.add_filter("tojson", _tojson)
        env.add_global("raise_exception", _raise_exception)
        env.add_global("strftime_now", _strftime_now)
        try:
            env.add_template(self._NAME, _GENERATION_TAGS.sub("", source))
        except minijinja.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self._env = env

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> ChatTemplate:
        try:
            source = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ChatTemplateError(f"cannot read chat template {path}: {exc}") from exc
        return cls(source, **kwargs)

    def render(self, messages: list[dict[str, Any]], *, tools: list[Any] | None = None,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render a conversation; ``kwargs`` (chat_template_kwargs) become template variables."""
        ctx: dict[str, Any] = dict(self._specials)
        ctx["bos_token"] = self.bos_token if self.bos_token is not None else ""
        ctx["eos_token"] = self.eos_token if self.eos_token is not None else ""
        ctx.update(kwargs)
        ctx["messages"] = messages
        ctx["tools"] = tools
        ctx["add_generation_prompt"] = add_generation_prompt
        try:
            return str(self._env.render_template(self._NAME, **ctx))
        except ChatTemplateError:
            raise
        except minijinja.TemplateError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ChatTemplateError):
                raise TemplateRaisedError(str(cause)) from exc
            raise ChatTemplateError(f"chat template error: {_describe(exc)}") from exc
        except Exception as exc:  # a filter/function raised something else
            raise ChatTemplateError(f"chat template error: {exc}") from exc


TEXT_PARTS = ("text", "input_text", "output_text")


def message_content(content: Any) -> str:
    """String as is; content-part arrays concatenated (text parts only); null/missing -> ""."""
    if content is None or content is UNSET:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in TEXT_PARTS:
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


def _decode_arguments(call: Any) -> Any:
    """Prior-turn tool calls: string `arguments` (top level or under `function`) are JSON-parsed
    for the template, as transformers-style templates expect a mapping."""
    if not isinstance(call, dict):
        return call
    out = dict(call)
    if isinstance(out.get("function"), dict):
        out["function"] = dict(out["function"])  # copied first: the request's own stays as sent
    for holder in (out, out.get("function")):
        if isinstance(holder, dict) and isinstance(holder.get("arguments"), str):
            try:
                holder["arguments"] = json.loads(holder["arguments"])
            except ValueError:
                pass
    return out


def template_messages(messages: list[Any], *, decode_arguments: bool = True,
                      null_content: bool = True) -> list[dict[str, Any]]:
    """The template's view of request messages (objects with ``role``, ``content`` and optional
    ``tool_calls``, ``name``, ``tool_call_id``; docs/behavior.md §12): prior tool calls' string
    arguments JSON-decoded, and an assistant message with tool calls and content "" given
    content null. ``render_messages`` falls back to raw arguments and to "" for templates that
    cannot take them."""
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": m.role, "content": message_content(m.content)}
        for key in ("tool_calls", "name", "tool_call_id"):
            value = getattr(m, key)
            if value is not None and value is not UNSET:
                msg[key] = value
        if msg.get("tool_calls"):
            if decode_arguments:
                msg["tool_calls"] = [_decode_arguments(c) for c in msg["tool_calls"]]
            if msg["content"] == "" and null_content:
                msg["content"] = None
        if msg["content"] is None and not null_content:
            msg["content"] = ""
        out.append(msg)
    return out


def render_messages(template: Any, messages: list[Any], tools: Any, kwargs: dict[str, Any],
                    add_generation_prompt: bool = True) -> str:
    """Render with the reference's message view; if the template fails on it, again with raw
    tool-call arguments (templates that print the string, DeepSeek style) and/or "" for null
    content (templates that concatenate content, such as SmolLM2's, on which a client's own
    assistant tool-call turn had failed). Raises the first error when every view fails."""
    first: Exception | None = None
    tried: list[list[dict[str, Any]]] = []
    for decode, null in ((True, True), (True, False), (False, True), (False, False)):
        view = template_messages(messages, decode_arguments=decode, null_content=null)
        if view in tried:
            continue
        tried.append(view)
        try:
            return str(template.render(view, tools=tools,
                                       add_generation_prompt=add_generation_prompt, **kwargs))
        except Exception as exc:  # template errors are the client's messages/tools
            first = first or exc
    assert first is not None
    raise first


def _describe(exc: minijinja.TemplateError) -> str:
    message = getattr(exc, "message", None)
    return str(message) if message else str(exc).splitlines()[0]
