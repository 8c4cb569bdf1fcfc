"""repetition_detection: vLLM's rule, and an engine output it ends early (text kept)."""

from __future__ import annotations

import pytest

from kiln.engine.repetition import REPETITION, RepetitionDetection, repeats
from tests.engine.drive import drive, text, token_ids
from tests.engine.fakes import ScriptRunner
from tests.engine.test_output_processor import make, req


@pytest.mark.parametrize(("tokens", "rule", "want"), [
    ([1, 2, 1, 2, 1, 2], RepetitionDetection(2, 3), True),
    ([1, 2, 1, 2, 1], RepetitionDetection(2, 3), False),  # the tail is no third copy yet
    ([9, 1, 2, 1, 2], RepetitionDetection(2, 3), False),
    ([5, 5, 5], RepetitionDetection(3, 3), True),  # pattern size 1 is tried first
    ([5, 5, 5], RepetitionDetection(3, 3, min_pattern_size=2), False),
    ([1, 2, 3, 1, 2, 3], RepetitionDetection(2, 2), False),  # a 3-token loop, sizes up to 2
    ([1, 2, 3, 1, 2, 3], RepetitionDetection(3, 2), True),
])
def test_rule(tokens: list[int], rule: RepetitionDetection, want: bool) -> None:
    assert repeats(tokens, rule) is want


@pytest.mark.parametrize("bad", [(0, 2, 1), (2, 1, 1), (2, 2, 3)])
def test_rules_that_detect_nothing_are_refused(bad: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        RepetitionDetection(*bad)


def test_a_looping_output_stops_early_with_its_text() -> None:
    sched, stage = make()
    runner = ScriptRunner({"a": [7, 0, 1, 0, 1, 0, 1, 2, 3, 4]})  # "h" then "ab" x 3
    outs = drive(sched, runner, [req("a", max_tokens=10,
                                     repetition_detection=RepetitionDetection(4, 3))],
                 output=stage)["a"]
    assert token_ids(outs) == [7, 0, 1, 0, 1, 0, 1]
    assert text(outs) == "hababab"  # the last token makes text, unlike EOS
    assert (outs[-1].finish_reason, outs[-1].stop_reason) == ("stop", REPETITION)
    assert sched.pool.num_used_blocks == 0
