"""Reasoning separation: streamed splitting equals the one-shot split for any cut points."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.text.thinking import ReasoningSplitter, fold, prompt_starts_in_reasoning, split_reasoning

PIECES = st.sampled_from(["<think>", "</think>", "</", "think>", "<", ">", "a", " b", "\n", "é", "</thi"])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(parts=st.lists(PIECES, max_size=12), cuts=st.lists(st.integers(0, 60), max_size=8),
       in_reasoning=st.booleans())
def test_stream_split_equals_one_shot(parts: list[str], cuts: list[int], in_reasoning: bool) -> None:
    text = "".join(parts)
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    splitter = ReasoningSplitter(in_reasoning)
    reasoning, content = "", ""
    for chunk in chunks:
        d = splitter.push(chunk)
        reasoning += d.reasoning
        content += d.content
        if in_reasoning and "</think>" not in text[: len(reasoning)]:
            assert "</think>" not in reasoning  # never leaks the tag
    tail = splitter.flush()
    reasoning += tail.reasoning
    content += tail.content
    want_reasoning, want_content = split_reasoning(text, in_reasoning)
    assert (reasoning or None, content) == (want_reasoning, want_content)


def test_prompt_detection_and_fold() -> None:
    assert prompt_starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert split_reasoning("plan</think>answer", True) == ("plan", "answer")
    assert split_reasoning("plan only", True) == ("plan only", "")
    assert split_reasoning("x</think>y", False) == (None, "x</think>y")
    assert fold("r", "c") == "<think>\nr</think>\n\nc"
    assert fold("r", "") == "<think>\nr</think>"
    assert fold(None, "c") == "c"
