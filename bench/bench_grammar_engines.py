"""Grammar engines compared on the default model's tokenizer (issue 26): llguidance (what Kiln
serves, through kiln.engine.grammar), xgrammar and outlines-core.

Per engine: the tokenizer/vocabulary preparation time (once); the compile time (p50/p99/max) of
each schema of the corpus (tests/fixtures/structured/schemas.json: 52 served schemas plus 5 that
Kiln refuses, marked ``refused``); which corpus schemas the engine refuses; and the time of one
full-vocabulary token bitmask per step while a valid JSON instance of four representative schemas
is walked token by token (the mask before each token, then the token fed to the matcher), and
likewise for the bounded repeat ``[a-z ]{400}`` (a costly case for llguidance: its lexer state is
new at every position).

llguidance gets the grammar text Kiln builds (``from_response_format``: the schema closed, ", "
and ": " separators); xgrammar gets the schema as sent (``compile_json_schema``, its defaults);
outlines-core the regex of ``json_schema.build_regex_from_schema`` (its defaults). The masks are
32-bit little-endian bitmasks of the full vocabulary in every engine.

xgrammar and outlines-core are not Kiln dependencies; an engine that is not installed is skipped
(said in the output). To install them for the comparison without replacing the CPU torch wheel:

    .venv/bin/python -m pip install --no-deps xgrammar==0.2.8 apache-tvm-ffi outlines-core==0.2.14

Writes bench/results/grammar_engines.json; prints the figures.
Usage: python -m bench.bench_grammar_engines [--engines llguidance xgrammar outlines_core]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy

from kiln.api.structured.constraints import from_response_format, from_structured_outputs
from kiln.engine.grammar import GrammarCompiler, GrammarError
from kiln.model.loader import load_model
from kiln.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "structured" / "schemas.json"
OUT = ROOT / "bench" / "results" / "grammar_engines.json"
REPEAT = "[a-z ]{400}"
REPEAT_TEXT = ("the quick brown fox jumps over the lazy dog " * 10)[:400]
# Valid instances (keys in schema order, Kiln's separators) of four representative schemas.
INSTANCES: dict[str, Any] = {
    "math_reasoning": {"steps": [
        {"explanation": "Subtract 7 from both sides.", "output": "8x = -30"},
        {"explanation": "Divide both sides by 8.", "output": "x = -3.75"}],
        "final_answer": "x = -3.75"},
    "calendar_event": {"name": "Science fair", "date": "Friday",
                       "participants": ["Alice", "Bob", "Carol"]},
    "fn_book_flight": {"from": "SFO", "to": "JFK", "date": "2026-12-24", "passengers": 2,
                       "class": "economy"},
    "pydantic_invoice": {"number": "INV-042", "total": 129.5, "paid": True},
}


class Refused(Exception):
    """The engine refuses a schema or grammar (its message)."""


class Matcher:
    """One engine's matcher: the next-token bitmask into ``out``, and a token fed."""

    def fill(self, out: numpy.ndarray) -> None:
        raise NotImplementedError

    def advance(self, token: int) -> None:
        raise NotImplementedError


@dataclass
class Engine:
    name: str
    prepare: Callable[[], None]  # the tokenizer/vocabulary, once
    schema: Callable[[dict[str, Any]], Matcher]  # raises Refused
    regex: Callable[[str], Matcher]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


class _LLMatcher(Matcher):
    def __init__(self, m: Any) -> None:
        self.m = m

    def fill(self, out: numpy.ndarray) -> None:
        self.m.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def advance(self, token: int) -> None:
        if not self.m.consume_token(token):
            raise Refused(f"llguidance rejected token {token}: {self.m.get_error()}")


def llguidance_engine(tok: Tokenizer) -> Engine:
    compiler = GrammarCompiler(tok)

    def compile_text(text: str) -> Matcher:
        try:
            return _LLMatcher(compiler.matcher(text))
        except GrammarError as e:
            raise Refused(str(e)) from None

    def schema(s: dict[str, Any]) -> Matcher:
        try:
            built = from_response_format({"type": "json_schema",
                                          "json_schema": {"name": "s", "schema": s}})
        except Exception as e:  # the handlers' own 400 (a private class)
            raise Refused(str(e)) from None
        assert built is not None
        return compile_text(built[0])

    def regex(r: str) -> Matcher:
        built = from_structured_outputs({"regex": r})
        assert built is not None
        return compile_text(built[0])

    def prepare() -> None:
        _ = compiler.ll_tokenizer

    return Engine("llguidance", prepare, schema, regex)


