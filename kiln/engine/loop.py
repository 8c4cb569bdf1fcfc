"""The engine thread and its asyncio bridge.

One dedicated thread runs ``step()`` = schedule -> execute -> update -> process outputs (text
and stop strings, kiln.engine.output_processor) -> publish. Requests and aborts enter through a
locked inbox (the thread sleeps on a condition when idle); outputs go back to each request's
``asyncio.Queue`` through ``loop.call_soon_threadsafe`` and reach the caller as a RequestStream.
Scoring jobs and adapter loads run between steps (``run_exclusive``). This module imports no
torch at import time (the runner is imported when a model-backed engine is built), so the HTTP
layer can import it freely.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kiln.engine.config import EngineConfig
from kiln.engine.core import build_core
from kiln.engine.errors import EngineError
from kiln.engine.exclusive import ExclusiveCall
from kiln.engine.executor import Executor
from kiln.engine.lora_mix import LoraMix
from kiln.engine.output_processor import OutputProcessor
from kiln.engine.outputs import (
    PositionScore,
    RequestOutput,
    RequestStream,
    SchedulerOutput,
)
from kiln.engine.request import Request
from kiln.engine.scheduler import Scheduler
from kiln.engine.score_queue import ScoringQueue
from kiln.engine.training_controls import TrainingControls

if TYPE_CHECKING:
    from kiln.model.loader import Loaded

__all__ = ["AsyncEngine", "EngineError", "Executor", "build_core", "build_on_engine_thread",
           "build_output_processor"]

_Sink = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[RequestOutput]"]
_T = TypeVar("_T")
_IDLE_WAIT_S = 0.005  # when work exists but nothing could be scheduled (never expected)


def build_output_processor(loaded: Loaded) -> OutputProcessor:
    """The output stage for ``loaded``'s tokenizer (special tokens make text only where a
    request sets skip_special_tokens false)."""
    from kiln.text.tokenizer import IncrementalDetokenizer

    tok = loaded.tokenizer
    return OutputProcessor(lambda sp: IncrementalDetokenizer(
        tok, skip_special_tokens=sp.skip_special_tokens,
        spaces_between_special_tokens=sp.spaces_between_special_tokens))


class AsyncEngine(TrainingControls):
    max_model_len: int

    def __init__(self, loaded: Loaded, config: EngineConfig) -> None:
        self._init(*build_core(loaded, config), build_output_processor(loaded))

    @classmethod
    def from_components(cls, scheduler: Scheduler, executor: Executor,
                        output: OutputProcessor | None = None) -> AsyncEngine:
        """An engine over any executor (tests use a fake runner); without an output stage, no
        text is made."""
        self = cls.__new__(cls)
        self._init(scheduler, executor, output or OutputProcessor())
        return self

    def _init(self, scheduler: Scheduler, executor: Executor, output: OutputProcessor) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.output = output
        self.max_model_len = scheduler.max_model_len
        self._cv = threading.Condition()
        self._inbox: list[tuple[str, Request | str | ExclusiveCall[Any]]] = []
        self._sinks: dict[str, _Sink] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._stats: dict[str, float] = scheduler.stats()
        self._scoring = ScoringQueue(self.run_exclusive, lambda: scheduler.pool.num_blocks)
        self.num_steps = 0
        self.num_failed_steps = 0

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="kiln-engine", daemon=True)
        self._thread.start()

    def run_in_current_thread(self) -> None:
        """Run the engine loop on the calling thread until shutdown (instead of start()); for a
        thread that already did the model's torch work."""
        if self._thread is not None:
            raise RuntimeError("the engine is already running")
        self._stopping = False
        self._thread = threading.current_thread()
        self._run()

    def shutdown(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- event-loop side -------------------------------------------------------------------------
    def add_request(self, req: Request) -> asyncio.Queue[RequestOutput]:
        """Queue ``req`` (call on the event loop thread); admission errors raise EngineError."""
        if not self.is_running or self._stopping:
            raise EngineError("engine_not_running", "The engine is not running.")
        self.scheduler.check_request(req)
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        with self._cv:
            if req.request_id in self._sinks:
                raise EngineError("duplicate_request_id",
                                  f"Duplicate request id {req.request_id!r}.")
            self._sinks[req.request_id] = (loop, queue)
            self._inbox.append(("add", req))
            self._cv.notify()
        return queue

    def generate(self, req: Request) -> RequestStream:
        """Admit ``req`` (EngineError on failure) and stream its outputs until it finishes;
        cancelling or closing the stream aborts it."""
        return RequestStream.over_queue(req.request_id, self.add_request(req), self.abort)

    async def score(self, prompt_ids: Sequence[int], top_k: int,
                    lora: LoraMix = ()) -> list[PositionScore]:
        """Prompt-logprob scoring under the base model, or under the adapter mix ``lora``: one
        chunk at a time alone on the model, with the engine's own steps in between, one job at a
        time (kiln.engine.score_queue). Raises EngineError (a mix that can never run, blocks)
        and ValueError (a bad prompt or top_k)."""
        self.scheduler.check_lora(lora)  # as generation refuses it (a 400), not a 500 mid-job
        return await self._scoring.run(
            self.executor.scoring_job(self.scheduler.pool, prompt_ids, top_k, lora))

    def compute_plan(self) -> dict[str, str]:
        """The runner's compute plan (kiln.model.native.plan), as strings."""
        plan = self.executor.plan
        if plan is None:
            raise TypeError("the compute plan needs an engine over a model")
        out: dict[str, str] = plan.as_dict()
        if self.scheduler.speculation.config is not None:
            out["speculative"] = self.scheduler.speculation.config.describe()
        return out

    def kv_on_demand(self) -> bool:
        """Whether the KV cache's memory becomes resident as blocks are first written (the
        compute plan's zero-page cache on the CPU) rather than when it is allocated."""
        return self.executor.kv_on_demand

    def kv_geometry(self) -> tuple[int, int, int]:
        """The KV cache's blocks, tokens per block and bytes per block (all layers, K and V)."""
        per_block = self.executor.kv_bytes_per_block
        if per_block is None:
            raise TypeError("the KV geometry needs an engine over a model")
        return self.scheduler.pool.num_blocks, self.scheduler.pool.block_size, per_block

    def abort(self, request_id: str) -> None:
        """Thread-safe; the request finishes with "abort" and its blocks are freed."""
        with self._cv:
            self._inbox.append(("abort", request_id))
            self._cv.notify()

    def abort_all(self, message: str) -> None:
        """Thread-safe; every request finishes with "abort" and ``message`` as its error (a
        drain that ran out: the handlers answer each with an error rather than be cancelled)."""
        with self._cv:
            self._inbox.append(("abort_all", message))
            self._cv.notify()

    def run_exclusive(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        """Run ``fn`` on the engine thread between steps, alone on the model (call on an event
        loop). The returned future resolves on the caller's loop with ``fn``'s result or
        exception; cancelling it before ``fn`` starts skips ``fn``."""
        loop = asyncio.get_running_loop()
        call = ExclusiveCall(fn, loop)
        with self._cv:
            if not self.is_running or self._stopping:
                raise EngineError("engine_not_running", "The engine is not running.")
            self._inbox.append(("exclusive", call))
            self._cv.notify()
        return call.future

    def stats(self) -> dict[str, float]:
        """The scheduler's gauges, with scoring jobs counted as running (or waiting for the one
        scoring slot): an engine busy scoring must not look idle to a load balancer."""
        with self._cv:
            stats = dict(self._stats)
        scoring = self._scoring.gauges()
        stats.update(scoring)
        stats["running"] = stats.get("running", 0.0) + scoring["scoring_running"]
        stats["waiting"] = stats.get("waiting", 0.0) + scoring["scoring_waiting"]
        return stats

    # -- engine thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._inbox or self._stopping or self.scheduler.has_work):
                    self._cv.wait()
                if self._stopping:
                    break
                inbox, self._inbox = self._inbox, []
            self._drain(inbox)
            if self.scheduler.has_work:
                self._guarded_step()
        self._drain(self._take_inbox(), shutting_down=True)
        self._process_and_publish(self.scheduler.finish_all("abort",
                                                            error="the engine shut down"))

    def _take_inbox(self) -> list[tuple[str, Request | str | ExclusiveCall[Any]]]:
        with self._cv:
            inbox, self._inbox = self._inbox, []
            return inbox

    def _drain(self, inbox: list[tuple[str, Request | str | ExclusiveCall[Any]]],
               shutting_down: bool = False) -> None:
        outputs: list[RequestOutput] = []
        exclusive: list[ExclusiveCall[Any]] = []
        for kind, item in inbox:
            out: RequestOutput | None = None
            if isinstance(item, ExclusiveCall):
                exclusive.append(item)
            elif kind == "abort" and isinstance(item, str):
                out = self.scheduler.abort(item)
            elif kind == "abort_all" and isinstance(item, str):
                outputs.extend(self.scheduler.finish_all("abort", error=item))
            elif isinstance(item, Request):
                try:
                    out = self.scheduler.add_request(item)
                    self.output.add_request(item)
                except EngineError as e:
                    out = _error_output(item, e.message)
            if out is not None:
                outputs.append(out)
        self._process_and_publish(outputs)
        for call in exclusive:  # between steps: nothing else touches the model meanwhile
            if shutting_down:
                call.fail(EngineError("engine_not_running", "The engine shut down."))
            else:  # it may borrow or return blocks: the gauges follow before its caller wakes
                call.run(after=self._refresh_stats)

    def _guarded_step(self) -> None:
        try:
            if not self.step():
                with self._cv:
                    self._cv.wait(_IDLE_WAIT_S)
        except Exception as e:  # a scheduler bug: fail everything, keep serving
            self._process_and_publish(self.scheduler.finish_all("error",
                                                                error=f"engine error: {e!r}"))

    def step(self) -> bool:
        """One engine step; False when nothing could be scheduled."""
        # drafts only while the runner verifies them (kiln.engine.speculative)
        self.scheduler.speculation.runner_verifies = self.executor.verifies_drafts
        so = self.scheduler.schedule()
        if so.is_empty:
            return False
        outputs = self._execute_and_update(so)
        self._publish(self.output.process(outputs, self.scheduler.finish_stopped))
        return True

    def _execute_and_update(self, so: SchedulerOutput) -> list[RequestOutput]:
        self.num_steps += 1
        try:
            ro = self.executor.execute(so)
        except Exception as e:
            self.num_failed_steps += 1
            return self.scheduler.fail_step(so, f"model execution failed: {e!r}")
        return self.scheduler.update_from_output(so, ro)

    def _process_and_publish(self, outputs: list[RequestOutput]) -> None:
        """Outputs from outside a step (admissions, aborts, failures): their text state ends."""
        self._publish(self.output.process(outputs, self.scheduler.finish_stopped))

    def _refresh_stats(self) -> None:
        with self._cv:
            self._refresh_stats_locked()

    def _refresh_stats_locked(self) -> None:
        self._stats = self.scheduler.stats()
        self._stats["steps"] = float(self.num_steps)
        self._stats["failed_steps"] = float(self.num_failed_steps)

    def _publish(self, outputs: list[RequestOutput]) -> None:
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[RequestOutput],
                                                            RequestOutput]]] = {}
        with self._cv:
            for out in outputs:
                sink = (self._sinks.pop(out.request_id, None) if out.finished
                        else self._sinks.get(out.request_id))
                if sink is not None:
                    batches.setdefault(sink[0], []).append((sink[1], out))
            self._refresh_stats_locked()
        self.executor.release([out.request_id for out in outputs if out.finished])
        for loop, items in batches.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # that event loop is closed; nobody is listening
                pass


