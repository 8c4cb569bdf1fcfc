"""LoRA through the engine: per-request adapter mixes batched together, prefix-cache isolation
between mixes, the adapter-slot limit, and requests keeping their weights across reload/delete.

References are engines over a model whose weights have the adapters merged in (greedy decoding,
so equal logits up to float noise give equal tokens)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest
import torch

from kiln.adapters import AdapterNotFound, InvalidAdapterName
from kiln.config import ServerConfig
from kiln.engine.block_pool import ROOT_HASH
from kiln.engine.config import EngineConfig
from kiln.engine.errors import NON_FINITE_MIX, EngineError
from kiln.engine.loop import AsyncEngine, build_core
from kiln.engine.lora_mix import LoraMix, mix_root_hash
from kiln.engine.outputs import ModelRunnerOutput, RequestOutput, SchedulerOutput
from kiln.engine.request import Request, SamplingParams
from kiln.engine.runner import Runner
from kiln.engine.scheduler import Scheduler
from kiln.model import LoadedModel, load_model
from kiln.model.lora import LORA_MODULES, AdapterLoadError, LoraAdapter, load_adapter
from kiln.serving import EngineBackend
from tests.engine.drive import drive, token_ids
from tests.engine.fakes import NoModel
from tests.model.test_lora import merged, write_peft
from tests.tiny_models import random_tensors, tiny_config, write_tiny_qwen3

SEED = 3
MAX_TOKENS = 10
CONFIG = EngineConfig(block_size=4, num_blocks=256, max_num_batched_tokens=64)


@dataclasses.dataclass
class World:
    loaded: LoadedModel
    base: dict[str, torch.Tensor]
    adapter_dir: Path
    a: LoraAdapter
    b: LoraAdapter
    c: LoraAdapter


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("lora_engine")
    loaded = load_model(str(write_tiny_qwen3(root / "model", seed=SEED)), device="cpu")
    cfg = loaded.config
    assert cfg == tiny_config("qwen3")
    adir = root / "adapters"
    a = load_adapter(write_peft(adir / "a", cfg, r=4, alpha=8, targets=LORA_MODULES, seed=1), cfg)
    b = load_adapter(write_peft(adir / "b", cfg, r=8, alpha=16,
                                targets=("q_proj", "v_proj", "down_proj"), seed=2), cfg)
    c = load_adapter(write_peft(adir / "c", cfg, r=2, alpha=4, targets=("o_proj", "up_proj"),
                                seed=3), cfg)
    return World(loaded, random_tensors(cfg, seed=SEED), adir, a, b, c)


class Recorder(NoModel):
    """Wraps the model runner; records the distinct mixes and adapters of every step."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.mixes: list[set[tuple[tuple[str, float], ...]]] = []
        self.adapters: list[set[str]] = []

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self.mixes.append({tuple((a.content_sha256, s) for a, s in q.lora) for q in so.seqs})
        self.adapters.append({a.content_sha256 for q in so.seqs for a, _ in q.lora})
        return self.runner.execute(so)


def engine(loaded: LoadedModel, config: EngineConfig = CONFIG) -> tuple[AsyncEngine, Recorder]:
    scheduler, runner = build_core(loaded, config)
    rec = Recorder(runner)
    eng = AsyncEngine.from_components(scheduler, rec)
    eng.start()
    return eng, rec


def merged_engine(w: World, mix: Sequence[tuple[LoraAdapter, float]]) -> AsyncEngine:
    model = merged(w.loaded.config, w.base, list(mix))
    return engine(dataclasses.replace(w.loaded, model=model))[0]


def prompt(i: int, n: int = 13) -> list[int]:
    gen = torch.Generator().manual_seed(100 + i)
    return torch.randint(10, 500, (n,), generator=gen).tolist()


def request(rid: str, ids: list[int], lora: LoraMix = (), n: int = MAX_TOKENS) -> Request:
    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return Request(rid, ids, sp, lora=lora)


