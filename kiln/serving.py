"""EngineBackend: the real model + engine behind the HTTP edge's Backend port."""

from __future__ import annotations

import asyncio
import functools
import gc
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.adapters import AdapterStore, validate_name
from kiln.config import ServerConfig, engine_config, process_settings
from kiln.engine.errors import EngineError
from kiln.engine.loop import AsyncEngine, build_on_engine_thread
from kiln.engine.lora_mix import mix_entries_problem
from kiln.engine.outputs import PositionScore, RequestStream
from kiln.engine.request import Request
from kiln.model.loader import Loaded, load_model
from kiln.model.swap import NewWeights, load_beside
from kiln.provenance import PolicyIdentity, content_identity, policy_identity
from kiln.resident import release_freed_heap
from kiln.weight_update import (
    WeightUpdate,
    WeightUpdateBusy,
    WeightUpdateError,
    WeightUpdateTimeout,
    on_own_thread,
)

if TYPE_CHECKING:
    from kiln.model.lora import LoraAdapter


class EngineBackend:
    """The Backend port over a Loaded and its AsyncEngine: model facts for the handlers,
    adapters from the adapter directory, and everything else passed on to the engine."""

    def __init__(self, loaded: Loaded, config: ServerConfig) -> None:
        self.loaded = loaded
        self.engine = AsyncEngine(loaded, engine_config(config))
        # Backend.submit is the engine's own generate: no hop between the handlers and the
        # engine's one stream wrapper (raises EngineError on admission failure)
        self.submit: Callable[[Request], RequestStream] = self.engine.generate
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
        self._started = False
        # the weights served at start (policy_identity's; None once a level-2 sleep dropped them)
        self._started_with: Loaded | None = loaded
        self._weights_asleep = False  # a level-2 sleep let go of them (wake_up reads them again)
        self._identities: dict[str, PolicyIdentity | None] = {}  # updates' (update_weights)
        self._updating = False
        self._config = config
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
        after they change). Raises ValueError for an empty mix, more entries than a mix may
        have or a non-finite scale; InvalidAdapterName / AdapterNotFound from the store;
        AdapterLoadError for an adapter that is malformed or does not fit the base model."""
        self._check_mix(mix)
        return tuple((self.adapter_store.load(name, self.loaded.config), float(scale))
                     for name, scale in mix)

    @staticmethod
    def _check_mix(mix: Sequence[tuple[str, float]]) -> None:
        if not mix:
            raise ValueError("an adapter mix must name at least one adapter")
        problem = mix_entries_problem([scale for _, scale in mix])
        if problem is not None:
            raise ValueError(problem)
        for name, _ in mix:
            validate_name(name)

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
                quant_kernels=process_settings().quant_kernels,
                torch_free=True,  # a GGUF the CPU step runs whole: torch only if needed
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

    def compute_plan(self) -> dict[str, str] | None:
        return self.engine.compute_plan()

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def kv_geometry(self) -> tuple[int, int, int]:
        """The KV cache's blocks, tokens per block and bytes per block (all layers, K and V)."""
        return self.engine.kv_geometry()

    def kv_on_demand(self) -> bool:
        """Whether the KV cache becomes resident as it fills (see AsyncEngine.kv_on_demand)."""
        return self.engine.kv_on_demand()

    def abort_all(self, message: str) -> None:
        self.engine.abort_all(message)

    async def pause(self, mode: str) -> int:
        return await self.engine.pause(mode)

    async def resume(self) -> None:
        await self.engine.resume()

    async def reset_prefix_cache(self) -> int:
        return await self.engine.reset_prefix_cache()

    async def sleep(self, level: int = 1) -> tuple[int, int]:
        """Level 1: the engine's sleep (the KV cache's memory given back). Level 2: the
        weights' too, when they were loaded from a file (``wake_up`` reads them again); raises
        WeightUpdateError for weights that were not."""
        if level == 2:
            if not Path(self.loaded.source).is_file() and not Path(self.loaded.source).is_dir():
                raise WeightUpdateError("the weights were not loaded from a file: level 2 "
                                        "could not bring them back", param="level")
            await asyncio.to_thread(self.policy_identity)  # hashed while the files are known
        out = await self.engine.sleep(level)
        if level == 2:  # the last references to the model: the runner let go of its own
            self.loaded.model = None  # type: ignore[assignment]
            self._started_with = None
            self._weights_asleep = True
            gc.collect()
            release_freed_heap()
        return out

    async def wake_up(self) -> None:
        """Serve again after ``sleep``: at level 2 the weights are read from their file again
        (as an update to the same weights, under the same name) before anything runs."""
        if self._weights_asleep:
            new = await self._load(self.loaded.source, self.weight_version, hash_files=False)
            try:
                await self.engine.update_weights(new.model, new.version, abort=True,
                                                 fresh=new.loaded if new.fresh_runner else None)
            except EngineError as exc:
                raise WeightUpdateError(exc.message) from None
            self.loaded = new.loaded
            self._weights_asleep = False
        await self.engine.resume()

    @property
    def weight_version(self) -> str:
        return self.engine.weight_version

    async def update_weights(self, model_path: str, version: str | None, mode: str,
                             timeout_s: float) -> WeightUpdate:
        """Load ``model_path`` beside the serving weights (a thread of its own: the engine
        serves meanwhile), then swap it in between two steps: ``abort`` ends every request
        first, ``keep`` lets running ones continue on the new weights, ``wait`` admits nothing
        new until the running ones finished (within ``timeout_s``, else WeightUpdateTimeout and
        nothing changed). Raises WeightUpdateBusy while another update runs, WeightUpdateError
        (nothing changed) for a checkpoint that cannot take the serving one's place."""
        if self._updating:
            raise WeightUpdateBusy("another weight update is in flight")
        self._updating = True
        try:
            return await self._update_weights(model_path, version, mode, timeout_s)
        finally:
            self._updating = False

    async def _update_weights(self, model_path: str, version: str | None, mode: str,
                              timeout_s: float) -> WeightUpdate:
        loop = asyncio.get_running_loop()
        started = loop.time()
        new = await self._load(model_path, version, hash_files=True)
        loaded_s = loop.time() - started
        if new.fresh_runner and mode == "keep":
            raise WeightUpdateError(
                f"{model_path!r} runs another compute plan than the serving weights (its KV "
                "cache is laid out otherwise): no request can continue on it; use mode abort "
                "or wait")
        paused_here = False
        if mode == "wait":
            if self.engine.scheduler.pause_mode is None:
                await self.engine.pause("wait")
                paused_here = True
            deadline = loop.time() + timeout_s
            while self.engine.scheduler.num_running:  # a keep pause in force: until /resume
                if loop.time() > deadline:
                    if paused_here:
                        await self.engine.resume()
                    raise WeightUpdateTimeout(
                        f"the running requests did not finish within {timeout_s:g} s; the "
                        "serving weights are unchanged")
                await asyncio.sleep(0.02)
        try:
            aborted = await self.engine.update_weights(
                new.model, new.version, abort=mode == "abort",
                fresh=new.loaded if new.fresh_runner else None)
        except EngineError as exc:
            raise WeightUpdateError(exc.message) from None
        finally:
            if paused_here:
                await self.engine.resume()
        self._identities[new.version] = new.identity
        self.loaded = new.loaded
        return WeightUpdate(version=new.version, aborted=aborted, load_s=loaded_s,
                            total_s=loop.time() - started)

    async def _load(self, path: str, version: str | None, hash_files: bool) -> NewWeights:
        """``load_beside`` for the serving runner, on a thread of its own."""
        from kiln.engine.runner import CArrays, Runner

        runner = self.engine.executor
        plan = runner.plan
        c_step = isinstance(runner, Runner) and isinstance(runner.kv, CArrays)  # heads-major
        torch_free = isinstance(runner, Runner) and runner.program is not None
        layout = "heads-major" if c_step or plan is None else plan.kv_layout
        return await on_own_thread(functools.partial(
            load_beside, self.loaded, path, version=version, torch_free=torch_free,
            kv_layout=layout, dtype=None if self._config.dtype == "auto" else self._config.dtype,
            device=self._config.device, quant_kernels=process_settings().quant_kernels,
            identity=self._identity_of if hash_files else lambda _: None))

    def _identity_of(self, loaded: Loaded) -> PolicyIdentity | None:
        backend = self.tokenizer.backend
        return policy_identity(
            served_model_id=self.model_id, source=Path(loaded.source),
            model_config=loaded.config.record(), dtype=loaded.dtype_name,
            kv_cache_dtype=self.kv_cache_dtype, backend=loaded.device_type,
            runtime=f"torch-{torch_version()}",
            vocab=lambda: backend.get_vocab(with_added_tokens=True),
            tokenizer_json=backend.to_str, chat_template=self.chat_template.source)

    def identity(self) -> dict[str, str]:
        if self._identity is None:
            self._identity = content_identity(self.loaded.config.record(),
                                              self.tokenizer.config_sha256(),
                                              self.chat_template.source)
        return self._identity

    def policy_identity(self, version: str | None = None) -> PolicyIdentity | None:
        """The identity of the weights named ``version`` (None: those serving now). The start's
        is computed once (hashing the weight files takes a moment), then cached; ``start``
        begins it on a thread of its own, and a caller that comes first waits for that
        computation. An update's is computed as it loads (``update_weights``)."""
        if version is None:
            version = self.weight_version
        if version in self._identities:
            return self._identities[version]
        with self._policy_lock:
            if not self._policy_done:
                self._policy = self._compute_policy()
                self._policy_done = True
            return self._policy

    def _compute_policy(self) -> PolicyIdentity | None:
        assert self._started_with is not None  # level 2 sleep computes it before letting go
        return self._identity_of(self._started_with)

    async def score(
        self, prompt_ids: list[int], top_k: int, lora: tuple[tuple[Any, float], ...] = ()
    ) -> list[PositionScore]:
        """Prompt-logprob scoring under the base model, or under the adapter mix `lora` (see
        docs/decisions.md), between the engine's own steps (``AsyncEngine.score``)."""
        return await self.engine.score(prompt_ids, top_k, lora)


def _adapter_dir(config: ServerConfig, loaded: Loaded) -> Path | None:
    """``config.adapter_dir``; unset: ``<model folder>/adapters`` (docs/behavior.md §6), or no
    adapters for a model that is not a folder (a GGUF file, the embedded default)."""
    configured = getattr(config, "adapter_dir", None)
    if configured:
        return Path(configured).expanduser()
    source = Path(loaded.source)
    return source / "adapters" if source.is_dir() else None


def torch_version() -> str:
    """The installed torch's version (``torch.__version__``), read without importing torch."""
    from importlib.metadata import version

    return version("torch")

