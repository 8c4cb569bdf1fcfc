"""Write C steps for tests/kernels/isa/step_replay.c and build that driver for a target: how a
build of the kernels that this Python cannot load (aarch64, under qemu-user) runs the very steps
the loaded builds run, so their logits can be compared bit for bit."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
from kiln_kernels.cpu import loader
from kiln_kernels.cpu.cpu_step import LAYER_FIELDS, CpuStepWeights
from kiln_kernels.quant import FORMAT_IDS, MAX_PARTS, Packed

HERE = Path(__file__).parent
DRIVER = HERE / "step_replay.c"
AARCH64_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"


def cross_tools() -> bool:
    return shutil.which(AARCH64_CC) is not None and shutil.which(QEMU) is not None


def _np(a: Any) -> np.ndarray:
    return a.detach().numpy() if hasattr(a, "detach") else np.asarray(a)


class ReplayFile:
    """Named arrays, in the order written."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def add(self, name: str, data: np.ndarray | bytes) -> None:
        raw = data if isinstance(data, bytes) else np.ascontiguousarray(data).tobytes()
        key = name.encode()
        self.parts.append(struct.pack("<I", len(key)) + key + struct.pack("<Q", len(raw)) + raw)

    def weight(self, name: str, pw: Packed) -> None:
        parts = pw.parts
        pad = MAX_PARTS - len(parts)
        meta = [len(parts), pw.in_features, *[FORMAT_IDS[p.fmt] for p in parts], *[0] * pad,
                *[p.out_features for p in parts], *[0] * pad]
        self.add(f"w.{name}.meta", np.array(meta, dtype=np.int64))
        for i, p in enumerate(parts):
            self.add(f"w.{name}.data{i}", _np(p.tiles))

    def write(self, path: Path) -> None:
        path.write_bytes(b"".join(self.parts))


def replay_file(w: CpuStepWeights, cache_buffers: list[np.ndarray], kv_strides: tuple[int, ...],
                block_size: int, steps: list[dict[str, np.ndarray]], threads: int) -> ReplayFile:
    """The model, its caches (the contiguous buffers behind the program's views, K then V per
    layer) and the steps' inputs (``ids`` or ``x``, ``ctx_lens``, ``block_tables``, ``slots``,
    ``seq_first``, ``logit_rows``)."""
    f = ReplayFile()
    kv_f16 = int(cache_buffers[0].dtype == np.float16)
    f.add("model.i64", np.array([len(w.layers), w.hidden, w.inter, w.heads, w.kv_heads,
                                 w.head_dim, w.head.out_features, block_size, kv_f16,
                                 *kv_strides], dtype=np.int64))
    f.add("model.f32", np.array([w.eps, w.head_dim ** -0.5], dtype=np.float32))
    f.add("threads", np.array([threads], dtype=np.int64))
    f.add("final_norm", _np(w.final_norm).astype(np.float32))
    f.add("inv_freq", _np(w.inv_freq).astype(np.float32))
    f.weight("head", w.head)
    if w.embed is not None:
        f.weight("embed", w.embed)
    for i, layer in enumerate(w.layers):
        for name in LAYER_FIELDS[:4]:
            f.weight(f"L{i}.{name}", getattr(layer, name))
        for name in LAYER_FIELDS[4:11]:
            t = getattr(layer, name)
            if t is not None:
                f.add(f"L{i}.{name}", _np(t).astype(np.float32))
        f.add(f"L{i}.k_cache", cache_buffers[2 * i])
        f.add(f"L{i}.v_cache", cache_buffers[2 * i + 1])
    for s, step in enumerate(steps):
        lens = step["ctx_lens"].astype(np.int64)
        tables = step["block_tables"].astype(np.int32)
        f.add(f"s{s}.i64", np.array([len(lens), tables.shape[1], int(lens.max()),
                                     len(step["logit_rows"])], dtype=np.int64))
        f.add(f"s{s}.ctx_lens", lens)
        f.add(f"s{s}.block_tables", tables)
        for name in ("slots", "seq_first", "logit_rows"):
            f.add(f"s{s}.{name}", step[name].astype(np.int64))
        if "ids" in step:
            f.add(f"s{s}.ids", step["ids"].astype(np.int64))
        else:
            f.add(f"s{s}.x", step["x"].astype(np.float32))
    return f


def build_driver(out: Path, *, cc: str, flags: tuple[str, ...]) -> Path:
    """The replay driver linked with the kernels' sources, built by ``cc`` with ``flags`` (an
    ISA's target flags); static, so qemu-user needs no target libraries."""
    includes = [f"-I{d}" for d in loader.INCLUDE_DIRS]
    cmd = [cc, "-O2", *flags, "-ffp-contract=off", "-fopenmp", "-static", *includes,
           *map(str, loader.SOURCES), str(DRIVER), "-o", str(out), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"building the replay driver failed: {proc.stderr[-3000:]}")
    return out


def run_driver(driver: Path, replay: Path, out: Path, *, qemu: bool) -> bytes:
    cmd = ([QEMU] if qemu else []) + [str(driver), str(replay), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"the replay driver failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return out.read_bytes()
