"""Live contract fuzzing: schemathesis against a real `python -m kiln serve` subprocess.

Starts the server (default model) on a free 127.0.0.1 port, optionally with an adapter directory
holding one random PEFT adapter named ``style`` (the contract's example name), waits for /health,
runs the schemathesis CLI with every check, negative testing on, a fixed seed, bounded examples
and ``--workers 1``, stops the server and writes a summary to ``bench/results/fuzz_live.json``.

This module is also the schemathesis hooks module (``SCHEMATHESIS_HOOKS=bench.fuzz_live``): the
hooks keep generation cheap on a CPU (positive bodies get ``max_tokens <= 4``, ``n <= 2``, at most
4 batch prompts) and skip positive bodies that may break a rule of the served document's
``x-kiln-rules`` (the generic evaluator in ``kiln/fuzz_filter.py``, shared with
``tests/api/test_schemathesis.py``). No response is filtered: every refusal of a body the
document calls valid is a failure.

    python -m bench.fuzz_live --max-examples 50 --timeout 600
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import schemathesis

from bench.live_server import PYTHON, RESULTS, ROOT, running_server, write_random_adapter
from kiln.fuzz_filter import refusal, rules_of

# Cost caps applied to positive (schema-valid) generation bodies.
MAX_TOKENS = 4
MAX_N = 2
MAX_BATCH_PROMPTS = 4
# A generated completion's cost on a CPU: few prompts of few tokens (scoring bodies keep theirs).
MAX_GENERATION_PROMPTS = 2
MAX_GENERATION_PROMPT_TOKENS = 64
# Scoring cost grows faster than linearly with prompt length on a CPU (4096 tokens: ~40 s).
MAX_SCORING_PROMPT_TOKENS = int(os.environ.get("KILN_FUZZ_MAX_PROMPT_TOKENS", "512"))
SKIP_LOG_ENV = "KILN_FUZZ_SKIP_LOG"  # where filter_case notes each body it keeps out (JSON lines)
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions/batch", "/v1/messages")
# the Responses API names its limit max_output_tokens
OUTPUT_TOKENS_PATHS = ("/v1/responses",)

# -- schemathesis hooks --------------------------------------------------------------------------


def _is_int(value: object) -> TypeGuard[int]:
    """An integer as JSON Schema counts them: 8044435.0 is one (schemathesis sends such), and a
    max_tokens of it left uncapped ran past the request timeout (--seed 89)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and float(value).is_integer())