def xgrammar_engine(tok: Tokenizer) -> Engine:
    import torch
    import transformers
    import xgrammar  # type: ignore[import-not-found,unused-ignore]

    state: dict[str, Any] = {}

    def prepare() -> None:
        hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend)
        info = xgrammar.TokenizerInfo.from_huggingface(
            hf, vocab_size=tok.backend.get_vocab_size(), stop_token_ids=sorted(tok.eos_token_ids))
        state["compiler"] = xgrammar.GrammarCompiler(info, cache_enabled=False)
        state["vocab"] = info.vocab_size

    class _XMatcher(Matcher):
        def __init__(self, compiled: Any) -> None:
            self.m = xgrammar.GrammarMatcher(compiled)
            self.bits = xgrammar.allocate_token_bitmask(1, state["vocab"])

        def fill(self, out: numpy.ndarray) -> None:
            self.m.fill_next_token_bitmask(self.bits)
            out[:] = self.bits[0, :out.shape[0]].numpy()

        def advance(self, token: int) -> None:
            if not self.m.accept_token(token):
                raise Refused(f"xgrammar rejected token {token}")

    def schema(s: dict[str, Any]) -> Matcher:
        try:
            return _XMatcher(state["compiler"].compile_json_schema(json.dumps(s)))
        except (RuntimeError, ValueError, TypeError) as e:
            raise Refused(str(e).splitlines()[0] if str(e) else type(e).__name__) from None

    def regex(r: str) -> Matcher:
        return _XMatcher(state["compiler"].compile_regex(r))

    del torch  # imported so that a missing torch fails here, not mid-run
    return Engine("xgrammar", prepare, schema, regex)


