"""The CPU C library: its sources grouped by operation, and its one public loader.

- ``matmul/``: packed-weight products (``gemm.c``; formats in ``quant.h`` and ``blocks*.h``)
- ``step/``: the CPU step, one whole forward pass in one call (``cpu_step.c``, ``attention.c``);
  Python binding :mod:`kiln_kernels.cpu.cpu_step`
- ``sampling/``: the sampler (``sample.c``, ``top_p.c``, ``counter.c``); Python binding
  :mod:`kiln_kernels.sampling.native`; grammar token masks (``token_mask.c``), bound by
  :mod:`kiln_kernels.grammar.native`
- ``common/``: vector math shared by all three, inline (``vmath.h``)
- ``tiling/``: a GGUF's matrices into the products' tiles at load (``tile.c``), its own small
  library without OpenMP (start-up loads it before torch); binding :mod:`kiln_kernels.tiling`

Everything else is compiled into one shared library by :mod:`.loader` (see
``kiln_kernels/README.md``); :func:`threads` is how many threads its calls run on. Nothing here
imports torch: the bindings take numpy arrays or CPU torch tensors alike (:mod:`.arrays`).
"""

from __future__ import annotations

from .loader import (
    NATIVE_FLAGS,
    PORTABLE_FLAGS,
    KernelBuildError,
    available,
    cache_dir,
    library,
    threads,
)

__all__ = ["NATIVE_FLAGS", "PORTABLE_FLAGS", "KernelBuildError", "available", "cache_dir",
           "library", "threads"]
