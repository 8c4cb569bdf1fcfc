"""Definitions added after the seed: errors, models, health and the adapter endpoints."""

from __future__ import annotations

from .common import F, Schema, obj, ref


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
                "The request field the error refers to, as OpenAI names it (`n`, "
                "`messages[0].content`, `prompts[1]`), or null.",
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
                    "param": "n",
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
                "has_weights",
                True,
                {"type": "boolean"},
                "Whether adapter_model.safetensors exists.",
            ),
            F("size_bytes", True, {"type": "integer", "minimum": 0}, "Total size of its files."),
            F(
                "modified_at",
                True,
                ref("NullableString"),
                "Last modification time, ISO-8601 UTC with a Z suffix, or null.",
            ),
            F(
                "files",
                True,
                {"type": "array", "items": {"type": "string"}},
                "File names inside the adapter directory, sorted.",
            ),
        ],
        closed=True,
    )
    defs["AdapterList"] = obj(
        "Available adapters and the server default (`GET /v1/adapters`).",
        [
            F(
                "active",
                True,
                ref("NullableString"),
                "The server-default adapter used when a chat request omits `adapter`, or null "
                "for the base model.",
            ),
            F(
                "available",
                True,
                {"type": "array", "items": ref("AdapterInfo")},
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
                "status",
                True,
                {"type": "string", "enum": ["loaded", "unloaded", "deleted"]},
                "What happened.",
            ),
            F("name", False, ref("NullableString"), "The adapter concerned, if any."),
            F(
                "deleted",
                False,
                {"type": "array", "items": {"type": "string"}},
                "Directories removed by a delete (the adapter and its checkpoints).",
            ),
        ],
        closed=True,
    )
    return defs
