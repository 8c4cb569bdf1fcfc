"""Issue 52.2: a forced call in the Qwen3.5 XML format ends as a call. A raw-text value has an
end (``xml_tools.RAW_VALUE_MAX_TOKENS``, made small here): a model that drifts into prose inside
a parameter is held to ``\\n</parameter>`` after the cap, and a value written within the cap
closes exactly as written. The grammar is driven as the engine drives it (kiln/engine/
grammar.py: the next-token mask, then the sampled token), on the tiny test tokenizer."""

from __future__ import annotations

import json
import time
from functools import cache
from typing import Any

import llguidance
import numpy
import pytest

from kiln.api.structured import xml_tools
from kiln.engine.grammar import LIMITS
from kiln.text.tools import parse_tool_calls
from tests.api.test_xml_tools import TOOLS, VALID, call, xml_grammar
from tests.tiny_models import tiny_tokenizer

PROSE = ("The weather in Paris is lovely today, so let me tell you a long story about it "
         "instead of closing the parameter. ") * 4
CAP = 8
# past the cap, a value may take the tokens its closing tag could have (one a byte) and one more
SLACK = len("\n\n</parameter>") + 1


@cache
def _tokenizer() -> llguidance.LLTokenizer:
    tiny = tiny_tokenizer()
    return llguidance.LLTokenizer(tiny.to_str(), eos_token=tiny.token_to_id("<|im_end|>"))


