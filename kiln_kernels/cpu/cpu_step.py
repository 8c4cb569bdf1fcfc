"""The CPU step's binding: ``step/cpu_step.c``, one whole forward step (every layer, the LM
head) in one call.

:class:`CpuStepWeights` holds the model side (dimensions, per-layer packed weights and norms);
:meth:`CpuStepWeights.bind` pairs it with one KV cache, giving a :class:`CpuStepProgram` whose
:meth:`~CpuStepProgram.step` runs M token rows (decodes, or rows of short prefill chunks). The structures mirror ``cpu_step.c``;
the layer table is an int64 array of addresses, so the tensors it points at are kept alive here.
The torch path of ``kiln.model`` is the reference (``tests/model/test_cpu_step.py``).

Nothing here imports torch: every array (norms, biases, ``inv_freq``, the KV caches, the step's
inputs, :class:`LoraRows`) may be a numpy array or a CPU torch tensor, mixed as they come
(:mod:`.arrays`); :meth:`CpuStepProgram.step` returns numpy logits.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ..quant import FORMAT_IDS, MAX_PARTS, Packed
from .arrays import (
    Array,
    addr,
    aligned_empty,
    as_numpy,
    dense,
    dtype_name,
    is_float32_dense,
    on_cpu,
    shape,
    strides,
)
from .loader import NATIVE_FLAGS, library, threads

KV_DTYPES = ("float32", "float16")  # the cache element types cpu_step.c reads (dtype_name)
LAYER_FIELDS = ("qkv", "o", "gate_up", "down", "in_norm", "post_norm", "q_norm", "k_norm", "q_bias", "k_bias", "v_bias",
                "k_cache", "v_cache")


class _Model(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("layers", "hidden", "inter", "heads", "kv_heads",  # type: ignore[assignment]
                                               "head_dim", "vocab", "block_size", "fields")] + [
        ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("table", ctypes.c_void_p),
        ("final_norm", ctypes.c_void_p), ("head", ctypes.c_void_p),
        ("kv_f16", ctypes.c_int64), ("kv_sb", ctypes.c_int64), ("kv_sp", ctypes.c_int64),
        ("kv_sh", ctypes.c_int64), ("embed", ctypes.c_void_p), ("inv_freq", ctypes.c_void_p)]


class _Weight(ctypes.Structure):  # KilnWeight (quant.h)
    _fields_ = [("parts", ctypes.c_int64), ("K", ctypes.c_int64),
                ("fmt", ctypes.c_int64 * MAX_PARTS), ("rows", ctypes.c_int64 * MAX_PARTS),
                ("data", ctypes.c_void_p * MAX_PARTS)]


def weight_struct(w: Packed) -> _Weight:
    """The C description of a packed weight (its tiles must outlive it)."""
    parts = w.parts
    if len(parts) > MAX_PARTS:
        raise ValueError(f"a weight of {len(parts)} parts (at most {MAX_PARTS})")
    pad = MAX_PARTS - len(parts)
    return _Weight(parts=len(parts), K=w.in_features,
                   fmt=(ctypes.c_int64 * MAX_PARTS)(*[FORMAT_IDS[p.fmt] for p in parts], *[0] * pad),
                   rows=(ctypes.c_int64 * MAX_PARTS)(*[p.out_features for p in parts], *[0] * pad),
                   data=(ctypes.c_void_p * MAX_PARTS)(*[addr(p.tiles) for p in parts],
                                                       *[None] * pad))


def cache_strides(cache: Array) -> tuple[int, int, int]:
    """Element strides (block, position, KV head) of a ``[blocks, block_size, kv_heads, dim]``
    cache (numpy array or torch tensor) whose storage is dense with ``dim`` innermost
    (contiguous, or a permutation of the first three axes of a contiguous array); raises
    ValueError otherwise."""
    dims, st = shape(cache), strides(cache)
    if len(dims) != 4 or st[3] != 1:
        raise ValueError("a KV cache is [blocks, block_size, kv_heads, dim] with dim innermost")
    order = sorted(range(3), key=lambda a: -st[a])
    if not dense(tuple(dims[a] for a in (*order, 3)), tuple(st[a] for a in (*order, 3))):
        raise ValueError("a KV cache's storage must be dense")
    return st[0], st[1], st[2]


LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class _Lora(ctypes.Structure):
    _fields_ = [("K", ctypes.c_int64), ("nslots", ctypes.c_int64), ("rank", ctypes.c_int64),
                ("slot_idx", ctypes.c_void_p), ("scales", ctypes.c_void_p),
                ("a", ctypes.c_void_p * 7), ("bt", ctypes.c_void_p * 7), ("t", ctypes.c_void_p)]


class _Step(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("M", "max_blocks", "max_ctx", "L")] + [
        (n, ctypes.c_void_p) for n in ("x", "ctx_lens", "block_tables", "slots",
                                       "seq_first", "logit_rows", "logits", "scratch", "lora",
                                       "ids")]


@dataclass(frozen=True)
class LoraRows:
    """LoRA of a step's rows: ``slot_idx`` int32 [K, M] (-1: none), ``scales`` float32 [K, M];
    per module in LORA_MODULES order, the A stack ``[layers, slots, rank, in]`` and the B^T
    stack ``[layers, slots, rank, out]`` (None: no adapter targets it). Each a numpy array or
    a CPU torch tensor."""

    slot_idx: Array
    scales: Array
    a: tuple[Array | None, ...]
    bt: tuple[Array | None, ...]

    def struct(self, rows: int, keep: list[Array]) -> _Lora:
        k = int(shape(self.slot_idx)[0])
        stacks = [t for t in (*self.a, *self.bt) if t is not None]
        if not stacks:
            raise ValueError("LoraRows without any stack")
        nslots, rank = shape(stacks[0])[1:3]
        for t in stacks:
            if not is_float32_dense(t) or shape(t)[1:3] != (nslots, rank):
                raise ValueError("LoRA stacks must be contiguous float32 [L, slots, rank, n]")
        idx = as_numpy(self.slot_idx, "int32")
        scales = as_numpy(self.scales, "float32")
        if idx.shape != (k, rows) or scales.shape != (k, rows):
            raise ValueError("LoRA slot_idx/scales must be [K, M]")
        t = aligned_empty(max(1, rows * k * rank))
        keep.extend([idx, scales, t])
        return _Lora(K=k, nslots=nslots, rank=rank, slot_idx=addr(idx),
                     scales=addr(scales), a=(ctypes.c_void_p * 7)(*map(addr, self.a)),
                     bt=(ctypes.c_void_p * 7)(*map(addr, self.bt)), t=addr(t))


MAX_GROUP = 16  # query heads per KV head that cpu_step.c handles


@dataclass(frozen=True)
class CpuStepLayer:
    qkv: Packed  # rows: q heads, then k heads, then v heads
    o: Packed
    gate_up: Packed  # rows: gate, then up
    down: Packed
    in_norm: Array  # float32, numpy or CPU torch, as every array here
    post_norm: Array
    q_norm: Array | None = None  # qwen3
    k_norm: Array | None = None
    q_bias: Array | None = None  # qwen2
    k_bias: Array | None = None
    v_bias: Array | None = None


def _f32(t: Array | None) -> Array | None:
    if t is None:
        return None
    if not is_float32_dense(t):
        raise ValueError("decode arrays must be contiguous float32 in CPU memory")
    return t


@dataclass(frozen=True)
class CpuStepWeights:
    hidden: int
    inter: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    layers: tuple[CpuStepLayer, ...]
    final_norm: Array
    head: Packed  # [vocab, hidden]
    inv_freq: Array  # float32 [head_dim / 2]: the rotary frequencies
    embed: Packed | None = None  # the token embedding [vocab, hidden], when held packed

    def bind(self, k_caches: list[Array], v_caches: list[Array],
             flags: tuple[str, ...] = NATIVE_FLAGS) -> CpuStepProgram:
        """The program for these KV caches (per layer ``[blocks, block_size, kv_heads, dim]``),
        on the library built with ``flags`` (``loader.PORTABLE_FLAGS``: the scalar paths)."""
        return CpuStepProgram(self, k_caches, v_caches, flags)


class CpuStepProgram:
    def __init__(self, w: CpuStepWeights, k_caches: list[Array],
                 v_caches: list[Array], flags: tuple[str, ...] = NATIVE_FLAGS) -> None:
        lib = library(flags)
        if lib.kiln_cpu_step_layout_version() != len(LAYER_FIELDS):
            raise RuntimeError("cpu_step.c and cpu_step.py disagree on the layer table")
        if w.heads % w.kv_heads or w.heads // w.kv_heads > MAX_GROUP:
            raise ValueError(f"{w.heads} query heads over {w.kv_heads} KV heads: unsupported")
        if len(k_caches) != len(w.layers) or len(v_caches) != len(w.layers):
            raise ValueError("one K and one V cache per layer")
        if shape(w.inv_freq) != (w.head_dim // 2,):
            raise ValueError(f"inv_freq must be [{w.head_dim // 2}], the half head")
        self.lib, self.weights = lib, w
        self._keep: list[Array] = []
        self._structs: list[_Weight] = []  # the weights' descriptions the table points at
        self._strides = cache_strides(k_caches[0])
        rows = [self._layer_row(layer, k, v) for layer, k, v in
                zip(w.layers, k_caches, v_caches, strict=True)]
        self.table = np.array(rows, dtype=np.int64)
        self.block_size = shape(k_caches[0])[1]
        sb, sp, sh = self._strides
        self.kv_dtype = dtype_name(k_caches[0])  # "float32" or "float16"
        self.vocab = w.head.out_features
        self.model = _Model(
            layers=len(w.layers), hidden=w.hidden, inter=w.inter, heads=w.heads,
            kv_heads=w.kv_heads, head_dim=w.head_dim, vocab=self.vocab,
            block_size=self.block_size, fields=len(LAYER_FIELDS), eps=w.eps,
            scale=w.head_dim ** -0.5, table=addr(self.table),
            final_norm=addr(self._hold(_f32(w.final_norm))), head=self._weight(w.head),
            kv_f16=int(self.kv_dtype == "float16"),
            kv_sb=sb, kv_sp=sp, kv_sh=sh, embed=self._embed(w.embed),
            inv_freq=addr(self._hold(_f32(w.inv_freq))))

    def _embed(self, pw: Packed | None) -> int:
        if pw is None:
            return 0
        if pw.in_features != self.weights.hidden:
            raise ValueError(f"an embedding {pw.in_features} wide for a model {self.weights.hidden}"
                             " wide")
        return self._weight(pw)

    @property
    def embeds(self) -> bool:
        """Whether :meth:`step` takes token ids (the program holds the embedding)."""
        return self.weights.embed is not None

    def _weight(self, pw: Packed) -> int:
        """The address of ``pw``'s C description, kept (with its tiles) as long as the program."""
        self._keep.extend(p.tiles for p in pw.parts)
        self._structs.append(weight_struct(pw))
        return ctypes.addressof(self._structs[-1])

    def _hold(self, t: Array | None) -> Array | None:
        if t is not None:
            self._keep.append(t)
        return t

    def _layer_row(self, layer: CpuStepLayer, k: Array, v: Array) -> list[int]:
        w = self.weights
        dims = {"qkv": ((w.heads + 2 * w.kv_heads) * w.head_dim, w.hidden),
                "o": (w.hidden, w.heads * w.head_dim), "gate_up": (2 * w.inter, w.hidden),
                "down": (w.hidden, w.inter)}
        row: dict[str, int] = {}
        for name, (n, kk) in dims.items():
            pw: Packed = getattr(layer, name)
            if (pw.out_features, pw.in_features) != (n, kk):
                raise ValueError(f"{name} is {pw.out_features}x{pw.in_features}, not {n}x{kk}")
            row[name] = self._weight(pw)
        for name in ("in_norm", "post_norm", "q_norm", "k_norm", "q_bias", "k_bias", "v_bias"):
            row[name] = addr(self._hold(_f32(getattr(layer, name))))
        for name, cache in (("k_cache", k), ("v_cache", v)):
            if dtype_name(cache) not in KV_DTYPES or dtype_name(cache) != dtype_name(k) or \
                    not on_cpu(cache) or cache_strides(cache) != self._strides:
                raise ValueError("KV caches must be dense float32 or float16 CPU arrays, "
                                 "all laid out alike")
            if shape(cache)[2:] != (w.kv_heads, w.head_dim):
                raise ValueError("KV cache heads/dim do not match the model")
            row[name] = addr(self._hold(cache))
        return [row[f] for f in LAYER_FIELDS]

    def step(self, x: Array | None, ctx_lens: Array, block_tables: Array, slots: Array,
             logit_rows: Array, lora: LoraRows | None = None, seq_first: Array | None = None,
             ids: Array | None = None, n_threads: int | None = None) -> np.ndarray:
        """M token rows: ``x [M, hidden]`` embeddings (clobbered), or None with ``ids`` [M],
        their token ids, looked up in the program's embedding (:attr:`embeds`); ``ctx_lens``
        [M] (the row's position + 1: its rotary angle too), ``block_tables`` [M, B]
        (its sequence's table), ``slots`` [M], ``seq_first`` [M] (the first row of the row's
        sequence; rows of a sequence consecutive; default: every row its own) -> numpy float32
        logits ``[len(logit_rows), vocab]``. Each argument a numpy array or a CPU torch tensor
        (integers of any int type, converted; ``x`` contiguous float32). ``n_threads``: the
        call's threads (default: ``threads()``, asked at each call). Raises IndexError for an
        id outside the embedding."""
        if (x is None) == (ids is None):
            raise ValueError("a step takes either embeddings (x) or token ids")
        if ids is not None and not self.embeds:
            raise ValueError("this program holds no embedding: pass the rows' embeddings")
        tok = None if ids is None else as_numpy(ids, "int64")
        m = shape(x)[0] if x is not None else int(tok.shape[0])  # type: ignore[union-attr]
        if x is None:
            x = aligned_empty((m, self.weights.hidden))
        lens = as_numpy(ctx_lens, "int64")
        max_ctx = int(lens.max())
        tables = as_numpy(block_tables, "int32")
        if int(tables.shape[1]) * self.block_size < max_ctx:
            raise ValueError("block tables do not cover the context")
        xs = _f32(x)
        slot = as_numpy(slots, "int64")
        rows = as_numpy(logit_rows, "int64")
        first = as_numpy(np.arange(m) if seq_first is None else seq_first, "int64")
        logits = aligned_empty((rows.size, self.vocab))
        need = self.lib.kiln_cpu_step_scratch_floats(ctypes.byref(self.model), m, max_ctx)
        scratch = aligned_empty(need)
        keep: list[Array] = []
        lora_struct = None if lora is None else lora.struct(m, keep)
        st = _Step(M=m, max_blocks=int(tables.shape[1]), max_ctx=max_ctx, L=rows.size,
                   x=addr(xs), ctx_lens=addr(lens), block_tables=addr(tables), slots=addr(slot),
                   seq_first=addr(first), logit_rows=addr(rows), logits=addr(logits),
                   scratch=addr(scratch),
                   lora=None if lora_struct is None else ctypes.addressof(lora_struct),
                   ids=None if tok is None else addr(tok))
        bad = self.lib.kiln_cpu_step(ctypes.byref(self.model), ctypes.byref(st),
                                     threads() if n_threads is None else n_threads)
        if bad >= 0:
            assert tok is not None
            raise IndexError(f"token id {int(tok[bad])} is outside the embedding's "
                             f"{self.weights.embed.out_features} rows")  # type: ignore[union-attr]
        return logits
