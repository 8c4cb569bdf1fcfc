"""kiln.resident: which mappings start-up hands back, and that the process runs on after it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kiln.resident import MADV_PAGEOUT, library_ranges, release_library_pages

MAPS = """\
55d0c0000000-55d0c0001000 r--p 00000000 08:01 100 /usr/bin/python3.11
55d0c2000000-55d0c2400000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000100000 r--p 00000000 08:01 200 /venv/torch/lib/libtorch_cpu.so
7f0000100000-7f0000900000 r-xp 00100000 08:01 200 /venv/torch/lib/libtorch_cpu.so
7f0000900000-7f0000a00000 r--p 00900000 08:01 200 /venv/torch/lib/libtorch_cpu.so
7f0000a00000-7f0000a10000 rw-p 00a00000 08:01 200 /venv/torch/lib/libtorch_cpu.so
7f0000b00000-7f0000b01000 ---p 00000000 08:01 300 /usr/lib/libc.so.6
7f0000b01000-7f0000b80000 r-xp 00001000 08:01 300 /usr/lib/libc.so.6
7f0000c00000-7f0006c00000 r--s 00000000 08:01 400 /models/SmolLM2.Q4_1.gguf
7f0007000000-7f0007100000 rw-s 00000000 00:01 500 /dev/zero (deleted)
7f0008000000-7f0008010000 r-xp 00000000 08:01 600 /venv/numpy/_core/_umath.cpython-311.so
7f0009000000-7f0009001000 r--p 00000000 00:00 0
7ffd00000000-7ffd00001000 r-xp 00000000 00:00 0 [vdso]
"""


def test_only_read_only_library_mappings_are_picked() -> None:
    assert library_ranges(MAPS.splitlines()) == [
        (0x7F0000000000, 0x7F0000100000),  # libtorch_cpu.so: read-only data
        (0x7F0000100000, 0x7F0000900000),  # ... its code
        (0x7F0000900000, 0x7F0000A00000),  # ... relocated, now read-only
        (0x7F0000B01000, 0x7F0000B80000),  # libc.so.6's code (a versioned name)
        (0x7F0008000000, 0x7F0008010000),  # an extension module
    ]  # never: writable data, the heap, the model file, the KV cache, guards, anonymous, vdso


def test_every_picked_range_is_advised_and_counted(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    calls: list[tuple[int, int, int]] = []

    def advise(start: int, length: int, advice: int) -> int:
        calls.append((start, length, advice))
        return -1 if start == 0x7F0000B01000 else 0  # the kernel declines one range

    advised = release_library_pages(maps, advise)
    ranges = library_ranges(MAPS.splitlines())
    assert calls == [(a, b - a, MADV_PAGEOUT) for a, b in ranges]
    assert advised == sum(b - a for a, b in ranges) - (0x7F0000B80000 - 0x7F0000B01000)


def test_unreadable_maps_advise_nothing(tmp_path: Path) -> None:
    def advise(start: int, length: int, advice: int) -> int:
        raise AssertionError("nothing to advise")

    assert release_library_pages(tmp_path / "missing", advise) == 0


def test_a_process_computes_the_same_after_its_pages_are_released() -> None:
    """The real call on this machine's kernel (declined or done): torch, numpy and tokenizers
    give the same results after it as before (their code pages are read back on use)."""
    code = """
import torch, numpy
from kiln.resident import release_library_pages
g = torch.Generator().manual_seed(0)
a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
before = (a @ b, torch.log_softmax(a, 1), numpy.sort(a.numpy(), axis=1))
release_library_pages()
after = (a @ b, torch.log_softmax(a, 1), numpy.sort(a.numpy(), axis=1))
assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
assert (before[2] == after[2]).all()
print("same")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip() == "same"