def outlines_core_engine(tok: Tokenizer) -> Engine:
    import outlines_core  # type: ignore[import-not-found,unused-ignore]
    from outlines_core.json_schema import (  # type: ignore[import-not-found,unused-ignore]
        build_regex_from_schema,
    )

    state: dict[str, Any] = {}
    llt = GrammarCompiler(tok).ll_tokenizer  # only to decode each token to its bytes

    def prepare() -> None:
        eos = min(tok.eos_token_ids)
        vocab: dict[bytes, list[int]] = {}
        for t in range(int(llt.vocab_size)):
            if t in tok.eos_token_ids or llt.is_special_token(t):
                continue
            vocab.setdefault(llt.decode_bytes([t]), []).append(t)
        vocab.pop(b"", None)
        state["vocab"] = outlines_core.Vocabulary(eos, vocab)

    class _OMatcher(Matcher):
        def __init__(self, index: Any) -> None:
            self.g = outlines_core.Guide(index)

        def fill(self, out: numpy.ndarray) -> None:
            self.g.write_mask_into(out.ctypes.data, out.size, out.itemsize)

        def advance(self, token: int) -> None:
            try:
                self.g.advance(token)
            except ValueError as e:
                raise Refused(f"outlines-core rejected token {token}: {e}") from None

    def build(r: str) -> Matcher:
        try:
            return _OMatcher(outlines_core.Index(r, state["vocab"]))
        except (ValueError, TypeError, RuntimeError) as e:
            raise Refused(str(e).splitlines()[0] if str(e) else type(e).__name__) from None

    def schema(s: dict[str, Any]) -> Matcher:
        try:
            r = build_regex_from_schema(json.dumps(s))
        except (ValueError, TypeError, RuntimeError) as e:
            raise Refused(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
        return build(r)

    return Engine("outlines_core", prepare, schema, build)


FACTORIES = {"llguidance": ("llguidance", llguidance_engine),
             "xgrammar": ("xgrammar", xgrammar_engine),
             "outlines_core": ("outlines_core", outlines_core_engine)}


def walk(m: Matcher, tokens: list[int], words: int) -> list[float]:
    """Seconds per mask over ``tokens`` (the mask before each token, then the token; the last
    token, EOS after a JSON instance, is only checked against its mask: outlines-core's guide
    does not advance past its final state)."""
    out = numpy.zeros(words, dtype=numpy.int32)
    times = []
    for k, t in enumerate(tokens):
        t0 = time.perf_counter()
        m.fill(out)
        times.append(time.perf_counter() - t0)
        if not (int(out[t // 32]) >> (t % 32)) & 1:
            raise Refused(f"the mask does not allow token {t}")
        if k + 1 < len(tokens):
            m.advance(t)
    return times


def _us(times: list[float]) -> dict[str, float]:
    return {"steps": len(times), "mean_us": statistics.fmean(times) * 1e6,
            "p50_us": _pct(times, 0.5) * 1e6, "p99_us": _pct(times, 0.99) * 1e6}


def measure(engine: Engine, tok: Tokenizer, corpus: list[dict[str, Any]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    engine.prepare()
    result: dict[str, Any] = {"prepare_ms": (time.perf_counter() - t0) * 1e3}
    times, refused = [], {}
    for e in corpus:
        t0 = time.perf_counter()
        try:
            engine.schema(e["schema"])
        except Refused as err:
            refused[e["name"]] = str(err)[:160]
            continue
        times.append(time.perf_counter() - t0)
    marked = [e["name"] for e in corpus if "refused" in e]
    result.update({
        "compiled": len(times), "compile_p50_ms": _pct(times, 0.5) * 1e3,
        "compile_p99_ms": _pct(times, 0.99) * 1e3, "compile_max_ms": max(times) * 1e3,
        "refused": len(refused), "refused_of_marked": sorted(set(refused) & set(marked)),
        "refused_unmarked": sorted(set(refused) - set(marked)),
        "accepted_marked": sorted(set(marked) - set(refused)), "refusals": refused})
    words = (tok.backend.get_vocab_size() + 31) // 32
    by_name = {e["name"]: e["schema"] for e in corpus}
    masks: dict[str, Any] = {}
    for name, instance in INSTANCES.items():
        ids = tok.encode(json.dumps(instance)) + sorted(tok.eos_token_ids)[:1]
        try:
            masks[name] = _us(walk(engine.schema(by_name[name]), ids, words))
        except Refused as err:
            masks[name] = {"error": str(err)[:160]}
    try:
        t0 = time.perf_counter()
        m = engine.regex(REPEAT)
        compile_ms = (time.perf_counter() - t0) * 1e3
        masks[REPEAT] = {"compile_ms": compile_ms,
                         **_us(walk(m, tok.encode(REPEAT_TEXT), words))}
    except Refused as err:
        masks[REPEAT] = {"error": str(err)[:160]}
    result["masks"] = masks
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_grammar_engines")
    parser.add_argument("--engines", nargs="*", choices=list(FACTORIES), default=list(FACTORIES))
    args = parser.parse_args(argv)
    loaded = load_model(None, device="cpu")
    tok = loaded.tokenizer
    corpus = json.loads(CORPUS.read_text())
    results: dict[str, Any] = {
        "model": loaded.served_name,
        "vocab_size": tok.backend.get_vocab_size(), "schemas": len(corpus),
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "engines": {}}
    for key in args.engines:
        module, factory = FACTORIES[key]
        if importlib.util.find_spec(module) is None:
            print(f"{key}: not installed, skipped (see this module's docstring)")
            results["engines"][key] = {"skipped": "not installed"}
            continue
        try:
            engine = factory(tok)
        except ImportError as e:  # installed without a dependency it imports
            print(f"{key}: cannot be imported ({e}), skipped")
            results["engines"][key] = {"skipped": f"import failed: {e}"}
            continue
        r = measure(engine, tok, corpus)
        results["engines"][key] = r
        print(f"{key}: prepare {r['prepare_ms']:.0f} ms; compile {r['compiled']} schemas "
              f"p50 {r['compile_p50_ms']:.2f} / p99 {r['compile_p99_ms']:.2f} / max "
              f"{r['compile_max_ms']:.2f} ms; refused {r['refused']} (of the 5 marked: "
              f"{len(r['refused_of_marked'])}; unmarked: {r['refused_unmarked']})")
        for name, fig in r["masks"].items():
            if "error" in fig:
                print(f"  mask {name}: {fig['error']}")
            else:
                print(f"  mask {name}: {fig['steps']} steps mean {fig['mean_us']:.1f} / p50 "
                      f"{fig['p50_us']:.1f} / p99 {fig['p99_us']:.1f} us")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
