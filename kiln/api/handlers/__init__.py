"""One module per entrypoint family; HANDLERS maps (method, path) from the route table."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from kiln.api.handlers import (
    adapters,
    batch,
    chat,
    completions,
    conversations,
    generate,
    messages,
    meta,
    models,
    render,
    responses,
    tokenizer,
    training,
    ui,
)

Endpoint = Callable[[Request], Awaitable[Response]]

HANDLERS: dict[tuple[str, str], Endpoint] = {
    ("POST", "/v1/chat/completions"): chat.create,
    ("POST", "/v1/completions"): completions.create,
    ("POST", "/v1/completions/batch"): batch.create,
    ("POST", "/v1/responses"): responses.create,
    ("GET", "/v1/responses/{response_id}"): responses.retrieve,
    ("DELETE", "/v1/responses/{response_id}"): responses.delete,
    ("GET", "/v1/responses/{response_id}/input_items"): responses.list_input_items,
    ("POST", "/v1/messages"): messages.create,
    ("POST", "/v1/messages/count_tokens"): messages.count_tokens,
    ("GET", "/v1/conversations"): conversations.list_conversations,
    ("POST", "/v1/conversations"): conversations.create,
    ("GET", "/v1/conversations/{conversation_id}/export"): conversations.export,
    ("GET", "/v1/conversations/{conversation_id}"): conversations.retrieve,
    ("PATCH", "/v1/conversations/{conversation_id}"): conversations.update,
    ("DELETE", "/v1/conversations/{conversation_id}"): conversations.delete,
    ("POST", "/v1/completions/render"): render.completion,
    ("POST", "/v1/chat/completions/render"): render.chat,
    ("GET", "/v1/models"): models.list_models,
    ("GET", "/v1/models/{model}"): models.retrieve_model,
    ("GET", "/v1/adapters"): adapters.list_adapters,
    ("POST", "/v1/adapters/load"): adapters.load,
    ("POST", "/v1/adapters/unload"): adapters.unload,
    ("DELETE", "/v1/adapters/{name}"): adapters.delete,
    ("POST", "/pause"): training.pause,
    ("POST", "/resume"): training.resume,
    ("GET", "/is_paused"): training.is_paused,
    ("POST", "/reset_prefix_cache"): training.reset_prefix_cache,
    ("POST", "/sleep"): training.sleep,
    ("POST", "/wake_up"): training.wake_up,
    ("GET", "/is_sleeping"): training.is_sleeping,
    ("POST", "/update_weights_from_disk"): training.update_weights_from_disk,
    ("POST", "/inference/v1/generate"): generate.create,
    ("POST", "/tokenize"): tokenizer.tokenize,
    ("POST", "/detokenize"): tokenizer.detokenize,
    ("GET", "/tokenizer_info"): tokenizer.info,
    ("GET", "/health"): meta.health,
    ("GET", "/metrics"): meta.prometheus,
    ("GET", "/openapi.json"): meta.openapi,
    ("GET", "/ui"): ui.page,
    ("GET", "/ui/{asset}"): ui.file,
}
