"""Prompt-logprob scoring on a running engine: one job at a time, one chunk per exclusive call.

A ``ScoringJob`` (kiln.engine.scoring) feeds its prompt a chunk per ``step()``; here each step runs
alone on the model between the engine's own steps (``run_exclusive``), so running streams keep
decoding (a 4,096-token prompt takes ~17 s to score on a 2-core CPU; in one piece it had stalled
every stream that long). This module imports no torch: it only drives jobs it is handed.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from kiln.engine.errors import EngineError
from kiln.engine.outputs import PositionScore

if TYPE_CHECKING:
    from kiln.engine.scoring import ScoringJob

__all__ = ["SCORING_BLOCK_WAIT_S", "ScoringQueue"]

SCORING_BLOCK_WAIT_S = 0.05  # a scoring job waiting for KV blocks looks again this often


class ScoringQueue:
    """Runs scoring jobs one at a time (a job holds its prompt's KV blocks until it ends, and
    several at once could take the blocks running streams need) and counts them, running or
    waiting, for the engine's gauges (on the event loop)."""

    def __init__(self, run_exclusive: Callable[[Callable[[], Any]], asyncio.Future[Any]],
                 num_blocks: Callable[[], int]) -> None:
        self._run_exclusive = run_exclusive
        self._num_blocks = num_blocks
        self._jobs = {"running": 0, "waiting": 0}
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary())

    def gauges(self) -> dict[str, float]:
        return {"scoring_running": float(self._jobs["running"]),
                "scoring_waiting": float(self._jobs["waiting"])}

    async def run(self, job: ScoringJob) -> list[PositionScore]:
        """Every chunk of ``job`` on the engine thread; its blocks go back when it fails or the
        caller is cancelled."""
        lock = self._lock()
        with self._counted("waiting"):
            await lock.acquire()
        try:
            with self._counted("running"):
                await self._first_step(job)
                while not job.done:
                    await self._run_exclusive(job.step)
        finally:
            if not job.done:  # failed or cancelled: its blocks go back on the engine thread
                with contextlib.suppress(EngineError):
                    self._run_exclusive(job.close)
            lock.release()
        return job.scores

    async def _first_step(self, job: ScoringJob) -> None:
        """The job's first chunk, which borrows all its blocks. While running streams hold too
        many, wait for them (a 503 at once had failed ~10% of scoring requests in mixed traffic);
        the request's own timeout bounds the wait. A prompt bigger than the whole cache fails."""
        while True:
            try:
                await self._run_exclusive(job.step)
                return
            except EngineError as exc:
                fits = job.blocks_needed <= self._num_blocks()
                if exc.code != "kv_cache_exhausted" or job.started or not fits:
                    raise
            self._jobs["running"] -= 1  # waiting for blocks, as the gauges should say
            try:
                with self._counted("waiting"):
                    await asyncio.sleep(SCORING_BLOCK_WAIT_S)
            finally:
                self._jobs["running"] += 1

    @contextlib.contextmanager
    def _counted(self, key: str) -> Iterator[None]:
        self._jobs[key] += 1
        try:
            yield
        finally:
            self._jobs[key] -= 1

    def _lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        return lock
