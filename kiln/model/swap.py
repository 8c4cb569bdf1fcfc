"""New weights from disk, loaded beside the serving ones (SGLang's /update_weights_from_disk).

``load_beside`` reads a checkpoint — an HF folder or a GGUF, any format ``load_model`` loads —
on the calling thread (the backend runs it on a thread of its own, so the engine keeps serving
while it reads), checks that it can take the serving model's place, and returns it with its
name (the caller's version, else its content hash) and its policy identity. It changes nothing:
the swap is the engine's, between two steps (``AsyncEngine.update_weights``), so a checkpoint
refused here — another architecture or shapes, a bad or truncated file — leaves the old weights
serving untouched.

An update changes the weights only: the tokenizer, the chat template, the sampling defaults (a
folder's generation_config.json) and the adapters stay the serving model's. What must match:
the model config (architecture, every shape, rotary and norm constants) and, for a torch model, its dtype. A model
whose compute plan lays the KV cache out otherwise (an HF folder the torch path runs, replacing
a GGUF the C step runs) gets a runner of its own (``NewWeights.fresh_runner``), which no request
can continue on (the backend refuses mode keep for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.model.loader import Loaded, LoadedModel, load_model
from kiln.provenance import PolicyIdentity, base_model_sha256, weight_files
from kiln.weight_update import WeightUpdateError


@dataclass(frozen=True)
class NewWeights:
    """A checkpoint loaded and checked, ready to swap in."""

    loaded: Loaded
    version: str
    model: Any  # what the engine's runner swaps in: a CModel or a CausalLM
    identity: PolicyIdentity | None
    # its compute plan lays the KV cache out otherwise than the serving one: it needs a runner
    # (and cache) of its own, so no request may hold KV across the swap (not mode keep)
    fresh_runner: bool = False


def config_differences(serving: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The model-config fields whose values differ, as ``name: serving -> new``."""
    names = sorted(set(serving) | set(new))
    return [f"{n}: {serving.get(n)!r} -> {new.get(n)!r}" for n in names
            if serving.get(n) != new.get(n)]


def load_beside(serving: Loaded, path: str, *, version: str | None, torch_free: bool,
                kv_layout: str, dtype: str | None, device: str | None, quant_kernels: bool,
                identity: Any) -> NewWeights:
    """Load ``path`` for ``serving``'s place. ``torch_free``: the serving runner runs the C
    step without torch (a GGUF then loads as a ``CModel``); ``kv_layout``: the serving KV
    cache's layout; ``quant_kernels``: the setting ``load_model`` takes; ``identity(loaded) ->
    PolicyIdentity | None`` hashes the new files (its ``base_model_sha256`` names the weights
    when ``version`` is None). Raises WeightUpdateError (nothing loaded stays referenced)."""
    file = Path(path).expanduser()
    if not file.exists():
        raise WeightUpdateError(f"model_path {path!r} does not exist")
    try:
        new = load_model(str(file), dtype=dtype, device=device, torch_free=torch_free,
                         quant_kernels=quant_kernels, served_model_name=serving.served_name)
    except Exception as exc:  # a bad, truncated or unknown file: its loader's own words
        raise WeightUpdateError(f"cannot load {path!r}: {exc}") from None
    diff = config_differences(serving.config.record(), new.config.record())
    if diff:
        raise WeightUpdateError(
            f"{path!r} is not the serving model's architecture and shapes ({'; '.join(diff)})")
    model: Any = new.model
    if isinstance(new, LoadedModel):
        if new.dtype_name != serving.dtype_name:
            raise WeightUpdateError(f"{path!r} loads as {new.dtype_name}, the serving weights "
                                    f"are {serving.dtype_name}")
    fresh = isinstance(new, LoadedModel) and new.model.plan.kv_layout != kv_layout
    ident = identity(new)
    if version is None:
        version = ident.base_model_sha256 if ident is not None else \
            base_model_sha256(weight_files(file))
    return NewWeights(loaded=new, version=version, model=model, identity=ident,
                      fresh_runner=fresh)