async def collect(stream: AsyncIterator[RequestOutput]) -> tuple[list[int], RequestOutput]:
    outs = [o async for o in stream]
    assert outs[-1].finished and outs[-1].error is None, outs[-1].error
    return [t for o in outs for t in o.new_token_ids], outs[-1]


def run(eng: AsyncEngine, reqs: list[Request]) -> list[list[int]]:
    """Run ``reqs`` concurrently; their tokens."""
    async def go() -> list[tuple[list[int], RequestOutput]]:
        return await asyncio.gather(*(collect(eng.generate(r)) for r in reqs))

    return [toks for toks, _ in asyncio.run(go())]


def test_adapter_request_equals_merged_weights(world: World) -> None:
    w = world
    eng, _ = engine(w.loaded)
    mixes: list[tuple[tuple[LoraAdapter, float], ...]] = [
        ((w.a, 1.0),), ((w.b, 0.7),), ((w.a, 0.5), (w.b, -1.2))]
    try:
        base = run(eng, [request("base", prompt(0))])[0]
        for i, mix in enumerate(mixes):
            got = run(eng, [request(f"lora{i}", prompt(0), mix)])[0]
            ref = merged_engine(w, mix)
            try:
                want = run(ref, [request("ref", prompt(0))])[0]
            finally:
                ref.shutdown()
            assert got == want, f"mix {i}"
            assert got != base, f"mix {i} did not change the output"
    finally:
        eng.shutdown()


def test_mixed_batch_gives_every_request_its_solo_tokens(world: World) -> None:
    w = world
    mixes: list[LoraMix] = [(), ((w.a, 1.0),), ((w.b, 0.8),), ((w.a, 0.5), (w.b, 1.5)),
                            ((w.b, 1.5), (w.a, 0.5)), ((w.a, 0.0),)]
    reqs = [request(f"r{i}", prompt(i, 9 + 2 * i), mix) for i, mix in enumerate(mixes)]
    eng, rec = engine(w.loaded)
    try:
        together = run(eng, reqs)
    finally:
        eng.shutdown()
    assert max(len(m) for m in rec.mixes) >= 4  # the mixes really shared forward passes
    solo_eng, solo_rec = engine(w.loaded)
    try:
        solo = [run(solo_eng, [r])[0] for r in reqs]
    finally:
        solo_eng.shutdown()
    assert max(len(m) for m in solo_rec.mixes) == 1
    assert together == solo
    assert len({tuple(t) for t in solo}) >= 4


def test_prefix_cache_never_shared_across_mixes(world: World) -> None:
    w = world
    eng, _ = engine(w.loaded)

    def cached(rid: str, lora: LoraMix) -> tuple[int, list[int]]:
        async def go() -> tuple[list[int], RequestOutput]:
            return await collect(eng.generate(request(rid, prompt(7), lora)))

        toks, final = asyncio.run(go())
        return final.num_cached_tokens, toks

    try:
        assert cached("base1", ())[0] == 0
        hit, a_first = cached("a1", ((w.a, 1.0),))
        assert hit == 0  # same prompt as base1: no KV from the base model
        hit, a_again = cached("a2", ((w.a, 1.0),))
        assert hit == 12 and a_again == a_first  # same mix: shares (13 tokens, blocks of 4)
        assert cached("a_half", ((w.a, 0.5),))[0] == 0  # another scale is another mix
        assert cached("ab", ((w.a, 1.0), (w.b, 1.0)))[0] == 0
        assert cached("ba", ((w.b, 1.0), (w.a, 1.0)))[0] == 12  # a sum: order-free
        assert cached("base2", ())[0] == 12
    finally:
        eng.shutdown()
    ref = merged_engine(w, [(w.a, 1.0)])
    try:
        assert run(ref, [request("ref", prompt(7))])[0] == a_again
    finally:
        ref.shutdown()


