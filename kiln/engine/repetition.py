"""vLLM's repetition_detection: end an output whose tail repeats one token pattern.

An output stops (finish_reason "stop", stop_reason ``REPETITION``) once its last
``pattern_len * min_count`` tokens are ``min_count`` copies of one ``pattern_len``-token pattern,
for some ``pattern_len`` from ``min_pattern_size`` to ``max_pattern_size``. No torch: the
scheduler checks it after each token, beside EOS and the stop token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["REPETITION", "RepetitionDetection", "repeats"]

REPETITION = "repetition_detected"  # the stop_reason of an output ended by it


MIN_PATTERN_SIZE = 1  # the smallest pattern, and the fewest copies, a rule can ask for
MIN_COUNT = 2


@dataclass(frozen=True)
class RepetitionDetection:
    max_pattern_size: int
    min_count: int
    min_pattern_size: int = 1

    def __post_init__(self) -> None:
        if not MIN_PATTERN_SIZE <= self.min_pattern_size <= self.max_pattern_size:
            raise ValueError(f"need {MIN_PATTERN_SIZE} <= min_pattern_size <= max_pattern_size")
        if self.min_count < MIN_COUNT:
            raise ValueError(f"min_count must be at least {MIN_COUNT}")


def _tail_repeats(tokens: Sequence[int], size: int, count: int) -> bool:
    end = len(tokens)
    last = tokens[end - size:]
    return all(tokens[end - size * (m + 1):end - size * m] == last for m in range(1, count))


def repeats(tokens: Sequence[int], rule: RepetitionDetection) -> bool:
    """Whether ``tokens`` end with ``rule.min_count`` copies of one pattern of an allowed size."""
    seq = list(tokens[max(0, len(tokens) - rule.max_pattern_size * rule.min_count):])
    for size in range(rule.min_pattern_size, rule.max_pattern_size + 1):
        if size * rule.min_count > len(seq):
            return False
        if _tail_repeats(seq, size, rule.min_count):
            return True
    return False
