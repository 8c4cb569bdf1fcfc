"""The one loader of the CPU C library: compile every C source under ``kiln_kernels/cpu/``
(``matmul/``: the packed-weight products; ``step/``: the CPU step, a whole forward pass;
``sampling/``: the sampler; ``common/``: vector math) once per machine into a cache folder and
load it with ctypes. Beside it, ``tiling/tile.c`` builds into a small library of its own
without OpenMP (:func:`tiling_library`): start-up loads it before torch.

The library is built with the system C compiler (``$CC``, else ``cc``/``gcc``) for the CPU it runs
on (``-march=native``) and linked against the OpenMP runtime that torch has already loaded (the
same ``libgomp.so.1`` soname), so its threads are torch's threads. The cache key covers the
source, the flags and the CPU's feature flags; a build is written to a temporary name and renamed
into place, so concurrent processes never load a half-written file.

Nothing here imports torch. Callers that use torch import it before :func:`load` so that its
OpenMP runtime is in the process first; a process without torch (numpy buffers only) loads the
system's ``libgomp.so.1``, which a torch imported later then uses too (one runtime per soname).
:func:`threads` is how many threads the C calls run on.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).parent
INCLUDE_DIRS = (HERE / "common", HERE / "matmul", HERE / "step", HERE / "sampling")
SOURCES = (HERE / "matmul" / "gemm.c", HERE / "step" / "cpu_step.c",
           HERE / "step" / "attention.c", HERE / "sampling" / "counter.c",
           HERE / "sampling" / "sample.c", HERE / "sampling" / "top_p.c",
           HERE / "sampling" / "token_mask.c")
HEADERS = (HERE / "matmul" / "quant.h", HERE / "matmul" / "blocks.h",
           HERE / "matmul" / "blocks_legacy.h", HERE / "matmul" / "blocks_k.h",
           HERE / "matmul" / "blocks_float.h", HERE / "matmul" / "blocks_iq.h",
           HERE / "step" / "cpu_step.h",
           HERE / "common" / "vmath.h", HERE / "common" / "isa.h", HERE / "sampling" / "counter.h",
           HERE / "sampling" / "sample.h")
TILING_SOURCES = (HERE / "tiling" / "tile.c",)
TILING_FLAGS = ("-O2", "-shared", "-fPIC")  # memcpy of whole blocks: no vector code of its own

# The ISA layer (common/isa.h) picks its build from the compiler's target flags; each ISA's
# flags here. -ffp-contract=off on every build: no build fuses a product the others round, so
# every build gives the same bits (isa.h).
ISAS = ("avx512", "avx2", "neon", "plain")  # best first
ISA_TARGET_FLAGS: dict[str, tuple[str, ...]] = {
    "avx512": ("-march=native", "-mprefer-vector-width=512"),
    "avx2": ("-march=x86-64-v3", "-mtune=native"),  # AVX2 + FMA + F16C, no AVX-512
    "neon": ("-march=armv8-a",),
    "plain": ("-DKILN_ISA_PLAIN",),
}
ISA_ENV = "KILN_CPU_ISA"  # declared in kiln.config's table; read here, once


def _cpu_flag_set() -> set[str]:
    return set(_cpu_flags().split())


def supported_isas() -> tuple[str, ...]:
    """The layer's builds this CPU runs, best first (plain always)."""
    machine = platform.machine().lower()
    found: list[str] = []
    if machine in ("x86_64", "amd64"):
        have = _cpu_flag_set()
        if {"avx512f", "avx2", "fma", "f16c"} <= have:
            found.append("avx512")
        if {"avx2", "fma", "f16c"} <= have:
            found.append("avx2")
    elif machine in ("aarch64", "arm64"):
        found.append("neon")
    found.append("plain")
    return tuple(found)


def isa_flags(isa: str) -> tuple[str, ...]:
    """The compiler flags of the library's ``isa`` build (one of :data:`ISAS`)."""
    if isa not in ISA_TARGET_FLAGS:
        raise ValueError(f"unknown CPU ISA {isa!r} (one of {', '.join(ISAS)})")
    return ("-O3", *ISA_TARGET_FLAGS[isa], "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")


