"""A training loop's controls of the engine (vLLM's and SGLang's RL routes): pause and resume
the scheduler, forget the prefix cache, sleep (the KV cache's memory, and at level 2 the
weights, given back) and serve new weights, each run on the engine thread between two steps
(``AsyncEngine.run_exclusive``). ``AsyncEngine`` (``kiln.engine.loop``) takes them from here,
so the loop module holds the engine thread alone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from kiln.engine.core import build_core
from kiln.engine.errors import EngineError
from kiln.engine.executor import Executor
from kiln.engine.outputs import RequestOutput
from kiln.engine.scheduler import Scheduler

if TYPE_CHECKING:
    from kiln.model.loader import Loaded

_T = TypeVar("_T")


class TrainingControls:
    """The controls; the engine provides what they run on."""

    scheduler: Scheduler
    executor: Executor

    def run_exclusive(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        raise NotImplementedError  # AsyncEngine's

    def _process_and_publish(self, outputs: list[RequestOutput]) -> None:
        raise NotImplementedError  # AsyncEngine's

    def pause(self, mode: str) -> asyncio.Future[int]:
        """Pause the scheduler between steps (vLLM's /pause: abort | wait | keep); resolves with
        the number of requests aborted. "wait" returns at once: the caller watches ``stats``'
        "paused" for the running requests to finish."""
        def run() -> int:
            outputs = self.scheduler.pause(mode)
            self._process_and_publish(outputs)
            return len(outputs)
        return self.run_exclusive(run)

    def resume(self) -> asyncio.Future[None]:
        return self.run_exclusive(self.scheduler.resume)

    def reset_prefix_cache(self) -> asyncio.Future[int]:
        """Forget every cached prefix block (blocks in use stay theirs); resolves with the
        number of cached blocks forgotten."""
        return self.run_exclusive(self.scheduler.pool.reset_prefix_cache)

    def sleep(self, level: int = 1) -> asyncio.Future[tuple[int, int]]:
        """vLLM's sleep: every request aborted and new ones held (a pause), the prefix cache
        forgotten, and the KV cache's memory given back (``release_kv``); at level 2 the runner
        lets go of the model too (``drop_weights``: ``update_weights`` gives it one back).
        Resolves with (requests aborted, KV bytes released). ``resume`` wakes it; blocks are
        zero again."""
        def run() -> tuple[int, int]:
            outputs = self.scheduler.pause("abort", why="the server was put to sleep")
            self._process_and_publish(outputs)
            self.scheduler.pool.reset_prefix_cache()
            released = self.executor.release_kv()
            if level == 2:
                self.executor.drop_weights()
            return len(outputs), released
        return self.run_exclusive(run)

    def update_weights(self, model: Any, version: str, abort: bool,
                       fresh: Loaded | None = None) -> asyncio.Future[int]:
        """Serve ``model`` (a ``CModel`` or ``CausalLM`` of the serving architecture and shapes:
        the caller checked) from the next step on, named ``version``; resolves with the number
        of requests aborted. Between two steps: with ``abort`` every request (running or
        waiting) finishes first; without, running requests continue on the new weights over
        the KV the old ones computed (SGLang's and vLLM's keep), their later tokens in a new
        ``WeightSpan``. Either way the prefix cache is forgotten (``weights_changed``).
        ``fresh``: ``model``'s Loaded, whose compute plan needs a runner and KV cache of its
        own (built here first; EngineError and nothing changed when it does not hold the
        scheduler's blocks, or when a request still holds KV without ``abort``)."""
        def run() -> int:
            runner = None
            if fresh is not None:
                if not abort and self.scheduler.num_running:
                    raise EngineError("weights_in_use", "requests still hold KV of the "
                                      "serving runner; a fresh runner needs them finished", 409)
                _, runner = build_core(fresh, self.scheduler.config)
                if runner.num_blocks != self.scheduler.pool.num_blocks:
                    raise EngineError("weights_mismatch", f"the new weights' KV cache holds "
                                      f"{runner.num_blocks} blocks, the serving one "
                                      f"{self.scheduler.pool.num_blocks}", 400)
            aborted: list[RequestOutput] = []
            if abort:
                aborted = self.scheduler.finish_all(
                    "abort", error="aborted: the weights were updated (mode abort)")
                self._process_and_publish(aborted)
            if runner is not None:
                self.executor = runner
            else:
                self.executor.swap_weights(model)
            self.scheduler.weights_changed(version)
            return len(aborted)
        return self.run_exclusive(run)

    @property
    def weight_version(self) -> str:
        """The name of the weights serving now."""
        return self.scheduler.weight_version
