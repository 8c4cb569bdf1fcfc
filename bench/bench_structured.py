"""Structured outputs: grammar compile time over the shipped schema corpus and of nested
structural tags, the grammar stage's cost per step (masks + applying them) at 1 and 8
constrained rows, and engine step time of 8 unconstrained rows with and without 8 constrained
neighbours, on the default model.

Writes bench/results/structured.json; prints the figures. Usage: python -m bench.bench_structured
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from kiln.api.structured.constraints import from_response_format, from_structured_outputs
from kiln.engine.config import EngineConfig
from kiln.engine.grammar import GrammarCompiler, GrammarRows
from kiln.engine.loop import AsyncEngine
from kiln.engine.outputs import ScheduledSeq
from kiln.engine.request import GrammarSpec, Request, SamplingParams
from kiln.engine.runner import Runner
from kiln.engine.sampler import Sampler
from kiln.model import LoadedModel
from kiln.model.loader import load_model

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "structured" / "schemas.json"
OUT = ROOT / "bench" / "results" / "structured.json"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def compile_times(loaded: LoadedModel) -> dict[str, float]:
    entries = [e for e in json.loads(CORPUS.read_text()) if "refused" not in e]
    compiler = GrammarCompiler(loaded.tokenizer)
    t0 = time.perf_counter()
    _ = compiler.ll_tokenizer
    tokenizer_s = time.perf_counter() - t0
    times = []
    for e in entries:
        built = from_response_format({"type": "json_schema", "json_schema": {
            "name": e["name"], "schema": e["schema"]}})
        assert built is not None
        t0 = time.perf_counter()
        compiler.check(built[0])  # a fresh compile: every grammar text differs
        times.append(time.perf_counter() - t0)
    return {"schemas": len(entries), "tokenizer_build_ms": tokenizer_s * 1e3,
            "compile_p50_ms": _pct(times, 0.5) * 1e3, "compile_p99_ms": _pct(times, 0.99) * 1e3,
            "compile_max_ms": max(times) * 1e3}


def _tools(n: int) -> list[dict[str, Any]]:
    return [{"begin": f"<function=f{i}>", "end": "</function>", "content": {
        "type": "json_schema", "json_schema": {"type": "object", "properties": {
            "x": {"type": "integer"}, f"k{i}": {"type": "string"}}, "required": ["x"]}}}
        for i in range(n)]


def structural_tag_formats() -> dict[str, dict[str, Any]]:
    """Nested structural tags (xgrammar's ``format`` form) of the shapes clients send."""
    calls = {"type": "triggered_tags", "triggers": ["<function="], "tags": _tools(8)}
    return {
        "triggered_tags_8_tools": calls,
        "think_then_one_call": {"type": "sequence", "elements": [
            {"type": "tag", "begin": "<think>", "content": {"type": "any_text"},
             "end": "</think>"},
            {**calls, "at_least_one": True, "stop_after_first": True}]},
        "tags_with_separator_in_a_tag": {"type": "tag", "begin": "<calls>[", "end": "]</calls>",
                                         "content": {"type": "tags_with_separator",
                                                     "separator": ", ", "tags": _tools(8)}},
        "triggered_tags_32_tools": {**calls, "tags": _tools(32)},
    }


def structural_tag_compile_ms(loaded: LoadedModel) -> dict[str, float]:
    """Translation (format -> grammar) and a fresh compile of each nested structural tag, in ms
    (the tokenizer already built)."""
    compiler = GrammarCompiler(loaded.tokenizer)
    _ = compiler.ll_tokenizer
    out = {}
    for name, fmt in structural_tag_formats().items():
        t0 = time.perf_counter()
        built = from_response_format({"type": "structural_tag", "format": fmt})
        assert built is not None
        compiler.check(built[0])
        out[f"structural_tag_{name}_ms"] = (time.perf_counter() - t0) * 1e3
    return out


def _seq(i: int, spec: GrammarSpec, output: list[int]) -> ScheduledSeq:
    return ScheduledSeq(f"r{i}", [0], 0, [], True, False, SamplingParams(grammar=spec), 0,
                        len(output), [0], output)


def mask_cost(loaded: LoadedModel, rows: int, steps: int = 48) -> float:
    """Mean seconds per step for ``rows`` JSON-constrained rows: masks, then the sampler's
    mask applied to [rows, vocab] logits, then the argmax token fed back."""
    built = from_structured_outputs({"json": {"type": "object", "properties": {
        "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "tags"]}})
    assert built is not None
    spec = GrammarSpec(built[0])
    stage = GrammarRows(GrammarCompiler(loaded.tokenizer))
    sampler = Sampler(torch.device("cpu"), "c")
    vocab = loaded.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    outputs: list[list[int]] = [[] for _ in range(rows)]
    times = []
    for _ in range(steps):
        logits = torch.randn(rows, vocab, generator=gen)
        seqs = [_seq(i, spec, list(outputs[i])) for i in range(rows)]
        t0 = time.perf_counter()
        step = stage.masks(seqs)
        masked = sampler.constrain(logits, step.bits, list(step.rows))
        times.append(time.perf_counter() - t0)
        assert not step.errors, step.errors
        for i, t in enumerate(masked.argmax(dim=1).tolist()):
            if t not in loaded.tokenizer.eos_token_ids:
                outputs[i].append(int(t))
    return statistics.median(times)


async def _run(engine: AsyncEngine, reqs: list[Request]) -> None:
    async def one(r: Request) -> None:
        async for _ in engine.generate(r):
            pass
    await asyncio.gather(*(one(r) for r in reqs))


# The constraints of the step-time comparison, each unable to finish within the run's tokens
# (every step masks all constrained rows): a JSON schema as clients send them, and a bounded
# repeat, llguidance's costly case (its lexer state is new at every position).
CONSTRAINTS: dict[str, dict[str, object]] = {
    "json": {"json": {"type": "array", "items": {"type": "string"}, "minItems": 50}},
    "regex_bounded_repeat": {"regex": "[a-z ]{400}"},
}


def step_times(loaded: LoadedModel, tokens: int = 32) -> dict[str, float]:
    """Milliseconds per engine step: 8 unconstrained rows alone, and beside 8 constrained rows
    (each of ``CONSTRAINTS``), against 16 unconstrained rows (the same model work): the
    difference is the grammar's cost."""
    engine = AsyncEngine(loaded, EngineConfig(kv_memory_mb=256))
    engine.start()
    prompt = loaded.tokenizer.encode(loaded.chat_template.render(
        [{"role": "user", "content": "Write a long story."}], add_generation_prompt=True))
    specs = {}
    for name, structured in CONSTRAINTS.items():
        built = from_structured_outputs(structured)
        assert built is not None
        specs[name] = GrammarSpec(built[0])

    def rows(constrained: int, tag: str, spec: GrammarSpec | None = None) -> list[Request]:
        free = [Request(f"{tag}u{i}", prompt, SamplingParams(
            max_tokens=tokens, ignore_eos=True, seed=i)) for i in range(8)]
        held = [Request(f"{tag}c{i}", prompt, SamplingParams(
            max_tokens=tokens, seed=i, grammar=spec)) for i in range(constrained)]
        return free + held

    runs: list[tuple[str, int, GrammarSpec | None]] = [
        ("8_unconstrained", 0, None), ("16_unconstrained", 0, None),
        *((f"8_unconstrained_8_{name}", 8, spec) for name, spec in specs.items())]
    samples: dict[str, list[float]] = {}
    grammar_s = _time_grammar_stage(engine)
    try:
        for name, warm in specs.items():
            asyncio.run(_run(engine, rows(8, f"warm{name}", warm)))
        for rep in range(5):  # interleaved repeats; the median of each is reported
            for label, constrained, spec in runs:
                reqs = rows(constrained, f"{label}{rep}", spec)
                if label.startswith("16"):
                    reqs += rows(0, f"{label}{rep}b")
                steps0, t0 = engine.num_steps, time.perf_counter()
                spent0 = grammar_s[0]
                asyncio.run(_run(engine, reqs))
                steps = engine.num_steps - steps0
                per_step = (time.perf_counter() - t0) / steps
                samples.setdefault(label + "_step_ms", []).append(per_step * 1e3)
                if spec is not None:
                    samples.setdefault(label + "_grammar_ms", []).append(
                        (grammar_s[0] - spent0) / steps * 1e3)
    finally:
        engine.shutdown()
    out = {k: statistics.median(v) for k, v in samples.items()}
    base = out["16_unconstrained_step_ms"]
    for name in specs:  # the constrained rows' cost, as a share of the same model work
        label = f"8_unconstrained_8_{name}"
        out[f"{name}_step_overhead_pct"] = 100 * (out[f"{label}_step_ms"] / base - 1)
        out[f"{name}_grammar_share_of_step_pct"] = 100 * out[f"{label}_grammar_ms"] / base
    return out


def _time_grammar_stage(engine: AsyncEngine) -> list[float]:
    """Seconds the engine thread spends in the grammar stage (masks filled and applied), counted
    into the returned one-element list: the constrained rows' own cost, which a whole-step
    difference on a shared 2-core machine cannot resolve to a few percent."""
    spent = [0.0]
    runner = engine.executor
    assert isinstance(runner, Runner)
    for owner, name in ((runner, "_start_masks"), (runner.torch_rows().sampler, "constrain")):
        inner = getattr(owner, name)

        def timed(*args: Any, _inner: Any = inner) -> Any:
            t0 = time.perf_counter()
            try:
                return _inner(*args)
            finally:
                spent[0] += time.perf_counter() - t0

        setattr(owner, name, timed)
    return spent


def main() -> None:
    loaded = load_model(None, device="cpu")
    result: dict[str, Any] = compile_times(loaded)
    result.update(structural_tag_compile_ms(loaded))
    result["mask_step_ms_1_row"] = mask_cost(loaded, 1) * 1e3
    result["mask_step_ms_8_rows"] = mask_cost(loaded, 8) * 1e3
    result.update(step_times(loaded))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    for k, v in result.items():
        print(f"{k:40} {v:10.3f}" if isinstance(v, float) else f"{k:40} {v}")


if __name__ == "__main__":
    main()
