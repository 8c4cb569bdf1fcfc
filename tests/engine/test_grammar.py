"""The grammar stage (kiln/engine/grammar.py) and the sampler's mask, on the default model's
tokenizer; and through the threaded engine: a seeded constrained request samples the same
tokens alone and in a batch of 8 mixed constrained and unconstrained rows, and its logprobs
come from the masked distribution."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Literal

import llguidance
import numpy
import pytest
import torch

from kiln.api.structured import constraints
from kiln.api.structured.constraints import from_response_format, from_structured_outputs
from kiln.engine.grammar import GrammarError, GrammarRows, RowMasks, compiler_for
from kiln.engine.loop import AsyncEngine
from kiln.engine.outputs import RequestOutput, ScheduledSeq
from kiln.engine.request import GrammarSpec, Request, SamplingParams
from kiln.engine.sampler import Sampler
from kiln.model import LoadedModel
from tests.engine.drive import chat, collect, text, token_ids


def grammar(structured: dict[str, object]) -> str:
    built = from_structured_outputs(structured)
    assert built is not None
    return built[0]


def seq(rid: str, spec: GrammarSpec | None, output: list[int]) -> ScheduledSeq:
    return ScheduledSeq(rid, [0], 0, [], True, False, SamplingParams(grammar=spec), 0,
                        len(output), [0], list(output))


def allowed(step: RowMasks, row: int) -> set[int]:
    words = torch.from_numpy(step.bits[step.rows.index(row)].copy())
    bits = ((words[:, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten()
    return set(torch.nonzero(bits).flatten().tolist())


def test_choice_mask_allows_prefixes_then_eos(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    spec = GrammarSpec(grammar({"choice": ["yes", "no"]}), param="structured_outputs")
    rows = GrammarRows(compiler_for(tok))
    step = rows.masks([seq("a", spec, [])])
    assert not step.errors and step.rows == (0,)
    first = allowed(step, 0)
    assert {tok.decode([t]) for t in first} <= {"y", "ye", "yes", "n", "no"}
    assert tok.encode("yes")[0] in first and tok.encode("no")[0] in first
    done = rows.masks([seq("a", spec, tok.encode("yes"))])
    assert allowed(done, 0) == set(tok.eos_token_ids)  # complete: only EOS
    rows.release(["a"])
    assert len(rows) == 0


def test_output_outside_the_grammar_is_a_row_error(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    spec = GrammarSpec(grammar({"regex": "[0-9]+"}), param="structured_outputs")
    rows = GrammarRows(compiler_for(tok))
    step = rows.masks([seq("ok", None, []), seq("bad", spec, tok.encode("abc"))])
    assert set(step.errors) == {"bad"} and "structured_outputs" in step.errors["bad"]
    assert step.rows == ()  # the unconstrained row never gets a mask


def test_constraint_waits_for_the_close_sequence(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    close = tuple(tok.encode("</think>"))
    spec = GrammarSpec(grammar({"regex": "[0-9]+"}), after=close)
    rows = GrammarRows(compiler_for(tok))
    thinking = tok.encode("<think>hmm, words")
    assert rows.masks([seq("r", spec, thinking)]).rows == ()  # free text while reasoning
    step = rows.masks([seq("r", spec, [*thinking, *close])])
    assert step.rows == (0,) and all(tok.decode([t]).isdigit() for t in allowed(step, 0))


def test_compiler_refuses_and_caches(smollm: LoadedModel) -> None:
    compiler = compiler_for(smollm.tokenizer)
    assert compiler is compiler_for(smollm.tokenizer)
    # the API refuses "if" before a grammar is built (schema_keywords); the compiler refuses a
    # grammar with it too, for any caller that gets past that walk
    with pytest.raises(constraints._Invalid, match="if"):
        from_response_format({"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "if": {}}}})
    with pytest.raises(GrammarError, match="if"):
        compiler.check(str(llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps({"type": "object", "if": {}}))))
    text_ = grammar({"choice": ["a"]})
    assert compiler.matcher(text_) is not compiler.matcher(text_)  # copies of one compile


@pytest.mark.parametrize(("mask_impl", "dtype"), [
    ("c", torch.float32), ("c", torch.bfloat16), ("torch", torch.float32),
    ("torch", torch.bfloat16), ("triton", torch.float32)])  # triton off CUDA: the reference
def test_sampler_mask_leaves_other_rows_bit_identical(mask_impl: Literal["c", "triton", "torch"],
                                                      dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 70, generator=gen).to(dtype)
    mask = numpy.zeros((1, 2), dtype=numpy.int32)  # 64 bits: ids 64..69 lie past the mask
    mask[0, 0] = 0b101  # tokens 0 and 2
    out = Sampler(torch.device("cpu"), "c", mask_impl).constrain(logits.clone(), mask, [1])
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])  # bits promised
    finite = torch.isfinite(out[1]).nonzero().flatten().tolist()
    assert finite == [0, 2] and torch.equal(out[1, [0, 2]], logits[1, [0, 2]])




SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "population": {"type": "integer"}},
          "required": ["city", "population"]}


def _json_spec() -> GrammarSpec:
    built = from_response_format({"type": "json_schema", "json_schema": {
        "name": "c", "schema": SCHEMA}})
    assert built is not None
    return GrammarSpec(built[0])


@pytest.mark.slow
def test_seeded_constrained_same_alone_and_in_a_mixed_batch(engine: AsyncEngine,
                                                            smollm: LoadedModel) -> None:
    sp = SamplingParams(temperature=0.9, max_tokens=40, seed=7, grammar=_json_spec(), logprobs=2)
    p = chat(smollm, "Name a city and its population.")
    alone = asyncio.run(collect(engine, Request("alone", p, sp)))

    async def batch() -> list[list[RequestOutput]]:
        others = []
        for i in range(7):
            g = None if i % 2 else GrammarSpec(grammar({"choice": [f"c{i}", "other"]}))
            others.append(Request(f"o{i}", chat(smollm, f"Count to {i + 3}."),
                                  SamplingParams(temperature=1.0, max_tokens=10 + i, seed=i,
                                                 grammar=g)))
        rows = [*others[:3], Request("in", p, sp), *others[3:]]
        return list(await asyncio.gather(*(collect(engine, r) for r in rows)))

    outs = asyncio.run(batch())
    together = outs[3]
    assert token_ids(together) == token_ids(alone)
    assert [o.new_logprobs for o in together] == [o.new_logprobs for o in alone]
    assert alone[-1].finish_reason in ("stop", "length")
    if alone[-1].finish_reason == "stop":
        doc = json.loads(text(alone))
        assert set(doc) == {"city", "population"} and isinstance(doc["population"], int)
    for i, o in enumerate([*outs[:3], *outs[4:]]):  # the constrained neighbours obey theirs
        if i % 2 == 0 and o[-1].finish_reason == "stop":
            assert text(o) in (f"c{i}", "other")


@pytest.mark.slow
def test_logprobs_come_from_the_masked_distribution(engine: AsyncEngine,
                                                    smollm: LoadedModel) -> None:
    spec = GrammarSpec(grammar({"choice": ["red", "blue"]}))
    sp = SamplingParams(temperature=1.0, max_tokens=8, seed=3, grammar=spec, logprobs=5)
    outs = asyncio.run(collect(engine, Request("lp", chat(smollm, "A colour?"), sp)))
    assert outs[-1].finish_reason == "stop" and text(outs) in ("red", "blue")
    first = next(t for o in outs for t in o.new_top_logprobs if t is not None)
    # only allowed tokens are alternatives, and their probabilities sum to 1 after the mask
    assert all(smollm.tokenizer.decode([t]) in ("r", "re", "red", "b", "bl", "blu", "blue")
               for t in first.top_ids)
    assert math.fsum(math.exp(v) for v in first.top_logprobs) <= 1.0 + 1e-6
