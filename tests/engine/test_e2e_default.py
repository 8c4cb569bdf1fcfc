"""End to end on the default model (SmolLM2-135M-Instruct) through the threaded AsyncEngine."""

from __future__ import annotations

import asyncio

import pytest

from kiln.engine.config import EngineConfig
from kiln.engine.loop import AsyncEngine
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request, SamplingParams
from kiln.model import LoadedModel
from tests.engine.drive import chat, collect, text, token_ids

pytestmark = pytest.mark.slow




def test_greedy_capital_of_france(engine: AsyncEngine, smollm: LoadedModel) -> None:
    r = Request("paris", chat(smollm, "What is the capital of France?"),
                SamplingParams(temperature=0.0, max_tokens=30))
    outs = asyncio.run(collect(engine, r))
    assert "Paris" in text(outs)
    last = outs[-1]
    assert last.finish_reason == "stop" and last.num_output_tokens == len(token_ids(outs))
    assert smollm.tokenizer.eos_token_ids & {token_ids(outs)[-1]}  # EOS counted, not in text
    assert last.metrics is not None and last.metrics.ttft is not None


def test_seeded_sample_same_alone_and_in_batch(engine: AsyncEngine, smollm: LoadedModel
                                               ) -> None:
    sp = SamplingParams(temperature=0.8, top_p=0.95, top_k=40, max_tokens=16, seed=42,
                        ignore_eos=True)
    p = chat(smollm, "Write one sentence about the sea.")
    alone = asyncio.run(collect(engine, Request("alone", p, sp)))

    async def batch() -> list[list[RequestOutput]]:
        others = [Request(f"o{i}", chat(smollm, f"Count to {i + 3}."),
                          SamplingParams(temperature=1.0, max_tokens=12 + i)) for i in range(4)]
        return list(await asyncio.gather(*(collect(engine, r) for r in
                                           [*others[:2], Request("in", p, sp), *others[2:]])))

    together = asyncio.run(batch())[2]
    assert token_ids(together) == token_ids(alone) and len(token_ids(alone)) == 16
    assert together[-1].seed == 42


def test_siblings_share_prompt_blocks(engine: AsyncEngine, smollm: LoadedModel) -> None:
    p = chat(smollm, "Give me a name for a cat. Answer with a single word, please.")
    before = engine.stats()["prefix_cache_hit_tokens"]

    async def siblings() -> list[list[RequestOutput]]:
        rs = [Request(f"sib{i}", p, SamplingParams(temperature=0.7, seed=7 + i, max_tokens=8))
              for i in range(3)]
        return list(await asyncio.gather(*(collect(engine, r) for r in rs)))

    outs = asyncio.run(siblings())
    hits = engine.stats()["prefix_cache_hit_tokens"] - before
    assert hits >= 2 * (len(p) // 16) * 16 > 0
    assert sum(o[-1].num_cached_tokens > 0 for o in outs) >= 2


def test_abort_mid_generation_frees_blocks(engine: AsyncEngine, smollm: LoadedModel) -> None:
    async def main() -> list[RequestOutput]:
        q = engine.add_request(Request("ab", chat(smollm, "Tell me a long story."),
                                       SamplingParams(max_tokens=500, ignore_eos=True, seed=1)))
        got = [await asyncio.wait_for(q.get(), 60) for _ in range(3)]
        assert engine.stats()["kv_blocks_used"] > 0
        engine.abort("ab")
        while not got[-1].finished:
            got.append(await asyncio.wait_for(q.get(), 60))
        return got

    outs = asyncio.run(main())
    assert outs[-1].finish_reason == "abort" and len(token_ids(outs)) < 500
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["running"] == 0


def test_long_prompt_same_logprobs_prefilled_idle_and_beside_decodes(smollm: LoadedModel
                                                                      ) -> None:
    """A 300-token prompt is prefilled in one step on an idle engine and in chunks of at most
    8 rows beside 3 decoding streams on another: the seeded choice gets the same tokens and the
    same behaviour logprobs, bit for bit (every CPU row runs through the C step)."""
    prompt = chat(smollm, " ".join(f"item {i} is {(i * 37) % 101}." for i in range(55)))
    assert len(prompt) > 300
    sp = SamplingParams(temperature=0.8, max_tokens=12, seed=5, ignore_eos=True)
    config = EngineConfig(kv_memory_mb=64, enable_prefix_caching=False)

    async def run(busy: bool) -> list[RequestOutput]:
        eng = AsyncEngine(smollm, config)
        eng.start()
        try:
            others = [Request(f"bg{i}", chat(smollm, f"Tell a story about {i}."),
                              SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True))
                      for i in range(3 if busy else 0)]
            decoding = [asyncio.Event() for _ in others]

            async def background(r: Request, ev: asyncio.Event) -> None:
                async for _ in eng.generate(r):
                    ev.set()

            tasks = [asyncio.create_task(background(r, ev))
                     for r, ev in zip(others, decoding, strict=True)]
            await asyncio.gather(*(ev.wait() for ev in decoding))
            outs = await collect(eng, Request("long", prompt, sp))
            for r in others:
                eng.abort(r.request_id)
            await asyncio.gather(*tasks)
            return outs
        finally:
            eng.shutdown()

    idle, busy = asyncio.run(run(False)), asyncio.run(run(True))
    assert token_ids(busy) == token_ids(idle) and len(token_ids(idle)) == 12
    assert [lp for o in busy for lp in o.new_logprobs] == [lp for o in idle for lp in o.new_logprobs]
