"""AsyncEngine.score (kiln.engine.score_queue): the prompt in slices between the engine's steps
(running streams keep decoding), one scoring job at a time, blocks back on cancellation."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from kiln.engine.config import EngineConfig
from kiln.engine.errors import EngineError
from kiln.engine.loop import AsyncEngine
from kiln.engine.outputs import PositionScore
from kiln.engine.request import Request, SamplingParams
from kiln.engine.scoring import ScoringJob
from kiln.model import LoadedModel
from tests.engine.test_scoring import check_against_dense, prompt


def test_engine_scores_in_slices_between_engine_steps(tiny_llama: LoadedModel,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """AsyncEngine.score feeds one chunk per exclusive call: a decoding stream gets engine
    steps between the chunks, the scores equal the dense reference, and every borrowed block
    comes back, also when the caller is cancelled half-way."""
    eng = AsyncEngine(tiny_llama, EngineConfig(kv_memory_mb=8))
    steps_at_chunk: list[int] = []
    real_step = ScoringJob.step

    def spy(self: ScoringJob) -> bool:
        steps_at_chunk.append(eng.num_steps)
        return real_step(self)

    monkeypatch.setattr(ScoringJob, "step", spy)
    eng.start()
    pool = eng.scheduler.pool
    ids = prompt(300, seed=9)  # 299 rows fed: 5 chunks of 64

    async def scored_while_decoding() -> list[PositionScore]:
        sp = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
        stream = eng.generate(Request("gen", prompt(20, seed=1), sp))
        await anext(aiter(stream))  # decoding has begun
        try:
            return await eng.score(ids, 4)
        finally:
            await stream.aclose()

    async def cancelled() -> None:
        before = len(steps_at_chunk)
        task = asyncio.create_task(eng.score(prompt(600, seed=3), 2))
        while len(steps_at_chunk) < before + 2:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def free_blocks() -> int:
        deadline = time.monotonic() + 120  # ends when the blocks are back; generous for a loaded CI
        while True:
            free = await eng.run_exclusive(lambda: pool.num_free_blocks)
            if free == pool.num_blocks or time.monotonic() > deadline:
                return free
            await asyncio.sleep(0.01)

    try:
        scores = asyncio.run(scored_while_decoding())
        assert len(steps_at_chunk) == 5
        assert all(b > a for a, b in itertools.pairwise(steps_at_chunk))
        check_against_dense(tiny_llama.model, ids, 4, scores)
        asyncio.run(cancelled())
        assert asyncio.run(free_blocks()) == pool.num_blocks
    finally:
        eng.shutdown()


def test_engine_scores_one_job_at_a_time(tiny_llama: LoadedModel,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two concurrent scoring requests do not interleave their chunks (each job holds its
    prompt's KV blocks until it ends); both still score right; the gauges count the job that
    runs and the one that waits (a server busy scoring had looked idle)."""
    eng = AsyncEngine(tiny_llama, EngineConfig(kv_memory_mb=8))
    order: list[int] = []
    gauges: list[tuple[float, float, float, float]] = []
    real_step = ScoringJob.step

    def spy(self: ScoringJob) -> bool:
        order.append(id(self))
        s = eng.stats()
        gauges.append((s["scoring_running"], s["scoring_waiting"], s["running"], s["waiting"]))
        return real_step(self)

    monkeypatch.setattr(ScoringJob, "step", spy)
    eng.start()
    a_ids, b_ids = prompt(200, seed=1), prompt(200, seed=2)

    async def both() -> list[list[PositionScore]]:
        return list(await asyncio.gather(eng.score(a_ids, 2), eng.score(b_ids, 2)))

    try:
        a, b = asyncio.run(both())
    finally:
        eng.shutdown()
    assert len(order) == 8 and len(set(order)) == 2
    assert order[:4] == [order[0]] * 4 and order[4:] == [order[4]] * 4
    assert gauges == [(1, 1, 1, 1)] * 4 + [(1, 0, 1, 0)] * 4
    idle = eng.stats()
    assert (idle["scoring_running"], idle["scoring_waiting"], idle["running"]) == (0, 0, 0)
    check_against_dense(tiny_llama.model, a_ids, 2, a)
    check_against_dense(tiny_llama.model, b_ids, 2, b)


def test_c_step_scores_equal_the_decode_step_logits(smollm: LoadedModel) -> None:
    """On the quantized CPU model scoring runs through the C step, whose per-row numbers do not
    depend on how rows are grouped: a scored position's log-probabilities are those of the
    logits a one-row decode step computes there, bit for bit (here across a 512-position part)."""
    import torch

    from kiln.engine.block_pool import BlockPool
    from kiln.engine.scoring import score_prompt
    from kiln.model.batch import build_forward_batch
    from kiln.model.kv_cache import KVCache

    model = smollm.model
    assert model.plan.step == "c"
    ids = torch.randint(100, 40000, (600,), generator=torch.Generator().manual_seed(4)).tolist()
    kv = KVCache(smollm.config, 48, 16, torch.float32, torch.device("cpu"))
    scores = score_prompt(model, kv, BlockPool(48, 16), ids, 3)
    # decode: positions 0..n-3 prefilled in 8-row chunks, then position n-2 alone
    kv2 = KVCache(smollm.config, 48, 16, torch.float32, torch.device("cpu"))
    table, n = list(range(48)), len(ids)
    for s in range(0, n - 2, 8):
        model.forward(build_forward_batch([(ids[s:min(n - 2, s + 8)], s, table)], 16, "all",
                                          torch.device("cpu")), kv2)
    last = model.forward(build_forward_batch([(ids[n - 2:n - 1], n - 2, table)], 16, "last",
                                             torch.device("cpu")), kv2)
    want = torch.log_softmax(last, dim=-1)[0]
    got = scores[-1]
    assert got.token_id == ids[-1]
    assert got.logprob == float(want[ids[-1]])
    assert got.top_logprobs == [float(want[t]) for t in got.top_ids]


def test_scoring_waits_for_blocks_that_running_streams_hold(tiny_llama: LoadedModel) -> None:
    """A prompt that fits the cache but not its free blocks waits for a running stream to end
    (it had failed at once with 503 kv_cache_exhausted); a prompt bigger than the whole cache
    still fails at once."""
    eng = AsyncEngine(tiny_llama, EngineConfig(kv_memory_mb=1))  # 128 blocks of 16
    eng.start()
    pool = eng.scheduler.pool

    async def main() -> tuple[int, int, str]:
        sp = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
        stream = eng.generate(Request("gen", prompt(1200, seed=1), sp))  # ~78 blocks
        await anext(aiter(stream))
        free_then = await eng.run_exclusive(lambda: pool.num_free_blocks)
        scoring = asyncio.create_task(eng.score(prompt(1000, seed=2), 1))  # ~63 blocks
        async for _ in stream:
            pass
        scores = await scoring
        with pytest.raises(EngineError) as too_big:
            await eng.score(prompt(2100, seed=3), 1)
        return free_then, len(scores), too_big.value.code

    try:
        free_then, scored, code = asyncio.run(main())
    finally:
        eng.shutdown()
    assert free_then < 63  # the scoring job could not have started at once
    assert scored == 999 and code == "context_length_exceeded"