class Driver:
    """One grammar, fed token by token where its mask allows, as the engine samples."""

    def __init__(self, grammar: str) -> None:
        self.tok = _tokenizer()
        self.m = llguidance.LLMatcher(self.tok, grammar, log_level=0, limits=LIMITS)
        assert not self.m.is_error(), self.m.get_error()
        self.written: list[int] = []

    def allowed(self) -> set[int]:
        bits = numpy.zeros((self.tok.vocab_size + 31) // 32, dtype=numpy.int32)
        self.m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        assert not self.m.is_error(), self.m.get_error()
        return {t for t in range(self.tok.vocab_size) if bits[t // 32] >> (t % 32) & 1}

    def write(self, text: str) -> int:
        """Feed ``text``'s tokens until the mask refuses one; how many it took."""
        taken = 0
        for t in self.tok.tokenize_str(text):
            if t not in self.allowed():
                break
            assert self.m.consume_token(t), self.m.get_error()
            self.written.append(t)
            taken += 1
        return taken

    def forced(self) -> str:
        """The text the grammar forces from here (while exactly one token is allowed)."""
        out: list[int] = []
        while len(allowed := self.allowed()) == 1 and not self.m.is_accepting():
            (t,) = allowed
            assert self.m.consume_token(t), self.m.get_error()
            out.append(t)
        self.written.extend(out)
        return self.tok.decode_str(out)

    def text(self) -> str:
        return self.tok.decode_str(self.written)


def _drive(grammar: str, text: str) -> Driver:
    d = Driver(grammar)
    assert d.write(text) == len(d.tok.tokenize_str(text)), f"refused after {d.text()!r}"
    return d


@pytest.fixture
def small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # raising=False: before the cap, there was no such name, and prose ran on
    monkeypatch.setattr(xml_tools, "RAW_VALUE_MAX_TOKENS", CAP, raising=False)


@pytest.mark.parametrize(("text", "args"), VALID)
def test_values_close_as_written_under_the_mask(text: str, args: dict[str, Any]) -> None:
    """The calls test_xml_tools accepts, fed as the engine feeds them (mask, then token)."""
    d = _drive(xml_grammar("required"), text)
    assert d.m.is_accepting()
    assert json.loads(parse_tool_calls(text, TOOLS).tool_calls[0].arguments) == args


@pytest.mark.parametrize("value", ["", "a\n", "\nlead", "x\n</paramete", "x </parameter",
                                   "Δδ 日本語 😀"])
def test_a_value_within_the_cap_closes_as_written(small_cap: None, value: str) -> None:
    cut = _tokenizer().decode_str(_tokenizer().tokenize_str(PROSE)[:CAP])
    for v in (value, cut):  # `cut`: exactly CAP tokens of prose
        for text, args in ((call("get_weather", ("city", v), ("days", "2")),
                            {"city": v, "days": 2}),
                           (call("ping", ("host", v)), {"host": v})):
            d = _drive(xml_grammar("required"), text)
            assert d.m.is_accepting(), text
            assert json.loads(parse_tool_calls(text, TOOLS).tool_calls[0].arguments) == args


@pytest.mark.parametrize(("name", "key", "rest"), [
    ("get_weather", "city", "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"),
    ("ping", "host", "</function>\n</tool_call>"),
])
def test_prose_past_the_cap_can_only_close_the_parameter(small_cap: None, name: str, key: str,
                                                         rest: str) -> None:
    """The issue's failure: the model wrote `<parameter=city>` and then prose until max_tokens.
    Past the cap the mask allows nothing but `\\n</parameter>`; the call then completes and its
    argument is the text written."""
    close = "\n</parameter>\n"
    for choice in ("required", {"type": "function", "function": {"name": name}}):
        d = _drive(xml_grammar(choice), f"<tool_call>\n<function={name}>\n<parameter={key}>\n")
        taken = d.write(PROSE)
        assert CAP <= taken <= CAP + SLACK < len(d.tok.tokenize_str(PROSE))
        forced = d.forced()
        assert forced.startswith(close)
        rest_now = rest.removeprefix(forced.removeprefix(close))
        assert d.write(rest_now) == len(d.tok.tokenize_str(rest_now))
        assert d.m.is_accepting(), d.text()
        parsed = parse_tool_calls(d.text(), TOOLS)
        assert parsed.content == "" and len(parsed.tool_calls) == 1
        value = json.loads(parsed.tool_calls[0].arguments)[key]
        assert PROSE.startswith(value) and len(d.tok.tokenize_str(value)) >= CAP


def test_a_minlength_value_is_never_cut_short(small_cap: None) -> None:
    """The cap is at least 4 tokens a minLength character: a value the schema requires fits."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "minLength": 40}},
        "required": ["s"]}}}]
    d = _drive(xml_grammar("required", tools=tools), "<tool_call>\n<function=f>\n<parameter=s>\n")
    assert d.write(PROSE) > 4 * 40
    assert d.forced().startswith("\n</parameter>\n</function>\n")


def test_a_free_form_parameter_name_is_capped() -> None:
    named = {"type": "function", "function": {"name": "ping"}}
    d = _drive(xml_grammar(named), "<tool_call>\n<function=ping>\n<parameter=")
    assert d.write("key_" * 200) == getattr(xml_tools, "KEY_MAX_TOKENS", None)
    assert d.forced() == ">"


def test_many_tools_of_raw_text_compile_and_drive_quickly() -> None:
    """Two capped terminals a raw value cost the lexer little: 50 tools of 20 string
    parameters compile and drive a call well within the grammar limits."""
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {f"p{j}": {"type": "string"} for j in range(20)}}}}
        for i in range(50)]
    start = time.monotonic()
    d = _drive(xml_grammar("required", tools=tools),
               call("f7", ("p0", "hello"), ("p19", "two\nlines")))
    assert d.m.is_accepting()
    assert time.monotonic() - start < 10


# Issue 52.2: a raw-text parameter with minLength/maxLength. The bound used to be intersected
# with `~/…</parameter>…/` in one lexeme, whose lexer ran out of step fuel ("too many
# expressions constructed") computing a mask a few dozen characters into the value, i.e. the
# request failed mid-generation; minLength 5000 did not compile ("fuel exhausted").
TEXT = ("Some <b>bold</b> text\n</param x </parameter_ <</parameter é日本😀 \t--  "
        "and more words to go on with. ") * 400


def _bounded(*bounds: dict[str, Any], nullable: bool = False) -> list[dict[str, Any]]:
    """One tool, ``f``, whose string parameters ``s0``, ``s1``… carry ``bounds``."""
    def prop(b: dict[str, Any]) -> dict[str, Any]:
        s = {"type": "string", **b}
        return {"anyOf": [s, {"type": "null"}]} if nullable else s
    props = {f"s{j}": prop(b) for j, b in enumerate(bounds)}
    return [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": props, "required": list(props)}}}]


def _fill(d: Driver, text: str) -> str:
    """Write as much of ``text`` as the mask lets through: its tokens, then (where a token
    would overrun the bound) one character at a time; the text written."""
    before = d.text()
    d.write(text)
    for ch in text[len(d.text()) - len(before):]:
        if d.write(ch) < len(d.tok.tokenize_str(ch)):
            break
    return d.text()[len(before):]


def _closes(d: Driver, rest: str) -> bool:
    """Whether all of ``rest`` can be written now (``d`` moves on as far as it fits)."""
    return d.write(rest) == len(d.tok.tokenize_str(rest))


@pytest.mark.parametrize("high", [64, 1000, 10_000])
@pytest.mark.parametrize("nullable", [False, True])
def test_a_max_length_value_ends_at_max_length(high: int, nullable: bool) -> None:
    """The value takes exactly maxLength characters of prose (never more: then only the close
    fits), the call closes, and the argument is those characters; a second parameter with
    another bound after it, so that two bounded lexemes share the lexer."""
    d = _drive(xml_grammar("required", tools=_bounded({"maxLength": high}, {"maxLength": 40},
                                                      nullable=nullable)),
               "<tool_call>\n<function=f>\n<parameter=s0>\n")
    value = _fill(d, TEXT)
    assert value == TEXT[:high]
    assert d.forced() == "\n</parameter>\n<parameter=s1>"  # then "\n" and the value
    assert _fill(d, "\n" + TEXT[7:]) == "\n" + TEXT[7:47]
    assert _closes(d, "\n</parameter>\n</function>\n</tool_call>") and d.m.is_accepting()
    args = json.loads(parse_tool_calls(d.text(), _bounded()).tool_calls[0].arguments)
    assert args == {"s0": TEXT[:high], "s1": TEXT[7:47]}


@pytest.mark.parametrize(("low", "high"), [(40, None), (40, 50), (3000, None), (2000, 2500)])
def test_a_min_length_value_cannot_close_early(low: int, high: int | None) -> None:
    """Short of minLength the closing tag does not fit (`\\n</parameter>` is refused after a
    value of low - 1 characters), at minLength it does."""
    bounds = {"minLength": low} if high is None else {"minLength": low, "maxLength": high}
    grammar = xml_grammar("required", tools=_bounded(bounds))
    head = "<tool_call>\n<function=f>\n<parameter=s0>\n"
    short = _drive(grammar, head + TEXT[:low - 1])
    assert not _closes(short, "\n</parameter>\n</function>")
    enough = _drive(grammar, head + TEXT[:low])
    assert _closes(enough, "\n</parameter>\n</function>\n</tool_call>")
    assert enough.m.is_accepting()


def test_a_bounded_value_still_cannot_hold_the_closing_tag() -> None:
    d = _drive(xml_grammar("required", tools=_bounded({"maxLength": 100})),
               "<tool_call>\n<function=f>\n<parameter=s0>\n")
    assert _fill(d, "a</parameter>b") == "a</parameter"
    assert d.forced() == ""  # `>` refused; `\n</parameter>` (or more value) may follow


@pytest.mark.parametrize(("bounds", "named"), [
    ([{"maxLength": 100_000}], "parameter 's0': maxLength 100000"),
    ([{"minLength": 5000}], "parameter 's0': minLength 5000"),
    ([{"minLength": 5000, "maxLength": 6000}], "parameter 's0': minLength 5000"),
    ([{"maxLength": 8000}, {"maxLength": 7000}], "parameter 's1': maxLength 7000"),
    ([{"minLength": 2000}, {"minLength": 1500}], "parameter 's1': minLength 1500"),
    ([{"minLength": 9, "maxLength": 8}], "parameter 's0': minLength 9 is above maxLength 8"),
    ([{"maxLength": -1}], "parameter 's0': maxLength must be a non-negative integer"),
    ([{"minLength": 2.5}], "parameter 's0': minLength must be a non-negative integer"),
])
def test_a_bound_past_what_the_grammar_can_count_is_refused(bounds: list[dict[str, Any]],
                                                            named: str) -> None:
    """Refused before generation (a 400 naming `tools`, the function, the parameter and the
    bound), never a lexer failure partway through the value."""
    with pytest.raises(Exception) as info:
        xml_grammar("required", tools=_bounded(*bounds))
    assert getattr(info.value, "param", None) == "tools"
    assert "function 'f'" in str(info.value) and named in str(info.value), str(info.value)


def test_the_length_budget_is_shared_by_the_tools_and_counts_a_bound_once() -> None:
    """The budget spans every tool of the grammar (one lexer), and the same bounds on several
    parameters are one lexeme (counted once)."""
    half = xml_tools.BOUND_CHARS // 2 + 1
    tool = _bounded({"maxLength": half})[0]
    other = json.loads(json.dumps(tool).replace('"f"', '"g"').replace(str(half), str(half + 1)))
    with pytest.raises(Exception) as info:
        xml_grammar("required", tools=[tool, other])
    assert "function 'g', parameter 's0': maxLength" in str(info.value)
    assert xml_grammar({"type": "function", "function": {"name": "g"}}, tools=[tool, other])
    same = _bounded(*[{"maxLength": half}] * 5)
    assert xml_grammar("required", tools=same)


@pytest.mark.parametrize(("low", "high"), [(3000, None), (0, 12_000)])
def test_the_largest_bounds_compile_and_drive(low: int, high: int | None) -> None:
    """The budget's own limits work: the grammar compiles and the first masks of the value
    are computed (BOUND_CHARS and MIN_LENGTH_CHARS, each the whole budget on one parameter)."""
    bounds = {"minLength": low} if high is None else {"maxLength": high}
    d = _drive(xml_grammar("required", tools=_bounded(bounds)),
               "<tool_call>\n<function=f>\n<parameter=s0>\n")
    assert len(_fill(d, TEXT[:200])) == 200


def test_the_no_close_regex_is_text_without_the_closing_tag() -> None:
    """xml_tools._NO_CLOSE (written out, without `~`) against its definition, on strings made
    of the tag's pieces."""
    import random
    import re
    rx = re.compile(xml_tools._NO_CLOSE.replace("\\/", "/"), re.DOTALL)
    tag, rnd = "</parameter>", random.Random(5)
    pieces = [*"</parameter>x\n", *(tag[:k] for k in range(1, 13))]
    for _ in range(20_000):
        s = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 12)))
        assert bool(rx.fullmatch(s)) == (tag not in s), s
