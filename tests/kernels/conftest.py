"""Shared fixtures for the kernel tests.

Triton comparisons run natively on CUDA, or on the CPU under ``TRITON_INTERPRET=1`` (the Makefile
sets it); with neither they are skipped.
"""

from __future__ import annotations

import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def triton_device() -> str:
    """Device for Triton launches: cuda natively, else cpu under the interpreter, else skip."""
    if HAS_CUDA and not INTERPRET:
        return "cuda"
    if INTERPRET:
        return "cpu"
    pytest.skip("Triton needs CUDA or TRITON_INTERPRET=1")


@pytest.fixture
def cuda_device() -> str:
    if not HAS_CUDA:
        pytest.skip("needs CUDA")
    return "cuda"
