"""routes.json: every HTTP route with its request and response definitions."""

from __future__ import annotations

from .common import Schema
from .tokenizer import tokenizer_routes

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
                    "description": "Generated completions (an SSE stream of `TextCompletionChunk` events when `stream` is true), or the scored prompt's log probabilities.",
                    "media_types": {
                        "application/json": "TextCompletionResponse",
                        "text/event-stream": "TextCompletionChunk",
                    },
                },
                **_errors(*post_errors),
            },
            "streaming": True,
            "tag": "inference",
            "summary": "Generate text from prompts (vLLM's completions), or score prompt-token log probabilities.",
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
            "operation_id": "retrieveModel",
            "method": "GET",
            "path": "/v1/models/{model}",
            "request": None,
            "responses": {
                "200": {
                    "description": "The served base model, or an available adapter, by its id.",
                    "media_types": {"application/json": "ModelCard"},
                },
                **_errors("401", "404", "500"),
            },
            "streaming": False,
            "tag": "models",
            "summary": "One model that requests may name (OpenAI's models.retrieve).",
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
        *tokenizer_routes(_errors("400", "401", "404", "413", "415", "500")),
    ]
