"""What handlers share: the app's state (the config, the backend, the contract, the admission
gate, the stores of --data-dir's database, the request log), request ids, and how a response
leaves, encoded with msgspec from the contract's generated structs (kiln/api/_generated/wire.py),
so that the contract types what leaves as well as what enters. Running engine requests is
``kiln.api.submission``'s. The handlers' common ground, as vLLM's ``serving_engine.py`` is its
OpenAI handlers'."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from kiln.api._generated import wire
from kiln.api.backend import Backend
from kiln.api.contract import Contract, contract
from kiln.api.errors import ApiError
from kiln.api.response_store import ResponseStore
from kiln.config import ServerConfig
from kiln.conversations import ConversationStore
from kiln.database import Database, open_database
from kiln.request_log import RequestLog


class Gate:
    """Bounds the engine requests in flight: running slots plus a waiting queue; past that,
    429 with Retry-After (backpressure instead of an unbounded queue)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.active = 0

    def enter(self, n: int) -> None:
        if self.active + n > self.capacity:
            raise ApiError(
                429,
                "rate_limit_exceeded",
                f"the server is at capacity ({self.active} requests in flight); retry shortly",
                headers={"retry-after": "1"},
            )
        self.active += n

    def leave(self, n: int = 1) -> None:
        self.active = max(0, self.active - n)


@dataclass
class AppState:
    config: ServerConfig
    backend: Backend
    contract: Contract = field(default_factory=contract)
    started: float = field(default_factory=time.time)
    gate: Gate = field(init=False)
    database: Database | None = field(init=False)  # --data-dir's, opened here once
    responses: ResponseStore = field(init=False)  # the Responses API's stored responses
    conversations: ConversationStore = field(init=False)  # /ui's (kiln/conversations.py)
    request_log: RequestLog | None = field(init=False)  # --request-log's, else None
    pause_mode: str | None = None  # the training routes' pause in force (handlers/training.py)
    sleeping: bool = False  # POST /sleep until POST /wake_up
    sleep_level: int = 1  # the level of the sleep in force (2: the weights let go of too)

    def __post_init__(self) -> None:
        self.gate = Gate(self.config.max_num_seqs + self.config.max_waiting_requests)
        # one database for every store that keeps something on disk (kiln/database.py)
        self.database = open_database(self.config.data_dir) if self.config.data_dir else None
        self.responses = ResponseStore.from_config(self.config, self.database)
        self.conversations = ConversationStore(self.database)
        cfg = self.config
        self.request_log = RequestLog(cfg.request_log, cfg.request_log_max_mb * 1024 * 1024,
                                      cfg.request_log_max_age_s, cfg.request_log_text) \
            if cfg.request_log else None


def app_state(request: HttpRequest) -> AppState:
    state: AppState = request.app.state.kiln
    return state


def request_id(request: HttpRequest) -> str:
    rid: str = request.scope.get("state", {}).get("request_id", "")
    return rid


def claim_request_id(request: HttpRequest, body_id: str | None) -> str:
    """The request's one id, which the response's ``X-Request-Id`` and its body's ``id`` both
    carry: the client's X-Request-Id header, else the body's ``request_id`` (vLLM's), else the
    one the middleware drew (kiln/api/app.py)."""
    state = request.scope.setdefault("state", {})
    if body_id and not state.get("request_id_given"):
        state["request_id"] = body_id
    return request_id(request)

_encoder = msgspec.json.Encoder()

Finish = Literal["error", "length", "stop", "tool_calls"]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        _encoder.encode(body), status_code=status, media_type="application/json", headers=headers
    )


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
          ) -> wire.Usage:
    """Token usage, its total the sum (every route's); ``cached_tokens``: prompt tokens the
    prefix cache held (vLLM's ``prompt_tokens_details.cached_tokens``)."""
    out = wire.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens)
    if cached_tokens is not None:
        out.prompt_tokens_details = wire.PromptTokensDetails(cached_tokens=cached_tokens)
    return out


def as_wire(value: Any) -> Any:
    """A nested object a lower layer builds in the contract's shape and key order, carried into
    a generated struct's field as it is (msgspec encodes it unchanged; the response tests check
    it against the contract): the thinking-budget record and outcome (kiln/text/thinking.py) and
    the rollout record (kiln/provenance.py), which cannot import the edge's structs."""
    return value


def finish_reason(engine: str | None) -> Finish:
    """The engine's finish reason as the wire tells it: "length", or "stop" (a stop string, a
    stop token, EOS)."""
    return "length" if engine == "length" else "stop"