def test_mix_root_hash() -> None:
    @dataclasses.dataclass(frozen=True)
    class Fake:
        content_sha256: str
        rank: int = 4

    a, b = Fake("aa"), Fake("bb")
    assert mix_root_hash(()) == ROOT_HASH
    assert mix_root_hash(((a, 1.0), (b, 2.0))) == mix_root_hash(((b, 2.0), (a, 1.0)))
    assert mix_root_hash(((a, 1.0),)) == mix_root_hash(((Fake("aa", 8), 1),))
    keys = {mix_root_hash(m) for m in [((a, 1.0),), ((a, 2.0),), ((b, 1.0),),
                                       ((a, 1.0), (b, 1.0)), ((a, 1.0), (a, 1.0))]}
    assert len(keys) == 5 and ROOT_HASH not in keys


def test_scheduler_limits_distinct_adapters_fifo() -> None:
    @dataclasses.dataclass(frozen=True)
    class Fake:
        content_sha256: str
        rank: int = 4

    a, b, c = Fake("a"), Fake("b"), Fake("c")
    sched = Scheduler(dataclasses.replace(CONFIG, max_lora_slots=2), 256, 2048)
    for rid, lora in [("ra", ((a, 1.0),)), ("rb", ((b, 1.0),)), ("rc", ((c, 1.0),)),
                      ("base", ()), ("ra2", ((a, 1.0), (a, 2.0))), ("rcb", ((b, 1.0), (c, 1.0)))]:
        sched.add_request(request(rid, prompt(len(rid), 5), lora))
    so = sched.schedule()
    assert [s.request_id for s in so.seqs] == ["ra", "rb", "base", "ra2"]
    assert so.seqs[1].lora == ((b, 1.0),)
    assert [st.request_id for st in sched._waiting] == ["rc", "rcb"]
    for rid in ("ra", "ra2"):
        sched.abort(rid)
    so = sched.schedule()  # a's slot is free; rc takes it (rcb then fits too: b and c)
    assert {s.request_id for s in so.seqs if s.is_new} == {"rc", "rcb"}
    with pytest.raises(EngineError) as e:
        sched.add_request(request("three", prompt(0), ((a, 1), (b, 1), (c, 1))))
    assert e.value.code == "invalid_compose_request" and e.value.status == 400
    for bad in [((Fake("big", 300), 1.0),), ((a, float("nan")),), ((a, 1.0),) * 17]:
        with pytest.raises(EngineError):
            sched.check_request(request("bad", prompt(0), bad))


def test_more_adapters_than_slots_all_finish(world: World) -> None:
    w = world
    mixes: list[LoraMix] = [((w.a, 1.0),), ((w.b, 1.0),), ((w.c, 1.0),), (),
                            ((w.c, 1.0), (w.a, 1.0)), ((w.b, 2.0),)]
    reqs = [request(f"r{i}", prompt(i), mix) for i, mix in enumerate(mixes)]
    small = dataclasses.replace(CONFIG, max_lora_slots=2)
    eng, rec = engine(w.loaded, small)
    try:
        together = run(eng, reqs)
        slots = rec.runner.torch_step().lora_slots
        assert slots.max_slots == 2 and slots.evictions > 0
        with pytest.raises(EngineError):
            run(eng, [request("three", prompt(0), ((w.a, 1.0), (w.b, 1.0), (w.c, 1.0)))])
    finally:
        eng.shutdown()
    assert max(len(s) for s in rec.adapters) == 2
    solo_eng, _ = engine(w.loaded)
    try:
        assert together == [run(solo_eng, [r])[0] for r in reqs]
    finally:
        solo_eng.shutdown()


def _want(w: World, adapter: LoraAdapter, ids: list[int], n: int) -> list[int]:
    ref = merged_engine(w, [(adapter, 1.0)])
    try:
        return run(ref, [request("ref", ids, n=n)])[0]
    finally:
        ref.shutdown()


