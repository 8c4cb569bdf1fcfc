"""Engine RequestMetrics -> the contract's performance metadata and latency diagnostics.

Phases Kiln-for-Python measures: queue (arrival -> first scheduled), admission (arrival -> engine
thread receipt), prefill, decode, tokenization. Stalls are gaps > 3x the median inter-token gap,
attributed to the engine phase recorded with the late token; phases this server has no notion of
(graph capture, training, ...) are reported as null or 0, never invented.
"""

from __future__ import annotations

from typing import Any

from kiln.api._generated import wire
from kiln.api.state import Finish
from kiln.engine.outputs import PHASE_DECODE, PHASE_PREEMPTED, PHASE_PREFILL, RequestMetrics

MAX_GAP_SAMPLES = 8192
STALL_REASONS = (
    "actor_queue", "actor_admission", "actor_prefill", "actor_decode", "actor_cycle_idle",
    "response_delivery", "handler_queue", "client_delivery", "sampling", "readback",
    "gpu_lock_wait", "graph_capture", "graph_replay", "synchronization", "resize", "trim",
    "adapter", "training", "unexplained",
)  # fmt: skip
_PHASE_TO_REASON = {
    PHASE_DECODE: "actor_decode",
    PHASE_PREFILL: "actor_prefill",
    PHASE_PREEMPTED: "trim",
}
_NULL_PHASES = (
    "actor_cycle_idle_ms", "sampling_ms", "readback_ms", "response_delivery_ms",
    "handler_queue_ms", "client_delivery_ms", "gpu_lock_wait_ms", "graph_capture_ms",
    "graph_replay_ms", "synchronization_ms", "resize_ms", "trim_ms", "adapter_ms", "training_ms",
    "unexplained_ms",
)  # fmt: skip


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(max(0.0, seconds) * 1000.0, 3)


def latency(m: RequestMetrics, tokenization_s: float | None) -> wire.RequestLatencyDiagnostics:
    gaps = m.inter_token_latencies
    retained = gaps[:MAX_GAP_SAMPLES]
    median = m.itl_percentile(0.5)
    reasons = dict.fromkeys(STALL_REASONS, 0)
    for stall in m.stalls:
        reasons[_PHASE_TO_REASON.get(stall.phase, "unexplained")] += 1
    admission = None if m.admitted_time is None else m.admitted_time - m.arrival_time
    phases: dict[str, Any] = {
        "actor_queue_ms": ms(m.queue_time),
        "actor_admission_ms": ms(admission),
        "tokenization_ms": ms(tokenization_s),
        "prefill_ms": ms(m.prefill_time),
        "decode_ms": ms(m.decode_time),
    }
    phases.update(dict.fromkeys(_NULL_PHASES, None))
    return wire.RequestLatencyDiagnostics(
        emitted_tokens=len(m.token_times),
        gap_samples=len(gaps),
        retained_gap_samples=len(retained),
        gap_samples_truncated=len(gaps) > MAX_GAP_SAMPLES,
        ttft_ms=ms(m.ttft),
        itl_ms_p50=ms(median),
        itl_ms_p99=ms(m.itl_percentile(0.99)),
        itl_ms_p999=ms(m.itl_percentile(0.999)),
        max_itl_ms=ms(max(gaps)) if gaps else None,
        stall_threshold_ms=ms(m.stall_threshold),
        stall_count=len(m.stalls),
        unexplained_stall_count=reasons["unexplained"],
        stall_reasons=wire.LatencyStallReasonCounts(**reasons),
        phases=wire.LatencyPhaseTimings(**phases),
    )


def performance(
    m: RequestMetrics | None,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    total_latency_s: float,
    adapter: str,
    thinking_mode: str,
    finish_reason: Finish,
    tokenization_s: float | None,
    choice_tokens: int | None = None,
) -> wire.ChatCompletionPerformanceMetadata:
    """``m`` is the first choice's record (docs/behavior.md §13); ``choice_tokens`` that choice's
    completion tokens (default: ``completion_tokens``, the response's), so that with n > 1 the
    decode rate is one choice's tokens over that choice's decode time. The rate counts the
    tokens after the first (decode time runs from the first token to the last)."""
    decode_s = None if m is None else m.decode_time
    tokens = completion_tokens if choice_tokens is None else choice_tokens
    tps = None
    if decode_s and tokens > 1:
        tps = round((tokens - 1) / decode_s, 3)
    admission = None
    if m is not None and m.admitted_time is not None:
        admission = m.admitted_time - m.arrival_time
    wall = None
    if m is not None and m.first_scheduled_time is not None and m.prefill_end_time is not None:
        wall = m.prefill_end_time - m.first_scheduled_time
    return wire.ChatCompletionPerformanceMetadata(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        ttft_ms=None if m is None else ms(m.ttft),
        prefill_ms=None if m is None else ms(m.prefill_time),
        actor_queue_ms=None if m is None else ms(m.queue_time),
        actor_admission_ms=ms(admission),
        actor_prefill_wall_ms=ms(wall),
        resident_prefill_used=None,
        decode_ms=ms(decode_s),
        total_latency_ms=ms(total_latency_s) or 0.0,
        decode_tokens_per_sec=tps,
        adapter_used=adapter,
        thinking_mode=thinking_mode,
        finish_reason=finish_reason,
        latency=None if m is None else latency(m, tokenization_s),
    )
