"""Author the Kiln contract files from the published field tables.

The JSON files next to this script are the artifact and the single source of truth; this script is
how they were written, kept for maintainers. It builds every definition field by field from the
tables of the seed documentation page (``kiln-inference-contract-v1.md``), copies its composition
rules and ``x-kiln-*`` annotations verbatim, applies the fixes listed in ``CHANGELOG.md``, and
dumps deterministic JSON (``indent=2``, definition order kept, exact integers).

Usage::

    python contract/_author.py          # rewrite the JSON files
    python contract/_author.py --check  # exit 1 when a file differs from what this script writes
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

Schema = dict[str, Any]
Field = tuple[str, bool, Schema]

HERE = Path(__file__).resolve().parent
BASE_URI = "https://ericflo.github.io/kiln/contracts/"
MAIN_FILE = "kiln-inference-v1.schema.json"
TB_FILE = "thinking-budget-v1.schema.json"
DIALECT = "https://json-schema.org/draft/2020-12/schema"

UINT32_MAX = 4294967295
# 2**64 - 1 written exactly. The seed prints 18446744073709552000 (2**64 - 1 rounded through a
# binary64 float), which would admit seeds that no u64 can hold. See CHANGELOG.md.
UINT64_MAX = 18446744073709551615
# Chat `n` and batch `n` are bounded; see CHANGELOG.md.
MAX_CHOICES = 64
# /v1/completions scores at most 4096 prompt tokens (seed: "capped at 4096").
MAX_PROMPT_TOKENS = 4096
# Regex escape (not literal control characters): no C0 control character and no DEL.
CONTROL_FREE = "^[^\\u0000-\\u001f\\u007f]+$"
ACCEPTED = "accepted_and_ignored"

_MISSING: Any = object()


# The root annotations, copied exactly from the seed (entrypoints, examples, status).
SEED_ROOT_ANNOTATIONS: Schema = {
    "x-kiln-entrypoints": [
        "BatchCompletionRequest",
        "BatchCompletionResponse",
        "ChatCompletionChunkStream",
        "ChatCompletionRequest",
        "ChatCompletionResponse",
        "TextCompletionRequest",
        "TextCompletionResponse",
    ],
    "x-kiln-examples": {
        "BatchCompletionRequest": [
            {
                "prompts": [
                    [{"role": "user", "content": "Name one primary color."}],
                    [{"role": "user", "content": "Name one secondary color."}],
                ],
                "n": 2,
                "max_tokens": 16,
                "thinking_budget_tokens": None,
            },
            {
                "prompts": [[{"role": "user", "content": "Name one color."}]],
                "adapter": None,
                "adapters": [{"name": "style", "scale": 1}],
            },
        ],
        "BatchCompletionResponse": [
            {
                "id": "batchcmpl-example",
                "object": "batch.completion",
                "created": 1700000000,
                "model": "example-model",
                "completions": [
                    {
                        "prompt_index": 0,
                        "completion_index": 0,
                        "text": "Red.",
                        "finish_reason": "stop",
                        "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10},
                    }
                ],
                "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10},
                "metadata": {
                    "thinking_budget": {
                        "configured": False,
                        "tokens_source": "unlimited",
                        "time_source": "unlimited",
                    }
                },
            }
        ],
        "ChatCompletionChunk": [
            {
                "id": "chatcmpl-example",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": "example-model",
                "choices": [{"index": 0, "delta": {"content": "Blue"}}],
            }
        ],
        "ChatCompletionRequest": [
            {
                "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                "max_tokens": 64,
                "thinking_budget_tokens": 32,
                "thinking_budget_ms": None,
                "stream": False,
            },
            {
                "messages": [{"role": "user", "content": "What is 3 + 3?"}],
                "adapter": "math",
                "adapters": None,
            },
        ],
        "ChatCompletionResponse": [
            {
                "id": "chatcmpl-example",
                "object": "chat.completion",
                "created": 1700000000,
                "model": "example-model",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "4"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
                "metadata": {
                    "thinking_enabled": False,
                    "thinking_mode": "non_reasoning",
                    "thinking_source": "template_default",
                    "final_content_empty": False,
                    "reasoning_folded_into_content": False,
                    "thinking_budget": {
                        "configured": False,
                        "applied": False,
                        "tokens_source": "unlimited",
                        "time_source": "unlimited",
                        "triggered": False,
                    },
                },
            }
        ],
        "RolloutProvenanceV1": [
            {
                "schema": "kiln.rollout-provenance.v1",
                "input_token_ids": [1, 2],
                "prompt_token_count": 1,
                "prompt_messages_sha256": "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                "scored_payload_sha256": "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
                "action_tokens": [
                    {
                        "sequence_index": 1,
                        "token_id": 2,
                        "source": "sampled",
                        "behavior_logprob": -0.25,
                    }
                ],
                "behavior_policy": {
                    "served_model_id": "example-model",
                    "base_model_sha256": "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc",
                    "inference_config_sha256": "sha256:dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd",
                    "implementation": "kiln",
                },
                "tokenizer": {
                    "vocab_sha256": "sha256:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee",
                    "config_sha256": "sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
                    "chat_template_sha256": "sha256:1111111111111111111111111111111111111111111111111111111111111111",
                },
                "sampling": {
                    "temperature": 0.9,
                    "top_p": 0.95,
                    "top_k": 20,
                    "min_p": 0,
                    "max_tokens": 64,
                    "repetition_penalty": 1,
                    "presence_penalty": 0,
                    "frequency_penalty": 0,
                    "stop": [],
                },
                "seed": 42,
                "generation_backend": "rocm",
            }
        ],
        "StreamingTokenTiming": [
            {
                "object": "kiln.token_timing",
                "source": "batching_engine",
                "token_index": 0,
                "token_id": 42,
                "ready_ms": 12.5,
                "producer_delivered_ms": 12.6,
                "handler_received_ms": 12.8,
                "body_enqueued_ms": 13,
                "response_delivery_ms": 0.1,
                "handler_queue_ms": 0.2,
                "queue_delay_ms": 0.3,
                "client_delivery_ms": 0.2,
                "blocking_phase": None,
                "blocking_phase_ms": None,
            }
        ],
        "TextCompletionRequest": [
            {
                "prompt": [1, 42, 314],
                "max_tokens": 0,
                "prompt_logprobs": 5,
                "add_special_tokens": True,
            }
        ],
        "TextCompletionResponse": [
            {
                "id": "cmpl-example",
                "object": "text_completion",
                "created": 1700000000,
                "model": "example-model",
                "system_fingerprint": None,
                "choices": [
                    {
                        "index": 0,
                        "text": "",
                        "finish_reason": "length",
                        "prompt_logprobs": [
                            None,
                            {"42": {"logprob": -0.25, "rank": 1, "decoded_token": "answer"}},
                        ],
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3},
            }
        ],
    },
    "x-kiln-field-schema-status": "complete",
}


def ref(name: str) -> Schema:
    """A reference to a definition of the main file."""
    return {"$ref": f"#/$defs/{name}"}


def tb(name: str) -> Schema:
    """A reference to a definition of the thinking-budget file (relative to the main file)."""
    return {"$ref": f"{TB_FILE}#/$defs/{name}"}


def nullable(schema: Schema) -> Schema:
    """``null`` or ``schema``, written the way the seed's Nullable* helpers are."""
    return {"oneOf": [{"type": "null"}, schema]}


def F(
    name: str, required: bool, schema: Schema, description: str, *, default: Any = _MISSING
) -> Field:
    """One row of a field table: the property schema with its description (and default)."""
    prop = {**schema, "description": description}
    if default is not _MISSING:
        prop["default"] = default
    return name, required, prop


def obj(
    description: str,
    fields: list[Field],
    *,
    closed: bool,
    rules: Schema | None = None,
    annotations: Schema | None = None,
    examples: list[Any] | None = None,
) -> Schema:
    """An object definition.

    Closed objects ("Unknown fields rejected") get ``additionalProperties: false``. Open request
    objects get no ``additionalProperties`` (JSON Schema's default already accepts unknown fields)
    and carry the seed's ``x-kiln-unknown-field-policy`` annotation instead.
    """
    schema: Schema = {"description": description, "type": "object"}
    required = [name for name, req, _ in fields if req]
    if required:
        schema["required"] = required
    if fields:
        schema["properties"] = {name: prop for name, _, prop in fields}
    if closed:
        schema["additionalProperties"] = False
    if rules:
        schema.update(rules)
    if annotations:
        schema.update(annotations)
    if examples:
        schema["examples"] = examples
    return schema


def leaf(
    description: str,
    schema: Schema,
    *,
    annotations: Schema | None = None,
    examples: list[Any] | None = None,
) -> Schema:
    """A non-object definition (scalar, union, array)."""
    out: Schema = {"description": description, **schema}
    if annotations:
        out.update(annotations)
    if examples:
        out["examples"] = examples
    return out


def n_choices(description: str) -> Field:
    """Chat and batch ``n``: null or 1..64 (the seed leaves it unbounded; see CHANGELOG.md)."""
    return F(
        "n",
        False,
        nullable({"type": "integer", "minimum": 1, "maximum": MAX_CHOICES}),
        description,
        default=1,
    )


