"""What the engine loop (``kiln.engine.loop``) asks of the runner that executes its steps: one
protocol with every member the loop uses, so that mypy checks each runner against it and a
renamed member fails there, not at a ``getattr`` default. ``Runner`` (``runner.py``)
implements it; the tests' doubles take the defaults of an executor without a model (``tests/engine/fakes.py``). Imports no torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from kiln.engine.lora_mix import LoraMix
from kiln.engine.outputs import ModelRunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from kiln.engine.block_pool import BlockPool
    from kiln.engine.scoring import ScoringJob
    from kiln.model.native.plan import ComputePlan


class Executor(Protocol):
    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Run one scheduled step and sample its rows."""
        ...

    @property
    def plan(self) -> ComputePlan | None:
        """The compute plan (``/health``), or None for an executor without a model."""
        ...

    @property
    def kv_bytes_per_block(self) -> int | None:
        """The KV cache's bytes per block (all layers, K and V), or None without one."""
        ...

    @property
    def kv_on_demand(self) -> bool:
        """Whether the KV cache's memory becomes resident only as blocks are first written."""
        ...

    @property
    def verifies_drafts(self) -> bool:
        """Whether a step's drafted decodes are verified (``kiln.engine.speculative``)."""
        ...

    def release(self, request_ids: list[str]) -> None:
        """Finished requests: drop their per-request state (grammar matchers)."""
        ...

    def release_kv(self) -> int:
        """Give the KV cache's memory back (sleep); the bytes released."""
        ...

    def drop_weights(self) -> None:
        """Sleep level 2: let go of the model until ``swap_weights`` gives one back."""
        ...

    def swap_weights(self, model: Any) -> None:
        """Serve ``model`` (same architecture and shapes) from the next step on."""
        ...

    def scoring_job(self, pool: BlockPool, prompt_ids: Sequence[int], top_k: int,
                    mix: LoraMix = ()) -> ScoringJob:
        """A prompt-scoring job over this executor's model and KV cache."""
        ...
