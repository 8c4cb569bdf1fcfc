"""End to end on the default model (SmolLM2-135M-Instruct) through the threaded AsyncEngine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kiln.engine.config import EngineConfig
from kiln.engine.loop import AsyncEngine
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request, SamplingParams
from kiln.model import LoadedModel
from tests.engine.drive import text, token_ids

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(smollm: LoadedModel) -> Iterator[AsyncEngine]:
    eng = AsyncEngine(smollm, EngineConfig(kv_memory_mb=128))
    eng.start()
    yield eng
    eng.shutdown()


def chat(m: LoadedModel, content: str) -> list[int]:
    rendered = m.chat_template.render([{"role": "user", "content": content}],
                                      add_generation_prompt=True)
    return m.tokenizer.encode(rendered)


async def collect(eng: AsyncEngine, r: Request) -> list[RequestOutput]:
    return [o async for o in eng.generate(r)]


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
