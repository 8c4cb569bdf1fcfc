"""The root annotations of the main file (entrypoints, x-kiln-examples) and its oneOf list."""

from __future__ import annotations

from .common import Schema

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


ENTRYPOINTS = [
    "BatchCompletionRequest",
    "BatchCompletionResponse",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "TextCompletionRequest",
    "TextCompletionResponse",
]
