"""A request's LoRA mix as the scheduler sees it (pure Python, never imports torch).

A mix is ``((adapter, scale), ...)``; the adapter objects are opaque here (anything with a
``content_sha256`` and a ``rank``, e.g. ``kiln.model.lora.LoraAdapter``). The mix is a sum
(``y = Wx + sum scale_i * (alpha_i/r_i) * B_i A_i x``), so its identity ignores order: A+B and
B+A are the same mix, and so share prefix-cache blocks; any other difference (content, scale)
gives a different KV cache.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable, Sequence
from typing import Protocol

from kiln.engine.block_pool import ROOT_HASH

MAX_MIX_ENTRIES = 16  # entries of one request's adapter composition: the one owner of the limit


class LoraAdapterLike(Protocol):
    """What the engine needs to know about an adapter without touching its weights."""

    @property
    def content_sha256(self) -> str: ...

    @property
    def rank(self) -> int: ...


LoraMix = tuple[tuple[LoraAdapterLike, float], ...]


def mix_identity(mix: Sequence[tuple[LoraAdapterLike, float]]) -> tuple[tuple[str, float], ...]:
    """The order-free identity of a mix: ``(content_sha256, scale)`` pairs, sorted."""
    return tuple(sorted((a.content_sha256, float(s)) for a, s in mix))


def mix_root_hash(mix: Sequence[tuple[LoraAdapterLike, float]]) -> int:
    """The parent hash of a request's first KV block: ROOT_HASH for the base model, else a
    stable 63-bit hash of the mix's identity (never ROOT_HASH), so no KV is shared between
    different mixes, while requests with the same mix (in any order) share."""
    if not mix:
        return ROOT_HASH
    h = hashlib.sha256(b"kiln-lora-mix-v1\0")
    for sha, scale in mix_identity(mix):
        h.update(sha.encode("utf-8"))
        h.update(b"\0")
        h.update(struct.pack("<d", scale + 0.0))  # + 0.0: -0.0 and 0.0 are the same scale
    value = int.from_bytes(h.digest()[:8], "little") >> 1
    return value if value != ROOT_HASH else 1


def adapter_keys(mix: Sequence[tuple[LoraAdapterLike, float]]) -> frozenset[str]:
    """The distinct adapters (content hashes) of a mix: the device slots it occupies."""
    return frozenset(a.content_sha256 for a, _ in mix)


class AdapterAdmission:
    """Device slots during one admission pass: the running requests' adapters stay resident; a
    request that would need more than `max_slots` waits, and once one waits, later requests may
    bring no new adapter (they must not take the slot it is waiting for)."""

    def __init__(self, running: Iterable[Sequence[tuple[LoraAdapterLike, float]]],
                 max_slots: int) -> None:
        self.keys: set[str] = {k for mix in running for k in adapter_keys(mix)}
        self.max_slots = max_slots
        self.blocked = False

    def admits(self, mix: Sequence[tuple[LoraAdapterLike, float]]) -> bool:
        new = adapter_keys(mix) - self.keys
        if new and (self.blocked or len(self.keys) + len(new) > self.max_slots):
            self.blocked = True
            return False
        return True

    def add(self, mix: Sequence[tuple[LoraAdapterLike, float]]) -> None:
        self.keys |= adapter_keys(mix)


def mix_entries_problem(scales: Sequence[object]) -> str | None:
    """Why a mix with these scales (one per entry) is malformed whatever its adapters are: more
    than MAX_MIX_ENTRIES entries, or a scale that is not a finite number; None when it is not."""
    if len(scales) > MAX_MIX_ENTRIES:
        return f"A LoRA mix has at most {MAX_MIX_ENTRIES} entries, got {len(scales)}."
    for scale in scales:
        if isinstance(scale, bool) or not isinstance(scale, int | float) \
                or not math.isfinite(scale):
            return f"A LoRA scale must be a finite number, got {scale!r}."
    return None


def check_mix(mix: Sequence[tuple[LoraAdapterLike, float]], max_slots: int,
              max_rank: int) -> str | None:
    """Why ``mix`` can never run on an engine with ``max_slots`` adapter slots of rank at most
    ``max_rank``, or None when it can."""
    problem = mix_entries_problem([scale for _, scale in mix])
    if problem is not None:
        return problem
    for adapter, _ in mix:
        if adapter.rank > max_rank:
            return f"An adapter has rank {adapter.rank}; the server accepts at most {max_rank}."
    distinct = len(adapter_keys(mix))
    if distinct > max_slots:
        return (f"The request uses {distinct} distinct adapters; the server runs at most "
                f"{max_slots} at once.")
    return None
