"""Prompt-logprob scoring on the engine thread: chunked paged scoring vs a dense reference,
exact ranks with ties, block accounting, and run_exclusive alongside generation."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from kiln.engine.block_pool import BlockPool
from kiln.engine.config import EngineConfig
from kiln.engine.errors import EngineError
from kiln.engine.loop import AsyncEngine
from kiln.engine.outputs import PositionScore
from kiln.engine.request import Request, SamplingParams
from kiln.engine.runner import Runner
from kiln.engine.scheduler import Scheduler
from kiln.engine.scoring import score_prompt, score_rows, top_k_ids
from kiln.model import CausalLM, LoadedModel
from kiln.model.batch import build_forward_batch
from kiln.model.kv_cache import KVCache
from tests.engine.fakes import FakeRunner
from tests.numerics import check_rank, forward_rtol, reorder_rtol
from tests.tiny_models import model_from_tensors, random_tensors, tiny_config

BS = 16
VOCAB = 512
NUM_BLOCKS = 64


@pytest.fixture(scope="module")
def tied_model() -> CausalLM:
    """Untied tiny llama whose output rows at odd ids are zero: those logits tie exactly at 0,
    and the tie block straddles the top-K boundary for K around half the vocabulary."""
    cfg = tiny_config("llama", tie=False)
    tensors = random_tensors(cfg, seed=7)
    tensors["lm_head.weight"][1::2] = 0.0
    return model_from_tensors(cfg, tensors)


@pytest.fixture(scope="module")
def plain_model() -> CausalLM:
    cfg = tiny_config("llama", tie=True)
    return model_from_tensors(cfg, random_tensors(cfg, seed=3))


def new_kv(model: CausalLM) -> KVCache:
    return KVCache(model.config, NUM_BLOCKS, BS, torch.float32, torch.device("cpu"))


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def dense_logits(model: CausalLM, ids: list[int]) -> torch.Tensor:
    """Plain forward of the whole prompt in one chunk (fresh cache), logits of every row."""
    kv = KVCache(model.config, -(-len(ids) // BS), BS, torch.float32, torch.device("cpu"))
    batch = build_forward_batch([(ids, 0, list(range(kv.num_blocks)))], BS, "all", "cpu")
    return model.forward(batch, kv)


def logit_bound(model: CausalLM, ids: list[int], row: np.ndarray) -> float:
    """How far a logit of ``row`` may move between the chunked and the dense forward pass: they
    differ only in summation order (tests/numerics.py)."""
    return forward_rtol(model.config, len(ids)) * float(np.abs(row).max())


def logprob_bound(model: CausalLM, ids: list[int], row: np.ndarray) -> float:
    """A logprob is logit - logsumexp: both move by the logit bound, and the exp-sum over the
    vocabulary is itself a sum in some order (its relative error is the log's absolute one)."""
    return 2 * logit_bound(model, ids, row) + reorder_rtol(len(row))


def check_against_dense(model: CausalLM, ids: list[int], k: int,
                        scores: list[PositionScore]) -> None:
    assert len(scores) == len(ids) - 1
    if len(ids) < 2:
        return
    logits = dense_logits(model, ids).double()
    lsm = torch.log_softmax(logits, -1).numpy()
    arr = logits.numpy()
    for p, s in enumerate(scores, start=1):
        row, obs = arr[p - 1], ids[p]
        assert s.token_id == obs
        bound = logprob_bound(model, ids, row)
        assert abs(s.logprob - lsm[p - 1, obs]) <= bound, (p, s.logprob, lsm[p - 1, obs], bound)
        check_rank(row, obs, k, s.rank, s.top_ids, 2 * logit_bound(model, ids, row), f"pos {p}")
        assert np.abs(np.asarray(s.top_logprobs) - lsm[p - 1, s.top_ids]).max(initial=0) <= bound


@pytest.mark.parametrize("n", [1, 2, 127, 128, 129, 300])
def test_matches_dense_reference_across_chunk_boundaries(tied_model: CausalLM, n: int) -> None:
    pool = BlockPool(NUM_BLOCKS, BS)
    ids = prompt(n, seed=n)
    scores = score_prompt(tied_model, new_kv(tied_model), pool, ids, 5)
    check_against_dense(tied_model, ids, 5, scores)
    assert pool.num_free_blocks == NUM_BLOCKS


@pytest.mark.parametrize("k", [0, 1, 200, 256, 300, VOCAB])
def test_ranks_with_exact_ties(tied_model: CausalLM, k: int) -> None:
    ids = prompt(90, seed=1)
    ids[10:40] = [1, 3, 5, 7, 9, 11] * 5  # observed tokens inside the zero-logit tie block
    scores = score_prompt(tied_model, new_kv(tied_model), BlockPool(NUM_BLOCKS, BS), ids, k)
    check_against_dense(tied_model, ids, k, scores)
    if k == 0:
        assert all(s.top_ids == [] and s.top_logprobs == [] for s in scores)
    if k == VOCAB:
        assert all(sorted(s.top_ids) == list(range(VOCAB)) for s in scores)
    # The zero block really straddles the boundary for mid-sized K and ties go to lower ids.
    tied = [s for s in scores if s.token_id % 2 == 1 and s.rank > max(k, 1)]
    if 0 < k < VOCAB:
        assert tied and all(s.rank >= 256 for s in tied)


def test_odd_chunk_and_projection_sizes(tied_model: CausalLM) -> None:
    ids = prompt(75, seed=9)
    scores = score_prompt(tied_model, new_kv(tied_model), BlockPool(NUM_BLOCKS, BS), ids, 3,
                          chunk_tokens=7, proj_rows=5)
    check_against_dense(tied_model, ids, 3, scores)


def test_rank_rules_on_hand_made_logits() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 2.0]] * 4)
    assert top_k_ids(logits[:1], 2).tolist() == [[1, 2]]
    assert top_k_ids(logits[:1], 4).tolist() == [[1, 2, 4, 5]]
    s = score_rows(logits, torch.tensor([4, 2, 3, 5]), 2)
    assert [x.rank for x in s] == [3, 2, 6, 4]
    assert all(x.top_ids == [1, 2] for x in s)
    s0 = score_rows(logits, torch.tensor([4, 2, 3, 1]), 0)
    assert [x.rank for x in s0] == [3, 3, 6, 3] and s0[0].top_ids == []
    lsm = torch.log_softmax(logits[0], -1)
    # the same log_softmax over 6 values of magnitude <= 3, reduced in any order
    assert abs(s[0].logprob - float(lsm[4])) <= 2 * 3.0 * reorder_rtol(6)
    assert s[0].top_logprobs[0] == s[0].logprob