def test_request_keeps_its_weights_across_reload_and_delete(world: World,
                                                            tmp_path: Path) -> None:
    w = world
    cfg = w.loaded.config
    adir = tmp_path / "adapters"
    write_peft(adir / "x", cfg, r=4, alpha=8, targets=LORA_MODULES, seed=11)
    backend = EngineBackend(w.loaded, ServerConfig(adapter_dir=str(adir), block_size=4,
                                                   kv_memory_mb=8))
    backend.start()
    ids, n = prompt(9), 24

    async def mid_flight(rid: str, lora: LoraMix, action: Callable[[], object]) -> list[int]:
        stream = backend.submit(request(rid, ids, lora, n))
        it = aiter(stream)
        first = await anext(it)
        assert not first.finished

        def act() -> int:
            action()
            return backend.engine.scheduler.num_running

        assert await backend.engine.run_exclusive(act) == 1  # still running when it happened
        rest, _ = await collect(it)
        return first.new_token_ids + rest

    def prepare(mix: list[tuple[str, float]]) -> tuple[tuple[LoraAdapter, float], ...]:
        return asyncio.run(backend.prepare_lora(mix))

    try:
        old = prepare([("x", 1.0)])
        got = asyncio.run(mid_flight(
            "reload", old, lambda: write_peft(adir / "x", cfg, r=8, alpha=4, targets=LORA_MODULES,
                                    seed=12)))
        assert got == _want(w, old[0][0], ids, n)
        new = prepare([("x", 1.0)])
        assert new[0][0].content_sha256 != old[0][0].content_sha256
        got_new = asyncio.run(mid_flight("delete", new, lambda: backend.adapter_store.delete("x")))
        want_new = _want(w, new[0][0], ids, n)
        assert got_new == want_new and got_new != got
        with pytest.raises(AdapterNotFound):
            prepare([("x", 1.0)])
    finally:
        backend.shutdown()


def test_load_lora_rejects_bad_mixes(world: World, tmp_path: Path) -> None:
    w = world
    adir = tmp_path / "adapters"
    write_peft(adir / "ok", w.loaded.config, r=2, alpha=2, targets=("q_proj",), seed=1)
    write_peft(adir / "misfit", tiny_config("llama"), r=2, alpha=2, targets=("q_proj",), seed=1)
    backend = EngineBackend(w.loaded, ServerConfig(adapter_dir=str(adir), kv_memory_mb=8))
    mix = backend.load_lora([("ok", 0.5), ("ok", 2)])
    assert [(a.name, s) for a, s in mix] == [("ok", 0.5), ("ok", 2.0)] and mix[0][0] is mix[1][0]
    for bad in ([], [("ok", 1.0)] * 17, [("ok", float("inf"))]):
        with pytest.raises(ValueError):
            backend.load_lora(bad)
    with pytest.raises(InvalidAdapterName):
        backend.load_lora([("../ok", 1.0)])
    with pytest.raises(AdapterNotFound):
        backend.load_lora([("ok", 1.0), ("missing", 1.0)])
    with pytest.raises(AdapterLoadError):
        backend.load_lora([("misfit", 1.0)])
    default = EngineBackend(w.loaded, ServerConfig(kv_memory_mb=8))
    assert default.adapter_store.root == Path(w.loaded.source) / "adapters"


