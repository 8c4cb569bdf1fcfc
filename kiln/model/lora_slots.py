"""Batched multi-adapter LoRA: adapter weights stacked in device slots, and per-batch row plans.

:class:`AdapterSlots` keeps up to ``max_slots`` adapters resident, stacked per module across
layers (``A [L, S+1, r_max, in]``, ``B [L, S+1, out, r_max]``; each adapter zero-padded to
``r_max``; slot ``S`` stays all-zero), keyed by content hash and evicted least-recently-used.

:class:`LoraBatch` (what goes in ``ForwardBatch.lora``) gives each token row up to K
``(slot, scale * alpha / r)`` pairs: a request composing adapters ``[(a1, s1), (a2, s2)]`` uses
positions 0 and 1, so ``y = Wx + sum_k scale_k * B_k A_k x`` with each source's own alpha / r.
Rows with different mixes share one forward pass; each composition position is one shrink +
expand. On CUDA that is the Triton SGMV pair in ``kiln_kernels.lora``. On the CPU two
plain-torch strategies chosen per position when the batch is built: a per-row gather + ``bmm``
(decode: one row per request, no host work per row) or one ``addmm`` per run of rows sharing an
adapter (prefill: long runs, no per-row weight copies).

Used from the engine thread only; not thread-safe.
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from types import TracebackType
from typing import Literal

import torch

from kiln.model.checkpoint.config import ModelConfig
from kiln.model.lora import LoraAdapter, module_shape

AdapterRef = LoraAdapter | str  # an adapter, or the content hash of a registered/resident one


class LoraCapacityError(RuntimeError):
    """The batch needs more adapters than there are slots, or a rank above ``max_rank``."""


class AdapterSlots:
    """Device-resident stacks of up to ``max_slots`` adapters, LRU-evicted, keyed by content."""

    def __init__(self, cfg: ModelConfig, max_slots: int = 8, *, max_rank: int = 256,
                 dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", triton: bool = False) -> None:
        if max_slots <= 0 or max_rank <= 0:
            raise ValueError("AdapterSlots: max_slots and max_rank must be positive")
        self.cfg = cfg
        self.max_slots = max_slots
        self.max_rank = max_rank
        self.dtype = dtype
        self.device = torch.device(device)
        self.triton = triton  # the SGMV kernels (the compute plan's lora on CUDA): their layout
        self.zero_slot = max_slots  # an always-zero slot (rows without an adapter, CPU path)
        self.rank = 0  # current r_max of the stacks
        self.loads = 0
        self.evictions = 0
        self._stacks: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._lru: OrderedDict[str, int] = OrderedDict()  # resident key -> slot, oldest first
        self._slot_info: dict[int, tuple[float, int]] = {}  # slot -> (scaling, rank)
        self._free = list(range(max_slots - 1, -1, -1))
        self._pins = [0] * max_slots
        self._known: weakref.WeakValueDictionary[str, LoraAdapter] = (
            weakref.WeakValueDictionary())

    def register(self, adapter: LoraAdapter) -> str:
        """Make ``adapter`` addressable by its key (content hash) while it is alive."""
        self._known[adapter.content_sha256] = adapter
        return adapter.content_sha256

    def resident(self) -> list[str]:
        """Keys of resident adapters, least recently used first."""
        return list(self._lru)

    def slot_of(self, key: str) -> int | None:
        return self._lru.get(key)

    def stacks(self, module: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(A [L, S+1, r, in], B [L, S+1, out, r])`` of ``module``; None if no resident
        adapter ever targeted it."""
        return self._stacks.get(module)

    def acquire(self, ref: AdapterRef) -> tuple[int, float, int]:
        """Make the adapter resident and pin it; returns ``(slot, alpha/r scaling, rank)``."""
        key = ref.content_sha256 if isinstance(ref, LoraAdapter) else ref
        if isinstance(ref, LoraAdapter):
            self.register(ref)
        slot = self._lru.get(key)
        if slot is None:
            adapter = self._known.get(key)
            if adapter is None:
                raise KeyError(f"adapter {key!r} is neither resident nor registered")
            if adapter.rank > self.max_rank:
                raise LoraCapacityError(
                    f"adapter {adapter.name!r} has rank {adapter.rank} > max_rank "
                    f"{self.max_rank}")
            slot = self._take_slot()
            self._write(slot, adapter)
            self._lru[key] = slot
        else:
            self._lru.move_to_end(key)
        self._pins[slot] += 1
        scaling, rank = self._slot_info[slot]
        return slot, scaling, rank

    def release(self, slot: int) -> None:
        if self._pins[slot] <= 0:
            raise RuntimeError(f"slot {slot} released more often than acquired")
        self._pins[slot] -= 1

    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        for key, slot in self._lru.items():
            if self._pins[slot] == 0:
                del self._lru[key]
                self.evictions += 1
                return slot
        raise LoraCapacityError(
            f"all {self.max_slots} adapter slots are pinned by the running batch")

    def _write(self, slot: int, adapter: LoraAdapter) -> None:
        if adapter.rank > self.rank:
            self._grow(adapter.rank)
        for a_all, b_all in self._stacks.values():
            a_all[:, slot].zero_()
            b_all[:, slot].zero_()
        for (layer, module), (a, b) in adapter.weights.items():
            a_all, b_all = self._stack_for(module)
            r = a.shape[0]
            a_all[layer, slot, :r].copy_(a.to(self.dtype))
            b_all[layer, slot, :, :r].copy_(b.to(self.dtype))
        self._slot_info[slot] = (adapter.scaling, adapter.rank)
        self.loads += 1

    def _stack_for(self, module: str) -> tuple[torch.Tensor, torch.Tensor]:
        pair = self._stacks.get(module)
        if pair is None:
            n_in, n_out = module_shape(self.cfg, module)
            shape = (self.cfg.num_layers, self.max_slots + 1)
            pair = (torch.zeros(*shape, self.rank, n_in, dtype=self.dtype, device=self.device),
                    self._alloc_b(n_out, self.rank))
            self._stacks[module] = pair
        return pair

    def _alloc_b(self, n_out: int, rank: int) -> torch.Tensor:
        """A zero ``[L, S+1, out, r]`` B stack: contiguous for the CUDA kernels; on the CPU a
        transposed view of ``[L, S+1, r, out]`` storage, so a range of slots flattens to a
        ``[slots * r, out]`` matrix without a copy."""
        shape = (self.cfg.num_layers, self.max_slots + 1)
        if self.triton:
            return torch.zeros(*shape, n_out, rank, dtype=self.dtype, device=self.device)
        store = torch.zeros(*shape, rank, n_out, dtype=self.dtype, device=self.device)
        return store.transpose(2, 3)

    def _grow(self, rank: int) -> None:
        """Widen every stack to ``rank`` (existing slot contents and indices are kept)."""
        old = self.rank
        for module, (a_all, b_all) in list(self._stacks.items()):
            a_new = a_all.new_zeros(*a_all.shape[:2], rank, a_all.shape[3])
            b_new = self._alloc_b(b_all.shape[2], rank)
            a_new[:, :, :old].copy_(a_all)
            b_new[..., :old].copy_(b_all)
            self._stacks[module] = (a_new, b_new)
        self.rank = rank