def cap_body(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A copy of a valid generation body with bounded cost (few tokens, few choices)."""
    if path in OUTPUT_TOKENS_PATHS:
        out = dict(body)
        limit = out.get("max_output_tokens")
        out["max_output_tokens"] = min(limit, MAX_TOKENS) if _is_int(limit) else MAX_TOKENS
        return out
    if path not in GENERATION_PATHS:
        return body
    out = dict(body)
    capped = False
    for key in ("max_tokens", "max_completion_tokens"):
        if _is_int(out.get(key)):
            out[key] = min(out[key], MAX_TOKENS)
            capped = True
    if not capped:
        out["max_tokens"] = MAX_TOKENS
    thinking = out.get("thinking")
    if path == "/v1/messages" and isinstance(thinking, dict) and thinking.get("type") == "enabled":
        out["thinking"] = {"type": "disabled"}  # its budget (>= 1024) must stay below max_tokens
    if _is_int(out.get("n")):
        out["n"] = min(out["n"], MAX_N)
    _cap_min_tokens(out)
    prompts = out.get("prompts")
    if path == "/v1/completions/batch" and isinstance(prompts, list):
        out["prompts"] = prompts[:MAX_BATCH_PROMPTS]
    return out


def _cap_prompt(prompt: Any, tokens: int = MAX_SCORING_PROMPT_TOKENS) -> Any:
    if isinstance(prompt, list) and len(prompt) > tokens:
        return prompt[:tokens]
    if isinstance(prompt, str):
        # A string prompt must be at least one token (a 400 otherwise, which the schema cannot
        # state): the default model's vocabulary has no token for U+0004, so "\u0004" is none.
        # A leading letter always is one.
        return "x" + prompt[: 4 * tokens - 1]
    return prompt


def cap_scoring_body(body: dict[str, Any]) -> dict[str, Any]:
    """A copy of a valid `/v1/completions` body with a bounded prompt length; a generation body
    (no prompt_logprobs) also gets few prompts, choices and tokens (a missing or null max_tokens
    would be 16 or the whole context window)."""
    prompt = body.get("prompt")
    out = dict(body)
    scoring = body.get("prompt_logprobs") is not None
    tokens = MAX_SCORING_PROMPT_TOKENS if scoring else MAX_GENERATION_PROMPT_TOKENS
    if isinstance(prompt, list) and prompt and not all(_is_int(t) for t in prompt):
        out["prompt"] = [_cap_prompt(p, tokens) for p in prompt[:MAX_GENERATION_PROMPTS]]
    else:
        out["prompt"] = _cap_prompt(prompt, tokens)
    if not scoring:
        mt = out.get("max_tokens")
        out["max_tokens"] = min(mt, MAX_TOKENS) if _is_int(mt) else MAX_TOKENS
        if _is_int(out.get("n")):
            out["n"] = min(out["n"], MAX_N)
        _cap_min_tokens(out)
    return out


def _cap_min_tokens(out: dict[str, Any]) -> None:
    """min_tokens may not pass the capped max_tokens (a 400 otherwise)."""
    cap = out.get("max_tokens")
    if cap is None:  # chat: max_tokens wins over max_completion_tokens when non-null
        cap = out.get("max_completion_tokens")
    low = out.get("min_tokens")  # an integral float is an integer to the contract
    if isinstance(low, int | float) and not isinstance(low, bool) and _is_int(cap):
        out["min_tokens"] = min(low, cap)


def _body_is_positive(case: Any) -> bool:
    meta = getattr(case, "meta", None)
    if meta is None:
        return True
    from schemathesis.core.parameters import ParameterLocation

    return bool(meta.generation.mode.is_positive) and not meta.is_negative_at(
        ParameterLocation.BODY
    )


def capped(case: Any) -> Any:
    """The body a positive case is sent with (``map_case`` caps its cost)."""
    if not (_body_is_positive(case) and isinstance(case.body, dict)):
        return case.body
    if case.operation.path in ("/v1/completions", "/v1/completions/render"):
        return cap_scoring_body(case.body)
    return cap_body(case.operation.path, case.body)


@schemathesis.hook
def filter_case(ctx: Any, case: Any) -> bool:
    """Skip a valid body that may break one of the served document's rules for its operation
    (evaluated on the body as it will be sent, after the cost caps)."""
    if not _body_is_positive(case):
        return True
    rule = refusal(rules_of(case.operation.definition.raw), capped(case))
    log = os.environ.get(SKIP_LOG_ENV)
    if rule is not None and log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"operation": f"{case.method} {case.operation.path}",
                                "kind": rule["kind"], "param": rule["param"]}) + "\n")
    return rule is None


@schemathesis.hook
def map_case(ctx: Any, case: Any) -> Any:
    """Keep model work cheap for valid generation requests."""
    case.body = capped(case)
    return case


# -- the run -----------------------------------------------------------------------------------


@dataclass
class FuzzResult:
    returncode: int
    timed_out: bool
    wall_s: float
    tests: int
    failures: list[dict[str, str]]
    output_tail: str
    server_exit: int | None
    server_log_tail: str
    skipped: dict[str, int]  # positive bodies kept out, by "kind param" of the first rule



def _parse_junit(path: Path) -> tuple[int, list[dict[str, str]]]:
    if not path.is_file():
        return 0, []
    root = ET.parse(path).getroot()
    tests, failures = 0, []
    for case in root.iter("testcase"):
        tests += 1
        for tag in ("failure", "error"):
            for node in case.findall(tag):
                text = (node.get("message") or "") + "\n" + (node.text or "")
                failures.append({"operation": case.get("name", "?"), "kind": tag,
                                 "detail": text.strip()[:4000]})
    return tests, failures


def run_fuzz(
    *, max_examples: int, seed: int, timeout_s: float, phases: str, adapters: bool,
    time_budget_s: int | None = None, request_timeout_s: float = 120.0,
    max_response_time_s: float = 120.0,
    report_dir: Path | None = None, extra_st_args: Sequence[str] = (),
) -> FuzzResult:
    """Start the server, run schemathesis over its live OpenAPI document, stop the server."""
    report_dir = report_dir or Path(tempfile.mkdtemp(prefix="kiln-fuzz-live-"))
    report_dir.mkdir(parents=True, exist_ok=True)
    junit = report_dir / "junit.xml"
    skip_log = report_dir / "skipped.jsonl"
    skip_log.write_text("")
    with contextlib.ExitStack() as stack:
        server_args = ["--request-timeout-s", "120"]
        if adapters:
            adapter_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kiln-ad-")))
            write_random_adapter(adapter_dir)
            server_args += ["--adapter-dir", str(adapter_dir)]
        server = stack.enter_context(
            running_server(server_args, log_path=report_dir / "server.log"))
        cmd = [
            str(Path(PYTHON).with_name("schemathesis")), "run", server.url + "/openapi.json",
            "--checks", "all", "--mode", "all", "--seed", str(seed),
            "--max-examples", str(max_examples), "--workers", "1", "--phases", phases,
            "--request-timeout", str(request_timeout_s), "--suppress-health-check", "all",
            "--max-response-time", str(max_response_time_s), "--output-sanitize", "false",
            "--report", "junit", "--report-junit-path", str(junit),
            "--report-dir", str(report_dir), "--output-truncate", "false", "--no-color",
            *(["--max-time", str(time_budget_s)] if time_budget_s else []), *extra_st_args,
        ]
        env = dict(os.environ, SCHEMATHESIS_HOOKS="bench.fuzz_live", **{SKIP_LOG_ENV: str(skip_log)},
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                            os.environ.get("PYTHONPATH")])))
        start = time.monotonic()
        timed_out = False
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGINT)  # schemathesis prints its summary on interrupt
            try:
                out, _ = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
        wall = time.monotonic() - start
        alive = server.proc.poll() is None
        server_exit = None if alive else server.proc.returncode
    text = out.decode(errors="replace")
    (report_dir / "st_output.txt").write_text(text)
    tests, failures = _parse_junit(junit)
    skipped: dict[str, int] = {}
    for line in skip_log.read_text().splitlines():
        entry = json.loads(line)
        key = f"{entry['kind']} {entry['param']}"
        skipped[key] = skipped.get(key, 0) + 1
    if not alive:
        failures.append({"operation": "server", "kind": "crash",
                         "detail": f"server exited with {server_exit} during the run"})
    return FuzzResult(
        returncode=proc.returncode if proc.returncode is not None else -1, timed_out=timed_out,
        wall_s=round(wall, 1), tests=tests, failures=failures, output_tail=text[-12000:],
        server_exit=server_exit, server_log_tail=server.log_tail(6000),
        skipped=dict(sorted(skipped.items(), key=lambda kv: -kv[1])),
    )


def summary_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if re.search(r"\d+ (passed|failed|errored)", ln)]
    return lines[-1].strip() if lines else ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz_live", description=__doc__)
    parser.add_argument("--max-examples", type=int, default=50)
    parser.add_argument("--seed", type=int, default=20240611)
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="hard wall-clock cap on the schemathesis run (s)")
    parser.add_argument("--time-budget", type=int, default=None,
                        help="schemathesis --max-time: keep fuzzing until this is spent (s)")
    parser.add_argument("--phases", default="examples,coverage,fuzzing,stateful")
    parser.add_argument("--no-adapters", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "fuzz_live.json")
    args = parser.parse_args(argv)
    report_dir = Path(tempfile.mkdtemp(prefix="kiln-fuzz-live-"))
    result = run_fuzz(max_examples=args.max_examples, seed=args.seed, timeout_s=args.timeout,
                      phases=args.phases, adapters=not args.no_adapters,
                      time_budget_s=args.time_budget, report_dir=report_dir)
    print(result.output_tail)
    record = {
        "max_examples": args.max_examples, "seed": args.seed, "phases": args.phases,
        "adapters": not args.no_adapters, "returncode": result.returncode,
        "timed_out": result.timed_out, "wall_s": result.wall_s, "tests": result.tests,
        "summary": summary_line(result.output_tail), "failures": result.failures,
        "skipped_positive_bodies": sum(result.skipped.values()),
        "skipped_by_rule": result.skipped,
        "report_dir": str(report_dir),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"fuzz_live: {len(result.failures)} failure(s), st exit {result.returncode}, "
          f"{result.wall_s} s, timed out: {result.timed_out}, "
          f"{sum(result.skipped.values())} positive bodies kept out by x-kiln-rules; "
          f"wrote {args.out}")
    ok = result.returncode == 0 and not result.failures and not result.timed_out
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
