"""The performance metadata built from a request's timing record (docs/behavior.md §13)."""

from __future__ import annotations

import msgspec
import pytest

from kiln.api.contract import contract
from kiln.api.replies.perf import performance
from kiln.engine.outputs import PHASE_DECODE, RequestMetrics


def record(gaps: list[float]) -> RequestMetrics:
    m = RequestMetrics(arrival_time=0.0, admitted_time=0.001, first_scheduled_time=0.002,
                       prefill_start_time=0.002, prefill_end_time=0.05)
    t = 0.05
    m.record_token(t, PHASE_DECODE)
    for gap in gaps:
        t += gap
        m.record_token(t, PHASE_DECODE)
    m.finalize(t)
    return m


def test_n_choices_rate_is_the_first_choices_own() -> None:
    """With n = 3 the record is choice 0's (6 tokens over 0.5 s of decode): its rate is 5 / 0.5,
    not the response's 18 tokens over choice 0's time."""
    m = record([0.1] * 5)
    perf = performance(m, prompt_tokens=7, completion_tokens=18, choice_tokens=6,
                       total_latency_s=0.6, adapter="base", thinking_mode="non_reasoning",
                       finish_reason="length", tokenization_s=0.001)
    assert perf.completion_tokens == 18
    assert perf.decode_tokens_per_sec == pytest.approx(10.0)
    assert perf.latency is not None and perf.latency.emitted_tokens == 6
    assert perf.latency.stall_threshold_ms == pytest.approx(500.0)
    wire = msgspec.to_builtins(perf)  # what the response carries
    assert contract().first_violation("ChatCompletionPerformanceMetadata", wire) is None
