"""The text completion and prompt scoring definitions (POST /v1/completions)."""

from __future__ import annotations

from .common import F, Schema, obj
from .completions_request import MAX_COMPLETION_CHOICES, completion_request_defs
from .logprobs import GENERATED_CHOICE_FIELDS, logprob_defs


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
        "One completion choice: generated text (or, in prompt-logprob scoring mode, the scored prompt).",
        [
            F(
                "index",
                True,
                {"$ref": "#/$defs/NonNegativeInteger"},
                "Zero-based choice index, prompt-major: prompt p, choice c is p * n + c (0 in scoring mode).",
            ),
            F(
                "text",
                True,
                {"type": "string"},
                "Generated text (after the prompt when echo is set); empty in prompt-logprob scoring mode.",
            ),
            F("finish_reason", True, {"$ref": "#/$defs/FinishReason"}, "Why generation (or prompt scoring) ended."),
            F(
                "prompt_logprobs",
                False,
                {
                    "type": "array",
                    "items": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/PromptLogprobMap"}]},
                },
                "One entry per prompt token. The first is null; later maps contain the observed token plus requested top-K candidates.",
            ),
            *GENERATED_CHOICE_FIELDS,
        ],
        closed=True,
        annotations={"x-kiln-rust-type": "TextCompletionChoice"},
    )
    defs["TextCompletionResponse"] = obj(
        "Generated completions (or one scored prompt's log probabilities), identity, and token usage.",
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
            F("model", True, {"type": "string"}, "Served model (or adapter) ID."),
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
                    "maxItems": MAX_COMPLETION_CHOICES,
                },
                "The choices, prompt-major (the single scored prompt in scoring mode).",
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
    defs.update(completion_request_defs())
    defs.update(logprob_defs())
    return defs
