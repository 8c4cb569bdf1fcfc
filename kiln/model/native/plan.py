"""The compute plan: which implementation runs each part of a step, decided here and only here.

A served model gets one frozen :class:`ComputePlan` when it loads (:func:`model_plan`, owned by
its ``CausalLM``), completed with the KV cache's element type when the engine builds its runner
(:func:`with_kv_cache`); the runner logs it in one line and ``/health`` shows it. Every caller
reads the plan and calls the implementation it names; nothing else looks at the device to pick
one. Switches come in as arguments (``quant_kernels`` is the ``KILN_QUANT_KERNELS`` setting of
kiln.config); this module reads no environment variable.

The choices:

- weights: ``packed`` (the file's own blocks only, no float32 copy: every step runs the CPU
  step), ``dense+packed`` (float32 tensors, and packed blocks that decode rows multiply by), or
  ``dense`` (torch tensors of the model's dtype).
- step: ``c`` (one C call per step, ``kiln_kernels.cpu.cpu_step``) or ``torch`` (the layers of
  ``kiln.model``).
- attention: ``c`` (inside the C step), ``triton`` (``kiln_kernels.attention``), ``torch``.
- sampler: ``c`` (``kiln_kernels.sampling.native``), ``triton``, ``torch`` (the reference).
- lora: ``c`` (inside the C step, on CPU stacks), ``triton`` (the SGMV pair), ``torch``.
- grammar_mask: how the sampler applies structured outputs' token masks (``kiln_kernels.grammar``):
  ``c`` (in place on the CPU's float32 logits), ``triton`` (CUDA), ``torch`` (the reference).
- kv_layout: ``heads-major`` (the C step's blocks) or ``contiguous``; kv_dtype.
- cpu_isa: the build of the C kernels (``kiln_kernels/cpu/common/isa.h``): ``avx512``,
  ``avx2``, ``neon``, ``plain``, or ``none`` where no C kernel runs. Every build gives the same
  bits. Where no vector build fits the CPU (the layer found ``plain`` by itself: another ISA,
  or an x86 CPU without AVX2), the weights are not packed and the torch path runs (its BLAS has
  vector code for that CPU; the plain C products have none): :func:`c_step_isa` is that rule.
  ``KILN_CPU_ISA=plain`` forces the plain C step (tests and benchmarks).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Literal

from kiln_kernels.cpu import available as c_library_available
from kiln_kernels.cpu import loader as c_loader

if TYPE_CHECKING:  # annotations only: this module never imports torch (its names as torch
    import torch  # devices and dtypes: kiln.model.devices)

log = logging.getLogger("kiln.model")

Weights = Literal["packed", "dense+packed", "dense"]
Impl = Literal["c", "triton", "torch"]

# the dtype names a setting may use, and the plan's name of each
DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16",
                  "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16"}


@dataclass(frozen=True)
class ComputePlan:
    """What runs where, for one model (see the module docstring for the values)."""

    device: str
    dtype: str
    weights: Weights
    step: Literal["c", "torch"]
    attention: Impl
    sampler: Impl
    lora: Impl
    grammar_mask: Impl
    kv_layout: Literal["heads-major", "contiguous"]
    kv_dtype: str
    cpu_isa: str = "none"

    @property
    def torch_attention(self) -> Literal["triton", "torch"]:
        """The attention of the torch path (a step the C step does not take, hidden states)."""
        return "triton" if self.device.startswith("cuda") else "torch"

    @property
    def torch_lora(self) -> Literal["triton", "torch"]:
        """The LoRA path of the torch layers (and the layout of the adapter stacks)."""
        return "triton" if self.device.startswith("cuda") else "torch"

    @property
    def grammar_beside_step(self) -> bool:
        """Whether grammar masks fill on a worker thread while the model runs: where the model
        runs on an accelerator and leaves the CPU free. On the CPU the step's threads use every
        core, and a mask walk beside them stalls the whole team at its next barrier, so the masks
        fill inline (measured with ``python -m bench.bench_structured``)."""
        return not self.device.startswith("cpu")

    @property
    def kv_zero_pages(self) -> bool:
        """Whether the KV cache is mapped from the operating system's zero pages (the CPU): its
        memory is resident only once a block is first written, so an idle server holds none of
        it, and allocating it writes nothing (a 512 MiB cache was 0.24-0.32 s of start-up as
        ``torch.zeros``). Device memory is allocated and zeroed as usual."""
        return self.device.startswith("cpu")

    @property
    def packed_rows(self) -> bool:
        """Whether rows of the torch path read packed blocks (every weight form but dense)."""
        return self.weights != "dense"

    def as_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}

    def line(self) -> str:
        """The plan in one log line."""
        return "compute plan: " + " ".join(f"{k}={v}" for k, v in self.as_dict().items())


def dtype_name(dtype: str | None, device_type: str) -> str:
    """The plan's name of a dtype setting (``"float32"``/``"bfloat16"``/``"float16"`` or an
    alias) or of the default: bfloat16 on CUDA, float32 elsewhere."""
    if dtype is None or dtype == "auto":
        return "bfloat16" if device_type == "cuda" else "float32"
    if dtype not in DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return DTYPE_ALIASES[dtype]


def cpu_isa() -> str:
    """The ISA layer's build the C kernels run here (``none``: they cannot be built)."""
    return c_loader.chosen_isa() if c_library_available() else "none"