def chosen_isa(environ: dict[str, str] | None = None) -> str:
    """The best ISA this CPU runs, or ``$KILN_CPU_ISA`` where set: it may force a lower one; one
    the CPU cannot run, or an unknown name, is an error (raised at start, never a crash later)."""
    env = os.environ if environ is None else environ
    have = supported_isas()
    forced = (env.get(ISA_ENV) or "").strip().lower()
    if not forced:
        return have[0]
    if forced not in ISAS:
        raise ValueError(f"{ISA_ENV}={forced!r}: not one of {', '.join(ISAS)}")
    if forced not in have:
        raise ValueError(f"{ISA_ENV}={forced}: this CPU runs {', '.join(have)}")
    return forced



THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # torch's order: the later one wins


def threads() -> int:
    """The threads a C call runs on: ``torch.get_num_threads()`` where torch is imported, else
    what torch's default would be, found without importing it: ``$MKL_NUM_THREADS`` or
    ``$OMP_NUM_THREADS`` (torch reads both, the former winning) where set to a positive int, else
    the physical cores among the CPUs this process may run on."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        return int(torch.get_num_threads())
    n = 0
    for name in THREAD_ENVS:
        try:
            n = max(0, int(os.environ.get(name, ""))) or n
        except ValueError:
            pass
    return n or physical_cores()


def physical_cores() -> int:
    """Distinct (package, core) pairs among the CPUs of ``os.sched_getaffinity(0)`` (sysfs
    topology); the CPU count itself where the topology cannot be read."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else \
        set(range(os.cpu_count() or 1))
    cores: set[tuple[str, str]] = set()
    try:
        for cpu in cpus:
            topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
            cores.add(((topo / "physical_package_id").read_text().strip(),
                       (topo / "core_id").read_text().strip()))
    except OSError:
        return max(1, len(cpus))
    return max(1, len(cores))


_lock = threading.Lock()
_loaded: dict[tuple[str, ...], ctypes.CDLL] = {}


class KernelBuildError(RuntimeError):
    """No C compiler, or the kernel source did not compile."""


CACHE_ENV = "KILN_KERNEL_CACHE"  # declared in kiln.config's table; read here, at the build


