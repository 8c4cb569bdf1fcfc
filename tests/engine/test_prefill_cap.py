"""While sequences decode, prefill chunks are capped (max_prefill_tokens_while_decoding), so a
long prompt being admitted never stalls running streams for a whole token budget."""

from __future__ import annotations

from kiln.engine.config import EngineConfig
from kiln.engine.request import Request, SamplingParams
from kiln.engine.scheduler import Scheduler
from tests.engine.drive import drive, token_ids
from tests.engine.fakes import FakeRunner


def test_prefill_chunks_are_capped_while_decoding() -> None:
    cfg = EngineConfig(block_size=4, num_blocks=200, max_num_batched_tokens=96,
                       max_prefill_tokens_while_decoding=8)
    sched, runner = Scheduler(cfg, 200, max_model_len=512), FakeRunner(200, 4)
    streams = [Request(f"s{i}", [1, 2, 3, i], SamplingParams(max_tokens=40, ignore_eos=True))
               for i in range(2)]
    for r in streams:
        sched.add_request(r)
    for _ in range(3):  # the two streams are now decoding
        so = sched.schedule()
        sched.update_from_output(so, runner.execute(so))
    long = Request("long", list(range(5, 45)) * 3, SamplingParams(max_tokens=2, ignore_eos=True))
    sched.add_request(long)
    steps = 0
    while sched.has_work and steps < 200:
        so = sched.schedule()
        decoding = [s for s in so.seqs if s.request_id.startswith("s")]
        prefill = sum(s.num_tokens for s in so.seqs if s.request_id == "long" and not s.sample)
        if decoding:
            assert prefill <= 8, prefill
        sched.update_from_output(so, runner.execute(so))
        steps += 1
    assert not sched.has_work


def test_without_decodes_the_full_budget_is_used() -> None:
    cfg = EngineConfig(block_size=4, num_blocks=200, max_num_batched_tokens=96,
                       max_prefill_tokens_while_decoding=8)
    sched = Scheduler(cfg, 200, max_model_len=512)
    req = Request("a", list(range(3, 120)), SamplingParams(max_tokens=3, ignore_eos=True))
    sched.add_request(req)
    so = sched.schedule()
    assert so.num_batched_tokens == 96  # nothing decodes yet: the whole budget goes to prefill


def test_capped_chunks_give_the_same_tokens() -> None:
    def run(cap: int) -> list[int]:
        cfg = EngineConfig(block_size=4, num_blocks=200, max_num_batched_tokens=96,
                           max_prefill_tokens_while_decoding=cap)
        reqs = [Request("a", [1, 2, 3], SamplingParams(max_tokens=30, seed=1, ignore_eos=True)),
                Request("b", list(range(4, 100)), SamplingParams(max_tokens=5, seed=2,
                                                                 ignore_eos=True))]
        outs = drive(Scheduler(cfg, 200, max_model_len=512), FakeRunner(200, 4), reqs)
        return token_ids(outs["a"]) + token_ids(outs["b"])

    assert run(4) == run(96)


def test_chunks_shrink_as_their_context_grows() -> None:
    cfg = EngineConfig(block_size=4, num_blocks=400, max_num_batched_tokens=96,
                       max_prefill_tokens_while_decoding=8, prefill_cap_context=64)
    sched, runner = Scheduler(cfg, 400, max_model_len=1024), FakeRunner(400, 4)
    sched.add_request(Request("s", [1, 2, 3], SamplingParams(max_tokens=400, ignore_eos=True)))
    for _ in range(2):
        so = sched.schedule()
        sched.update_from_output(so, runner.execute(so))
    sched.add_request(Request("long", list(range(5, 300)), SamplingParams(max_tokens=1)))
    chunks: list[tuple[int, int]] = []  # (context before the chunk, chunk tokens)
    while len(chunks) < 200:
        so = sched.schedule()
        chunks += [(s.start_pos, s.num_tokens) for s in so.seqs if s.request_id == "long"]
        sched.update_from_output(so, runner.execute(so))
        if any(s.request_id == "long" and s.sample for s in so.seqs):
            break
    assert chunks[0] == (0, 8)
    for context, size in chunks:
        assert size <= max(1, 8 * 64 // (64 + context)), (context, size)
    assert sum(size for _, size in chunks) == 295  # the whole prompt, in shrinking chunks
