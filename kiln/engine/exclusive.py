"""A function queued for the engine thread to run between steps, alone on the model, and the
caller's future for its outcome (``AsyncEngine.run_exclusive``). No torch here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["ExclusiveCall"]

_T = TypeVar("_T")


class ExclusiveCall(Generic[_T]):
    """A function queued for the engine thread, and the caller's future for its outcome."""

    def __init__(self, fn: Callable[[], _T], loop: asyncio.AbstractEventLoop) -> None:
        self.fn = fn
        self.loop = loop
        self.future: asyncio.Future[_T] = loop.create_future()
        self.cancelled = False  # set on the caller's loop; read by the engine thread
        self.future.add_done_callback(self._on_done)

    def _on_done(self, fut: asyncio.Future[_T]) -> None:
        if fut.cancelled():
            self.cancelled = True

    def run(self, after: Callable[[], None] | None = None) -> None:
        """Call ``fn`` (unless cancelled), then ``after``, then settle the caller's future."""
        if self.cancelled:
            return
        settle: Callable[[asyncio.Future[_T]], None]
        try:
            result = self.fn()
            settle = lambda fut: fut.set_result(result)  # noqa: E731
        except Exception as e:  # handed to the awaiting caller, never kills the engine
            error = e
            settle = lambda fut: fut.set_exception(error)  # noqa: E731
        if after is not None:
            after()
        self._settle(settle)

    def fail(self, exc: BaseException) -> None:
        self._settle(lambda fut: fut.set_exception(exc))

    def _settle(self, action: Callable[[asyncio.Future[_T]], None]) -> None:
        def settle() -> None:
            if not self.future.done():
                action(self.future)

        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the caller's event loop is closed; nobody is waiting
            pass
