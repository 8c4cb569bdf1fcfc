"""The one runner (kiln/engine/runner.py) over the default model loaded without torch (a C model):
the same tokens as over the torch-loaded model for plain, seeded, penalized and constrained
requests; a step whose rows need torch (logprobs: torch's logit rows; an adapter: the torch
twin's forward) taken on the torch side with the numbers of the running sequences unchanged,
and the steps after it on the C path again; and a whole ``kiln serve`` backend that serves
without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.api.structured.constraints import from_structured_outputs
from kiln.engine.config import EngineConfig
from kiln.engine.loop import build_core
from kiln.engine.output_processor import OutputProcessor
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import GrammarSpec, Request, SamplingParams
from kiln.engine.runner import Runner
from kiln.model import LoadedModel, load_model
from kiln.model.loader import Loaded, LoadedCModel
from tests.engine.drive import chat, drive, token_ids

pytestmark = pytest.mark.slow
CONFIG = EngineConfig(kv_memory_mb=64, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def c_loaded(smollm: LoadedModel) -> LoadedCModel:
    """The default model as the torch-free C model."""
    loaded = load_model(None, device="cpu", torch_free=True)
    assert isinstance(loaded, LoadedCModel)  # a CModel, not a CausalLM
    return loaded


def requests(m: Loaded) -> list[Request]:
    schema = from_structured_outputs({"json": {"type": "object", "properties": {
        "n": {"type": "integer"}}, "required": ["n"]}})
    assert schema is not None
    return [
        Request("greedy", chat(m, "What is the capital of France?"),
                SamplingParams(temperature=0.0, max_tokens=24)),
        Request("seeded", chat(m, "Write one sentence about the sea."),
                SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=5, max_tokens=20,
                               ignore_eos=True)),
        Request("penalized", chat(m, "List some fruits."),
                SamplingParams(temperature=0.7, seed=9, presence_penalty=0.5,
                               frequency_penalty=0.4, repetition_penalty=1.2, max_tokens=20)),
        Request("json", chat(m, "Give me a number as JSON."),
                SamplingParams(temperature=0.0, max_tokens=20,
                               grammar=GrammarSpec(schema[0]))),
        Request("long", chat(m, "Tell me about bread. " * 20),  # prefill over several steps
                SamplingParams(temperature=0.0, max_tokens=8)),
    ]


def run(loaded: Loaded, reqs: list[Request]) -> tuple[dict[str, list[int]], object]:
    sched, runner = build_core(loaded, CONFIG)
    outs: dict[str, list[RequestOutput]] = drive(sched, runner, reqs)
    return {rid: token_ids(o) for rid, o in outs.items()}, runner


def test_the_c_engine_samples_the_torch_engine_s_tokens(smollm: LoadedModel,
                                                        c_loaded: LoadedCModel) -> None:
    want, torch_runner = run(smollm, requests(smollm))
    got, c_runner = run(c_loaded, requests(c_loaded))
    assert isinstance(torch_runner, Runner) and isinstance(c_runner, Runner)
    assert torch_runner.program is None and c_runner.program is not None
    assert c_runner.steps["torch"] == 0 and c_runner._torch is None  # no request needs torch
    assert c_runner._torch_rows is None
    assert got == want
    assert all(len(ids) > 0 for ids in got.values())
    assert c_runner.plan == torch_runner.plan


def test_steps_that_need_torch_take_the_torch_side_and_the_rest_stay_in_c(
        smollm: LoadedModel, c_loaded: LoadedCModel) -> None:
    """A logprobs request arrives while others decode: its steps' logit rows go through torch
    (the C step still computes them: no torch model is built), every request's tokens are those
    of the torch-loaded model alone, and once it is done the plain requests' steps run on the C
    path again (nothing is handed over for good)."""
    def reqs(m: Loaded) -> list[Request]:
        return [*requests(m)[:3],
                Request("logprobs", chat(m, "Say hello."),
                        SamplingParams(temperature=0.0, max_tokens=10, logprobs=2)),
                Request("after", chat(m, "Name a colour."),
                        SamplingParams(temperature=0.7, seed=3, max_tokens=12))]

    want, _ = run(smollm, reqs(smollm))
    sched, runner = build_core(c_loaded, CONFIG)
    assert isinstance(runner, Runner)
    first = reqs(c_loaded)
    stage = OutputProcessor()
    # three plain requests for a few steps, then the logprobs request joins
    outs = drive(sched, runner, first[:3], max_steps=6, output=stage, partial=True)
    assert runner.steps["torch"] == 0 and runner._torch is None
    outs2 = drive(sched, runner, first[3:4], output=stage)
    torch_steps = runner.steps["torch"]
    assert torch_steps > 0 and runner._torch is None and runner._torch_rows is not None
    c_steps = runner.steps["c"]
    outs3 = drive(sched, runner, first[4:], output=stage)  # a plain request after it
    assert runner.steps["torch"] == torch_steps and runner.steps["c"] > c_steps
    assert runner.last_path == "c"
    got = {rid: token_ids(outs.get(rid, []) + outs2.get(rid, []) + outs3.get(rid, []))
           for rid in want}
    assert got == want


def test_scoring_runs_on_the_torch_side(c_loaded: LoadedCModel, smollm: LoadedModel) -> None:
    from kiln.engine.scoring import score_prompt

    ids = chat(smollm, "The quick brown fox jumps over the lazy dog.")
    sched, runner = build_core(c_loaded, CONFIG)
    assert isinstance(runner, Runner)
    job = runner.scoring_job(sched.pool, ids, 3)
    while not job.step():
        pass
    t_sched, t_runner = build_core(smollm, CONFIG)
    side = t_runner.torch_step()
    want = score_prompt(side.model, side.kv, t_sched.pool, ids, 3)
    assert job.scores == want and runner._torch is not None and runner.program is not None


def test_after_an_adapter_and_a_logprobs_request_a_plain_one_runs_on_the_c_path(
        c_loaded: LoadedCModel, tmp_path: Path) -> None:
    """An adapter request (the torch twin's forward) and a logprobs request (torch's logit rows)
    leave nothing behind: the next plain request's steps run on the C path, with the tokens it
    gets on a runner that never saw them."""
    from kiln.model.lora import LORA_MODULES, load_adapter
    from tests.model.test_lora import write_peft

    cfg = c_loaded.config
    adapter = load_adapter(write_peft(tmp_path / "a", cfg, r=4, alpha=8, targets=LORA_MODULES,
                                      seed=1), cfg)

    def plain() -> Request:
        return Request("plain", chat(c_loaded, "Name a colour."),
                       SamplingParams(temperature=0.7, seed=3, max_tokens=12))

    want = token_ids(drive(*build_core(c_loaded, CONFIG), [plain()])["plain"])
    sched, runner = build_core(c_loaded, CONFIG)
    assert isinstance(runner, Runner)
    drive(sched, runner, [
        Request("lora", chat(c_loaded, "Say hello."),
                SamplingParams(temperature=0.0, max_tokens=6), lora=((adapter, 1.0),)),
        Request("logprobs", chat(c_loaded, "Say hello."),
                SamplingParams(temperature=0.0, max_tokens=6, logprobs=2))])
    assert runner._torch is not None and runner._torch_rows is not None
    c_steps, torch_steps = runner.steps["c"], runner.steps["torch"]
    assert torch_steps > 0
    got = token_ids(drive(sched, runner, [plain()])["plain"])
    assert runner.steps["torch"] == torch_steps and runner.steps["c"] > c_steps
    assert runner.last_path == "c" and runner.program is not None
    assert got == want


SERVE = """
import asyncio, json, sys
from kiln.config import from_env
from kiln.serving import EngineBackend
from kiln.engine.request import Request, SamplingParams
cfg = from_env().with_overrides(kv_memory_mb=64)
backend = EngineBackend.from_config(cfg)
backend.start()
ids = backend.tokenizer.encode("The capital of France is")
async def go():
    return [t async for o in backend.submit(Request("r", ids, SamplingParams(
        temperature=0.0, max_tokens=8))) for t in o.new_token_ids]
tokens = asyncio.run(go())
print(json.dumps({"torch": "torch" in sys.modules, "tokens": tokens,
                  "plan": backend.compute_plan()}))
backend.shutdown()
"""


def test_kiln_serve_s_backend_serves_without_torch(smollm: LoadedModel, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_MODEL")}
    done = subprocess.run([sys.executable, "-c", SERVE], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["torch"] is False
    assert out["plan"]["step"] == "c" and len(out["tokens"]) == 8
    want, _ = run(smollm, [Request("r", smollm.tokenizer.encode("The capital of France is"),
                                   SamplingParams(temperature=0.0, max_tokens=8))])
    assert out["tokens"] == want["r"]
