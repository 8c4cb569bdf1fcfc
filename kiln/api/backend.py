"""The port between the HTTP edge and whatever serves the model.

`kiln serve` plugs in `kiln.serving.EngineBackend` (the real engine); tests plug in a double that
lives under `tests/`. The edge never imports torch, so this module only names pure-Python types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kiln.adapters import AdapterStore
from kiln.engine.outputs import PositionScore, RequestStream
from kiln.engine.request import Request
from kiln.provenance import PolicyIdentity
from kiln.weight_update import WeightUpdate

__all__ = ["Backend", "ChatTemplatePort", "PositionScore", "TokenizerPort"]


class TokenizerPort(Protocol):
    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def surely_over(self, text: str, tokens: int) -> bool:
        """True only if ``text`` certainly encodes to more than ``tokens`` tokens (cheap)."""
        ...


class ChatTemplatePort(Protocol):
    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[Any] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str: ...


class Backend(Protocol):
    @property
    def model_id(self) -> str: ...

    @property
    def aliases(self) -> tuple[str, ...]: ...

    @property
    def created(self) -> int: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def tokenizer(self) -> TokenizerPort: ...

    @property
    def chat_template(self) -> ChatTemplatePort: ...

    @property
    def generation_config(self) -> dict[str, Any]:
        """The model's generation_config.json ({} for a GGUF): its sampling defaults."""
        ...

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def health(self) -> str:
        """"ok" (serving), "loading", or "error" (the engine cannot serve)."""
        ...

    def compute_plan(self) -> dict[str, str] | None:
        """The served model's compute plan (kiln.model.native.plan) as strings; None while
        loading."""
        ...

    async def score(
        self, prompt_ids: list[int], top_k: int, lora: tuple[tuple[Any, float], ...] = ()
    ) -> list[PositionScore]:
        """One entry per prompt position >= 1: the observed token's log-softmax value and
        full-vocabulary rank, and the top-k ids by raw logit (ties to the lower id); under the
        adapter mix `lora` when one is given."""
        ...

    @property
    def adapter_store(self) -> AdapterStore | None:
        """The adapter directory, or None when the server has none."""
        ...

    async def prepare_lora(self, mix: list[tuple[str, float]]) -> tuple[tuple[Any, float], ...]:
        """Load the named adapters for one request (raises InvalidAdapterName, AdapterNotFound,
        ValueError for an adapter that does not fit the model, or EngineError). The loading runs
        on the engine's thread: the server's torch work stays on one thread."""
        ...

    def submit(self, request: Request) -> RequestStream:
        """Admit `request` (raising kiln.engine.errors.EngineError on failure) and stream its
        outputs until one is `finished`. Closing the stream early aborts the request."""
        ...

    def abort(self, request_id: str) -> None: ...

    def abort_all(self, message: str) -> None:
        """End every engine request with "abort" and this error (the drain ran out)."""
        ...

    def stats(self) -> dict[str, float]: ...

    async def pause(self, mode: str) -> int:
        """Pause scheduling between steps (abort | wait | keep); the number aborted."""
        ...

    async def resume(self) -> None: ...

    async def reset_prefix_cache(self) -> int:
        """Forget every cached prefix block; how many were forgotten."""
        ...

    async def sleep(self, level: int = 1) -> tuple[int, int]:
        """Abort everything, hold new requests, give the KV cache's memory back (level 2: the
        weights' too): (requests aborted, KV bytes released). ``wake_up`` wakes it."""
        ...

    async def wake_up(self) -> None:
        """Serve again after ``sleep`` (level 2: the weights read again first)."""
        ...

    @property
    def weight_version(self) -> str:
        """The name of the weights serving now (--weight-version, or an update's)."""
        ...

    async def update_weights(self, model_path: str, version: str | None, mode: str,
                             timeout_s: float) -> WeightUpdate:
        """Load ``model_path`` beside the serving weights and swap it in (abort | wait | keep);
        raises WeightUpdateError / WeightUpdateBusy / WeightUpdateTimeout, changing nothing."""
        ...

    def identity(self) -> dict[str, str]:
        """Content hashes of the model, tokenizer and template (for fingerprints)."""
        ...

    def policy_identity(self, version: str | None = None) -> PolicyIdentity | None:
        """Content-addressed identity for rollout provenance of the weights named ``version``
        (None: those serving now); None when it cannot be had."""
        ...
