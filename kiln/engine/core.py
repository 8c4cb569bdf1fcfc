"""What an engine is built of for a loaded model: its scheduler and its runner (the torch-free
``CRunner`` for a ``LoadedCModel``, else the torch ``ModelRunner``; the KV cache allocated
there). ``kiln.engine.loop`` runs them. Imports no torch: the runner's module is
imported when one is built."""

from __future__ import annotations

from typing import TYPE_CHECKING, overload

from kiln.engine.config import EngineConfig, context_length
from kiln.engine.scheduler import Scheduler

if TYPE_CHECKING:
    from kiln.engine.c_runner import CRunner
    from kiln.engine.runner import ModelRunner
    from kiln.model.loader import Loaded, LoadedCModel, LoadedModel

__all__ = ["build_core"]


@overload
def build_core(loaded: LoadedModel, config: EngineConfig) -> tuple[Scheduler, ModelRunner]: ...


@overload
def build_core(loaded: LoadedCModel, config: EngineConfig) -> tuple[Scheduler, CRunner]: ...


@overload
def build_core(loaded: Loaded, config: EngineConfig
               ) -> tuple[Scheduler, ModelRunner | CRunner]: ...


def build_core(loaded: Loaded, config: EngineConfig
               ) -> tuple[Scheduler, ModelRunner | CRunner]:
    """The scheduler and model runner for ``loaded`` (KV cache allocated here): the torch-free
    ``CRunner`` for a model loaded without torch (``LoadedCModel``), else the ``ModelRunner``."""
    from kiln.model.loader import LoadedModel

    runner: ModelRunner | CRunner
    if isinstance(loaded, LoadedModel):
        from kiln.engine.runner import ModelRunner

        runner = ModelRunner(loaded.model, loaded.config, config, loaded.dtype, loaded.device,
                             tokenizer=loaded.tokenizer)
    else:
        from kiln.engine.c_runner import CRunner

        runner = CRunner(loaded.model, config, tokenizer=loaded.tokenizer)
    max_len = context_length(config, loaded.config.max_position)
    return Scheduler(config, runner.num_blocks, max_len, loaded.tokenizer.eos_token_ids), runner
