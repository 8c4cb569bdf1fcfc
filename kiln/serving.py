"""EngineBackend: the real model + engine behind the HTTP edge's Backend port."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import math
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.adapters import AdapterStore, validate_name
from kiln.api.backend import PositionScore
from kiln.config import ServerConfig
from kiln.engine.config import EngineConfig
from kiln.engine.errors import EngineError
from kiln.engine.loop import AsyncEngine, build_on_engine_thread
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request
from kiln.model.loader import LoadedModel, load_model
from kiln.provenance import (
    PolicyIdentity,
    base_model_sha256,
    inference_config_sha256,
    vocab_sha256,
    weight_files,
)

if TYPE_CHECKING:
    from kiln.model.lora import LoraAdapter

MAX_LORA_MIX = 16  # entries of one request's adapter composition (reference §6)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kiln")
    except PackageNotFoundError:
        return "0+unknown"


def _sha(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def engine_config(config: ServerConfig) -> EngineConfig:
    return EngineConfig(
        block_size=config.block_size,
        kv_memory_mb=config.kv_memory_mb,
        kv_cache_dtype=config.kv_cache_dtype,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_prefill_tokens_while_decoding=config.max_prefill_tokens_while_decoding,
        prefill_cap_context=config.prefill_cap_context,
        enable_prefix_caching=config.enable_prefix_caching,
        max_model_len=config.max_model_len,
        max_lora_slots=config.max_lora_slots,
    )


SCORING_BLOCK_WAIT_S = 0.05  # a scoring job waiting for KV blocks looks again this often


class EngineStream:
    """Outputs of one engine request; closing it early (even unstarted) aborts the request."""

    def __init__(
        self, engine: AsyncEngine, request_id: str, queue: asyncio.Queue[RequestOutput]
    ) -> None:
        self._engine = engine
        self._request_id = request_id
        self._queue = queue
        self._finished = False

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._finished:
            raise StopAsyncIteration
        out = await self._queue.get()
        self._finished = out.finished
        return out

    def close_now(self) -> None:
        if not self._finished:
            self._finished = True
            self._engine.abort(self._request_id)

    async def aclose(self) -> None:
        self.close_now()


class EngineBackend:
    """Wraps a LoadedModel and its AsyncEngine."""

    def __init__(self, loaded: LoadedModel, config: ServerConfig) -> None:
        self.loaded = loaded
        self._engine_config = engine_config(config)
        self.engine = AsyncEngine(loaded, self._engine_config)
        self.model_id = loaded.served_name
        self.aliases = config.model_aliases
        self.kv_cache_dtype = config.kv_cache_dtype
        self.created = int(time.time())
        self.max_model_len = self.engine.max_model_len
        self.tokenizer = loaded.tokenizer
        self.generation_config = dict(loaded.generation_config)  # sampling defaults (params)
        self.chat_template = loaded.chat_template
        self._identity: dict[str, str] | None = None
        self._start_engine: Callable[[], None] | None = None  # from_config: the engine's thread
        self._policy: PolicyIdentity | None = None
        self._policy_lock = threading.Lock()
        self._policy_done = False
        self._scoring_jobs = {"running": 0, "waiting": 0}  # on the event loop
        self._scoring_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary())
        self._started = False
        self.adapter_store = AdapterStore(_adapter_dir(config, loaded),
                                          max_loaded=config.max_cpu_loras)

    async def prepare_lora(self, mix: Sequence[tuple[str, float]]
                           ) -> tuple[tuple[LoraAdapter, float], ...]:
        """Resolve ``[(adapter name, scale), ...]`` to loaded adapters for ``Request.lora``.

        An adapter already loaded, with its files unchanged, is returned at once. Otherwise the
        mix is loaded by ``load_lora`` on the engine thread, between steps: torch work on the
        event loop's thread would start a second OpenMP team there, and on the 2-core CPU that
        throttles the C step's barriers for the rest of the server's life (measured: single-
        stream decode 131-136 -> 53-55 tok/s after the first request with a rank-64 adapter).
        Raises what ``load_lora`` raises, and EngineError when the engine is not running."""
        self._check_mix(mix)
        hits: list[tuple[LoraAdapter, float]] = []
        for name, scale in mix:
            hit = self.adapter_store.cached(name)
            if hit is None:  # something to read: the whole mix goes to the engine thread
                return await self.engine.run_exclusive(functools.partial(self.load_lora,
                                                                         list(mix)))
            hits.append((hit, float(scale)))
        return tuple(hits)

    def load_lora(self, mix: Sequence[tuple[str, float]]) -> tuple[tuple[LoraAdapter, float], ...]:
        """``prepare_lora`` on the calling thread (blocking: reads the files the first time, or
        after they change). Raises ValueError for an empty mix, more than 16 entries or a
        non-finite scale; InvalidAdapterName / AdapterNotFound from the store; AdapterLoadError
        for an adapter that is malformed or does not fit the base model."""
        self._check_mix(mix)
        return tuple((self.adapter_store.load(name, self.loaded.config), float(scale))
                     for name, scale in mix)

    @staticmethod
    def _check_mix(mix: Sequence[tuple[str, float]]) -> None:
        if not mix:
            raise ValueError("an adapter mix must name at least one adapter")
        if len(mix) > MAX_LORA_MIX:
            raise ValueError(f"an adapter mix has at most {MAX_LORA_MIX} entries, got {len(mix)}")
        for name, scale in mix:
            validate_name(name)
            if isinstance(scale, bool) or not isinstance(scale, int | float) \
                    or not math.isfinite(scale):
                raise ValueError(f"adapter scale must be a finite number, got {scale!r}")

    @classmethod
    def from_config(cls, config: ServerConfig) -> EngineBackend:
        """Load the model and build the engine on the thread that will run the engine
        (``build_on_engine_thread``: all torch work of the server on one thread)."""

        def build() -> EngineBackend:
            loaded = load_model(
                config.model,
                dtype=None if config.dtype == "auto" else config.dtype,
                device=config.device,
                chat_template_path=config.chat_template,
                served_model_name=config.served_model_name,
            )
            return cls(loaded, config)

        backend, start = build_on_engine_thread(build, lambda b: b.engine)
        backend._start_engine = start
        return backend

    def start(self) -> None:
        if self._start_engine is None:
            self.engine.start()
        else:
            self._start_engine()
        self._started = True
        # Hash the weight files now, off the event loop (about 0.56 GB/s here: ~30 s for a 16 GB
        # model, which on first use would have stalled every stream's delivery meanwhile).
        threading.Thread(target=self.policy_identity, name="kiln-identity", daemon=True).start()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def health(self) -> str:
        if self.engine.is_running:
            return "ok"
        return "error" if self._started else "loading"

    def stats(self) -> dict[str, float]:
        """The engine's gauges, with scoring jobs counted as running (or waiting for the one
        scoring slot): a server busy scoring must not look idle to a load balancer."""
        stats = self.engine.stats()
        stats["scoring_running"] = float(self._scoring_jobs["running"])
        stats["scoring_waiting"] = float(self._scoring_jobs["waiting"])
        stats["running"] = stats.get("running", 0.0) + stats["scoring_running"]
        stats["waiting"] = stats.get("waiting", 0.0) + stats["scoring_waiting"]
        return stats

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def kv_geometry(self) -> tuple[int, int, int]:
        """The KV cache's blocks, tokens per block and bytes per block (all layers, K and V)."""
        from kiln.engine.runner import kv_dtype
        from kiln.model.kv_cache import KVCache

        pool = self.engine.scheduler.pool
        dtype = kv_dtype(self._engine_config, self.loaded.dtype, self.loaded.device)
        return (pool.num_blocks, pool.block_size,
                KVCache.bytes_per_block(self.loaded.config, pool.block_size, dtype))

    def abort_all(self, message: str) -> None:
        self.engine.abort_all(message)

    def identity(self) -> dict[str, str]:
        if self._identity is None:
            cfg = json.dumps(asdict(self.loaded.config), sort_keys=True)
            self._identity = {
                "tokenizer_config_hash": _sha(self.tokenizer.config_sha256()),
                "chat_template_hash": _sha(self.chat_template.source),
                "model_config_hash": _sha(cfg),
            }
        return self._identity

    def policy_identity(self) -> PolicyIdentity | None:
        """Computed once (hashing the weight files takes a moment), then cached; ``start`` begins
        it on a thread of its own, and a caller that comes first waits for that computation."""
        with self._policy_lock:
            if not self._policy_done:
                self._policy = self._compute_policy()
                self._policy_done = True
            return self._policy

    def _compute_policy(self) -> PolicyIdentity | None:
        import torch  # its version names the runtime (torch is loaded already)

        source = Path(self.loaded.source)
        if not source.exists():
            return None
        backend = self.loaded.device.type
        runtime = f"torch-{torch.__version__}"
        model_cfg: dict[str, Any] = {**asdict(self.loaded.config),
                                     "dtype": str(self.loaded.dtype)}
        if self.kv_cache_dtype != "auto":  # it changes the numbers; auto keeps old hashes
            model_cfg["kv_cache_dtype"] = self.kv_cache_dtype
        return PolicyIdentity(
            served_model_id=self.model_id,
            base_model_sha256=base_model_sha256(weight_files(source)),
            inference_config_sha256=inference_config_sha256(model_cfg, backend, runtime),
            implementation=f"kiln-python/{_version()}/{backend}/{runtime}",
            vocab_sha256=vocab_sha256(self.tokenizer.backend.get_vocab(with_added_tokens=True)),
            tokenizer_config_sha256=_sha(self.tokenizer.backend.to_str()),
            chat_template_sha256=_sha(self.chat_template.source),
            generation_backend=backend,
        )

    def submit(self, request: Request) -> AsyncIterator[RequestOutput]:
        queue = self.engine.add_request(request)  # raises EngineError on admission failure
        return EngineStream(self.engine, request.request_id, queue)

    async def score(
        self, prompt_ids: list[int], top_k: int, lora: tuple[tuple[Any, float], ...] = ()
    ) -> list[PositionScore]:
        """Prompt-logprob scoring under the base model, or under the adapter mix `lora` (DESIGN
        §6): one chunk at a time alone on the model (``run_exclusive``), with the engine's own
        steps in between, so running streams keep decoding (a 4,096-token prompt takes ~17 s to
        score on this CPU; in one piece it had stalled every stream that long)."""
        from kiln.engine.lora_mix import check_mix
        from kiln.engine.runner import ModelRunner
        from kiln.engine.scoring import ScoringJob
        from kiln.model.lora_slots import LoraBatch

        runner = self.engine.executor
        if not isinstance(runner, ModelRunner):
            raise TypeError("EngineBackend.score needs an engine over a ModelRunner")
        mix = list(lora)
        config = self.engine.scheduler.config
        problem = check_mix(mix, config.max_lora_slots, config.max_lora_rank)
        if problem is not None:  # as generation refuses it (a 400), not a 500 mid-job
            raise EngineError("invalid_compose_request", problem, 400)

        def plan(n: int) -> LoraBatch:
            return LoraBatch.build([mix], [n], runner.lora_slots)

        job = ScoringJob(runner.model, runner.kv, self.engine.scheduler.pool, list(prompt_ids),
                         top_k, lora=plan if mix else None)
        # One scoring job at a time, as when each ran in one piece: a job holds its prompt's KV
        # blocks until it ends, and several at once could take the blocks running streams need.
        lock = self._scoring_lock()
        with self._counted("waiting"):
            await lock.acquire()
        try:
            with self._counted("running"):
                await self._first_step(job)
                while not job.done:
                    await self.engine.run_exclusive(job.step)
        finally:
            if not job.done:  # failed or cancelled: its blocks go back on the engine thread
                with contextlib.suppress(EngineError):
                    self.engine.run_exclusive(job.close)
            lock.release()
        return job.scores

    async def _first_step(self, job: Any) -> None:
        """The job's first chunk, which borrows all its blocks. While running streams hold too
        many, wait for them (a 503 at once had failed ~10% of scoring requests in mixed traffic);
        the request's own timeout bounds the wait. A prompt bigger than the whole cache fails."""
        while True:
            try:
                await self.engine.run_exclusive(job.step)
                return
            except EngineError as exc:
                fits = job.blocks_needed <= self.engine.scheduler.pool.num_blocks
                if exc.code != "kv_cache_exhausted" or job.started or not fits:
                    raise
            self._scoring_jobs["running"] -= 1  # waiting for blocks, as the gauges should say
            try:
                with self._counted("waiting"):
                    await asyncio.sleep(SCORING_BLOCK_WAIT_S)
            finally:
                self._scoring_jobs["running"] += 1

    @contextlib.contextmanager
    def _counted(self, key: str) -> Iterator[None]:
        self._scoring_jobs[key] += 1
        try:
            yield
        finally:
            self._scoring_jobs[key] -= 1

    def _scoring_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._scoring_locks.get(loop)
        if lock is None:
            lock = self._scoring_locks[loop] = asyncio.Lock()
        return lock


def _adapter_dir(config: ServerConfig, loaded: LoadedModel) -> Path | None:
    """``config.adapter_dir``; unset: ``<model folder>/adapters`` (reference §6), or no
    adapters for a model that is not a folder (a GGUF file, the embedded default)."""
    configured = getattr(config, "adapter_dir", None)
    if configured:
        return Path(configured).expanduser()
    source = Path(loaded.source)
    return source / "adapters" if source.is_dir() else None
