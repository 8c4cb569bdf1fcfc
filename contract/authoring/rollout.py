"""The rollout provenance definitions (RolloutProvenanceV1 and its parts)."""

from __future__ import annotations

from .common import CONTROL_FREE, UINT32_MAX, UINT64_MAX, F, Schema, leaf, obj


def rollout_defs() -> dict[str, Schema]:
    """RolloutProvenanceV1 and its parts."""
    defs: dict[str, Schema] = {}
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
    return defs