def cache_dir() -> Path:
    """``$KILN_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/kiln/kernels`` (``~/.cache`` by default)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kiln" / "kernels"


def compiler() -> str:
    for cand in (os.environ.get("CC"), "cc", "gcc"):
        if cand and shutil.which(cand):
            return cand
    raise KernelBuildError("no C compiler found (set CC, or install gcc)")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def isa_forced(environ: dict[str, str] | None = None) -> bool:
    """Whether ``$KILN_CPU_ISA`` names the build (else the CPU's flags chose it)."""
    env = os.environ if environ is None else environ
    return bool((env.get(ISA_ENV) or "").strip())


def machine_summary() -> str:
    """The machine and the layer's builds it runs, for log lines."""
    return f"{platform.machine() or 'unknown machine'}; builds: {', '.join(supported_isas())}"


NATIVE_FLAGS = isa_flags(chosen_isa())
PORTABLE_FLAGS = isa_flags("plain")  # the plain-C build: the same bits, no vector registers


def _key(cc: str, flags: tuple[str, ...], files: tuple[Path, ...]) -> str:
    h = hashlib.sha256()
    parts = [p.read_bytes() for p in files]
    for part in (*parts, cc.encode(), " ".join(flags).encode(), platform.machine().encode(),
                 _cpu_flags().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def build(flags: tuple[str, ...] = NATIVE_FLAGS, *, name: str = "kiln_quant",
          sources: tuple[Path, ...] = SOURCES, headers: tuple[Path, ...] = HEADERS) -> Path:
    """The compiled library of ``sources`` for ``flags`` (compiled on first use, then cached)."""
    cc = compiler()
    out_dir = cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}_{_key(cc, flags, (*sources, *headers))}.so"
    if target.is_file():
        return target
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        includes = [f"-I{d}" for d in INCLUDE_DIRS]
        proc = subprocess.run([cc, *flags, *includes, *map(str, sources), "-o", tmp, "-lm"],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise KernelBuildError(f"{cc} failed on the CPU kernels: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load(flags: tuple[str, ...] = NATIVE_FLAGS) -> ctypes.CDLL:
    """Build (if needed) and load the library, with argument types declared."""
    with _lock:
        lib = _loaded.get(flags)
        if lib is None:
            lib = ctypes.CDLL(str(build(flags)))
            p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
            lib.kiln_quant_gemm.argtypes = [i32, p, i64, i64, p, i64, p, i32]
            lib.kiln_quant_gemm.restype = None
            lib.kiln_dequant_rows.argtypes = [i32, p, i64, i64, p, i64, p]
            lib.kiln_dequant_rows.restype = i64
            lib.kiln_cpu_step.argtypes = [p, p, i32]
            lib.kiln_cpu_step.restype = i64
            lib.kiln_cpu_step_scratch_floats.argtypes = [p, i64, i64]
            lib.kiln_cpu_step_scratch_floats.restype = i64
            lib.kiln_cpu_step_layout_version.argtypes = []
            lib.kiln_cpu_step_layout_version.restype = i64
            lib.kiln_quant_simd.argtypes = []
            lib.kiln_quant_simd.restype = i32
            lib.kiln_isa_name.argtypes = []
            lib.kiln_isa_name.restype = ctypes.c_char_p
            lib.kiln_counter_uniform.argtypes = [p, p, i64, i64, p]
            lib.kiln_counter_uniform.restype = None
            lib.kiln_sample.argtypes = [p, i32]
            lib.kiln_sample.restype = None
            lib.kiln_sample_scratch_floats.argtypes = [i64, i64]
            lib.kiln_sample_scratch_floats.restype = i64
            lib.kiln_apply_token_mask.argtypes = [p, i64, i64, p, i64, p, i64]
            lib.kiln_apply_token_mask.restype = None
            _loaded[flags] = lib
        return lib


_build_errors: dict[tuple[str, ...], str] = {}  # flags -> why that build failed (not retried)


def library(flags: tuple[str, ...] = NATIVE_FLAGS) -> ctypes.CDLL:
    """The loaded library for ``flags``; raises :class:`KernelBuildError` where it cannot be
    built or loaded here (remembered: a failed build is not retried)."""
    if flags in _build_errors:
        raise KernelBuildError(_build_errors[flags])
    try:
        return load(flags)
    except (KernelBuildError, OSError, AttributeError) as exc:
        _build_errors[flags] = str(exc)
        raise KernelBuildError(str(exc)) from exc


def available(flags: tuple[str, ...] = NATIVE_FLAGS) -> bool:
    """Whether the C library could be built and loaded here (builds it on the first call)."""
    try:
        library(flags)
    except KernelBuildError:
        return False
    return True


_tiling: list[ctypes.CDLL | None] = []  # loaded once; None: it cannot be built here


def tiling_library() -> ctypes.CDLL | None:
    """The tiling library (``kiln_tile_claim``), built on first use; None where it cannot be built or
    loaded (callers then tile in numpy: ``kiln_kernels.tiling``). Loads no OpenMP runtime."""
    with _lock:
        if not _tiling:
            lib: ctypes.CDLL | None = None
            try:
                lib = ctypes.CDLL(str(build(
                    TILING_FLAGS, name="kiln_tiling", sources=TILING_SOURCES, headers=())))
                lib.kiln_tile_claim.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
                lib.kiln_tile_claim.restype = None
            except (KernelBuildError, OSError, AttributeError, subprocess.SubprocessError):
                lib = None
            _tiling.append(lib)
        return _tiling[0]
