"""The thinking-budget controller (docs/behavior.md §3.4, §3.5), the pre-decode checks (§3.3) and
budget resolution (§3.1)."""

from __future__ import annotations

import pytest
from msgspec import UNSET

from kiln.text.thinking import Outcome, resolve
from kiln.text.thinking_budget import (
    ThinkingBudgetController,
    close_progress,
    validate_budget,
)

CLOSE = (90, 91, 92)


def drive(
    ctl: ThinkingBudgetController,
    samples: list[int],
    times: list[float] | None = None,
) -> tuple[list[int], list[bool]]:
    """Feed ``samples`` as the model's candidates; -> (emitted tokens, forced flags)."""
    generated: list[int] = []
    forced: list[bool] = []
    for i, cand in enumerate(samples):
        tok, f = ctl.decide(generated, cand, times[i] if times else 0.0)
        generated.append(tok)
        forced.append(f)
    return generated, forced


def test_reference_example_two_token_budget() -> None:
    ctl = ThinkingBudgetController(CLOSE, 2, None, 100)
    out, forced = drive(ctl, [10, 11, 12, 13, 14, 15, 16])
    assert out == [10, 11, 90, 91, 92, 15, 16]
    assert forced == [False, False, True, True, True, False, False]
    assert ctl.outcome(len(out)) == Outcome(
        triggered=True, closed=True, thinking_tokens=2, thinking_time_ms=0, trigger="tokens")


def test_forcing_emits_close_token_even_when_candidate_equals_it() -> None:
    ctl = ThinkingBudgetController(CLOSE, 1, None, 100)
    out, forced = drive(ctl, [10, 5, 91, 92, 7])
    assert out == [10, 90, 91, 92, 7]
    assert forced == [False, True, True, True, False]  # 91/92 sampled, still reported forced


def test_zero_budget_closes_at_first_decode_candidate() -> None:
    ctl = ThinkingBudgetController(CLOSE, 0, None, 100)
    out, forced = drive(ctl, [10, 11, 12, 13])
    assert out == [90, 91, 92, 13] and forced == [True, True, True, False]
    o = ctl.outcome(4)
    assert (o.triggered, o.trigger, o.closed, o.thinking_tokens) == (True, "tokens", True, 0)


def test_time_trigger_with_fake_clock_and_frozen_elapsed() -> None:
    ctl = ThinkingBudgetController(CLOSE, None, 100, 1000)
    # start at the first candidate (t=1000); 100 ms elapsed at the 4th boundary
    times = [1000.0, 1040.0, 1080.0, 1100.0, 1150.0, 1200.0, 1900.0]
    out, forced = drive(ctl, [1, 2, 3, 4, 5, 6, 7], times)
    assert out == [1, 2, 3, 90, 91, 92, 7]
    assert forced == [False] * 3 + [True] * 3 + [False]
    o = ctl.outcome(len(out), now_ms=5000.0)
    assert o == Outcome(triggered=True, closed=True, thinking_tokens=3, thinking_time_ms=100,
                        trigger="time")


