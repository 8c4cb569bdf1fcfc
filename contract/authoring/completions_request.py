"""POST /v1/completions request: vLLM's completions request (the seed
`vllm-completion-request.schema.json`, every property) with Kiln's prompt scoring as one case."""

from __future__ import annotations

from .common import MAX_PROMPT_TOKENS, UINT32_MAX, F, Field, Schema, nullable, obj

INT64_MIN = -9223372036854775808
INT64_MAX = 9223372036854775807
MAX_LOGPROBS = 20  # the server's --max-logprobs default (vLLM's too)
MAX_COMPLETION_CHOICES = 64  # prompts x n, as chat and batch

TOKEN_ID: Schema = {"type": "integer", "minimum": 0, "maximum": UINT32_MAX}
TOKEN_IDS: Schema = {"type": "array", "items": TOKEN_ID}
NUMBER: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
ANY_OBJECT: Schema = {"type": "object"}


def _n(schema: Schema) -> Schema:
    return nullable(schema)


def request_fields() -> list[Field]:
    """The seed's 55 properties in the seed's order, then Kiln's additions."""
    rejected = "Not supported by this server: any value but the default is a 400 unsupported_parameter."
    return [
        F("model", False, _n({"type": "string"}),
          "Served model ID or an adapter name; missing or null selects the served model."),
        F("prompt", True, {"oneOf": [
            {"type": "array", "items": TOKEN_ID, "minItems": 1, "maxItems": MAX_PROMPT_TOKENS},
            {"type": "array", "items": {**TOKEN_IDS, "minItems": 1}, "minItems": 1,
             "maxItems": MAX_COMPLETION_CHOICES},
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1,
             "maxItems": MAX_COMPLETION_CHOICES},
        ]}, "Text, a list of texts, token IDs, or a list of token-ID lists. Choices are prompt-major: prompt p, choice c has index p * n + c. Scoring takes one text or one ID list of at most 4096 tokens."),
        F("echo", False, _n(BOOL), "Prepend the prompt to each choice's text (and its logprobs when logprobs is set; the first prompt position's are null).", default=False),
        F("frequency_penalty", False, _n(NUMBER), "OpenAI-style frequency penalty; null: the preset's or none."),
        F("logit_bias", False, _n({"type": "object", "propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": NUMBER}),
          "Token ID (decimal string) -> bias added to its logit before sampling; values clamped to -100..100."),
        F("logprobs", False, _n({"type": "integer", "minimum": 0, "maximum": MAX_LOGPROBS}),
          "Return each generated token's logprob and this many most likely alternatives."),
        F("max_tokens", False, _n({"type": "integer", "minimum": 0}),
          "Tokens to generate per choice (default 16; null: up to the context window). With prompt_logprobs and max_tokens missing, null, 0 or 1 the request is Kiln's prompt scoring and generates nothing.", default=16),
        F("n", False, _n({"type": "integer", "minimum": 1, "maximum": MAX_COMPLETION_CHOICES}),
          "Choices per prompt (prompts x n at most 64); null is 1.", default=1),
        F("presence_penalty", False, _n(NUMBER), "OpenAI-style presence penalty; null: the preset's or none."),
        F("seed", False, _n({"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}),
          "Choice (p, c) samples with seed + p * n + c (mod 2^64)."),
        F("stop", False, {"oneOf": [{"type": "null"}, {"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]},
          "Stop strings; the text ends before the first match (stop_reason names it).", default=[]),
        F("stream", False, _n(BOOL), "Stream text_completion chunks as server-sent events, then [DONE].", default=False),
        F("stream_options", False, _n({"$ref": "#/$defs/StreamOptions"}),
          "include_usage: a last chunk with no choices carries the usage."),
        F("suffix", False, _n({"type": "string"}), rejected),
        F("temperature", False, _n(NUMBER), "Sampling temperature (0: greedy); null: the preset's or 1."),
        F("top_p", False, _n(NUMBER), "Nucleus-sampling mass; null: the preset's or off."),
        F("user", False, _n({"type": "string"}), "An end-user identifier; recorded nowhere (OpenAI and vLLM accept it too)."),
        F("use_beam_search", False, BOOL, rejected, default=False),
        F("top_k", False, _n({"type": "integer", "minimum": -1, "maximum": UINT32_MAX}),
          "Top-k filter; 0 and -1 are off; null: the preset's or off."),
        F("min_p", False, _n(NUMBER), "Min-p filter; null: the preset's or off."),
        F("repetition_penalty", False, _n(NUMBER), "Repetition penalty over generated tokens; null: the preset's or none."),
        F("watermarking", False, _n(BOOL), rejected),
        F("length_penalty", False, NUMBER, rejected, default=1.0),
        F("stop_token_ids", False, _n(TOKEN_IDS), "Generating one of these token IDs stops the choice (stop_reason: the ID).", default=[]),
        F("include_stop_str_in_output", False, BOOL, "The text ends with the stop string that matched.", default=False),
        F("ignore_eos", False, BOOL, "Keep generating past the end-of-sequence token.", default=False),
        F("min_tokens", False, {"type": "integer", "minimum": 0},
          "EOS and stop_token_ids cannot be generated before this many tokens (with stop strings: a 400 unsupported_parameter).", default=0),
        F("skip_special_tokens", False, BOOL, rejected + " (special tokens are always left out of the text.)", default=True),
        F("spaces_between_special_tokens", False, BOOL, rejected, default=True),
        F("truncate_prompt_tokens", False, _n({"type": "integer", "minimum": -1, "maximum": INT64_MAX}), rejected),
        F("truncation_side", False, _n({"type": "string", "enum": ["left", "right"]}), rejected),
        F("allowed_token_ids", False, _n({**TOKEN_IDS, "minItems": 1}), "Only these token IDs can be generated."),
        F("prompt_logprobs", False, _n({"type": "integer", "minimum": 0, "maximum": 256}),
          "Kiln's prompt scoring: the top K (0..256) beside each prompt token's own logprob; with generation (max_tokens over 1) a 400 unsupported_parameter."),
        F("logprob_token_ids", False, _n(TOKEN_IDS), rejected),
        F("bad_words", False, {"type": "array", "items": {"type": "string"}}, rejected),
        F("prompt_embeds", False, {"oneOf": [{"type": "null"}, {"type": "string"}, {"type": "array", "items": {"type": "string"}}]}, rejected),
        F("add_special_tokens", False, BOOL, "Add the tokenizer's special tokens (BOS) to text prompts; ignored for token-ID prompts.", default=True),
        F("response_format", False, _n(ANY_OBJECT), "Until structured outputs land, only null or {\"type\": \"text\"}; anything else is a 400 unsupported_parameter."),
        F("structured_outputs", False, _n(ANY_OBJECT), rejected),
        F("priority", False, {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}, rejected, default=0),
        F("request_id", False, {"type": "string", "minLength": 1, "maxLength": 256}, "The response id becomes cmpl-<request_id>."),
        F("session_id", False, _n({"type": "string"}), rejected),
        F("return_tokens_as_token_ids", False, _n(BOOL), "With logprobs, tokens are written token_id:<id>."),
        F("return_token_ids", False, _n(BOOL), "Each choice carries prompt_token_ids and token_ids (a stream: prompt_token_ids in a choice's first chunk, token_ids per chunk)."),
        F("routed_experts_prompt_start", False, {"type": "integer", "minimum": 0}, rejected, default=0),
        F("return_token_offsets", False, _n(BOOL), rejected + " (vLLM: render route only.)", default=False),
        F("mm_payload", False, {"type": "string", "enum": ["tensors", "none"]}, rejected, default="tensors"),
        F("return_mm_kwargs", False, _n(BOOL), rejected),
        F("cache_salt", False, _n({"type": "string", "minLength": 1, "maxLength": 1024}), rejected),
        F("kv_transfer_params", False, _n(ANY_OBJECT), rejected),
        F("ec_transfer_params", False, _n(ANY_OBJECT), rejected),
        F("vllm_xargs", False, _n(ANY_OBJECT), rejected),
        F("repetition_detection", False, _n(ANY_OBJECT), rejected),
        F("thinking_token_budget", False, _n({"type": "integer", "minimum": -1}), rejected + " (-1, unlimited, is the default.)"),
        F("stream_interval", False, _n({"type": "integer", "minimum": 1}), "Tokens per streamed chunk (the first and last chunks excepted)."),
        # Kiln additions (CHANGELOG)
        F("sampling_preset", False, {"$ref": "#/$defs/SamplingPreset"},
          "A Kiln preset to start from; without one, vLLM's neutral defaults."),
    ]


def completion_request_defs() -> dict[str, Schema]:
    return {"TextCompletionRequest": obj(
        "Generate text from one or more prompts (vLLM's completions request), or, with prompt_logprobs and no generation, score prompt-token log probabilities.",
        request_fields(),
        closed=False,
        annotations={
            "x-kiln-field-schema-status": "complete",
            "x-kiln-rust-type": "TextCompletionRequest",
            "x-kiln-semantic-constraints": [
                "the tokenized prompt is non-empty and has at most min(4096, served context length) tokens",
                "raw token IDs and prompt_logprobs do not exceed the served vocabulary",
                "scored positions * (prompt_logprobs + 1) <= 65536",
                "real scoring rejects an active LoRA until adapter revision identity can be pinned",
                "prompts * n <= 64; a seed field this server does not implement, set to anything but its default, is a 400 unsupported_parameter",
            ],
            "x-kiln-unknown-field-policy": "accepted_and_ignored",
        },
    )}
