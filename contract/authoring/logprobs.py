"""Logprob shapes of generated tokens (completions and chat), and the completions SSE chunk."""

from __future__ import annotations

from .common import F, Field, Schema, nullable, obj

TOKEN_IDS: Schema = {"type": "array", "items": {"$ref": "#/$defs/NonNegativeInteger"}}
BYTES: Schema = nullable({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}})

# Fields a generated completion choice carries beside index/text/finish_reason.
GENERATED_CHOICE_FIELDS: list[Field] = [
    F("logprobs", False, nullable({"$ref": "#/$defs/CompletionLogprobs"}),
      "Per-token logprobs when the request set logprobs; null otherwise."),
    F("stop_reason", False, {"oneOf": [{"type": "null"}, {"type": "string"}, {"type": "integer"}]},
      "The stop string or stop token ID that ended the choice; null for EOS or length."),
    F("prompt_token_ids", False, nullable(TOKEN_IDS), "The prompt's token IDs (return_token_ids)."),
    F("token_ids", False, nullable(TOKEN_IDS), "The generated token IDs (return_token_ids)."),
]


_REJECTED = "Not supported yet: any value but the default is a 400 unsupported_parameter (never ignored)."
# Added to ChatCompletionRequest (CHANGELOG): OpenAI's logprobs and vLLM's sampling extras.
CHAT_ADDED_FIELDS: list[Field] = [
    F("logprobs", False, {"$ref": "#/$defs/NullableBoolean"},
      "Return each generated token's logprob in choices[].logprobs.content.", default=False),
    F("top_logprobs", False, nullable({"type": "integer", "minimum": 0, "maximum": 20}),
      "Alternatives per position (0..20); needs logprobs: true."),
    F("stop_token_ids", False, nullable({"type": "array", "items": {"$ref": "#/$defs/NonNegativeInteger"}}),
      "Generating one of these token IDs stops the choice (vLLM).", default=[]),
    F("logit_bias", False, nullable({"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                                      "additionalProperties": {"type": "number"}}),
      "Token ID (decimal string) -> bias added to its logit before sampling; values clamped to -100..100."),
    F("min_tokens", False, {"type": "integer", "minimum": 0},
      "EOS and stop_token_ids cannot be generated before this many tokens (with stop strings: a 400 unsupported_parameter).", default=0),
    F("include_stop_str_in_output", False, {"type": "boolean"}, _REJECTED, default=False),
    F("continue_final_message", False, {"type": "boolean"}, _REJECTED, default=False),
]
CHOICE_LOGPROBS: Field = F("logprobs", False, nullable({"$ref": "#/$defs/ChatLogprobs"}),
                           "Token logprobs when the request set logprobs: true.")


def logprob_defs() -> dict[str, Schema]:
    defs: dict[str, Schema] = {}
    defs["CompletionLogprobs"] = obj(
        "OpenAI's legacy completions logprobs: parallel arrays, one entry per token of the choice's text (echoed prompt tokens first).",
        [
            F("tokens", True, {"type": "array", "items": {"type": "string"}},
              "Each token's text (or token_id:<id> with return_tokens_as_token_ids)."),
            F("token_logprobs", True, {"type": "array", "items": nullable({"type": "number"})},
              "Each token's logprob; null for the first echoed prompt token."),
            F("top_logprobs", True, {"type": "array", "items": nullable(
                {"type": "object", "additionalProperties": {"type": "number"}})},
              "Per position, the most likely tokens (and the chosen one) by text; null for the first echoed prompt token."),
            F("text_offset", True, {"type": "array", "items": {"$ref": "#/$defs/NonNegativeInteger"}},
              "Each token's character offset in the choice's text."),
        ],
        closed=True,
    )
    defs["ChatTopLogprob"] = obj(
        "One likely token at a position of a chat completion.",
        [
            F("token", True, {"type": "string"}, "The token's text."),
            F("logprob", True, {"type": "number"}, "Its logprob under the distribution the sampler used."),
            F("bytes", True, BYTES, "The token's own bytes (a byte-level token may be part of a character)."),
        ],
        closed=True,
    )
    defs["ChatTokenLogprob"] = obj(
        "A generated chat token with its logprob and the most likely alternatives.",
        [
            F("token", True, {"type": "string"}, "The token's text."),
            F("logprob", True, {"type": "number"}, "Its logprob under the distribution the sampler used."),
            F("bytes", True, BYTES, "The token's own bytes."),
            F("top_logprobs", True, {"type": "array", "items": {"$ref": "#/$defs/ChatTopLogprob"}, "maxItems": 20},
              "The top_logprobs most likely tokens at this position, most likely first."),
        ],
        closed=True,
    )
    defs["ChatLogprobs"] = obj(
        "OpenAI's chat logprobs object.",
        [
            F("content", True, nullable({"type": "array", "items": {"$ref": "#/$defs/ChatTokenLogprob"}}),
              "One entry per generated token (in a stream: the tokens of this chunk)."),
        ],
        closed=True,
    )
    choice_fields: list[Field] = [
        F("index", True, {"$ref": "#/$defs/NonNegativeInteger"}, "Zero-based choice index (prompt-major)."),
        F("text", True, {"type": "string"}, "Text added by this chunk."),
        F("finish_reason", True, nullable({"$ref": "#/$defs/FinishReason"}),
          "Why the choice ended; null until its last chunk."),
        *GENERATED_CHOICE_FIELDS,
    ]
    defs["TextCompletionChunkChoice"] = obj(
        "One choice's increment in a streamed completion.", choice_fields, closed=True)
    defs["TextCompletionChunk"] = obj(
        "One server-sent event of a streamed completion (`stream: true`); the stream ends with `data: [DONE]`.",
        [
            F("id", True, {"type": "string", "pattern": "^cmpl-"}, "Shared by every chunk of the stream."),
            F("object", True, {"const": "text_completion"}, "OpenAI's discriminator (the same as the JSON response)."),
            F("created", True, {"$ref": "#/$defs/UnixSeconds"}, "Whole seconds since the Unix epoch."),
            F("model", True, {"type": "string"}, "Served model (or adapter) ID."),
            F("choices", True, {"type": "array", "items": {"$ref": "#/$defs/TextCompletionChunkChoice"}},
              "The choices that advanced; the usage chunk has none."),
            F("usage", False, nullable({"$ref": "#/$defs/Usage"}),
              "On the last chunk only, with stream_options.include_usage."),
        ],
        closed=True,
    )
    return defs
