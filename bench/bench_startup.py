"""Start-up: seconds from starting `kiln serve --model FILE` (no other flags) to a healthy
/health, beside llama-server on the same file, alternated round by round so that both see the
same machine; with ``--vs TREE``, also Kiln from another checkout (``PYTHONPATH=TREE``), for a
before/after figure in one run.

    python -m bench.bench_startup [--rounds 6] [--files F ...] [--vs TREE] [--llama-args "-c 8192"]

Default files: the default model's Q4_K_M and the Qwen2.5-0.5B- and Llama 3.2 1B-shaped Q4_K_M
files of ``bench/peers`` where they exist, else the default model. llama-server runs with
``-t 2`` and its own defaults otherwise (its context is the model's, its cache cleared at start;
``--llama-args`` adds flags). /health is polled every 10 ms. Writes bench/results/startup.json
(figures, no asserts).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import time
from pathlib import Path

from bench.bench_peer import LLAMA_SERVER, LLAMA_SHAPED, PEERS, SHAPED
from bench.live_server import ROOT
from kiln.testing import free_port, healthy, serve_command, start, stop

RESULTS = ROOT / "bench" / "results" / "startup.json"
TIMEOUT_S = 300.0  # a hang bound, never a figure
POLL_S = 0.01


def default_files() -> list[Path]:
    from kiln.model.checkpoint.locate import default_model_path

    files = [p for p in (PEERS / "models" / "smollm2-135m-Q4_K_M.gguf", SHAPED, LLAMA_SHAPED)
             if p.is_file()]
    return files or [Path(default_model_path())]


def seconds_to_health(cmd: list[str], port: int, log: Path, tree: Path) -> float:
    """``cmd`` run in ``tree`` (``python -m kiln`` imports the Kiln of its working folder)."""
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    server = start(cmd, url=url, log_path=log, env={"PYTHONPATH": str(tree)}, cwd=tree)
    try:
        while not healthy(url):
            if server.proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited {server.proc.returncode}:\n{server.log_tail()}")
            if time.perf_counter() - t0 > TIMEOUT_S:
                raise RuntimeError(f"not healthy after {TIMEOUT_S:.0f} s:\n{server.log_tail()}")
            time.sleep(POLL_S)
        return time.perf_counter() - t0
    finally:
        stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_startup")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--files", type=Path, nargs="*")
    parser.add_argument("--vs", type=Path, help="another checkout of Kiln, run as 'before'")
    parser.add_argument("--llama-args", default="", help="more llama-server flags")
    args = parser.parse_args()
    runs = {"kiln": ROOT}
    if args.vs is not None:
        runs = {"kiln before": args.vs.resolve(), "kiln": ROOT}
    figures: dict[str, dict[str, list[float]]] = {}
    for file in args.files or default_files():
        times: dict[str, list[float]] = {name: [] for name in (*runs, "llama-server")}
        for _ in range(args.rounds):
            for name, tree in runs.items():
                port = free_port()
                cmd = serve_command(["--model", str(file.resolve())], port=port)
                log = ROOT / "bench" / "results" / f"startup-{name.replace(' ', '-')}.log"
                times[name].append(seconds_to_health(cmd, port, log, tree))
            if LLAMA_SERVER.is_file() and file.is_file():  # llama-server reads GGUF files only
                port = free_port()
                cmd = [str(LLAMA_SERVER), "-m", str(file), "--host", "127.0.0.1", "--port",
                       str(port), "-t", "2", "--no-webui", *shlex.split(args.llama_args)]
                log = ROOT / "bench" / "results" / "startup-llama-server.log"
                times["llama-server"].append(seconds_to_health(cmd, port, log, ROOT))
        times = {k: v for k, v in times.items() if v}
        figures[file.name] = times
        print(f"== {file.name}")
        for name, t in times.items():
            print(f"  {name:12s} median {statistics.median(t):.2f} s  "
                  f"[{' '.join(f'{x:.2f}' for x in sorted(t))}]")
        if "llama-server" in times:
            peer = statistics.median(times["llama-server"])
            for name in runs:
                print(f"  {name} / llama-server: {statistics.median(times[name]) / peer:.2f}x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"llama_args": args.llama_args, "rounds": args.rounds,
                                   "seconds": figures}, indent=1) + "\n")


if __name__ == "__main__":
    main()