def isa_suits_c_step() -> bool:
    """The rule, from the CPU's flags and settings alone (nothing built): a vector build of the
    ISA layer fits this CPU, or ``KILN_CPU_ISA`` forced one."""
    return c_loader.chosen_isa() != "plain" or c_loader.isa_forced()


def c_step_isa() -> str | None:
    """The ISA the CPU step would run on, or None where the plan prefers the torch path: no C
    library, or no vector build of the layer for this CPU (``plain`` found, not forced by
    ``KILN_CPU_ISA``): the plain C products run one lane at a time, torch's BLAS has vector code
    for any CPU it runs on."""
    isa = cpu_isa()
    return None if isa == "none" or not isa_suits_c_step() else isa


def pack_weights(dtype: torch.dtype, device: torch.device, *, quant_kernels: bool) -> bool:
    """Whether a loader keeps weights in their stored format (packed blocks): float32 models on
    the CPU, when ``quant_kernels`` is on and the C step has a build for this CPU
    (:func:`c_step_isa`)."""
    if not quant_kernels or device.type != "cpu" or _name(dtype) != "float32":
        return False
    if not c_library_available():
        log.warning("quantized CPU kernels unavailable (no C compiler?): decoding with float32 "
                    "weights")
        return False
    if c_step_isa() is None:
        log.warning("no vector build of the C kernels for this CPU (%s): the torch path, with "
                    "float32 weights (KILN_CPU_ISA=plain forces the plain C step)",
                    c_loader.machine_summary())
        return False
    return True


def c_step_plan() -> ComputePlan:
    """The plan of a model every step of which runs in the CPU step (float32 on the CPU, every
    projection and the head packed). Needs no torch: the torch-free C engine's plan too."""
    sampler: Impl = "c" if c_library_available() else "torch"
    return ComputePlan(device="cpu", dtype="float32", weights="packed", step="c", attention="c",
                       sampler=sampler, lora="c", grammar_mask=sampler, kv_layout="heads-major",
                       kv_dtype="float32", cpu_isa=cpu_isa())


def model_plan(device: torch.device, dtype: torch.dtype, *, packed: bool, c_step: bool
               ) -> ComputePlan:
    """The plan of a loaded model: ``packed`` (some weights kept as packed blocks), ``c_step``
    (every projection and the head packed: the CPU step can run every step). The KV cache's
    element type is the model's until :func:`with_kv_cache`."""
    cuda = device.type == "cuda"
    cpu = device.type == "cpu"
    if c_step and cpu:
        return replace(c_step_plan(), dtype=_name(dtype), kv_dtype=_name(dtype))
    gpu_or_torch: Impl = "triton" if cuda else "torch"
    sampler: Impl = "c" if cpu and c_library_available() else gpu_or_torch
    return ComputePlan(
        device=str(device), dtype=_name(dtype),
        weights="dense+packed" if packed else "dense", step="torch", attention=gpu_or_torch,
        sampler=sampler, lora=gpu_or_torch,
        grammar_mask=sampler,  # the masks go where the sampler runs, by the same rule
        kv_layout="contiguous", kv_dtype=_name(dtype),
        cpu_isa=cpu_isa() if sampler == "c" or packed else "none")


def without_packed(plan: ComputePlan) -> ComputePlan:
    """``plan`` with float32 weights only and the torch path (``packed_disabled``)."""
    torch_impl: Impl = plan.torch_attention
    return replace(plan, weights="dense", step="torch", attention=torch_impl,
                   lora=plan.torch_lora)


def with_kv_cache(plan: ComputePlan, kv_cache_dtype: str) -> ComputePlan:
    """``plan`` with the engine's KV cache element type: ``auto`` (the model's dtype) or
    ``float16``, which the CPU kernels read (the CPU only)."""
    if kv_cache_dtype == "auto":
        return plan
    if not plan.device.startswith("cpu"):
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype} is supported on the CPU only "
                         f"(device {plan.device.split(':')[0]})")
    return replace(plan, kv_dtype=kv_cache_dtype)


def _name(dtype: torch.dtype) -> str:
    """The plan's name of a torch dtype (``torch.float32`` -> ``"float32"``)."""
    return str(dtype).removeprefix("torch.")
