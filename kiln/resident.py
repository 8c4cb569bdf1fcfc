"""What the server keeps resident once it has started: the clean pages of its shared libraries
that only start-up ran are handed back to the kernel (``release_library_pages``).

Importing torch makes ~55 MiB of ``libtorch_cpu.so`` resident (its static initializers register
thousands of operators), and the other extension libraries (tokenizers, jsonschema_rs, numpy's,
llguidance, libpython) add ~40 MiB more; serving runs a small part of that code again. These
pages are clean and file-backed: the kernel would reclaim them under memory pressure anyway,
and ``MADV_PAGEOUT`` (Linux 5.4+) asks it to do so now. A page that serving needs is read back
on its first use (a page fault, once). Writable mappings (data, relocations) are never touched:
their pages may be dirty, and only clean, read-only or executable mappings are advised.

Figures (RSS before and after, the first request's cost): docs/cpu-step.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import re
from collections.abc import Callable, Iterable
from pathlib import Path

MADV_PAGEOUT = 21  # linux/mman.h (5.4+); an older kernel answers EINVAL, which is ignored
_LIBRARY = re.compile(r"\.so(\.[0-9.]+)?$")

Range = tuple[int, int]


def library_ranges(maps_lines: Iterable[str]) -> list[Range]:
    """The (start, end) of every file-backed mapping of a shared library that is not writable,
    from ``/proc/PID/maps`` lines (``start-end perms offset dev inode path``)."""
    ranges: list[Range] = []
    for line in maps_lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or "w" in parts[1] or parts[1][0] != "r":
            continue
        path = parts[5].strip()
        if not path.startswith("/") or not _LIBRARY.search(path):
            continue
        start, end = (int(v, 16) for v in parts[0].split("-"))
        ranges.append((start, end))
    return ranges


def _madvise() -> Callable[[int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    fn = getattr(ctypes.CDLL(name, use_errno=True), "madvise", None) if name else None
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def release_library_pages(maps: Path = Path("/proc/self/maps"),
                          advise: Callable[[int, int, int], int] | None = None) -> int:
    """Advise ``MADV_PAGEOUT`` over this process's read-only library mappings; returns the bytes
    advised (0 where ``maps`` cannot be read or there is no ``madvise``: not Linux). The kernel
    may decline any range (an old kernel, a page another process holds): nothing changes then."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return 0
    fn = advise if advise is not None else _madvise()
    if fn is None:
        return 0
    advised = 0
    for start, end in library_ranges(lines):
        if fn(start, end - start, MADV_PAGEOUT) == 0:
            advised += end - start
    return advised


def release_freed_heap() -> None:
    """Give the heap pages a load freed back to the system (glibc's ``malloc_trim``, after a
    garbage collection: a reader's arrays are freed only then). Called once a load is done.

    Packing copies each tensor on its way to its tiles; glibc keeps most of what those copies
    freed (its mmap threshold rises after the first large frees, so later copies come from the
    heap), which for the default Q4_1 model was 77 MB of RSS after load, nearly the file's size
    again. A no-op where the C library has no ``malloc_trim``."""
    gc.collect()
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim(0)

