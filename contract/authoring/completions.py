"""The text completion and prompt scoring definitions (POST /v1/completions)."""

from __future__ import annotations

from .common import MAX_PROMPT_TOKENS, UINT32_MAX, F, Schema, nullable, obj


def completion_defs() -> dict[str, Schema]:
    """Text completion request, response and prompt logprobs."""
    defs: dict[str, Schema] = {}
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
    return defs