def test_topk_tie_run_straddling_k_keeps_lowest_ids() -> None:
    row = torch.zeros(1, 1000)
    row[0, 999] = 5.0
    assert top_k_ids(row, 4).tolist() == [[999, 0, 1, 2]]
    rev = (torch.arange(999.0, -1.0, -1.0) // 100).view(1, -1)  # ids 0..99 hold the top 9.0
    assert top_k_ids(rev, 3).tolist() == [[0, 1, 2]]


def test_blocks_returned_on_error_and_exhaustion(plain_model: CausalLM,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pool = BlockPool(NUM_BLOCKS, BS)
    held = pool.allocate(NUM_BLOCKS - 3)  # 3 free: 48 fed tokens fit, 49 do not
    with pytest.raises(EngineError) as e:
        score_prompt(plain_model, new_kv(plain_model), pool, prompt(50), 1)
    assert (e.value.code, e.value.status) == ("kv_cache_exhausted", 503)
    assert pool.num_free_blocks == 3
    assert len(score_prompt(plain_model, new_kv(plain_model), pool, prompt(49), 1)) == 48
    assert pool.num_free_blocks == 3

    def boom(*args: object) -> torch.Tensor:
        raise RuntimeError("boom")

    monkeypatch.setattr(plain_model, "hidden_states", boom)
    with pytest.raises(RuntimeError, match="boom"):
        score_prompt(plain_model, new_kv(plain_model), pool, prompt(40), 1)
    assert pool.num_free_blocks == 3
    pool.free(held)
    assert pool.num_free_blocks == NUM_BLOCKS


def test_evicts_cached_free_blocks(plain_model: CausalLM) -> None:
    pool = BlockPool(4, BS)
    blocks = pool.allocate(4)
    for i, b in enumerate(blocks):
        pool.cache_block(b, 1000 + i, 0, list(range(i, i + BS)))
    pool.free(blocks)
    assert pool.num_cached_blocks == 4
    scores = score_prompt(plain_model, KVCache(plain_model.config, 4, BS, torch.float32,
                                               torch.device("cpu")), pool, prompt(64), 2)
    assert len(scores) == 63 and pool.num_free_blocks == 4 and pool.num_cached_blocks == 0


def test_rejects_bad_arguments(plain_model: CausalLM) -> None:
    pool = BlockPool(NUM_BLOCKS, BS)
    kv = new_kv(plain_model)
    for ids, k in (([], 1), ([1, 2], -1), ([1, 2], VOCAB + 1), ([1, VOCAB], 1)):
        with pytest.raises(ValueError):
            score_prompt(plain_model, kv, pool, ids, k)
    assert pool.num_free_blocks == NUM_BLOCKS


# -- run_exclusive ---------------------------------------------------------------------------


@pytest.fixture
def fake_engine() -> Iterator[AsyncEngine]:
    cfg = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=32)
    eng = AsyncEngine.from_components(Scheduler(cfg, 64, 200), FakeRunner(64, 4))
    eng.start()
    yield eng
    eng.shutdown()


def test_run_exclusive_result_exception_and_thread(fake_engine: AsyncEngine) -> None:
    async def main() -> None:
        assert await fake_engine.run_exclusive(lambda: threading.current_thread().name) == \
            "kiln-engine"

        def fail() -> int:
            raise KeyError("nope")

        with pytest.raises(KeyError, match="nope"):
            await fake_engine.run_exclusive(fail)
        outs = [o async for o in fake_engine.generate(
            Request("g", [1, 2, 3], SamplingParams(max_tokens=4, seed=1)))]
        assert outs[-1].finish_reason == "length"  # the engine survived the exception

    asyncio.run(main())


def test_run_exclusive_cancelled_before_start_is_skipped(fake_engine: AsyncEngine) -> None:
    started, gate = threading.Event(), threading.Event()
    ran: list[str] = []

    def hold() -> None:
        started.set()
        assert gate.wait(10)

    async def main() -> None:
        first = fake_engine.run_exclusive(hold)
        await asyncio.to_thread(started.wait, 10)
        second = fake_engine.run_exclusive(lambda: ran.append("second"))
        second.cancel()
        await asyncio.sleep(0)
        gate.set()
        await first
        await fake_engine.run_exclusive(lambda: ran.append("third"))

    asyncio.run(main())
    assert ran == ["third"]


def test_run_exclusive_needs_running_engine_and_fails_on_shutdown(
        fake_engine: AsyncEngine) -> None:
    started, gate = threading.Event(), threading.Event()

    def hold() -> int:
        started.set()
        assert gate.wait(10)
        return 1

    async def main() -> None:
        first = fake_engine.run_exclusive(hold)
        await asyncio.to_thread(started.wait, 10)
        pending = fake_engine.run_exclusive(lambda: 2)
        stopper = threading.Thread(target=fake_engine.shutdown)
        stopper.start()
        while not fake_engine._stopping:
            await asyncio.sleep(0.001)
        gate.set()
        assert await first == 1
        with pytest.raises(EngineError) as e:
            await pending
        assert e.value.code == "engine_not_running"
        await asyncio.to_thread(stopper.join, 10)
        with pytest.raises(EngineError):
            fake_engine.run_exclusive(lambda: 3)

    asyncio.run(main())


def _generate_all(loaded: LoadedModel, score_ids: list[int] | None
                  ) -> tuple[list[list[int]], list[PositionScore] | None, float]:
    cfg = EngineConfig(block_size=BS, num_blocks=48, max_num_batched_tokens=64,
                       enable_prefix_caching=False)
    eng = AsyncEngine(loaded, cfg)
    eng.start()
    scored: list[PositionScore] | None = None
    runner, pool = eng.executor, eng.scheduler.pool
    assert isinstance(runner, Runner)

    def score() -> list[PositionScore]:
        assert score_ids is not None and isinstance(runner, Runner)
        side = runner.torch_step()
        return score_prompt(side.model, side.kv, pool, score_ids, 4)

    async def one(i: int) -> list[int]:
        nonlocal scored
        sp = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=10 + i)
        toks: list[int] = []
        async for out in eng.generate(Request(f"r{i}", prompt(20 + 7 * i, seed=i), sp)):
            toks.extend(out.new_token_ids)
            if i == 0 and score_ids is not None and len(toks) == 4:
                assert pool.num_used_blocks > 0  # the other requests hold blocks now
                scored = await eng.run_exclusive(score)
        return toks

    async def main() -> list[list[int]]:
        return list(await asyncio.gather(*(one(i) for i in range(3))))

    try:
        tokens = asyncio.run(main())
        deadline = time.monotonic() + 120  # ends when the blocks are back; generous for a loaded CI
        while eng.stats()["kv_blocks_used"] and time.monotonic() < deadline:
            time.sleep(0.01)
        used = eng.stats()["kv_blocks_used"]
    finally:
        eng.shutdown()
    return tokens, scored, used


def test_scoring_between_steps_leaves_generation_untouched(tiny_llama: LoadedModel) -> None:
    ids = prompt(150, seed=5)
    alone, _, _ = _generate_all(tiny_llama, None)
    mixed, scored, used = _generate_all(tiny_llama, ids)
    assert mixed == alone and all(len(t) == 12 for t in alone)
    assert used == 0
    assert scored is not None
    check_against_dense(tiny_llama.model, ids, 4, scored)



def test_run_exclusive_block_changes_show_in_stats_when_it_returns(
        fake_engine: AsyncEngine) -> None:
    """A scoring job borrows and returns blocks inside exclusive calls, with no engine step
    after them: the gauges must not wait for the next step (they had shown a cancelled job's
    blocks as used until other traffic came)."""
    pool = fake_engine.scheduler.pool
    held: list[int] = []

    async def main() -> None:
        assert fake_engine.stats()["kv_blocks_used"] == 0
        await fake_engine.run_exclusive(lambda: held.extend(pool.allocate(5)))
        assert fake_engine.stats()["kv_blocks_used"] == 5
        await fake_engine.run_exclusive(lambda: pool.free(held))
        assert fake_engine.stats()["kv_blocks_used"] == 0

    asyncio.run(main())
