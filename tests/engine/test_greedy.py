"""One greedy predicate (docs/behavior.md §5.2): the handlers, the engine's sampler and the
kernels agree on which rows take the argmax."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kiln_kernels.sampling import reference

from kiln.engine.request import GREEDY_TEMPERATURE, SamplingParams, is_greedy

SAMPLE_C = Path(reference.__file__).parent.parent / "cpu" / "sampling" / "sample.c"


def test_the_threshold_is_the_kernels() -> None:
    assert GREEDY_TEMPERATURE == reference.GREEDY_TEMPERATURE
    define = re.search(r"#define GREEDY_TEMPERATURE ([0-9.e+-]+)f", SAMPLE_C.read_text())
    assert define is not None
    assert float(define.group(1)) == GREEDY_TEMPERATURE


@pytest.mark.parametrize(("temperature", "top_k", "greedy"), [
    (0.0, 0, True), (-1.0, 0, True), (1e-6, 0, True), (-0.0, 5, True),
    (1e-5, 0, False), (0.7, 0, False), (0.7, 2, False),
    (0.7, 1, True), (2.0, 1, True),
])
def test_greedy_rows(temperature: float, top_k: int, greedy: bool) -> None:
    assert is_greedy(temperature, top_k) is greedy
    assert SamplingParams(temperature=temperature, top_k=top_k).greedy is greedy
