"""A weight update's records, errors and thread (SGLang's /update_weights_from_disk): what the
HTTP edge, the backend and the loader share, with no model code (the edge imports no
``kiln.model``). The loading and its checks are ``kiln.model.swap``'s; the swap between two
steps is the engine's (``AsyncEngine.update_weights``); the backend runs the modes
(``kiln.serving.EngineBackend.update_weights``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar


class WeightUpdateError(Exception):
    """A checkpoint that cannot replace the serving weights; nothing was changed."""

    def __init__(self, message: str, param: str = "model_path") -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class WeightUpdateBusy(Exception):
    """Another update is in flight (a 409)."""


class WeightUpdateTimeout(Exception):
    """Mode wait: the running requests did not finish in time; nothing was changed."""


@dataclass(frozen=True)
class WeightUpdate:
    """What an update did: the new weights' name, the requests aborted (mode abort), and the
    seconds spent loading and in all (load, waiting, swap)."""

    version: str
    aborted: int
    load_s: float
    total_s: float


_T = TypeVar("_T")


def on_own_thread(fn: Callable[[], _T]) -> asyncio.Future[_T]:
    """``fn()`` on a new thread that ends with it (call on an event loop). Not the loop's
    default executor: a loader's torch work starts an OpenMP team on its thread, and a pooled
    thread would keep that team alive beside the engine's for the server's life (on the 2-core
    CPU a second team throttles the C step's barriers: kiln.serving's prepare_lora). At the
    usual priority: a loader thread at niceness 19 left the engine 92% of its tokens/s while a
    Qwen2.5-0.5B-shaped F16 file loaded, but took 54.1 s to load it instead of 3.7 s (4 busy
    streams on 2 cores; python -m bench.bench_weight_update --shaped), and a trainer waits for
    the new weights."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if future.cancelled():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="kiln-weight-load", daemon=True).start()
    return future
