"""Drafts from a draft model (``--speculative-config '{"method": "draft_model", "model": PATH}'``):
a smaller model with the target's tokenizer proposes each drafting request's next tokens,
greedily, and the target verifies them (``kiln.engine.speculative``: what is kept is what plain
decoding makes, so the draft's numbers never reach an output; only how many tokens a step keeps
depends on them).

The draft model is a C model (a GGUF the CPU step runs whole, loaded without torch) with a KV
cache of its own: each request keeps its blocks and how many of its tokens the cache holds (the
tokens it was last fed; the positions of its rejected drafts are written over when it is fed
the tokens actually made). One call drafts for every drafting request of a step: the new
tokens of all of them in one C step, then one row each per further draft token.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy

from kiln.engine.config import EngineConfig, kv_blocks
from kiln.model.native.c_model import CModel

log = logging.getLogger("kiln.engine")


@dataclass
class _Held:
    """A request's part of the draft cache: its blocks, and how many of its tokens they hold."""

    blocks: list[int] = field(default_factory=list)
    cached: int = 0


class ModelDrafter:
    """The draft model, its KV cache and each drafting request's place in it (engine thread)."""

    def __init__(self, model: CModel, config: EngineConfig, max_position: int) -> None:
        from kiln_kernels.cpu import threads

        self.model = model
        self.block_size = config.block_size
        # positions past the draft model's own context are not drafted
        self.max_position = min(max_position, int(model.config.max_position))
        dtype = "float32"
        per_block = model.bytes_per_block(config.block_size, dtype)
        self.num_blocks = kv_blocks(config, per_block, self.max_position)
        k, v = model.kv_arrays(self.num_blocks, config.block_size, dtype)
        self._kv = (k, v)
        self.program = model.bind(k, v)
        self.threads = threads()
        self._free = list(range(self.num_blocks - 1, -1, -1))
        self._held: dict[str, _Held] = {}
        self.vocab = int(model.config.vocab_size)

    def forget(self, request_id: str) -> None:
        """A finished request: its draft blocks go back."""
        held = self._held.pop(request_id, None)
        if held is not None:
            self._free.extend(held.blocks)

    def _room(self, request_id: str, tokens: int) -> _Held | None:
        """The request's part, with blocks for ``tokens`` positions (None: the cache is full;
        that request does not draft this step)."""
        held = self._held.setdefault(request_id, _Held())
        need = -(-tokens // self.block_size) - len(held.blocks)
        if need > len(self._free):
            return None
        for _ in range(max(0, need)):
            held.blocks.append(self._free.pop())
        return held

    def propose(self, wants: Sequence[tuple[str, Sequence[int], int]]) -> dict[str, list[int]]:
        """Up to ``k`` greedy draft tokens after each ``(request_id, tokens, k)``'s ``tokens``
        (the request's prompt and output so far)."""
        rows: list[tuple[str, _Held, list[int], int, int]] = []  # id, part, new, start, k
        for rid, tokens, k in wants:
            if k <= 0 or not tokens or len(tokens) + k > self.max_position:
                continue
            held = self._room(rid, len(tokens) + k)
            if held is None:
                continue
            if held.cached >= len(tokens):  # (never: a running request's tokens only grow)
                held.cached = 0
            rows.append((rid, held, list(tokens[held.cached:]), held.cached, k))
        if not rows:
            return {}
        out: dict[str, list[int]] = {rid: [] for rid, *_ in rows}
        seqs = [(new, start, held.blocks) for _, held, new, start, _ in rows]
        active = list(range(len(rows)))
        while active:
            logits = self.model.forward(self.program, [seqs[i] for i in active], "last",
                                        self.threads)
            picked = numpy.argmax(logits, axis=1).tolist()
            still: list[int] = []
            for j, i in enumerate(active):
                rid, held, _, _, k = rows[i]
                token = int(picked[j])
                out[rid].append(token)
                _, start, blocks = seqs[i]
                if len(out[rid]) < k:
                    seqs[i] = ([token], start + len(seqs[i][0]), blocks)
                    still.append(i)
            active = still
        for _, held, new, start, _ in rows:
            held.cached = start + len(new)  # the real tokens; the drafts' positions are scratch
        return out


def load_drafter(path: str, config: EngineConfig, target_vocab: dict[str, int],
                 max_position: int) -> ModelDrafter:
    """The draft model at ``path`` (``load_model``'s locations), checked against the target:
    a GGUF the CPU step runs whole, with the target's vocabulary. ValueError naming
    ``--speculative-config`` otherwise."""
    from kiln.model import load_model
    from kiln.model.loader import LoadedCModel

    try:
        loaded = load_model(path, device="cpu", torch_free=True)
    except Exception as exc:  # a start-up error, named for the flag
        raise ValueError(f"--speculative-config model {path!r} cannot be loaded: {exc}") \
            from None
    if not isinstance(loaded, LoadedCModel):
        raise ValueError(f"--speculative-config model {path!r} is not a GGUF the CPU step runs "
                         "whole (a draft model runs without torch)")
    vocab = loaded.tokenizer.backend.get_vocab(with_added_tokens=True)
    if vocab != target_vocab:
        raise ValueError(f"--speculative-config model {path!r} has another tokenizer than the "
                         "served model (a draft model needs the same vocabulary)")
    drafter = ModelDrafter(loaded.model, config, max_position)
    log.info("draft model %s: %d KV blocks of its own", loaded.served_name, drafter.num_blocks)
    return drafter


__all__ = ["ModelDrafter", "load_drafter"]
