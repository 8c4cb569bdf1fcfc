"""What a checkpoint can be refused for: the model it describes, or the tensors it holds."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The checkpoint describes a model this server cannot run."""


class WeightLoadError(ValueError):
    """The checkpoint's tensors do not fit the model its config describes."""
