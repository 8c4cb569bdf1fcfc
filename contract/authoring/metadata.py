"""Performance, token timing, config hash and thinking-budget metadata definitions."""

from __future__ import annotations

from .common import UINT32_MAX, F, Schema, obj


def metadata_defs() -> dict[str, Schema]:
    """Performance, token timing, config hash and thinking-budget metadata."""
    defs: dict[str, Schema] = {}
    defs["ChatCompletionPerformanceMetadata"] = obj(
        "Token counts and request-local latency measurements emitted when performance metadata is enabled.",
        [
            F(
                "prompt_tokens",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Number of prompt tokens processed.",
            ),
            F(
                "completion_tokens",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Number of generated tokens.",
            ),
            F(
                "ttft_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time to first generated token in milliseconds, or null when unavailable.",
            ),
            F(
                "prefill_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Measured prompt-prefill work in milliseconds, or null when unavailable.",
            ),
            F(
                "actor_queue_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time waiting in the batching actor's queue, or null off the actor path.",
            ),
            F(
                "actor_admission_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Time from actor receipt to workload admission, or null off the actor path.",
            ),
            F(
                "actor_prefill_wall_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Wall-clock time from actor admission through prompt prefill, or null off the actor path.",
            ),
            F(
                "resident_prefill_used",
                True,
                {"$ref": "#/$defs/NullableBoolean"},
                "Whether prefill used resident recurrent state, or null when the route does not report it.",
            ),
            F(
                "decode_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Measured token-decode work in milliseconds, or null when unavailable.",
            ),
            F(
                "total_latency_ms",
                True,
                {"type": "number", "minimum": 0},
                "Request latency from handler entry through response construction, in milliseconds.",
            ),
            F(
                "decode_tokens_per_sec",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Generated tokens divided by measured decode time, or null when unavailable.",
            ),
            F(
                "adapter_used",
                True,
                {"type": "string"},
                "Base or named adapter selection used for generation.",
            ),
            F(
                "thinking_mode",
                True,
                {"type": "string"},
                "Thinking mode observed from the rendered prompt.",
            ),
            F(
                "finish_reason",
                True,
                {"$ref": "#/$defs/FinishReason"},
                "Terminal reason for this choice.",
            ),
            F(
                "latency",
                True,
                {"oneOf": [{"$ref": "#/$defs/RequestLatencyDiagnostics"}, {"type": "null"}]},
                "Detailed latency diagnostics when the serving path recorded them; otherwise null.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "ChatCompletionPerformanceMetadata"},
    )
    defs["ConfigHashes"] = obj(
        "Content hashes that identify the tokenizer, templates, model configuration, and resolved inference configuration.",
        [
            F(
                "tokenizer_config_hash",
                False,
                {"$ref": "#/$defs/Sha256"},
                "Hash of the tokenizer configuration.",
            ),
            F(
                "chat_template_hash",
                False,
                {"$ref": "#/$defs/Sha256"},
                "Hash of the inference chat template.",
            ),
            F(
                "training_chat_template_hash",
                False,
                {"$ref": "#/$defs/Sha256"},
                "Hash of the training chat template.",
            ),
            F(
                "model_config_hash",
                False,
                {"$ref": "#/$defs/Sha256"},
                "Hash of the model configuration.",
            ),
            F(
                "effective_config_hash",
                False,
                {"$ref": "#/$defs/Sha256"},
                "Hash of the resolved inference configuration.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "ConfigHashes"},
    )
    defs["StreamingTokenTiming"] = obj(
        "Request-relative timestamps and blocking attribution for one streamed token.",
        [
            F(
                "object",
                True,
                {"const": "kiln.token_timing"},
                "Kiln token-timing event discriminator.",
            ),
            F(
                "source",
                True,
                {"type": "string", "enum": ["batching_engine", "direct"]},
                "Producer path that owns ready and delivery timestamps.",
            ),
            F(
                "token_index",
                True,
                {"type": "integer", "minimum": 0, "maximum": UINT32_MAX},
                "Zero-based generated-token index.",
            ),
            F(
                "token_id",
                True,
                {"type": "integer", "minimum": 0, "maximum": UINT32_MAX},
                "Accepted model token represented by this timing event, including a special token that decodes to no visible text.",
            ),
            F(
                "ready_ms",
                True,
                {"type": "number", "minimum": 0},
                "Time when model work produced the token, relative to request start.",
            ),
            F(
                "producer_delivered_ms",
                True,
                {"type": "number", "minimum": 0},
                "Time when the generation producer handed off the token.",
            ),
            F(
                "handler_received_ms",
                True,
                {"type": "number", "minimum": 0},
                "Time when the HTTP handler received the token.",
            ),
            F(
                "body_enqueued_ms",
                True,
                {"type": "number", "minimum": 0},
                "Time when the handler enqueued the token event for the response body.",
            ),
            F(
                "response_delivery_ms",
                True,
                {"type": "number", "minimum": 0},
                "Delay from token readiness to producer handoff.",
            ),
            F(
                "handler_queue_ms",
                True,
                {"type": "number", "minimum": 0},
                "Delay from producer handoff to HTTP-handler receipt.",
            ),
            F(
                "queue_delay_ms",
                True,
                {"type": "number", "minimum": 0},
                "Compatibility aggregate equal to response_delivery_ms + handler_queue_ms.",
            ),
            F(
                "client_delivery_ms",
                True,
                {"type": "number", "minimum": 0},
                "Delay from handler receipt to response-body enqueue.",
            ),
            F(
                "blocking_phase",
                True,
                {
                    "type": ["string", "null"],
                    "enum": [
                        "actor_queue",
                        "actor_admission",
                        "actor_prefill",
                        "actor_decode",
                        "actor_cycle_idle",
                        "response_delivery",
                        "handler_queue",
                        "client_delivery",
                        "sampling",
                        "readback",
                        "gpu_lock_wait",
                        "graph_capture",
                        "graph_replay",
                        "synchronization",
                        "resize",
                        "trim",
                        "adapter",
                        "training",
                        "unexplained",
                        None,
                    ],
                },
                "Phase attributed as the dominant blocking interval for this token, or null.",
            ),
            F(
                "blocking_phase_ms",
                True,
                {"$ref": "#/$defs/NullableNonNegativeNumber"},
                "Blocking phase ms. A non-negative finite JSON number or null.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "StreamingTokenTiming"},
    )
    defs["ThinkingBudgetConfigurationMetadata"] = obj(
        "Request-wide resolved thinking limits and their configuration sources.",
        [
            F(
                "configured",
                True,
                {"type": "boolean"},
                "Whether either resolved thinking limit is finite.",
            ),
            F(
                "max_tokens",
                False,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Resolved thinking-token limit; omitted when unlimited.",
            ),
            F(
                "max_time_ms",
                False,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Resolved thinking-time limit in milliseconds; omitted when unlimited.",
            ),
            F(
                "tokens_source",
                True,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/source"},
                "Authority that supplied or removed the thinking-token limit.",
            ),
            F(
                "time_source",
                True,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/source"},
                "Authority that supplied or removed the thinking-time limit.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "ThinkingBudgetConfigurationMetadata"},
    )
    return defs
