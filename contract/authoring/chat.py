"""The chat response, chunk and streaming definitions."""

from __future__ import annotations

from .common import F, Schema, leaf, obj
from .logprobs import CHOICE_LOGPROBS


def chat_response_defs() -> dict[str, Schema]:
    """Chat responses, stream chunks and their metadata."""
    defs: dict[str, Schema] = {}
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
            CHOICE_LOGPROBS,
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
            CHOICE_LOGPROBS,
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "ChunkChoice"},
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
    return defs