# Added (CHANGELOG): OpenAI's parallel_tool_calls on chat and batch requests.
PARALLEL_TOOL_CALLS: Field = F(
    "parallel_tool_calls",
    False,
    {"$ref": "#/$defs/NullableBoolean"},
    "OpenAI-compatible: false keeps only the first tool call of each choice; missing, null or "
    "true keeps every tool call.",
)


def inference_defs() -> dict[str, Schema]:
    """Every definition of the seed's Definitions section, in the seed's order."""
    defs: dict[str, Schema] = {}
    defs["AdapterRef"] = obj(
        "One saved adapter and its composition scale.",
        [
            F(
                "name",
                True,
                {"type": "string", "minLength": 1},
                "Saved adapter name. The runtime also rejects path separators, traversal, and absolute paths.",
            ),
            F(
                "scale",
                True,
                {"type": "number"},
                "Composition scale used when merging request-wide adapters. The request must contain a finite JSON number; Kiln applies no narrower range.",
            ),
        ],
        closed=False,
        annotations={
            "x-kiln-rust-type": "AdapterRef",
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )
    defs["BatchCompletionItem"] = obj(
        "One generated choice from one prompt in a batch request.",
        [
            F(
                "prompt_index",
                True,
                {"type": "integer", "minimum": 0},
                "Zero-based index into request.prompts.",
            ),
            F(
                "completion_index",
                True,
                {"type": "integer", "minimum": 0},
                "Zero-based choice index for this prompt.",
            ),
            F("text", True, {"type": "string"}, "Final answer content after separated reasoning."),
            F(
                "reasoning_content",
                False,
                {"type": "string"},
                "Reasoning text inside the model's thinking block; omitted when absent.",
            ),
            F(
                "tool_calls",
                False,
                {"$ref": "#/$defs/ToolCallArray"},
                "OpenAI-shaped tool calls; omitted when absent.",
            ),
            F(
                "finish_reason",
                True,
                {"$ref": "#/$defs/FinishReason"},
                "Finish reason. Why generation ended. `error` identifies a per-item batch failure; ordinary termination emits `stop`, `length`, or `tool_calls`.",
            ),
            F(
                "thinking_budget",
                False,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/outcome"},
                "Completion-specific terminal thinking-budget outcome; omitted when no budget applied.",
            ),
            F(
                "usage",
                True,
                {"$ref": "#/$defs/Usage"},
                "Usage. Prompt, completion, and total token counts.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "BatchCompletionItem"},
    )
    defs["BatchCompletionMetadata"] = obj(
        "Request-wide metadata for a completed batch response.",
        [
            F(
                "thinking_budget",
                True,
                {"$ref": "#/$defs/ThinkingBudgetConfigurationMetadata"},
                "Resolved request-wide thinking-limit configuration.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "BatchCompletionMetadata"},
    )
    defs["BatchCompletionRequest"] = obj(
        "Generate one or more choices for each conversation in a batch.",
        [
            F(
                "model",
                False,
                {"$ref": "#/$defs/NullableString"},
                "Served model ID. Missing or null selects the configured served_model_id.",
            ),
            F(
                "prompts",
                True,
                {
                    "type": "array",
                    "items": {"type": "array", "items": {"$ref": "#/$defs/ChatMessageInput"}},
                    "minItems": 1,
                    "maxItems": 64,
                },
                "One message array per prompt. prompts.length multiplied by n must not exceed 64 outputs.",
            ),
            n_choices("Completions per prompt. Missing or null means 1."),
            F(
                "temperature",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "Sampling temperature. Null uses the selected preset or runtime default.",
            ),
            F(
                "top_p",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "Nucleus-sampling probability mass. Null uses the selected preset or runtime default.",
            ),
            F(
                "top_k",
                False,
                {"$ref": "#/$defs/NullableUint32"},
                "Maximum candidate count for top-k filtering. Null uses the selected preset or runtime default.",
            ),
            F(
                "min_p",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "Minimum probability relative to the most likely token. Null uses the selected preset or runtime default.",
            ),
            F(
                "presence_penalty",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "OpenAI-style presence penalty. Null uses the selected preset or runtime default.",
            ),
            F(
                "frequency_penalty",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "OpenAI-style frequency penalty. Null uses the selected preset or runtime default.",
            ),
            F(
                "repetition_penalty",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "Token repetition penalty. Null uses the selected preset or runtime default.",
            ),
            F(
                "sampling_preset",
                False,
                {"$ref": "#/$defs/SamplingPreset"},
                "Named group of sampling defaults; explicit sampling fields take precedence.",
            ),
            F(
                "max_tokens",
                False,
                {"$ref": "#/$defs/NullableNonNegativeInteger"},
                "Maximum generated tokens per completion. Null uses the runtime default.",
            ),
            F(
                "max_completion_tokens",
                False,
                {"$ref": "#/$defs/NullableNonNegativeInteger"},
                "Newer OpenAI alias. max_tokens wins when both are non-null.",
            ),
            F(
                "ignore_eos",
                False,
                {"type": "boolean"},
                "Treat tokenizer EOS IDs as ordinary tokens; max_tokens and explicit stop sequences still bound generation.",
                default=False,
            ),
            F(
                "thinking_budget_tokens",
                False,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/limitOverride"},
                "Per-request thinking-token limit override; null explicitly removes the limit.",
            ),
            F(
                "thinking_budget_ms",
                False,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/limitOverride"},
                "Per-request thinking-time limit in milliseconds; null explicitly removes the limit.",
            ),
            F(
                "stop",
                False,
                {"$ref": "#/$defs/StopInput"},
                "One or more decoded-text stop sequences.",
            ),
            F(
                "seed",
                False,
                {"$ref": "#/$defs/NullableUint64"},
                "Request seed; null lets the runtime choose.",
            ),
            F(
                "adapter",
                False,
                {"$ref": "#/$defs/NullableString"},
                "One adapter applied to every prompt. Mutually exclusive with adapters.",
            ),
            F(
                "adapters",
                False,
                {
                    "oneOf": [
                        {"type": "null"},
                        {
                            "type": "array",
                            "items": {"$ref": "#/$defs/AdapterRef"},
                            "minItems": 1,
                            "maxItems": 16,
                        },
                    ]
                },
                "Request-wide adapter composition. Mutually exclusive with adapter.",
            ),
            F(
                "tools",
                False,
                {"$ref": "#/$defs/NullableToolArray"},
                "Request-wide OpenAI-shaped tool definitions forwarded to the chat template.",
            ),
            F(
                "tool_choice",
                False,
                {},
                "Opaque OpenAI tool_choice value forwarded to the chat template.",
            ),
            F(
                "chat_template_kwargs",
                False,
                {"$ref": "#/$defs/NullableTemplateKwargs"},
                "Request-wide keyword arguments forwarded to the chat template.",
            ),
            PARALLEL_TOOL_CALLS,
        ],
        closed=False,
        rules={
            "allOf": [
                {
                    "not": {
                        "required": ["adapter", "adapters"],
                        "properties": {
                            "adapter": {"type": "string"},
                            "adapters": {"type": "array"},
                        },
                    }
                }
            ]
        },
        annotations={
            "x-kiln-field-schema-status": "complete",
            "x-kiln-rust-type": "BatchCompletionRequest",
            "x-kiln-semantic-constraints": [
                "prompts.length * (n or 1) <= 64",
                "the effective max_tokens must fit the active tokenizer's reasoning close sequence when a thinking budget applies",
            ],
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )
    defs["BatchCompletionResponse"] = obj(
        "All choices, token usage, and request-wide metadata from a batch generation request.",
        [
            F(
                "id",
                True,
                {"type": "string", "pattern": "^batchcmpl-"},
                "Unique batch-completion identifier.",
            ),
            F(
                "object",
                True,
                {"const": "batch.completion"},
                "OpenAI-style object discriminator for a batch completion.",
            ),
            F(
                "created",
                True,
                {"$ref": "#/$defs/UnixSeconds"},
                "Created. Whole seconds since the Unix epoch.",
            ),
            F("model", True, {"type": "string"}, "Served model ID used for every completion."),
            F(
                "completions",
                True,
                {
                    "type": "array",
                    "items": {"$ref": "#/$defs/BatchCompletionItem"},
                    "minItems": 1,
                    "maxItems": 64,
                },
                "Generated choices in prompt order, then completion order.",
            ),
            F(
                "usage",
                True,
                {"$ref": "#/$defs/Usage"},
                "Usage. Prompt, completion, and total token counts.",
            ),
            F(
                "metadata",
                True,
                {"$ref": "#/$defs/BatchCompletionMetadata"},
                "Metadata. Request-wide metadata for a completed batch response.",
            ),
        ],
        closed=True,
        annotations={
            "x-kiln-field-schema-status": "complete",
            "x-kiln-rust-type": "BatchCompletionResponse",
        },
    )
    defs["ChatCompletionChunk"] = obj(
        "One OpenAI-compatible server-sent event in a streaming chat completion.",
        [
            F(
                "id",
                True,
                {"type": "string", "pattern": "^chatcmpl-"},
                "Chat-completion identifier shared by every chunk in the stream.",
            ),
            F(
                "object",
                True,
                {"const": "chat.completion.chunk"},
                "OpenAI-compatible streaming-chunk discriminator.",
            ),
            F(
                "created",
                True,
                {"$ref": "#/$defs/UnixSeconds"},
                "Created. Whole seconds since the Unix epoch.",
            ),
            F("model", True, {"type": "string"}, "Served model ID used for this completion."),
            F(
                "choices",
                True,
                {"type": "array", "items": {"$ref": "#/$defs/ChunkChoice"}},
                "Incremental choices carried by this chunk; the usage-only chunk has none.",
            ),
            F(
                "metadata",
                False,
                {"$ref": "#/$defs/StreamingTerminalMetadata"},
                "Metadata. Metadata attached only to the terminal finish chunk.",
            ),
            F(
                "usage",
                False,
                {"$ref": "#/$defs/Usage"},
                "Token counts for this individual completion.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "ChatCompletionChunk"},
    )
    defs["ChatCompletionChunkStream"] = leaf(
        "Server-sent event stream containing JSON `ChatCompletionChunk` events, optional `kiln.token_timing` events when `include_performance` is true, an optional usage chunk with no choices when `stream_options.include_usage` is true, and a final `data: [DONE]` sentinel. The terminal finish chunk carries thinking-budget metadata before the optional usage chunk and sentinel.",
        {"type": "string", "contentMediaType": "text/event-stream"},
        annotations={
            "x-kiln-event-schemas": [
                {"$ref": "#/$defs/ChatCompletionChunk"},
                {"$ref": "#/$defs/StreamingTokenTiming"},
            ],
            "x-kiln-field-schema-status": "complete",
            "x-kiln-rust-type": "ChatCompletionChunkStream",
        },
    )
    defs["ChatCompletionMetadata"] = obj(
        "Kiln-specific thinking, configuration, and performance metadata for a chat completion.",
        [
            F(
                "thinking_enabled",
                True,
                {"type": "boolean"},
                "Whether the rendered prompt enabled model thinking.",
            ),
            F(
                "thinking_mode",
                True,
                {"type": "string", "enum": ["non_reasoning", "reasoning"]},
                "Mode observed from the rendered prompt.",
            ),
            F(
                "thinking_source",
                True,
                {
                    "type": "string",
                    "enum": ["custom", "request", "server_default", "template_default"],
                },
                "Authority that selected the effective thinking mode.",
            ),
            F(
                "default_thinking_enabled",
                False,
                {"type": "boolean"},
                "Configured server or template default before a request override.",
            ),
            F(
                "final_content_empty",
                True,
                {"type": "boolean"},
                "Whether the final answer content is empty after reasoning separation.",
            ),
            F(
                "content_empty_reason",
                False,
                {
                    "type": "string",
                    "enum": ["no_content", "reasoning_without_final_content", "tool_call"],
                },
                "Reason final answer content is empty; omitted when content is present.",
            ),
            F(
                "reasoning_folded_into_content",
                True,
                {"type": "boolean"},
                "Whether compatibility mode copied separated reasoning into content.",
            ),
            F(
                "thinking_budget",
                True,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/record"},
                "Resolved and terminal thinking-budget record.",
            ),
            F(
                "config_hashes",
                False,
                {"$ref": "#/$defs/ConfigHashes"},
                "Configuration hashes when requested or enabled by default.",
            ),
            F(
                "performance",
                False,
                {"$ref": "#/$defs/ChatCompletionPerformanceMetadata"},
                "Request-local performance metadata when requested or enabled by default.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "ChatCompletionMetadata"},
    )
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
    defs["ChatCompletionRequest"] = obj(
        "Create one or more OpenAI-compatible chat-completion choices.",
        [
            F(
                "model",
                False,
                {"$ref": "#/$defs/NullableString"},
                "Served model ID. Missing or null selects the configured served_model_id.",
            ),
            F(
                "messages",
                True,
                {"type": "array", "items": {"$ref": "#/$defs/ChatMessageInput"}},
                "Conversation messages in template order.",
            ),
            n_choices("Number of choices. Values above 1 require stream=false."),
            F(
                "temperature",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "Sampling temperature. Null uses the selected preset or runtime default.",
            ),
            F(
                "top_p",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "Nucleus-sampling probability mass. Null uses the selected preset or runtime default.",
            ),
            F(
                "top_k",
                False,
                {"$ref": "#/$defs/NullableUint32"},
                "Maximum candidate count for top-k filtering. Null uses the selected preset or runtime default.",
            ),
            F(
                "min_p",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "Minimum probability relative to the most likely token. Null uses the selected preset or runtime default.",
            ),
            F(
                "presence_penalty",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "OpenAI-style presence penalty. Null uses the selected preset or runtime default.",
            ),
            F(
                "frequency_penalty",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "OpenAI-style frequency penalty. Null uses the selected preset or runtime default.",
            ),
            F(
                "repetition_penalty",
                False,
                {"$ref": "#/$defs/NullableSamplingNumber"},
                "Token repetition penalty. Null uses the selected preset or runtime default.",
            ),
            F(
                "sampling_preset",
                False,
                {"$ref": "#/$defs/SamplingPreset"},
                "Named group of sampling defaults; explicit sampling fields take precedence.",
            ),
            F(
                "max_tokens",
                False,
                {"$ref": "#/$defs/NullableNonNegativeInteger"},
                "Maximum generated tokens per choice. Null uses the runtime default.",
            ),
            F(
                "max_completion_tokens",
                False,
                {"$ref": "#/$defs/NullableNonNegativeInteger"},
                "Newer OpenAI alias. max_tokens wins when both are non-null.",
            ),
            F(
                "ignore_eos",
                False,
                {"type": "boolean"},
                "Treat tokenizer EOS IDs as ordinary tokens; incompatible with rollout_provenance=true.",
                default=False,
            ),
            F(
                "thinking_budget_tokens",
                False,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/limitOverride"},
                "Per-request thinking-token limit override; null explicitly removes the limit.",
            ),
            F(
                "thinking_budget_ms",
                False,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/limitOverride"},
                "Per-request thinking-time limit in milliseconds; null explicitly removes the limit.",
            ),
            F(
                "stream",
                False,
                {"type": "boolean"},
                "Return server-sent events instead of one JSON response.",
                default=False,
            ),
            F(
                "stream_options",
                False,
                {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/StreamOptions"}]},
                "Additional streaming behavior; ignored for a non-streaming request.",
            ),
            F(
                "stop",
                False,
                {"$ref": "#/$defs/StopInput"},
                "One or more decoded-text stop sequences.",
            ),
            F(
                "seed",
                False,
                {"$ref": "#/$defs/NullableUint64"},
                "Request seed; null lets the runtime choose.",
            ),
            F(
                "adapter",
                False,
                {"$ref": "#/$defs/NullableString"},
                "Missing uses the server default; null or an empty string selects base; a non-empty string selects a named adapter. Mutually exclusive with adapters.",
            ),
            F(
                "adapters",
                False,
                {
                    "oneOf": [
                        {"type": "null"},
                        {
                            "type": "array",
                            "items": {"$ref": "#/$defs/AdapterRef"},
                            "minItems": 1,
                            "maxItems": 16,
                        },
                    ]
                },
                "Per-request adapter composition. Mutually exclusive with adapter.",
            ),
            F(
                "tools",
                False,
                {"$ref": "#/$defs/NullableToolArray"},
                "OpenAI-shaped tool definitions forwarded to the chat template.",
            ),
            F(
                "tool_choice",
                False,
                {},
                "Opaque OpenAI tool_choice value forwarded to the chat template.",
            ),
            F(
                "chat_template_kwargs",
                False,
                {"$ref": "#/$defs/NullableTemplateKwargs"},
                "Keyword arguments forwarded to the chat template.",
            ),
            F(
                "fold_reasoning_into_content",
                False,
                {"$ref": "#/$defs/NullableBoolean"},
                "Override whether separated reasoning is also copied into final content.",
            ),
            F(
                "include_performance",
                False,
                {"$ref": "#/$defs/NullableBoolean"},
                "Override whether the response includes request-local performance metadata.",
            ),
            F(
                "include_config_hashes",
                False,
                {"$ref": "#/$defs/NullableBoolean"},
                "Override whether the response includes content hashes for the active configuration.",
            ),
            F(
                "rollout_provenance",
                False,
                {"type": "boolean"},
                "Emit exact behavior-policy provenance. Requires one non-streaming real batched choice, ignore_eos=false, no non-empty tools or tool_choice, and positive effective generation capacity.",
                default=False,
            ),            PARALLEL_TOOL_CALLS,
        ],
        closed=False,
        rules={
            "allOf": [
                {
                    "not": {
                        "required": ["adapter", "adapters"],
                        "properties": {"adapters": {"type": "array"}},
                    }
                },
                {
                    "if": {"required": ["stream"], "properties": {"stream": {"const": True}}},
                    "then": {
                        "not": {
                            "required": ["n"],
                            "properties": {"n": {"type": "integer", "minimum": 2}},
                        }
                    },
                },
                {
                    "if": {
                        "required": ["rollout_provenance"],
                        "properties": {"rollout_provenance": {"const": True}},
                    },
                    "then": {
                        "properties": {
                            "ignore_eos": {"const": False},
                            "stream": {"const": False},
                            "n": {"oneOf": [{"type": "null"}, {"const": 1}]},
                            "max_tokens": {
                                "oneOf": [{"type": "null"}, {"type": "integer", "minimum": 1}]
                            },
                        }
                    },
                },
            ]
        },
        annotations={
            "x-kiln-field-schema-status": "complete",
            "x-kiln-rust-type": "ChatCompletionRequest",
            "x-kiln-semantic-constraints": [
                "rollout_provenance=true requires the real batching engine and content-addressed base-policy identity",
                "rollout_provenance=true rejects non-empty tools and non-null tool_choice",
                "the effective max_tokens must fit the active tokenizer's reasoning close sequence when a thinking budget applies",
            ],
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )
    defs["ChatCompletionResponse"] = obj(
        "A non-streaming OpenAI-compatible chat completion with Kiln metadata.",
        [
            F(
                "id",
                True,
                {"type": "string", "pattern": "^chatcmpl-"},
                "Unique chat-completion identifier.",
            ),
            F(
                "object",
                True,
                {"const": "chat.completion"},
                "OpenAI-compatible object discriminator.",
            ),
            F(
                "created",
                True,
                {"$ref": "#/$defs/UnixSeconds"},
                "Created. Whole seconds since the Unix epoch.",
            ),
            F("model", True, {"type": "string"}, "Served model ID used for generation."),
            F(
                "choices",
                True,
                {
                    "type": "array",
                    "items": {"$ref": "#/$defs/Choice"},
                    "minItems": 1,
                    "maxItems": 64,
                },
                "Generated choices in index order.",
            ),
            F(
                "usage",
                True,
                {"$ref": "#/$defs/Usage"},
                "Usage. Prompt, completion, and total token counts.",
            ),
            F(
                "metadata",
                True,
                {"$ref": "#/$defs/ChatCompletionMetadata"},
                "Metadata. Kiln-specific thinking, configuration, and performance metadata for a chat completion.",
            ),
        ],
        closed=True,
        annotations={
            "x-kiln-field-schema-status": "complete",
            "x-kiln-rust-type": "ChatCompletionResponse",
        },
    )
    defs["ChatMessageInput"] = obj(
        "One input message passed to the model's chat template.",
        [
            F(
                "role",
                True,
                {"type": "string"},
                "Template-visible role. Kiln forwards the string rather than enforcing a fixed vocabulary.",
            ),
            F(
                "content",
                False,
                {"oneOf": [{"type": "null"}, {"type": "string"}, {"type": "array", "items": {}}]},
                "String, null, or OpenAI content-part array. Text/input_text/output_text parts are concatenated and non-text parts are ignored.",
                default="",
            ),
            F(
                "reasoning_content",
                False,
                {"$ref": "#/$defs/NullableString"},
                "Prior assistant reasoning preserved for template round trips.",
            ),
            F(
                "tool_calls",
                False,
                {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/ToolCallArray"}]},
                "Prior assistant tool calls preserved for the next template render.",
            ),
            F("name", False, {"$ref": "#/$defs/NullableString"}, "Optional message name."),
            F(
                "tool_call_id",
                False,
                {"$ref": "#/$defs/NullableString"},
                "Tool-call identifier associated with a tool response.",
            ),
        ],
        closed=False,
        annotations={
            "x-kiln-rust-type": "Message",
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )
    defs["ChatMessageOutput"] = obj(
        "One assistant message emitted in a non-streaming choice.",
        [
            F("role", True, {"type": "string"}, "Assistant message role."),
            F(
                "content",
                True,
                {"type": "string"},
                "Final answer content after reasoning separation.",
            ),
            F(
                "reasoning_content",
                False,
                {"type": "string"},
                "Separated reasoning content; omitted when absent.",
            ),
            F(
                "tool_calls",
                False,
                {"$ref": "#/$defs/ToolCallArray"},
                "Tool calls emitted by the assistant; omitted when absent.",
            ),
            F("name", False, {"type": "string"}, "Optional message name."),
            F(
                "tool_call_id",
                False,
                {"type": "string"},
                "Tool-call identifier associated with a tool response.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "Message"},
    )
    defs["Choice"] = obj(
        "One complete non-streaming chat choice.",
        [
            F("index", True, {"$ref": "#/$defs/NonNegativeInteger"}, "Zero-based choice index."),
            F(
                "message",
                True,
                {"$ref": "#/$defs/ChatMessageOutput"},
                "Complete assistant message for this choice.",
            ),
            F(
                "finish_reason",
                True,
                {"$ref": "#/$defs/FinishReason"},
                "Why generation ended for this choice.",
            ),
            F(
                "thinking_budget",
                False,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/outcome"},
                "Thinking budget. See thinking-budget-v1.schema.json#/$defs/outcome.",
            ),
            F(
                "rollout_provenance",
                False,
                {"$ref": "#/$defs/RolloutProvenanceV1"},
                "Exact behavior-policy provenance when requested.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "Choice"},
    )
    defs["ChunkChoice"] = obj(
        "One incremental choice in a streaming chat chunk.",
        [
            F("index", True, {"$ref": "#/$defs/NonNegativeInteger"}, "Zero-based choice index."),
            F("delta", True, {"$ref": "#/$defs/Delta"}, "Fields added by this streaming chunk."),
            F(
                "finish_reason",
                False,
                {"$ref": "#/$defs/FinishReason"},
                "Why generation ended; present only on the terminal chunk.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "ChunkChoice"},
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
    defs["Delta"] = obj(
        "Incremental message fields emitted in a streaming choice.",
        [
            F("role", False, {"type": "string"}, "Role emitted when a streaming choice begins."),
            F("content", False, {"type": "string"}, "Incremental final-answer text."),
            F(
                "reasoning_content",
                False,
                {"type": "string"},
                "Incremental separated reasoning text.",
            ),
            F(
                "tool_calls",
                False,
                {"$ref": "#/$defs/ToolCallArray"},
                "Tool-call deltas emitted by this chunk.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "Delta"},
    )
    defs["FinishReason"] = leaf(
        "Why generation ended. `error` identifies a per-item batch failure; ordinary termination emits `stop`, `length`, or `tool_calls`.",
        {"type": "string", "enum": ["error", "length", "stop", "tool_calls"]},
    )
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
    defs["NonNegativeInteger"] = leaf(
        "An integer greater than or equal to zero.",
        {"type": "integer", "minimum": 0},
    )
    defs["NullableBoolean"] = leaf(
        "A Boolean value or null.",
        {"oneOf": [{"type": "null"}, {"type": "boolean"}]},
    )
    defs["NullableNonNegativeInteger"] = leaf(
        "A non-negative integer or null.",
        {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/NonNegativeInteger"}]},
    )
    defs["NullableNonNegativeNumber"] = leaf(
        "A non-negative finite JSON number or null.",
        {"oneOf": [{"type": "null"}, {"type": "number", "minimum": 0}]},
    )
    defs["NullableSamplingNumber"] = leaf(
        "Finite JSON number or null. The chat and batch endpoints currently apply no narrower range check before sampling.",
        {"oneOf": [{"type": "null"}, {"type": "number"}]},
        annotations={"x-kiln-runtime-validation": "finite_json_number_only"},
    )
    defs["NullableString"] = leaf(
        "A string or null.",
        {"oneOf": [{"type": "null"}, {"type": "string"}]},
    )
    defs["NullableTemplateKwargs"] = leaf(
        "Template-specific keyword arguments, or null.",
        {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "additionalProperties": {},
                    "description": "Template-specific JSON values, including enable_thinking.",
                },
            ]
        },
    )
    defs["NullableToolArray"] = leaf(
        "OpenAI-shaped tool definitions, or null.",
        {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "array",
                    "items": {},
                    "description": "Opaque OpenAI tool definitions forwarded to the chat template.",
                },
            ]
        },
    )
    defs["NullableUint32"] = leaf(
        "An unsigned 32-bit integer or null.",
        {"oneOf": [{"type": "null"}, {"type": "integer", "minimum": 0, "maximum": UINT32_MAX}]},
    )
    defs["NullableUint64"] = leaf(
        "An unsigned 64-bit integer or null.",
        {"oneOf": [{"type": "null"}, {"type": "integer", "minimum": 0, "maximum": UINT64_MAX}]},
    )
    defs["PromptLogprobEntry"] = obj(
        "The log probability, rank, and decoded text for one candidate token.",
        [
            F(
                "logprob",
                True,
                {"type": "number"},
                "Natural-log probability assigned to this token.",
            ),
            F(
                "rank",
                True,
                {"type": "integer", "minimum": 1},
                "One-based vocabulary rank by log probability.",
            ),
            F(
                "decoded_token",
                True,
                {"type": "string"},
                "Tokenizer-decoded text for this token ID.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "PromptLogprobEntry"},
    )
    defs["PromptLogprobMap"] = obj(
        "Map from decimal token ID strings to the observed/top-K log-probability entry.",
        [],
        closed=False,
        rules={
            "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": {"$ref": "#/$defs/PromptLogprobEntry"},
        },
        annotations={"x-kiln-rust-type": "BTreeMap<String, PromptLogprobEntry>"},
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
    defs["RolloutActionTokenV1"] = leaf(
        "One generated token labeled as sampled or forced, with the behavior-policy log probability present only for sampled tokens.",
        {
            "oneOf": [
                {
                    "type": "object",
                    "required": ["sequence_index", "token_id", "source", "behavior_logprob"],
                    "properties": {
                        "sequence_index": {"$ref": "#/$defs/NonNegativeInteger"},
                        "token_id": {"type": "integer", "minimum": 0, "maximum": UINT32_MAX},
                        "source": {"const": "sampled"},
                        "behavior_logprob": {"type": "number", "maximum": 1e-06},
                    },
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "required": ["sequence_index", "token_id", "source", "behavior_logprob"],
                    "properties": {
                        "sequence_index": {"$ref": "#/$defs/NonNegativeInteger"},
                        "token_id": {"type": "integer", "minimum": 0, "maximum": UINT32_MAX},
                        "source": {"const": "forced"},
                        "behavior_logprob": {"type": "null"},
                    },
                    "additionalProperties": False,
                },
            ]
        },
        annotations={"x-kiln-rust-type": "RolloutActionTokenV1"},
    )
    defs["RolloutAdapterIdentityV1"] = obj(
        "The name and content hash of the adapter used for a rollout.",
        [
            F("name", True, {"$ref": "#/$defs/RolloutIdentityText"}, "Saved adapter name."),
            F(
                "content_sha256",
                True,
                {"$ref": "#/$defs/Sha256"},
                "Content hash of the adapter used for generation.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "RolloutAdapterIdentityV1"},
    )
    defs["RolloutBehaviorPolicyIdentityV1"] = obj(
        "Content-addressed identity of the model, adapter, configuration, and implementation that generated a rollout.",
        [
            F(
                "served_model_id",
                True,
                {"$ref": "#/$defs/RolloutIdentityText"},
                "Model ID exposed by the inference API.",
            ),
            F(
                "base_model_sha256",
                True,
                {"$ref": "#/$defs/Sha256"},
                "Canonical content hash of the base model.",
            ),
            F(
                "adapter",
                False,
                {"$ref": "#/$defs/RolloutAdapterIdentityV1"},
                "Adapter identity when generation used one; omitted for base.",
            ),
            F(
                "inference_config_sha256",
                True,
                {"$ref": "#/$defs/Sha256"},
                "Hash of the resolved inference policy.",
            ),
            F(
                "implementation",
                True,
                {"$ref": "#/$defs/RolloutIdentityText"},
                "Implementation identity that generated the rollout.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "RolloutBehaviorPolicyIdentityV1"},
    )
    defs["RolloutChatTemplateInvocationV1"] = obj(
        "Tool and template inputs that affected the rendered rollout prompt.",
        [
            F(
                "tools",
                False,
                {"type": "array", "items": {}, "maxItems": 256},
                "Tool definitions supplied to the chat template.",
            ),
            F(
                "tool_choice",
                False,
                {},
                "OpenAI-shaped tool-choice value supplied to the chat template.",
            ),
            F(
                "template_kwargs",
                False,
                {"type": "object", "maxProperties": 256},
                "Additional keyword arguments supplied to the chat template.",
            ),
        ],
        closed=True,
        annotations={
            "x-kiln-rust-type": "RolloutChatTemplateInvocationV1",
            "x-kiln-semantic-constraints": ["serialized object size <= 1048576 bytes"],
        },
    )
    defs["RolloutIdentityText"] = leaf(
        "Non-empty, trimmed identity text without control characters. The schema's `maxLength` bounds code points; the runtime also rejects surrounding whitespace and enforces at most 256 UTF-8 bytes.",
        {"type": "string", "minLength": 1, "maxLength": 256, "pattern": CONTROL_FREE},
        annotations={"x-kiln-max-utf8-bytes": 256},
    )
    defs["RolloutProvenanceV1"] = obj(
        "Exact prompt, action-token, behavior-policy, tokenizer, sampling, and backend evidence for one generated rollout.",
        [
            F(
                "schema",
                True,
                {"const": "kiln.rollout-provenance.v1"},
                "Provenance schema identifier.",
            ),
            F(
                "input_token_ids",
                True,
                {
                    "type": "array",
                    "items": {"type": "integer"},
                    "minItems": 1,
                    "maxItems": 16777216,
                },
                "Rendered prompt tokens followed by every generated action token.",
            ),
            F(
                "prompt_token_count",
                True,
                {"type": "integer", "minimum": 1},
                "Number of leading input_token_ids that belong to the rendered prompt.",
            ),
            F(
                "prompt_messages_sha256",
                True,
                {"$ref": "#/$defs/Sha256"},
                "Hash of the canonical input-message payload.",
            ),
            F(
                "scored_payload_sha256",
                True,
                {"$ref": "#/$defs/Sha256"},
                "Hash of the exact token payload scored by the behavior policy.",
            ),
            F(
                "action_tokens",
                True,
                {"type": "array", "items": {"$ref": "#/$defs/RolloutActionTokenV1"}, "minItems": 1},
                "Ordered generated tokens with sampled-versus-forced provenance.",
            ),
            F(
                "behavior_policy",
                True,
                {"$ref": "#/$defs/RolloutBehaviorPolicyIdentityV1"},
                "Content-addressed policy that generated the action tokens.",
            ),
            F(
                "tokenizer",
                True,
                {"$ref": "#/$defs/RolloutTokenizerIdentityV1"},
                "Content-addressed tokenizer used for prompt rendering and generation.",
            ),
            F(
                "template_invocation",
                False,
                {"$ref": "#/$defs/RolloutChatTemplateInvocationV1"},
                "Tool and template arguments that affected prompt rendering; omitted when empty.",
            ),
            F(
                "sampling",
                True,
                {"$ref": "#/$defs/RolloutSamplingConfigV1"},
                "Resolved sampling configuration used for generation.",
            ),
            F(
                "seed",
                True,
                {"type": "integer", "minimum": 0, "maximum": UINT64_MAX},
                "Resolved generation seed.",
            ),
            F(
                "generation_backend",
                True,
                {"type": "string", "minLength": 1, "maxLength": 64, "pattern": CONTROL_FREE},
                "Backend name that generated the rollout.",
            ),
        ],
        closed=True,
        annotations={
            "x-kiln-rust-type": "kiln_train::RolloutProvenanceV1",
            "x-kiln-semantic-constraints": [
                "prompt_token_count <= input_token_ids.length",
                "action token sequence_index values are strictly increasing and index generated tokens",
                "each action token_id equals input_token_ids[sequence_index]",
                "at least one action token is sampled",
                "forced action token IDs belong to sampling.thinking_budget.close_token_ids",
            ],
        },
    )
    defs["RolloutSamplingConfigV1"] = obj(
        "Resolved sampling policy used to generate a rollout.",
        [
            F(
                "temperature",
                True,
                {"type": "number", "minimum": 0},
                "Resolved sampling temperature.",
            ),
            F(
                "top_p",
                True,
                {"type": "number", "minimum": 0, "maximum": 1},
                "Resolved nucleus-sampling probability mass.",
            ),
            F(
                "top_k",
                True,
                {"type": "integer", "minimum": 0, "maximum": UINT32_MAX},
                "Resolved maximum candidate count; zero disables top-k filtering.",
            ),
            F(
                "min_p",
                True,
                {"type": "number", "minimum": 0, "maximum": 1},
                "Resolved minimum probability relative to the most likely token.",
            ),
            F(
                "max_tokens",
                True,
                {"type": "integer", "minimum": 1},
                "Resolved generation-token ceiling.",
            ),
            F(
                "repetition_penalty",
                True,
                {"type": "number", "exclusiveMinimum": 0},
                "Resolved repetition penalty.",
            ),
            F(
                "presence_penalty",
                True,
                {"type": "number", "minimum": -2, "maximum": 2},
                "Resolved OpenAI-style presence penalty.",
            ),
            F(
                "frequency_penalty",
                True,
                {"type": "number", "minimum": -2, "maximum": 2},
                "Resolved OpenAI-style frequency penalty.",
            ),
            F(
                "stop",
                True,
                {"type": "array", "items": {"type": "string"}, "maxItems": 256},
                "Resolved stop sequences.",
            ),
            F(
                "thinking_budget",
                False,
                {"$ref": "#/$defs/RolloutThinkingBudgetV1"},
                "Resolved thinking limit when one applied.",
            ),
        ],
        closed=True,
        annotations={
            "x-kiln-rust-type": "RolloutSamplingConfigV1",
            "x-kiln-semantic-constraints": ["sum of UTF-8 stop-sequence bytes <= 16384"],
        },
    )
    defs["RolloutThinkingBudgetV1"] = obj(
        "Resolved thinking limit and the token sequence used to close the thinking block.",
        [
            F(
                "max_tokens",
                False,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Maximum thinking tokens before forced closure.",
            ),
            F(
                "max_time_ms",
                False,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Maximum thinking time in milliseconds before forced closure.",
            ),
            F(
                "close_token_ids",
                True,
                {"type": "array", "items": {"type": "integer"}, "minItems": 1},
                "Token sequence forced when a thinking limit closes the thinking block.",
            ),
        ],
        closed=True,
        rules={"anyOf": [{"required": ["max_tokens"]}, {"required": ["max_time_ms"]}]},
        annotations={"x-kiln-rust-type": "RolloutThinkingBudgetV1"},
    )
    defs["RolloutTokenizerIdentityV1"] = obj(
        "Content hashes for the tokenizer vocabulary, configuration, and chat template.",
        [
            F(
                "vocab_sha256",
                True,
                {"$ref": "#/$defs/Sha256"},
                "Hash of tokenizer vocabulary content.",
            ),
            F(
                "config_sha256",
                True,
                {"$ref": "#/$defs/Sha256"},
                "Hash of tokenizer configuration content.",
            ),
            F(
                "chat_template_sha256",
                True,
                {"$ref": "#/$defs/Sha256"},
                "Hash of the chat template used to render the rollout prompt.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "RolloutTokenizerIdentityV1"},
    )
    defs["SamplingPreset"] = leaf(
        "Named sampling profile. Known values are `qwen3-thinking-general`, `qwen3-thinking-coding`, `qwen3-non-thinking-general`, `qwen3-non-thinking-reasoning`, and `greedy`. For compatibility, the current runtime maps an unknown string to `qwen3-thinking-general` instead of rejecting it.",
        {"oneOf": [{"type": "null"}, {"type": "string"}]},
        annotations={
            "x-kiln-known-values": [
                "greedy",
                "qwen3-non-thinking-general",
                "qwen3-non-thinking-reasoning",
                "qwen3-thinking-coding",
                "qwen3-thinking-general",
            ],
            "x-kiln-unknown-value-policy": "fallback_to_qwen3_thinking_general",
        },
    )
    defs["Sha256"] = leaf(
        "A lowercase SHA-256 digest prefixed with sha256:.",
        {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
    )
    defs["StopInput"] = leaf(
        "Missing or null means no explicit stop sequence. One string and an array of strings normalize to the same internal list.",
        {
            "oneOf": [
                {"type": "null"},
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
            ]
        },
    )
    defs["StreamOptions"] = obj(
        "Options that control additional events in a streaming response.",
        [
            F(
                "include_usage",
                False,
                {"type": "boolean"},
                "Emit a final empty-choices chunk containing usage before [DONE].",
                default=False,
            ),
        ],
        closed=False,
        annotations={
            "x-kiln-rust-type": "StreamOptions",
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )
    defs["StreamingTerminalMetadata"] = obj(
        "Metadata attached only to the terminal finish chunk.",
        [
            F(
                "thinking_budget",
                True,
                {"$ref": "thinking-budget-v1.schema.json#/$defs/record"},
                "Resolved and terminal thinking-budget record.",
            ),
            F(
                "performance",
                False,
                {"$ref": "#/$defs/ChatCompletionPerformanceMetadata"},
                "Performance metadata when explicitly requested.",
            ),
        ],
        closed=True,
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
    defs["TextCompletionChoice"] = obj(
        "Prompt log probabilities and termination status for one scored prompt.",
        [
            F(
                "index",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Zero-based choice index; always zero for this endpoint.",
            ),
            F(
                "text",
                True,
                {"type": "string"},
                "Generated text; empty in prompt-logprob scoring mode.",
            ),
            F("finish_reason", True, {"$ref": "#/$defs/FinishReason"}, "Why prompt scoring ended."),
            F(
                "prompt_logprobs",
                False,
                {
                    "type": "array",
                    "items": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/PromptLogprobMap"}]},
                },
                "One entry per prompt token. The first is null; later maps contain the observed token plus requested top-K candidates.",
            ),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "TextCompletionChoice"},
    )
    defs["TextCompletionRequest"] = obj(
        "Score prompt-token log probabilities through the compatibility completions endpoint.",
        [
            F(
                "model",
                False,
                {"$ref": "#/$defs/NullableString"},
                "Must match the served base model when non-null.",
            ),
            F(
                "prompt",
                True,
                {
                    "oneOf": [
                        {"type": "string"},
                        {
                            "type": "array",
                            "items": {"type": "integer", "minimum": 0, "maximum": UINT32_MAX},
                            "minItems": 1,
                            "maxItems": MAX_PROMPT_TOKENS,
                        },
                    ]
                },
                "Text or raw token IDs. The tokenized prompt is capped at 4096 and the served context length.",
            ),
            F(
                "max_tokens",
                False,
                nullable({"type": "integer", "minimum": 0, "maximum": 1}),
                "Must be null, 0, or 1. This endpoint scores prompt log probabilities; it does not provide general text generation.",
                default=1,
            ),
            F(
                "prompt_logprobs",
                True,
                {"type": "integer", "minimum": 0, "maximum": 256},
                "Requested top K. The runtime also caps K by vocabulary size and total returned candidates at 65536.",
            ),
            F(
                "n",
                False,
                nullable({"const": 1}),
                "Compatibility field. Missing, null, and 1 all request the single supported choice.",
                default=1,
            ),
            F(
                "stream",
                False,
                {"const": False},
                "Prompt-logprob scoring is non-streaming only.",
                default=False,
            ),
            F(
                "add_special_tokens",
                False,
                {"type": "boolean"},
                "Tokenizer special-token insertion for text prompts; ignored for token-ID prompts.",
                default=True,
            ),
        ],
        closed=False,
        annotations={
            "x-kiln-field-schema-status": "complete",
            "x-kiln-rust-type": "TextCompletionRequest",
            "x-kiln-semantic-constraints": [
                "the tokenized prompt is non-empty and has at most min(4096, served context length) tokens",
                "raw token IDs and prompt_logprobs do not exceed the served vocabulary",
                "scored positions * (prompt_logprobs + 1) <= 65536",
                "real scoring rejects an active LoRA until adapter revision identity can be pinned",
            ],
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )
    defs["TextCompletionResponse"] = obj(
        "Prompt-token log probabilities, identity, and token usage for one scored prompt.",
        [
            F("id", True, {"type": "string", "pattern": "^cmpl-"}, "Unique completion identifier."),
            F(
                "object",
                True,
                {"const": "text_completion"},
                "OpenAI-compatible text-completion discriminator.",
            ),
            F(
                "created",
                True,
                {"$ref": "#/$defs/UnixSeconds"},
                "Created. Whole seconds since the Unix epoch.",
            ),
            F("model", True, {"type": "string"}, "Served base-model ID used for scoring."),
            F(
                "system_fingerprint",
                True,
                {"$ref": "#/$defs/NullableString"},
                "Canonical content-addressed teacher identity; mock responses retain the field as null.",
            ),
            F(
                "choices",
                True,
                {
                    "type": "array",
                    "items": {"$ref": "#/$defs/TextCompletionChoice"},
                    "minItems": 1,
                    "maxItems": 1,
                },
                "The single prompt-scoring choice.",
            ),
            F(
                "usage",
                True,
                {"$ref": "#/$defs/Usage"},
                "Usage. Prompt, completion, and total token counts.",
            ),
        ],
        closed=True,
        annotations={
            "x-kiln-field-schema-status": "complete",
            "x-kiln-rust-type": "TextCompletionResponse",
        },
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
    defs["ToolCallArray"] = leaf(
        "Opaque OpenAI-shaped tool-call values. Kiln normalizes generated Qwen tool calls but preserves prior-turn values for template round trips.",
        {"type": "array", "items": {}},
    )
    defs["UnixSeconds"] = leaf(
        "Whole seconds since the Unix epoch.",
        {"type": "integer", "minimum": 0},
    )
    defs["Usage"] = obj(
        "Prompt, completion, and total token counts.",
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
                "total_tokens",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Prompt tokens plus completion tokens.",
            ),
        ],
        closed=True,
        annotations={
            "x-kiln-rust-type": "Usage",
            "x-kiln-semantic-constraints": ["total_tokens = prompt_tokens + completion_tokens"],
        },
    )
    return defs


def added_defs() -> dict[str, Schema]:
    """Definitions that are not in the seed (see CHANGELOG.md): errors, models, health."""
    defs: dict[str, Schema] = {}
    defs["ErrorDetail"] = obj(
        "The error object of an error response (OpenAI shape). Kiln's machine-readable codes, such "
        "as `chat_invalid_request` or `adapter_not_found`, are carried in `code`.",
        [
            F("message", True, {"type": "string"}, "Human-readable description of the error."),
            F(
                "type",
                True,
                {"type": "string"},
                "Error category, for example `invalid_request_error`, `not_found_error` or "
                "`server_error`.",
            ),
            F(
                "param",
                False,
                ref("NullableString"),
                "The request field the error refers to (a JSON path such as `$.n`), or null.",
            ),
            F("code", False, ref("NullableString"), "Kiln error code, or null."),
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "ApiErrorBody"},
    )
    defs["ErrorResponse"] = obj(
        "The JSON body of every error response.",
        [F("error", True, ref("ErrorDetail"), "The error.")],
        closed=True,
        annotations={"x-kiln-rust-type": "ApiError"},
        examples=[
            {
                "error": {
                    "message": "n greater than 1 requires stream=false",
                    "type": "invalid_request_error",
                    "param": "$.n",
                    "code": "chat_invalid_request",
                }
            },
            {"error": {"message": "Malformed JSON body.", "type": "invalid_request_error"}},
        ],
    )
    defs["HealthResponse"] = obj(
        "Readiness of the server. `loading` and `error` are served with HTTP 503.",
        [
            F(
                "status",
                True,
                {"type": "string", "enum": ["ok", "loading", "error"]},
                "`ok` when the model is loaded and requests are admitted; `loading` while the "
                "model loads; `error` when the engine cannot serve.",
            ),
            F("model", True, {"type": "string"}, "Served model ID."),
            F(
                "detail",
                False,
                ref("NullableString"),
                "Why the server is not ready; omitted or null when `status` is `ok`.",
            ),
        ],
        closed=True,
        examples=[{"status": "ok", "model": "example-model"}],
    )
    defs["ModelCard"] = obj(
        "One model that requests may name: the served base model or an available adapter.",
        [
            F("id", True, {"type": "string", "minLength": 1}, "Model ID to use as `model`."),
            F("object", True, {"const": "model"}, "OpenAI-compatible object discriminator."),
            F("created", True, ref("UnixSeconds"), "Created. Whole seconds since the Unix epoch."),
            F("owned_by", True, {"type": "string"}, "Owner label; `kiln` for served models."),
            F(
                "parent",
                False,
                ref("NullableString"),
                "For an adapter, the ID of the base model it applies to; null for a base model.",
            ),
            F(
                "root",
                False,
                ref("NullableString"),
                "The model's root: the base model's source (path or repository ID), or null.",
            ),
            F(
                "max_model_len",
                False,
                ref("NullableNonNegativeInteger"),
                "Served context length in tokens, or null when unknown.",
            ),
        ],
        closed=True,
        examples=[
            {
                "id": "example-model",
                "object": "model",
                "created": 1700000000,
                "owned_by": "kiln",
                "parent": None,
                "root": "example-model",
                "max_model_len": 8192,
            },
            {
                "id": "style",
                "object": "model",
                "created": 1700000000,
                "owned_by": "kiln",
                "parent": "example-model",
            },
        ],
    )
    defs["ModelList"] = obj(
        "Models that requests may name (`GET /v1/models`): the base model, then adapters.",
        [
            F("object", True, {"const": "list"}, "OpenAI-compatible list discriminator."),
            F(
                "data",
                True,
                {"type": "array", "items": ref("ModelCard")},
                "The served base model first, then the available adapters by name.",
            ),
        ],
        closed=True,
        examples=[
            {
                "object": "list",
                "data": [
                    {
                        "id": "example-model",
                        "object": "model",
                        "created": 1700000000,
                        "owned_by": "kiln",
                    }
                ],
            }
        ],
    )
    defs.update(adapter_defs())
    return defs


def adapter_defs() -> dict[str, Schema]:
    """Adapter management bodies (`/v1/adapters...`), added for LoRA serving (CHANGELOG.md)."""
    defs: dict[str, Schema] = {}
    name = {"type": "string", "minLength": 1, "maxLength": 255}
    defs["AdapterInfo"] = obj(
        "One adapter directory under the server's adapter directory.",
        [
            F("name", True, name, "Adapter name (its directory name)."),
            F("has_config", True, {"type": "boolean"}, "Whether adapter_config.json exists."),
            F(
                "has_weights", True, {"type": "boolean"},
                "Whether adapter_model.safetensors exists.",
            ),
            F("size_bytes", True, {"type": "integer", "minimum": 0}, "Total size of its files."),
            F(
                "modified_at", True, ref("NullableString"),
                "Last modification time, ISO-8601 UTC with a Z suffix, or null.",
            ),
            F(
                "files", True, {"type": "array", "items": {"type": "string"}},
                "File names inside the adapter directory, sorted.",
            ),
        ],
        closed=True,
    )
    defs["AdapterList"] = obj(
        "Available adapters and the server default (`GET /v1/adapters`).",
        [
            F(
                "active", True, ref("NullableString"),
                "The server-default adapter used when a chat request omits `adapter`, or null "
                "for the base model.",
            ),
            F(
                "available", True, {"type": "array", "items": ref("AdapterInfo")},
                "Adapters found in the adapter directory, sorted by name.",
            ),
        ],
        closed=True,
        examples=[{"active": None, "available": []}],
    )
    defs["AdapterLoadRequest"] = obj(
        "Make a named adapter the server default (`POST /v1/adapters/load`).",
        [F("name", True, name, "Adapter name: a direct child directory of the adapter dir.")],
        closed=False,
        annotations={"x-kiln-unknown-field-policy": "accepted_and_ignored"},
        examples=[{"name": "style"}],
    )
    defs["AdapterStatusResponse"] = obj(
        "Result of an adapter management call.",
        [
            F(
                "status", True, {"type": "string", "enum": ["loaded", "unloaded", "deleted"]},
                "What happened.",
            ),
            F("name", False, ref("NullableString"), "The adapter concerned, if any."),
            F(
                "deleted", False, {"type": "array", "items": {"type": "string"}},
                "Directories removed by a delete (the adapter and its checkpoints).",
            ),
        ],
        closed=True,
    )
    return defs


ENTRYPOINTS = [
    "BatchCompletionRequest",
    "BatchCompletionResponse",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "TextCompletionRequest",
    "TextCompletionResponse",
]


def inference_schema() -> Schema:
    defs = inference_defs()
    defs.update(added_defs())
    return {
        "$schema": DIALECT,
        "$id": BASE_URI + MAIN_FILE,
        "title": "Kiln inference API contract v1",
        "description": (
            "Canonical field-level wire contract for POST /v1/chat/completions, POST "
            "/v1/completions, and POST /v1/completions/batch. Request objects explicitly identify "
            "Kiln's OpenAI-compatibility policy for unknown inputs; response objects describe "
            "only fields Kiln emits. Arbitrary JSON remains deliberate only for OpenAI tool "
            "definitions, tool choices, calls, and chat-template extension values."
        ),
        "oneOf": [ref(name) for name in ENTRYPOINTS],
        **SEED_ROOT_ANNOTATIONS,
        "$defs": {name: defs[name] for name in sorted(defs)},
    }


# ---------------------------------------------------------------------------------------------
# thinking-budget-v1.schema.json
# ---------------------------------------------------------------------------------------------

SOURCES_FINITE = ["server_default", "request", "suite", "run_override", "example", "unknown"]
SOURCES_UNLIMITED = [
    "unlimited",
    "request_unlimited",
    "suite_unlimited",
    "run_override_unlimited",
    "example_unlimited",
    "unknown",
]
SOURCES = [
    "unlimited",
    "server_default",
    "request",
    "request_unlimited",
    "suite",
    "suite_unlimited",
    "run_override",
    "run_override_unlimited",
    "example",
    "example_unlimited",
    "unknown",
]


def _count(description: str) -> Schema:
    return {"type": "integer", "minimum": 0, "description": description}


def _limit_matches_source(limit: str, source: str) -> Schema:
    """A finite limit needs a finite source; an absent limit needs an unlimited one."""
    return {
        "if": {"required": [limit]},
        "then": {"properties": {source: {"enum": SOURCES_FINITE}}},
        "else": {"properties": {source: {"enum": SOURCES_UNLIMITED}}},
    }


def thinking_budget_schema() -> Schema:
    any_limit = {"anyOf": [{"required": ["max_tokens"]}, {"required": ["max_time_ms"]}]}
    outcome_props: Schema = {
        "triggered": {
            "type": "boolean",
            "description": "Whether a limit forced the close sequence (trigger is then present).",
        },
        "trigger": {"$ref": "#/$defs/trigger"},
        "closed": {
            "type": "boolean",
            "description": "Whether the thinking block was closed (naturally or by force).",
        },
        "thinking_tokens": _count("Generated tokens counted as thinking."),
        "thinking_time_ms": _count("Thinking time in milliseconds, from the first decode step."),
    }
    record_outcome_props: Schema = {
        "applied": {
            "type": "boolean",
            "description": (
                "Whether the limit applied: configured, the rendered prompt starts inside a "
                "reasoning block, and max_tokens > 0."
            ),
        },
        **outcome_props,
    }
    trigger_iff_triggered = {
        "if": {"properties": {"triggered": {"const": True}}, "required": ["triggered"]},
        "then": {"required": ["trigger"]},
        "else": {"not": {"required": ["trigger"]}},
    }
    defs: dict[str, Schema] = {
        "limitOverride": {
            "description": (
                "A per-request thinking limit. Applies only when the property is present; absence "
                "inherits the server default."
            ),
            "oneOf": [
                {"type": "null", "description": "Explicitly unlimited, even over a default."},
                {
                    "type": "integer",
                    "minimum": 0,
                    "description": (
                        "Finite limit; 0 means closure starts at the first decode candidate."
                    ),
                },
            ],
        },
        "source": {
            "description": (
                "Authority that supplied or removed a thinking limit. An `_unlimited` suffix means "
                "that surface explicitly removed an inherited limit."
            ),
            "type": "string",
            "enum": SOURCES,
        },
        "trigger": {
            "description": (
                "The boundary that forced the close sequence; `max_tokens` is the remaining "
                "completion capacity."
            ),
            "type": "string",
            "enum": ["tokens", "time", "max_tokens"],
        },
        "request": {
            "description": "The thinking-budget fields of a request body.",
            "type": "object",
            "properties": {
                "thinking_budget_tokens": {"$ref": "#/$defs/limitOverride"},
                "thinking_budget_ms": {"$ref": "#/$defs/limitOverride"},
            },
            "additionalProperties": True,
        },
        "serverDefaults": {
            "description": "Server-wide default thinking limits; null means unlimited.",
            "type": "object",
            "required": ["default_thinking_budget_tokens", "default_thinking_budget_ms"],
            "properties": {
                "default_thinking_budget_tokens": {
                    "oneOf": [{"type": "null"}, {"type": "integer", "minimum": 0}]
                },
                "default_thinking_budget_ms": {
                    "oneOf": [{"type": "null"}, {"type": "integer", "minimum": 0}]
                },
            },
            "additionalProperties": False,
        },
        "effective": {
            "description": (
                "Resolved thinking limits and their sources. An absent limit means that dimension "
                "is unlimited; `configured` is true exactly when a limit is present."
            ),
            "type": "object",
            "required": ["configured", "tokens_source", "time_source"],
            "properties": {
                "configured": {
                    "type": "boolean",
                    "description": "Whether either resolved thinking limit is finite.",
                },
                "max_tokens": _count("Resolved thinking-token limit; omitted when unlimited."),
                "max_time_ms": _count(
                    "Resolved thinking-time limit in milliseconds; omitted when unlimited."
                ),
                "tokens_source": {"$ref": "#/$defs/source"},
                "time_source": {"$ref": "#/$defs/source"},
            },
            "allOf": [
                {
                    "if": {
                        "properties": {"configured": {"const": True}},
                        "required": ["configured"],
                    },
                    "then": any_limit,
                    "else": {"not": any_limit},
                },
                _limit_matches_source("max_tokens", "tokens_source"),
                _limit_matches_source("max_time_ms", "time_source"),
            ],
        },
        "outcome": {
            "description": (
                "Per-completion terminal thinking-budget state. A natural close has "
                "`triggered: false` and no `trigger`."
            ),
            "type": "object",
            "required": ["triggered", "closed", "thinking_tokens", "thinking_time_ms"],
            "properties": outcome_props,
            "additionalProperties": False,
            "allOf": [trigger_iff_triggered],
        },
        "record": {
            "description": (
                "The flat thinking-budget record written by chat, streaming and batch: the "
                "resolved limits plus, when a budget applied and finished, its outcome."
            ),
            "allOf": [
                {"$ref": "#/$defs/effective"},
                {
                    "type": "object",
                    "required": ["applied", "triggered"],
                    "properties": record_outcome_props,
                },
                {
                    "if": {"properties": {"applied": {"const": True}}, "required": ["applied"]},
                    "then": {"properties": {"configured": {"const": True}}},
                },
                {
                    "if": {"required": ["closed"]},
                    "then": {
                        "required": ["thinking_tokens", "thinking_time_ms"],
                        "properties": {"applied": {"const": True}},
                        **trigger_iff_triggered,
                    },
                    "else": {
                        "properties": {"triggered": {"const": False}},
                        "not": {
                            "anyOf": [
                                {"required": ["trigger"]},
                                {"required": ["thinking_tokens"]},
                                {"required": ["thinking_time_ms"]},
                            ]
                        },
                    },
                },
            ],
            "unevaluatedProperties": False,
        },
        "recentRecord": {
            "description": (
                "A thinking-budget record in the recent-requests log; outcome fields may be "
                "absent when the request failed before they were known."
            ),
            "allOf": [
                {"$ref": "#/$defs/effective"},
                {"type": "object", "properties": record_outcome_props},
            ],
            "unevaluatedProperties": False,
        },
    }
    return {
        "$schema": DIALECT,
        "$id": BASE_URI + TB_FILE,
        "title": "Kiln thinking-budget contract v1",
        "description": (
            "Thinking-budget fragments shared by the inference contract: request overrides, "
            "server defaults, resolved limits, terminal outcomes, and records."
        ),
        "$defs": defs,
    }


# ---------------------------------------------------------------------------------------------
# routes.json
# ---------------------------------------------------------------------------------------------

_ERROR_TEXT = {
    "400": "Invalid request (malformed JSON, contract violation, or a semantic rule).",
    "401": "Missing or invalid API key (when the server requires one).",
    "404": "Unknown model or adapter.",
    "409": "The adapter is the server default and cannot be deleted.",
    "408": "The request exceeded the server's request timeout.",
    "413": "Request body over the size limit.",
    "415": "Request body is not application/json.",
    "429": "Too many requests in flight; retry after the Retry-After delay.",
    "500": "Server-side failure.",
    "501": "Requested feature is not available on this server.",
    "503": "The server is not ready or is overloaded.",
}


def _errors(*statuses: str) -> Schema:
    return {
        status: {
            "description": _ERROR_TEXT[status],
            "media_types": {"application/json": "ErrorResponse"},
        }
        for status in statuses
    }


def routes() -> list[Schema]:
    post_errors = ("400", "401", "404", "408", "413", "415", "429", "500", "501", "503")
    return [
        {
            "operation_id": "createChatCompletion",
            "method": "POST",
            "path": "/v1/chat/completions",
            "request": "ChatCompletionRequest",
            "responses": {
                "200": {
                    "description": "A chat completion, or an SSE stream when `stream` is true.",
                    "media_types": {
                        "application/json": "ChatCompletionResponse",
                        "text/event-stream": "ChatCompletionChunkStream",
                    },
                },
                **_errors(*post_errors),
            },
            "streaming": True,
            "tag": "inference",
            "summary": "Create one or more OpenAI-compatible chat-completion choices.",
        },
        {
            "operation_id": "createCompletion",
            "method": "POST",
            "path": "/v1/completions",
            "request": "TextCompletionRequest",
            "responses": {
                "200": {
                    "description": "Prompt-token log probabilities for the scored prompt.",
                    "media_types": {"application/json": "TextCompletionResponse"},
                },
                **_errors(*post_errors),
            },
            "streaming": False,
            "tag": "inference",
            "summary": "Score prompt-token log probabilities.",
        },
        {
            "operation_id": "createBatchCompletion",
            "method": "POST",
            "path": "/v1/completions/batch",
            "request": "BatchCompletionRequest",
            "responses": {
                "200": {
                    "description": "Every choice of every prompt, in prompt then choice order.",
                    "media_types": {"application/json": "BatchCompletionResponse"},
                },
                **_errors(*post_errors),
            },
            "streaming": False,
            "tag": "inference",
            "summary": "Generate one or more choices for each conversation in a batch.",
        },
        {
            "operation_id": "listModels",
            "method": "GET",
            "path": "/v1/models",
            "request": None,
            "responses": {
                "200": {
                    "description": "The served base model and the available adapters.",
                    "media_types": {"application/json": "ModelList"},
                },
                **_errors("401", "500"),
            },
            "streaming": False,
            "tag": "models",
            "summary": "List the models that requests may name.",
        },
        {
            "operation_id": "listAdapters",
            "method": "GET",
            "path": "/v1/adapters",
            "request": None,
            "responses": {
                "200": {
                    "description": "Available adapters and the server default.",
                    "media_types": {"application/json": "AdapterList"},
                },
                **_errors("401", "500"),
            },
            "streaming": False,
            "tag": "adapters",
            "summary": "List adapters in the adapter directory.",
        },
        {
            "operation_id": "loadAdapter",
            "method": "POST",
            "path": "/v1/adapters/load",
            "request": "AdapterLoadRequest",
            "responses": {
                "200": {
                    "description": "The adapter is loaded and is now the server default.",
                    "media_types": {"application/json": "AdapterStatusResponse"},
                },
                **_errors("400", "401", "404", "413", "415", "500"),
            },
            "streaming": False,
            "tag": "adapters",
            "summary": "Load an adapter and make it the server default.",
        },
        {
            "operation_id": "unloadAdapter",
            "method": "POST",
            "path": "/v1/adapters/unload",
            "request": None,
            "responses": {
                "200": {
                    "description": "The server default is the base model again.",
                    "media_types": {"application/json": "AdapterStatusResponse"},
                },
                **_errors("401", "500"),
            },
            "streaming": False,
            "tag": "adapters",
            "summary": "Revert the server default to the base model.",
        },
        {
            "operation_id": "deleteAdapter",
            "method": "DELETE",
            "path": "/v1/adapters/{name}",
            "request": None,
            "responses": {
                "200": {
                    "description": "The adapter directory (and its checkpoints) was deleted.",
                    "media_types": {"application/json": "AdapterStatusResponse"},
                },
                **_errors("400", "401", "404", "409", "500"),
            },
            "streaming": False,
            "tag": "adapters",
            "summary": "Delete an adapter (409 while it is the server default).",
        },
        {
            "operation_id": "getHealth",
            "method": "GET",
            "path": "/health",
            "request": None,
            "responses": {
                "200": {
                    "description": "The server is ready.",
                    "media_types": {"application/json": "HealthResponse"},
                },
                "503": {
                    "description": "The server is loading or cannot serve.",
                    "media_types": {"application/json": "HealthResponse"},
                },
            },
            "streaming": False,
            "tag": "observability",
            "summary": "Readiness of the server.",
        },
        {
            "operation_id": "getMetrics",
            "method": "GET",
            "path": "/metrics",
            "request": None,
            "responses": {
                "200": {
                    "description": "Prometheus text exposition format.",
                    "media_types": {"text/plain": None},
                },
                **_errors("500"),
            },
            "streaming": False,
            "tag": "observability",
            "summary": "Prometheus metrics.",
        },
        {
            "operation_id": "getOpenAPI",
            "method": "GET",
            "path": "/openapi.json",
            "request": None,
            "responses": {
                "200": {
                    "description": "The OpenAPI 3.1 document generated from this contract.",
                    "media_types": {"application/json": None},
                },
            },
            "streaming": False,
            "tag": "meta",
            "summary": "The OpenAPI document of this server.",
        },
    ]


# ---------------------------------------------------------------------------------------------


def render(value: Any) -> str:
    """Deterministic JSON text: key order as built, exact integers, UTF-8, trailing newline."""
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def outputs() -> dict[str, str]:
    return {
        MAIN_FILE: render(inference_schema()),
        TB_FILE: render(thinking_budget_schema()),
        "routes.json": render(routes()),
    }


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, text in outputs().items():
        path = HERE / name
        if check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("out of date: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
