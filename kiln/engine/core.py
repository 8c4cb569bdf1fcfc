"""What an engine is built of for a loaded model: its scheduler and its runner (one ``Runner``:
``Runner.for_c_model`` for a ``LoadedCModel``, ``Runner.for_torch_model`` for a torch
``LoadedModel``; the KV cache allocated there), and the draft model of
``--speculative-config``'s ``draft_model`` (``kiln.engine.draft_model``). ``kiln.engine.loop`` runs them. Imports no
torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln.engine.config import EngineConfig, context_length
from kiln.engine.runner import Runner
from kiln.engine.scheduler import Scheduler

if TYPE_CHECKING:
    from kiln.model.loader import Loaded

__all__ = ["build_core"]


def build_core(loaded: Loaded, config: EngineConfig) -> tuple[Scheduler, Runner]:
    """The scheduler and runner for ``loaded`` (KV cache allocated here)."""
    from kiln.model.loader import LoadedModel

    if isinstance(loaded, LoadedModel):
        runner = Runner.for_torch_model(loaded.model, loaded.config, config, loaded.dtype,
                                        loaded.device, tokenizer=loaded.tokenizer)
    else:
        runner = Runner.for_c_model(loaded.model, config, tokenizer=loaded.tokenizer)
    max_len = context_length(config, loaded.config.max_position)
    scheduler = Scheduler(config, runner.num_blocks, max_len, loaded.tokenizer.eos_token_ids)
    spec = config.speculative
    if spec is not None and spec.method == "draft_model" and spec.model is not None:
        from kiln.engine.draft_model import load_drafter

        scheduler.speculation.drafter = load_drafter(
            spec.model, config, loaded.tokenizer.backend.get_vocab(with_added_tokens=True),
            max_len)
    return scheduler, runner
