"""What handlers share: the config, the backend, and the contract."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.requests import Request

from kiln.api.backend import Backend
from kiln.api.contract import Contract, contract
from kiln.api.errors import ApiError
from kiln.config import ServerConfig


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

    def __post_init__(self) -> None:
        self.gate = Gate(self.config.max_num_seqs + self.config.max_waiting_requests)


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.kiln
    return state


def request_id(request: Request) -> str:
    rid: str = request.scope.get("state", {}).get("request_id", "")
    return rid