def test_adapters_load_on_the_engine_thread(world: World, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare_lora (the API's path) reads an adapter on the engine thread, never on the event
    loop's: torch work there would start a second OpenMP team, which throttles the C step's
    barriers on a small CPU. A loaded, unchanged adapter comes from the cache without a hop;
    a changed one is read again on the engine thread. With no engine running: EngineError."""
    import threading

    from kiln.adapters import AdapterStore

    adir = tmp_path / "adapters"
    write_peft(adir / "a", world.loaded.config, r=2, alpha=2, targets=("q_proj",), seed=1)
    backend = EngineBackend(world.loaded, ServerConfig(adapter_dir=str(adir), kv_memory_mb=8))
    with pytest.raises(EngineError):
        asyncio.run(backend.prepare_lora([("a", 1.0)]))
    loads: list[threading.Thread] = []
    real_load = AdapterStore.load

    def spy(self: AdapterStore, name: str, cfg: object) -> LoraAdapter:
        loads.append(threading.current_thread())
        return real_load(self, name, cfg)  # type: ignore[arg-type]

    monkeypatch.setattr(AdapterStore, "load", spy)
    backend.start()
    try:
        first = asyncio.run(backend.prepare_lora([("a", 1.0)]))
        engine_thread = backend.engine._thread
        assert loads == [engine_thread] and engine_thread is not threading.current_thread()
        again = asyncio.run(backend.prepare_lora([("a", 0.5)]))
        assert again[0][0] is first[0][0] and again[0][1] == 0.5 and len(loads) == 1
        write_peft(adir / "a", world.loaded.config, r=4, alpha=2, targets=("q_proj",), seed=2)
        changed = asyncio.run(backend.prepare_lora([("a", 1.0)]))
        assert changed[0][0].content_sha256 != first[0][0].content_sha256
        assert loads == [engine_thread, engine_thread]
    finally:
        backend.shutdown()


def test_store_keeps_at_most_max_loaded_adapters(world: World, tmp_path: Path) -> None:
    """Least recently used first out; a dropped adapter is read again on its next use (same
    content), and an object a caller holds stays usable."""
    from kiln.adapters import AdapterStore

    cfg = world.loaded.config
    for i, name in enumerate(("a", "b", "c")):
        write_peft(tmp_path / name, cfg, r=2, alpha=2, targets=("q_proj",), seed=i)
    store = AdapterStore(tmp_path, max_loaded=2)
    a, b = store.load("a", cfg), store.load("b", cfg)
    assert store.cached("a") is a  # a is now the most recently used
    c = store.load("c", cfg)
    assert store.cached("b") is None and store.cached("a") is a and store.cached("c") is c
    b2 = store.load("b", cfg)
    assert b2 is not b and b2.content_sha256 == b.content_sha256
    assert store.cached("a") is None  # a was the oldest when b came back
    assert b.delta(0, "q_proj") is not None
    with pytest.raises(ValueError):
        AdapterStore(tmp_path, max_loaded=0)


def test_an_overflowing_scale_ends_only_its_request(world: World) -> None:
    """Issue 52, 3: a scale that makes a row's logits non-finite ends that request with the
    mix's error (the handlers answer 400 naming the scale, tests/e2e/test_lora_http.py); the
    rows beside it in the same steps, base and adapter alike, get their solo tokens."""
    w = world
    reqs = [request("base", prompt(1)), request("huge", prompt(2), ((w.a, 1e30),)),
            request("lora", prompt(3), ((w.a, 1.0),))]
    sched, runner = build_core(w.loaded, CONFIG)
    rec = Recorder(runner)
    outs = drive(sched, rec, reqs)
    assert len(rec.mixes[0]) == 3  # the three shared the first forward pass
    assert outs["huge"][-1].finish_reason == "error"
    assert outs["huge"][-1].error == NON_FINITE_MIX and token_ids(outs["huge"]) == []
    solo_sched, solo_runner = build_core(w.loaded, CONFIG)
    for rid in ("base", "lora"):
        r = next(q for q in reqs if q.request_id == rid)
        alone = drive(solo_sched, solo_runner, [dataclasses.replace(r, request_id=rid + "-1")])
        assert token_ids(outs[rid]) == token_ids(alone[rid + "-1"])
        assert len(token_ids(outs[rid])) == MAX_TOKENS
    assert sched.pool.num_used_blocks == 0