def test_natural_close_is_not_triggered() -> None:
    ctl = ThinkingBudgetController(CLOSE, 10, None, 100)
    out, forced = drive(ctl, [1, 2, 90, 91, 92, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    assert out == [1, 2, 90, 91, 92, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # budget no longer counts
    assert not any(forced)
    assert ctl.outcome(len(out)) == Outcome(
        triggered=False, closed=True, thinking_tokens=2, thinking_time_ms=0)


def test_natural_close_wins_at_the_trigger_boundary() -> None:
    ctl = ThinkingBudgetController(CLOSE, 2, None, 100)
    out, forced = drive(ctl, [1, 2, 90, 91, 92, 5])
    assert out == [1, 2, 90, 91, 92, 5] and not any(forced)
    o = ctl.outcome(len(out))
    assert (o.triggered, o.trigger, o.closed, o.thinking_tokens) == (False, None, True, 2)


def test_natural_path_then_force_when_model_strays_mid_close() -> None:
    ctl = ThinkingBudgetController(CLOSE, 2, None, 100)
    out, forced = drive(ctl, [1, 2, 90, 7, 8, 9])
    # 90 was sampled (natural path at the boundary); then the model strays: 91, 92 forced
    assert out == [1, 2, 90, 91, 92, 9]
    assert forced == [False, False, False, True, True, False]
    o = ctl.outcome(len(out))
    assert (o.trigger, o.closed, o.thinking_tokens) == ("tokens", True, 2)


def test_close_progress_when_model_starts_close_itself() -> None:
    ctl = ThinkingBudgetController(CLOSE, 3, None, 100)
    out, forced = drive(ctl, [1, 2, 90, 5, 6])
    # after [1, 2, 90] thinking = 3 - 1 = 2 < 3: the stray 5 is accepted (progress resets)
    assert out[:4] == [1, 2, 90, 5] and forced[:4] == [False] * 4
    # at [1, 2, 90, 5] thinking = 4 >= 3: force from the start of the close sequence
    assert out[4] == 90 and forced[4]
    ctl2 = ThinkingBudgetController(CLOSE, 2, None, 100)
    out2, forced2 = drive(ctl2, [1, 90, 7, 8, 9])
    # [1, 90]: progress 1, thinking 1 < 2 -> accept 7; [1, 90, 7]: thinking 3 -> force 90..92
    assert out2 == [1, 90, 7, 90, 91] and forced2 == [False, False, False, True, True]
    ctl3 = ThinkingBudgetController(CLOSE, 1, None, 100)
    out3, forced3 = drive(ctl3, [1, 90, 7, 8])
    # [1, 90]: progress 1, thinking 1 >= 1 -> forced continues at close[1]
    assert out3 == [1, 90, 91, 92] and forced3 == [False, False, True, True]
    o = ctl3.outcome(4)
    assert (o.trigger, o.closed, o.thinking_tokens) == ("tokens", True, 1)


def test_close_progress_helper() -> None:
    assert close_progress([], CLOSE) == 0
    assert close_progress([1, 90], CLOSE) == 1
    assert close_progress([1, 90, 91], CLOSE) == 2
    assert close_progress([90, 91, 92], CLOSE) == 0  # proper prefixes only
    assert close_progress([5, 5], (5, 5, 6)) == 2
    assert close_progress([5], (5,)) == 0


def test_max_tokens_trigger_fits_close_in_completion() -> None:
    ctl = ThinkingBudgetController(CLOSE, None, None, 6)
    out, forced = drive(ctl, [1, 2, 3, 4, 5, 6])
    assert out == [1, 2, 3, 90, 91, 92]
    assert forced == [False, False, False, True, True, True]
    o = ctl.outcome(6)
    assert (o.triggered, o.trigger, o.closed, o.thinking_tokens) == (True, "max_tokens", True, 3)


def test_tokens_and_time_at_same_boundary_reports_tokens() -> None:
    ctl = ThinkingBudgetController(CLOSE, 2, 50, 100)
    out, _ = drive(ctl, [1, 2, 3, 4, 5], [0.0, 10.0, 50.0, 60.0, 70.0])
    assert out[:3] == [1, 2, 90]
    assert ctl.outcome(5).trigger == "tokens"
    ctl2 = ThinkingBudgetController(CLOSE, 2, 50, 100)
    out2, _ = drive(ctl2, [1, 2, 3], [0.0, 50.0, 60.0])
    assert out2 == [1, 90, 91] and ctl2.outcome(3).trigger == "time"


def test_single_token_close_sequence() -> None:
    ctl = ThinkingBudgetController((7,), 2, None, 100)
    out, forced = drive(ctl, [1, 2, 3, 4])
    assert out == [1, 2, 7, 4] and forced == [False, False, True, False]
    assert ctl.outcome(4) == Outcome(True, True, 2, 0, "tokens")
    nat = ThinkingBudgetController((7,), 5, None, 100)
    out2, _ = drive(nat, [1, 7, 2])
    assert out2 == [1, 7, 2] and nat.outcome(3) == Outcome(False, True, 1, 0)


def test_unclosed_and_mid_sequence_outcomes() -> None:
    ctl = ThinkingBudgetController(CLOSE, None, None, 100)
    drive(ctl, [1, 2, 3], [0.0, 20.0, 30.0])
    # never closed, no trigger: thinking_tokens = completion count; elapsed is live
    assert ctl.outcome(3, now_ms=45.0) == Outcome(False, False, 3, 45)
    mid = ThinkingBudgetController(CLOSE, 1, None, 100)
    drive(mid, [1, 2])  # 1 accepted, 90 forced, then the request ended
    assert mid.outcome(2) == Outcome(True, False, 1, 0, "tokens")


def test_untouched_controller_outcome() -> None:
    ctl = ThinkingBudgetController(CLOSE, 5, None, 100)
    assert ctl.outcome(0) == Outcome(False, False, 0, 0)


def test_controller_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        ThinkingBudgetController((), 1, None, 10)
    with pytest.raises(ValueError):
        ThinkingBudgetController(CLOSE, -1, None, 10)


CAP = 'effective max_tokens 2 cannot fit the 3-token "</think>" thinking close sequence'


@pytest.mark.parametrize(
    ("roundtrip", "close_len", "max_tokens", "stops", "expect"),
    [
        (True, 3, 3, (), None),
        (True, 3, 100, ("\n\n", "END", "</answer>", "a"), None),
        (False, 3, 100, (), "decode back"),
        (True, 3, 2, (), CAP),
        (True, 1, 0, (), "effective max_tokens 0 cannot fit the 1-token"),
        (True, 3, 100, ("",), "conflicts"),
        (True, 3, 100, ("think",), "conflicts"),  # contained in the tag
        (True, 3, 100, (">",), "conflicts"),
        (True, 3, 100, ("</think>",), "conflicts"),
        (True, 3, 100, ("x</think>y",), "conflicts"),  # contains the tag
        (True, 3, 100, ("answer</",), "conflicts"),  # stop suffix == tag prefix
        (True, 3, 100, ("nk>then",), "conflicts"),  # tag suffix == stop prefix
        (True, 3, 100, ("ok", "x<"), "conflicts"),
    ],
)
def test_validate_budget(roundtrip: bool, close_len: int, max_tokens: int,
                         stops: tuple[str, ...], expect: str | None) -> None:
    msg = validate_budget(roundtrip, close_len, max_tokens, stops)
    if expect is None:
        assert msg is None
    else:
        assert msg is not None and expect in msg


DEFAULTS = (64, 1500)


@pytest.mark.parametrize(
    ("tokens", "ms", "defaults", "effective"),
    [
        (0, UNSET, DEFAULTS, {"configured": True, "max_tokens": 0, "max_time_ms": 1500,
                              "tokens_source": "request", "time_source": "server_default"}),
        (UNSET, None, DEFAULTS, {"configured": True, "max_tokens": 64,
                                 "tokens_source": "server_default",
                                 "time_source": "request_unlimited"}),
        (UNSET, UNSET, DEFAULTS, {"configured": True, "max_tokens": 64, "max_time_ms": 1500,
                                  "tokens_source": "server_default",
                                  "time_source": "server_default"}),
        (None, None, DEFAULTS, {"configured": False, "tokens_source": "request_unlimited",
                                "time_source": "request_unlimited"}),
        (UNSET, UNSET, (None, None), {"configured": False, "tokens_source": "unlimited",
                                      "time_source": "unlimited"}),
        (128, 250, (None, None), {"configured": True, "max_tokens": 128, "max_time_ms": 250,
                                  "tokens_source": "request", "time_source": "request"}),
        (None, UNSET, (None, 900), {"configured": True, "max_time_ms": 900,
                                    "tokens_source": "request_unlimited",
                                    "time_source": "server_default"}),
    ],
)
def test_resolution_conformance(tokens: object, ms: object, defaults: tuple[int | None, ...],
                                effective: dict[str, object]) -> None:
    cfg = resolve(tokens, ms, defaults[0], defaults[1])
    assert cfg.effective() == effective
    assert list(cfg.effective()) == list(effective)  # field order


def test_budget_problem_names_the_field_at_fault() -> None:
    from kiln.text.thinking_budget import budget_problem

    assert budget_problem(True, 3, 100, ()) is None
    assert budget_problem(False, 3, 100, ())[1] is None  # type: ignore[index]  # the tokenizer
    assert budget_problem(True, 3, 2, ())[1] == "max_tokens"  # type: ignore[index]
    assert budget_problem(True, 3, 100, ("ok", "</thi"))[1] == "stop"  # type: ignore[index]
