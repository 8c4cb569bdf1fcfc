"""What handlers share: the config, the backend, and the contract."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.requests import Request

from kiln.api.backend import Backend
from kiln.api.contract import Contract, contract
from kiln.config import ServerConfig


@dataclass
class AppState:
    config: ServerConfig
    backend: Backend
    contract: Contract = field(default_factory=contract)
    started: float = field(default_factory=time.time)


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.kiln
    return state


def request_id(request: Request) -> str:
    rid: str = request.scope.get("state", {}).get("request_id", "")
    return rid
