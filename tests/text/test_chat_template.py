"""minijinja rendering equals a transformers-style Jinja2 rendering."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kiln.text import ChatTemplate, ChatTemplateError
from tests.tiny_models import QWEN3_TEMPLATE

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city <b>now</b> & later",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Z\u00fcrich"},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "get_weather",
                                           "arguments": {"city": "Paris", "unit": "c"}}},
         {"type": "function", "function": {"name": "get_weather",
                                           "arguments": '{"city": "Lyon"}'}}]},
     {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "<ok> & 19"},
     {"role": "assistant", "content": "<think>\nSunny both.\n</think>\n\nIt is 21\u00b0C."},
     {"role": "user", "content": "Thanks \U0001F600"}],
    [{"role": "user", "content": "Think first"},
     {"role": "assistant", "content": "Done.", "reasoning_content": "Let me see."}],
]


def _hf_tojson(x: Any, ensure_ascii: bool = False, indent: Any = None,
               separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def jinja2_render(source: str, messages: list[dict[str, Any]], **ctx: Any) -> str:
    """Rendered as transformers does it (ImmutableSandboxedEnvironment & co)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = _hf_tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source).render(messages=messages, **ctx)


def _both(source: str, messages: list[dict[str, Any]], tools: list[Any] | None = None,
          add_generation_prompt: bool = True, **kwargs: Any) -> tuple[str, str]:
    ours = ChatTemplate(source, bos_token="<|im_start|>", eos_token="<|im_end|>").render(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)
    ref = jinja2_render(source, messages, tools=tools, add_generation_prompt=add_generation_prompt,
                        bos_token="<|im_start|>", eos_token="<|im_end|>", **kwargs)
    return ours, ref


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen", [True, False])
def test_smollm_template_matches_jinja2(smollm_meta: dict[str, object], conv: int,
                                        gen: bool) -> None:
    source = smollm_meta["tokenizer.chat_template"]
    assert isinstance(source, str)
    messages = [m for m in CONVERSATIONS[conv] if m["role"] != "tool"]
    ours, ref = _both(source, messages, add_generation_prompt=gen)
    assert ours == ref


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("tools", [None, [WEATHER_TOOL]])
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
def test_qwen3_fixture_matches_jinja2(conv: int, tools: list[Any] | None,
                                      kwargs: dict[str, Any]) -> None:
    source = QWEN3_TEMPLATE.read_text(encoding="utf-8")
    ours, ref = _both(source, CONVERSATIONS[conv], tools=tools, **kwargs)
    assert ours == ref
    if tools:
        assert '"description": "Weather for a city <b>now</b> & later"' in ours
        assert "Z\u00fcrich" in ours


def test_qwen3_tool_calls_and_thinking_rendered() -> None:
    tpl = ChatTemplate(QWEN3_TEMPLATE.read_text(encoding="utf-8"))
    text = tpl.render(CONVERSATIONS[2], tools=[WEATHER_TOOL])
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
            "\n</tool_call>") in text
    assert "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n" \
           "<tool_response>\n<ok> & 19\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_chat_template_kwargs_reach_template() -> None:
    tpl = ChatTemplate(QWEN3_TEMPLATE.read_text(encoding="utf-8"))
    msgs = CONVERSATIONS[0]
    on = tpl.render(msgs)
    off = tpl.render(msgs, enable_thinking=False)
    assert on != off
    assert off == on + "<think>\n\n</think>\n\n"
    custom = ChatTemplate("{{ greeting }} {{ bos_token }}{{ eos_token }}", bos_token="B",
                          eos_token="E")
    assert custom.render([], greeting="hey") == "hey BE"


def test_raise_exception_gives_chat_template_error() -> None:
    tpl = ChatTemplate(QWEN3_TEMPLATE.read_text(encoding="utf-8"))
    with pytest.raises(ChatTemplateError, match="Unexpected message role: robot"):
        tpl.render([{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}])


def test_errors_are_chat_template_errors() -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% for x in %}")
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[0].content.nope.deeper }}").render([{"content": "a"}])
    assert issubclass(ChatTemplateError, ValueError)


def test_environment_settings() -> None:
    # trim_blocks/lstrip_blocks on, trailing newline dropped, pycompat string methods,
    # tojson without HTML escaping and with indent, strftime_now available
    src = "  {% if true %}\n{{ ' a '.strip() }}|{{ {'k': '<&>'} | tojson(indent=2) }}\n{% endif %}\n"
    assert ChatTemplate(src).render([]) == 'a|{\n  "k": "<&>"\n}\n'
    assert ChatTemplate("x\n").render([]) == "x"
    year = ChatTemplate("{{ strftime_now('%Y') }}").render([])
    assert year == str(datetime.now().year)
    gen = ChatTemplate("{% generation %}x{% endgeneration %}").render([])
    assert gen == "x"
