"""`python -m bench.bench_sleep [--kv-memory-mb 256] [--prompts 6] [--level 1|2]`: what
POST /sleep gives back (level 2: the weights' memory as well). The default model's torch-free
engine (as `kiln serve` starts it), in this process;
distinct ~1,500-word prompts fill the KV cache, then /sleep: the KV maps' resident bytes (from
/proc/self/smaps, over the maps' own ranges) and the process's VmRSS before and after. Linux
only (smaps, MADV_REMOVE). Prints one line and writes bench/results/sleep.json (level 2:
sleep-level2.json)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.model.native.c_model import map_of
from kiln.serving import EngineBackend
from kiln.testing import map_resident_bytes

MIB = 1024 * 1024


def vm_rss() -> int:
    found = re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text())
    return int(found[1]) * 1024 if found else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kv-memory-mb", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--level", type=int, choices=(1, 2), default=1)
    args = parser.parse_args(argv)
    config = ServerConfig(kv_memory_mb=args.kv_memory_mb, enable_weight_updates=True)
    with TestClient(build_app(config, EngineBackend.from_config(config))) as c:
        kv = c.app.state.kiln.backend.engine.executor.kv  # type: ignore[attr-defined]
        maps = [m for m in (map_of(a) for a in kv.k + kv.v) if m is not None]
        for i in range(args.prompts):
            c.post("/v1/chat/completions", json={"max_tokens": 4, "messages": [
                {"role": "user", "content": f"Story {i}: " + "word " * 1500}]})
        rss_before, kv_before = vm_rss(), map_resident_bytes(maps)
        released = c.post(f"/sleep?level={args.level}").json()["released_bytes"]
        rss_after, kv_after = vm_rss(), map_resident_bytes(maps)
        c.post("/wake_up")
        rss_awake = vm_rss()
    out = {"level": args.level, "kv_maps_mib": sum(len(m) for m in maps) / MIB,
           "kv_resident_before_mib": kv_before / MIB, "kv_resident_after_mib": kv_after / MIB,
           "rss_before_mib": rss_before / MIB, "rss_after_mib": rss_after / MIB,
           "rss_drop_of_kv_resident": (rss_before - rss_after) / max(kv_before, 1),
           "released_mib": released / MIB, "rss_awake_mib": rss_awake / MIB}
    print(", ".join(f"{k} {v:.3f}" for k, v in out.items()))
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    name = "sleep.json" if args.level == 1 else f"sleep-level{args.level}.json"
    (results / name).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