def _deliver(items: list[tuple[asyncio.Queue[RequestOutput], RequestOutput]]) -> None:
    for queue, out in items:
        queue.put_nowait(out)


def _error_output(req: Request, message: str) -> RequestOutput:
    return RequestOutput(
        request_id=req.request_id, new_token_ids=[], new_logprobs=[], text_delta="",
        finished=True, finish_reason="error", stop_reason=None,
        num_prompt_tokens=len(req.prompt_token_ids), num_output_tokens=0, num_cached_tokens=0,
        seed=req.sampling.seed or 0, metrics=None, error=message)


def build_on_engine_thread(build: Callable[[], _T], engine_of: Callable[[_T], AsyncEngine]
                           ) -> tuple[_T, Callable[[], None]]:
    """Run ``build`` (model load included) on a new thread, which then runs the engine it built
    (``run_in_current_thread``) once the returned ``start`` is called; ``start`` waits until the
    engine runs. All torch work then happens on one thread: the OpenMP team belongs to the
    calling thread, and on the 2-core CPU a second team throttles the C step's barriers (a
    thread other than the loader decoded at about 2/3 of the speed). ``build``'s exception is
    raised here."""
    built: dict[str, Any] = {}
    ready, go = threading.Event(), threading.Event()

    def run() -> None:
        try:
            built["value"] = build()
        except BaseException as exc:  # raised to the caller below
            built["error"] = exc
            return
        finally:
            ready.set()
        go.wait()
        engine_of(built["value"]).run_in_current_thread()

    threading.Thread(target=run, name="kiln-engine", daemon=True).start()
    ready.wait()
    if "error" in built:
        raise built["error"]
    value: _T = built["value"]
    engine = engine_of(value)

    def start() -> None:
        go.set()
        deadline = time.monotonic() + 10
        while not engine.is_running and time.monotonic() < deadline:
            time.sleep(0.001)

    return value, start
