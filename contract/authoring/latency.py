"""The request latency diagnostics definitions."""

from __future__ import annotations

from .common import F, Schema, obj


def latency_defs() -> dict[str, Schema]:
    """RequestLatencyDiagnostics, its phase timings and stall reason counts."""
    defs: dict[str, Schema] = {}
    defs["LatencyPhaseTimings"] = obj(
        "Bounded request phase timings; null means the serving path did not measure that subphase.",
        [
            F(
                "actor_queue_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time waiting for the batching actor to receive the request.",
            ),
            F(
                "actor_admission_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time between actor receipt and workload admission.",
            ),
            F(
                "tokenization_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time spent rendering and tokenizing the prompt.",
            ),
            F(
                "prefill_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Measured accelerator time spent processing prompt tokens.",
            ),
            F(
                "decode_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Measured accelerator time spent generating tokens.",
            ),
            F(
                "actor_cycle_idle_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Intentional batching-actor pacing time.",
            ),
            F(
                "sampling_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time spent selecting output tokens from logits.",
            ),
            F(
                "readback_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time spent transferring inference results to the host.",
            ),
            F(
                "response_delivery_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time from token readiness to producer handoff.",
            ),
            F(
                "handler_queue_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time from producer handoff to HTTP-handler receipt.",
            ),
            F(
                "client_delivery_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time from handler receipt to response-body enqueue.",
            ),
            F(
                "gpu_lock_wait_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time waiting for exclusive accelerator ownership.",
            ),
            F(
                "graph_capture_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time spent capturing an accelerator graph.",
            ),
            F(
                "graph_replay_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time spent submitting an accelerator graph replay.",
            ),
            F(
                "synchronization_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time spent waiting for accelerator synchronization.",
            ),
            F(
                "resize_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time spent resizing runtime-owned storage.",
            ),
            F(
                "trim_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time spent trimming or reclaiming runtime-owned storage.",
            ),
            F(
                "adapter_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time spent loading, composing, or applying an adapter.",
            ),
            F(
                "training_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time blocked by accelerator work owned by training.",
            ),
            F(
                "unexplained_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Measured latency not covered by another reported phase.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "LatencyPhaseTimings"},
    )
    defs["LatencyStallReasonCounts"] = obj(
        "Number of retained inter-token stalls attributed to each bounded phase.",
        [
            F(
                "actor_queue",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to batching-actor queueing.",
            ),
            F(
                "actor_admission",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to batching-actor admission.",
            ),
            F(
                "actor_prefill",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to another request's actor-owned prefill.",
            ),
            F(
                "actor_decode",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to actor-owned decode work.",
            ),
            F(
                "actor_cycle_idle",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to intentional actor pacing.",
            ),
            F(
                "response_delivery",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to producer handoff.",
            ),
            F(
                "handler_queue",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to the queue before the HTTP handler.",
            ),
            F(
                "client_delivery",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to response-body delivery.",
            ),
            F(
                "sampling",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to token sampling.",
            ),
            F(
                "readback",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to accelerator readback.",
            ),
            F(
                "gpu_lock_wait",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to accelerator-ownership waits.",
            ),
            F(
                "graph_capture",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to graph capture.",
            ),
            F(
                "graph_replay",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to graph replay.",
            ),
            F(
                "synchronization",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to accelerator synchronization.",
            ),
            F(
                "resize",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to storage resizing.",
            ),
            F(
                "trim",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to storage trimming or reclaim.",
            ),
            F(
                "adapter",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to adapter work.",
            ),
            F(
                "training",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls primarily attributed to training-owned accelerator work.",
            ),
            F(
                "unexplained",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Stalls that no measured phase explains.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "LatencyStallReasonCounts"},
    )
    defs["RequestLatencyDiagnostics"] = obj(
        "Request-local TTFT, ITL tail, bounded stall reasons, and honest phase-coverage diagnostics.",
        [
            F(
                "emitted_tokens",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Number of generated tokens emitted by the request.",
            ),
            F(
                "gap_samples",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Number of inter-token gaps observed.",
            ),
            F(
                "retained_gap_samples",
                True,
                {"type": "integer", "minimum": 0, "maximum": 8192},
                "Inter-token gaps retained for percentile calculation after the bounded sample cap.",
            ),
            F(
                "gap_samples_truncated",
                True,
                {"type": "boolean"},
                "Whether the request produced more gap samples than the diagnostic retained.",
            ),
            F(
                "ttft_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time from request start to the first generated token.",
            ),
            F(
                "itl_ms_p50",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Median retained inter-token latency.",
            ),
            F(
                "itl_ms_p99",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "99th-percentile retained inter-token latency.",
            ),
            F(
                "itl_ms_p999",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "99.9th-percentile retained inter-token latency.",
            ),
            F(
                "max_itl_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Largest observed inter-token latency.",
            ),
            F(
                "stall_threshold_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Inter-token gap at or above which a sample is classified as a stall.",
            ),
            F(
                "stall_count",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Number of inter-token gaps classified as stalls.",
            ),
            F(
                "unexplained_stall_count",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Number of stalls not covered by a measured phase.",
            ),
            F(
                "stall_reasons",
                True,
                {"$ref": "#/$defs/LatencyStallReasonCounts"},
                "Stall counts grouped by the phase with the largest overlap.",
            ),
            F(
                "phases",
                True,
                {"$ref": "#/$defs/LatencyPhaseTimings"},
                "Measured request time grouped by bounded phase.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "RequestLatencyDiagnostics"},
    )
    return defs
