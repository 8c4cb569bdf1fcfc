from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.engine.output_processor import StopChecker
from kiln.engine.outputs import PHASE_DECODE, PHASE_PREFILL, RequestMetrics, percentile


class ChunkDetok:
    """Token i decodes to chunks[i]; text may arrive in multi-character pieces."""

    def __init__(self, chunks: list[str], tail: str = "") -> None:
        self.chunks = chunks
        self.tail = tail

    def push(self, token_id: int) -> str:
        return self.chunks[token_id]

    def flush(self) -> str:
        return self.tail


def oracle(chunks: list[str], stops: list[str]) -> tuple[str, str | None]:
    seen = ""
    for c in chunks:
        seen += c
        found = [(seen.find(s), s) for s in stops if s and s in seen]
        if found:
            i, s = min(found, key=lambda f: (f[0], len(f[1])))
            return seen[:i], s
    return seen, None


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.text(alphabet="ab c", max_size=3), max_size=12),
       stops=st.lists(st.text(alphabet="ab c", min_size=1, max_size=4), max_size=3))
def test_stop_strings_never_leak_and_cut_at_first_match(chunks: list[str], stops: list[str]
                                                        ) -> None:
    checker = StopChecker(ChunkDetok(chunks), stops)
    emitted = ""
    matched: str | None = None
    for i in range(len(chunks)):
        delta, m = checker.push(i)
        emitted += delta
        assert not any(s in emitted for s in stops)  # never on the wire, not even whole
        if m is not None:
            matched = m
            break
    if matched is None:
        delta, matched = checker.finish()
        emitted += delta
    want_text, want_stop = oracle(chunks, stops)
    assert emitted == want_text
    assert matched == want_stop


def test_held_prefix_released_when_generation_ends() -> None:
    checker = StopChecker(ChunkDetok(["hello wo", "r"], tail="!"), ["world"])
    assert checker.push(0) == ("hello ", None)  # "wo" could start "world"
    assert checker.push(1) == ("", None)
    assert checker.finish() == ("wor!", None)


def test_stall_detection_and_percentiles() -> None:
    m = RequestMetrics(arrival_time=0.0)
    t = 1.0
    phases = [PHASE_DECODE] * 6 + [PHASE_PREFILL] + [PHASE_DECODE] * 3
    for i, phase in enumerate(phases):
        t += 1.0 if i == 6 else 0.1
        m.record_token(t, phase)
    m.finalize(t)
    assert m.ttft == 1.1
    assert len(m.stalls) == 1 and m.stalls[0].token_index == 6
    assert m.stalls[0].phase == PHASE_PREFILL
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5 and percentile([], 0.5) is None
    assert m.stall_threshold == pytest.approx(0.5)  # 5 x the 0.1 s median


def test_stall_threshold_has_a_250_ms_floor() -> None:
    """docs/behavior.md §13: max(250 ms, 5 x p50). With 3 x p50 and no floor a plain 64-token CPU
    stream (p50 ~4 ms) had reported 17 'stalls' of ~15 ms."""
    m = RequestMetrics(arrival_time=0.0)
    t = 0.0
    for gap in [0.004] * 20 + [0.2, 0.004, 0.3, 0.004]:
        t += gap
        m.record_token(t, PHASE_DECODE)
    m.finalize(t)
    assert m.stall_threshold == 0.25
    assert [(s.token_index, round(s.gap_s, 6)) for s in m.stalls] == [(22, 0.3)]
