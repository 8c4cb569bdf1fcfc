"""The compute plan (kiln.model.native.plan): one decision per model, read by every caller."""

from __future__ import annotations

import logging

import pytest
import torch
from kiln_kernels.cpu import available as kernels_available

from kiln.engine.config import EngineConfig
from kiln.engine.loop import build_core
from kiln.model import LoadedModel
from kiln.model.devices import resolve_dtype
from kiln.model.native.plan import (
    ComputePlan,
    model_plan,
    pack_weights,
    with_kv_cache,
    without_packed,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_plan_names_one_implementation_per_part() -> None:
    c = model_plan(CPU, torch.float32, packed=True, c_step=True)
    if kernels_available():
        assert (c.weights, c.step, c.attention, c.lora, c.kv_layout, c.sampler) == (
            "packed", "c", "c", "c", "heads-major", "c")
    dense = model_plan(CPU, torch.float32, packed=False, c_step=False)
    assert (dense.weights, dense.step, dense.attention, dense.lora, dense.kv_layout) == (
        "dense", "torch", "torch", "torch", "contiguous")
    assert model_plan(CPU, torch.float32, packed=True, c_step=False).weights == "dense+packed"
    gpu = model_plan(CUDA, torch.bfloat16, packed=False, c_step=False)
    assert (gpu.step, gpu.attention, gpu.sampler, gpu.lora, gpu.dtype, gpu.kv_dtype) == (
        "torch", "triton", "triton", "triton", "bfloat16", "bfloat16")
    assert (c.grammar_mask, dense.grammar_mask, gpu.grammar_mask) == ("c", "c", "triton")
    assert model_plan(torch.device("meta"), torch.float32, packed=False,
                      c_step=False).grammar_mask == "torch"
    # c_step on a GPU cannot be: the C step is a CPU program
    assert model_plan(CUDA, torch.float32, packed=True, c_step=True).step == "torch"


def test_torch_only_and_kv_cache_variants() -> None:
    c = model_plan(CPU, torch.float32, packed=True, c_step=True)
    off = without_packed(c)
    assert (off.weights, off.step, off.attention, off.lora) == ("dense", "torch", "torch", "torch")
    assert with_kv_cache(c, "auto") is c
    assert with_kv_cache(c, "float16").kv_dtype == "float16"
    with pytest.raises(ValueError, match="CPU only"):
        with_kv_cache(model_plan(CUDA, torch.bfloat16, packed=False, c_step=False), "float16")


def test_switches_come_in_as_arguments() -> None:
    assert not pack_weights(torch.float32, CPU, quant_kernels=False)
    assert not pack_weights(torch.bfloat16, CPU, quant_kernels=True)
    assert not pack_weights(torch.float32, CUDA, quant_kernels=True)
    assert pack_weights(torch.float32, CPU, quant_kernels=True) == kernels_available()
    assert resolve_dtype(None, CUDA) == torch.bfloat16 and resolve_dtype("auto", CPU) == torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int8", CPU)


def test_the_runner_logs_its_plan_once_in_one_line(smollm: LoadedModel,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kiln.engine"):
        _, runner = build_core(smollm, EngineConfig(block_size=16, num_blocks=8,
                                                    kv_cache_dtype="float16"))
    lines = [r.getMessage() for r in caplog.records if "compute plan" in r.getMessage()]
    assert lines == [runner.plan.line()] and "\n" not in lines[0]
    assert runner.plan.kv_dtype == "float16" and runner.torch_kv.dtype == torch.float16
    assert runner.plan == with_kv_cache(smollm.model.plan, "float16")
    assert isinstance(runner.plan, ComputePlan)
    assert runner.torch_kv.heads_major == (runner.plan.kv_layout == "heads-major")
    assert set(runner.plan.as_dict()) == {"device", "dtype", "weights", "step", "attention",
                                          "sampler", "lora", "grammar_mask", "kv_layout",
                                          "kv_dtype", "cpu_isa"}


@pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")
def test_the_plan_names_the_isa_and_owns_the_no_vector_build_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """cpu_isa names the layer's build; where the CPU has no vector build (plain found by
    itself) the weights stay float32 on the torch path, unless KILN_CPU_ISA forced plain."""
    from kiln_kernels.cpu import loader

    from kiln.model.native import plan as plan_mod
    from kiln.model.native.early_tiles import tiles_will_be_held

    assert model_plan(CPU, torch.float32, packed=True, c_step=True).cpu_isa == \
        loader.chosen_isa()
    assert model_plan(CUDA, torch.bfloat16, packed=False, c_step=False).cpu_isa == "none"
    monkeypatch.setattr(loader, "chosen_isa", lambda environ=None: "plain")
    monkeypatch.delenv("KILN_CPU_ISA", raising=False)
    assert plan_mod.c_step_isa() is None
    assert not pack_weights(torch.float32, CPU, quant_kernels=True)
    assert not tiles_will_be_held("cpu", None, True)  # the start-up guess agrees
    monkeypatch.setenv("KILN_CPU_ISA", "plain")
    assert plan_mod.c_step_isa() == "plain"
    assert pack_weights(torch.float32, CPU, quant_kernels=True)
    assert tiles_will_be_held("cpu", None, True)
