"""Per-request timing records, filled by the scheduler on the engine thread.

All times are ``time.monotonic()`` seconds. Enough to derive queue time, TTFT, prefill and decode
durations, inter-token latency percentiles and stalls (the contract's latency diagnostics).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

# A gap >= max(STALL_FLOOR_S, STALL_FACTOR x median ITL) is a stall (docs/behavior.md §13).
STALL_FACTOR = 5.0
STALL_FLOOR_S = 0.25

# Phase tags recorded with every token (what the engine did in the step that produced it).
PHASE_DECODE = "decode"  # a pure decode step
PHASE_PREFILL = "prefill_interference"  # the step also ran prefill chunks
PHASE_PREEMPTED = "preemption_recompute"  # this request was preempted since its last token


@dataclass(frozen=True)
class Stall:
    token_index: int  # index of the token that arrived late
    gap_s: float
    phase: str


@dataclass
class RequestMetrics:
    arrival_time: float
    admitted_time: float | None = None  # accepted by the engine thread
    first_scheduled_time: float | None = None
    prefill_start_time: float | None = None
    prefill_end_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    token_phases: list[str] = field(default_factory=list)
    num_preemptions: int = 0
    stalls: list[Stall] = field(default_factory=list)

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def prefill_time(self) -> float | None:
        if self.prefill_start_time is None or self.prefill_end_time is None:
            return None
        return self.prefill_end_time - self.prefill_start_time

    @property
    def decode_time(self) -> float | None:
        if self.first_token_time is None or not self.token_times:
            return None
        return self.token_times[-1] - self.first_token_time

    @property
    def inter_token_latencies(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    def itl_percentile(self, q: float) -> float | None:
        """R-7 (linear interpolation) percentile of the inter-token gaps, q in [0, 1]."""
        return percentile(self.inter_token_latencies, q)

    def record_token(self, now: float, phase: str) -> None:
        if self.first_token_time is None:
            self.first_token_time = now
        self.token_times.append(now)
        self.token_phases.append(phase)

    @property
    def stall_threshold(self) -> float | None:
        """max(250 ms, 5 x the median gap); None without gaps."""
        median = percentile(self.inter_token_latencies, 0.5)
        return None if median is None else max(STALL_FLOOR_S, STALL_FACTOR * median)

    def finalize(self, now: float) -> None:
        """Close the record: finish time and stalls (gaps at or above ``stall_threshold``)."""
        self.finished_time = now
        threshold = self.stall_threshold
        self.stalls = []
        if threshold is None:
            return
        for i, gap in enumerate(self.inter_token_latencies):
            if gap >= threshold:
                self.stalls.append(Stall(i + 1, gap, self.token_phases[i + 1]))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    h = (len(xs) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])