# A run of consecutive rows sharing one adapter at one composition position:
# (first row, end row, slot, effective scale, rank).
_Segment = tuple[int, int, int, float, int]
Strategy = Literal["auto", "runs", "dense", "gather"]


def _choose(strategy: Strategy, tokens: int, segments: int, used: set[int]) -> str:
    """CPU strategy. ``runs``: one matmul pair per run of rows on one adapter (long runs:
    prefill). ``dense``: one matmul pair against the contiguous range of used slots with a
    per-row coefficient mask (short runs, few slots; folds every composition position into one
    pass). ``gather``: per-row copies of the adapter weights + bmm (short runs, sparse slots)."""
    if strategy != "auto":
        return strategy
    if tokens >= 4 * segments:
        return "runs"
    span = max(used) - min(used) + 1
    return "dense" if span <= max(2 * len(used), 8) else "gather"


class LoraBatch:
    """Per-row adapter plan of one forward batch; implements ``kiln.model.layers.LoraHook``.

    Holds pins on its slots until :meth:`release` (or the end of a ``with`` block).
    """

    def __init__(self, slots: AdapterSlots, num_tokens: int, slot_idx: torch.Tensor,
                 scales: torch.Tensor, segments: list[list[_Segment]], pinned: list[int],
                 strategy: Strategy = "auto") -> None:
        self.slots = slots
        self.num_tokens = num_tokens
        self.slot_idx = slot_idx  # int32 [K, T], -1 where a row has no k-th adapter
        self.scales = scales  # float32 [K, T], scale * alpha / r (0 where slot is -1)
        self.segments = segments
        self._pinned = pinned
        used = {seg[2] for runs in segments for seg in runs}
        self.strategy = "none" if not used else (
            "kernel" if slots.triton
            else _choose(strategy, num_tokens, sum(map(len, segments)), used))
        if self.strategy == "gather":
            self._gather_idx = torch.where(slot_idx >= 0, slot_idx, slots.zero_slot).long()
            self._gather_scales = scales.view(*scales.shape, 1, 1).to(slots.dtype)
        elif self.strategy == "dense":
            lo, hi = min(used), max(used)
            self._range = (lo, hi + 1)
            coef = torch.zeros(num_tokens, hi + 1 - lo, device=slots.device)
            rows = torch.arange(num_tokens, device=slots.device)
            for k in range(slot_idx.shape[0]):
                on = slot_idx[k] >= 0
                coef.index_put_((rows[on], slot_idx[k][on].long() - lo), scales[k][on],
                                accumulate=True)
            self._coef = coef.to(slots.dtype)[:, :, None]  # [T, R, 1]

    @property
    def num_positions(self) -> int:
        """K: the longest adapter mix in the batch (0 when every row runs the base model)."""
        return int(self.slot_idx.shape[0])

    @classmethod
    def build(cls, row_mixes: Sequence[Sequence[tuple[AdapterRef, float]]],
              tokens_per_row: Sequence[int], slots: AdapterSlots,
              strategy: Strategy = "auto") -> LoraBatch:
        """Plan a batch: ``row_mixes[i]`` is request i's ``[(adapter or key, scale), ...]``
        (empty: base model) and ``tokens_per_row[i]`` its number of new tokens, in batch order.

        Pins every slot it uses; raises :class:`LoraCapacityError` (pinning nothing) if the batch
        needs more distinct adapters than there are slots. ``strategy`` forces a CPU strategy
        (tests); CUDA always uses the kiln_kernels SGMV pair."""
        if len(row_mixes) != len(tokens_per_row):
            raise ValueError("LoraBatch.build: row_mixes and tokens_per_row differ in length")
        if any(n <= 0 for n in tokens_per_row):
            raise ValueError("LoraBatch.build: every row needs at least one token")
        acquired: dict[str, tuple[int, float, int]] = {}
        try:
            for mix in row_mixes:
                for ref, scale in mix:
                    if not math.isfinite(scale):
                        raise ValueError(f"LoRA scale must be finite, got {scale}")
                    key = ref.content_sha256 if isinstance(ref, LoraAdapter) else ref
                    if key not in acquired:
                        acquired[key] = slots.acquire(ref)
        except BaseException:
            for slot, _, _ in acquired.values():
                slots.release(slot)
            raise
        k_max = max((len(m) for m in row_mixes), default=0)
        total = sum(tokens_per_row)
        slot_rows = [[-1] * total for _ in range(k_max)]
        scale_rows = [[0.0] * total for _ in range(k_max)]
        segments: list[list[_Segment]] = [[] for _ in range(k_max)]
        row0 = 0
        for mix, n in zip(row_mixes, tokens_per_row, strict=True):
            for k, (ref, scale) in enumerate(mix):
                key = ref.content_sha256 if isinstance(ref, LoraAdapter) else ref
                slot, scaling, rank = acquired[key]
                eff = float(scale) * scaling
                slot_rows[k][row0:row0 + n] = [slot] * n
                scale_rows[k][row0:row0 + n] = [eff] * n
                runs = segments[k]
                if runs and runs[-1][1] == row0 and runs[-1][2:4] == (slot, eff):
                    runs[-1] = (runs[-1][0], row0 + n, slot, eff, rank)
                else:
                    runs.append((row0, row0 + n, slot, eff, rank))
            row0 += n
        dev = slots.device
        return cls(slots, total,
                   torch.tensor(slot_rows, dtype=torch.int32, device=dev).view(k_max, total),
                   torch.tensor(scale_rows, dtype=torch.float32, device=dev).view(k_max, total),
                   segments, [slot for slot, _, _ in acquired.values()], strategy)

    def release(self) -> None:
        """Unpin the batch's slots (idempotent)."""
        pinned, self._pinned = self._pinned, []
        for slot in pinned:
            self.slots.release(slot)

    def __enter__(self) -> LoraBatch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    def apply(self, layer: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y += sum_k scale_k[row] * B_k A_k x[row]`` for every row, in place; returns y."""
        pair = self.slots.stacks(module)
        if pair is None or self.strategy == "none":
            return y
        if x.shape[0] != self.num_tokens:
            raise ValueError(f"LoraBatch planned {self.num_tokens} rows, got {x.shape[0]}")
        a, b = pair[0][layer], pair[1][layer]  # [S+1, r, in], [S+1, out, r]
        xs = x.to(a.dtype)
        if self.strategy == "kernel":
            from kiln_kernels.lora import lora_expand, lora_shrink

            for k in range(self.num_positions):
                t = lora_shrink(x, a, self.slot_idx[k])
                lora_expand(y, t, b, self.slot_idx[k], self.scales[k])
        elif self.strategy == "dense":
            lo, hi = self._range
            r = a.shape[1]
            t = xs @ a[lo:hi].reshape(-1, a.shape[2]).t()  # [T, R * r]
            t = (t.view(x.shape[0], hi - lo, r) * self._coef).view(x.shape[0], -1)
            y.addmm_(t.to(y.dtype), b[lo:hi].transpose(1, 2).reshape(-1, b.shape[1]))
        elif self.strategy == "runs":
            for runs in self.segments:
                for start, end, slot, scale, rank in runs:
                    t = torch.mm(xs[start:end], a[slot, :rank].t()).mul_(scale)
                    y[start:end].addmm_(t.to(y.dtype), b[slot, :, :rank].t())
        else:
            for k in range(self.num_positions):
                idx = self._gather_idx[k]
                t = torch.bmm(a.index_select(0, idx), xs.unsqueeze(2)).mul_(self._gather_scales[k])
                y.unsqueeze(2).baddbmm_(b.index_select(0, idx), t.to(y.dtype))
        return y
