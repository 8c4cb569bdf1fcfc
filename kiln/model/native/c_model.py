"""A GGUF model served by the CPU step alone, without torch.

Where every matrix of a GGUF file has a C kernel, each forward step on the CPU is one C call
(``kiln_kernels.cpu.cpu_step``), whose bindings take numpy arrays. :class:`CModel` loads such a
file into that call's weights (:class:`~kiln_kernels.cpu.cpu_step.CpuStepWeights`) without
importing torch: the very weights ``kiln.model.gguf_loader`` gives the torch-loaded model's C
step (the same tiles, fused alike, gguf-py's float32 norms and biases) and its rotary
frequencies from :func:`kiln.model.checkpoint.rope.inv_freq` (computed without torch, as the torch
path takes them). Its steps run as ``kiln.model.cpu_step.CpuStep`` runs them, in chunks of
:func:`group_rows` rows, so its logits are the torch-loaded model's, bit for bit. Its KV cache
(:meth:`CModel.kv_arrays`) is laid out as ``kiln.model.kv_cache.KVCache`` lays out the C step's
(heads-major blocks in zero pages), so a torch view of its buffers is a valid ``KVCache``.

:meth:`CModel.load` returns None where the C step cannot serve the file this way (a matrix
without a kernel, projections that do not fuse, no C library, a head grouping the C step does not
take, no stored frequencies): the caller then loads it the torch way.
``kiln.model.loader.torch_model`` builds the torch model over the same tiles, for whatever needs
torch later.

The C step's row grouping lives here (torch-free); ``kiln.model.cpu_step.CpuStep`` uses it too.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
from kiln_kernels.cpu import available
from kiln_kernels.cpu.cpu_step import (
    KV_DTYPES,
    MAX_GROUP,
    CpuStepProgram,
    CpuStepWeights,
)
from kiln_kernels.quant import Format, PackedWeight

from kiln.model.checkpoint.config import ModelConfig
from kiln.model.checkpoint.gguf_index import GGUFIndex
from kiln.model.checkpoint.gguf_tensors import (
    ROPE_FREQS,
    dequantize,
    hf_name,
    read_config,
    row_permutation,
    tile_tensors,
    unpackable,
    unpermute_qk,
)
from kiln.model.native.early_tiles import Tiled
from kiln.model.native.step_weights import layer_products, step_weights

# -- the C step's row grouping (kiln.model.cpu_step.CpuStep runs its steps the same way) -----------
# Rows per C step. A longer forward step runs as consecutive C steps over its rows in order; a
# sequence's rows may straddle two, the later one reading the earlier one's K/V from the cache.
# Prefill through C steps of 128-256 rows measured as fast as the torch path (MKL, 512-row
# chunks) on the default model: 512 tokens 0.53-0.57 s against 0.57-0.65 s, 4,096 tokens 8.5-9.0 s
# against 7.9-8.5 s (the torch path's own spread), and faster than 512-row C steps (10.0 s).
C_MAX_ROWS = 128
# ... and at most about this many bytes of attention scores per C step (rows x heads x context
# float32: 128 rows of a 16-head model at context 32,768 would need 268 MB).
C_SCORES_BYTES = 64 << 20


def group_rows(heads: int, max_ctx: int) -> int:
    """Rows per C step for a forward step whose longest context is ``max_ctx``."""
    return max(1, min(C_MAX_ROWS, C_SCORES_BYTES // (4 * heads * max(1, max_ctx))))


def step_groups(n_rows: int, size: int, wanted: list[int], vocab: int,
                step: Callable[[int, int, list[int]], np.ndarray]) -> np.ndarray:
    """A forward step's logits ``[len(wanted), vocab]`` (rows ``wanted`` of its ``n_rows``, in
    that order) from consecutive C steps of at most ``size`` rows: ``step(a, b, rows)`` runs
    rows ``a:b`` and returns the logits of their rows ``rows`` (offsets from ``a``; ``[0]`` when
    the group has none wanted, as a C step computes at least one)."""
    out: np.ndarray | None = None
    for a in range(0, n_rows, size):
        b = min(n_rows, a + size)
        picked = [(j, r - a) for j, r in enumerate(wanted) if a <= r < b]
        logits = step(a, b, [k for _, k in picked] or [0])
        if b == n_rows and a == 0 and picked and len(picked) == len(wanted):
            return logits  # one C step, every logits row in the order asked
        if out is None:
            out = np.empty((len(wanted), logits.shape[1]), dtype=np.float32)
        if picked:
            out[[j for j, _ in picked]] = logits[:len(picked)]
    return out if out is not None else np.empty((0, vocab), dtype=np.float32)


@dataclass(frozen=True)
class StepRows:
    """A forward step's rows flattened once (numpy; the torch path views them with
    ``torch.from_numpy``, ``kiln.model.batch.build_forward_batch``): T new tokens of B sequences
    and the L rows whose logits are wanted."""

    ids: np.ndarray  # int64 [T]
    positions: np.ndarray  # int64 [T]
    slots: np.ndarray  # int64 [T]: block_id * block_size + offset
    owner: np.ndarray  # int64 [T]: the row's sequence
    first: np.ndarray  # int64 [T]: the row's sequence's first row
    query_start_loc: np.ndarray  # int32 [B + 1]
    seq_lens: np.ndarray  # int32 [B]
    tables: np.ndarray  # int32 [B, max_blocks], padded with 0
    logit_rows: np.ndarray  # int64 [L]


def flatten(seqs: Sequence[tuple[Sequence[int], int, Sequence[int]]], block_size: int,
            want: Literal["last", "all"] | Sequence[int] = "last") -> StepRows:
    """The rows of a step of ``seqs``, each ``(new_token_ids, start_pos, block_table)``
    (``start_pos`` tokens already cached; the table covers ``start_pos + len(new)``); logits for
    each sequence's last new row (``"last"``), every row (``"all"``), or its last ``want[s]``
    rows (a drafted decode's, kiln.engine.speculative). ValueError for an empty step, a sequence
    without new tokens or a table too short."""
    if not seqs:
        raise ValueError("forward: no sequences")
    max_blocks = max(len(table) for _, _, table in seqs) or 1
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    owner: list[int] = []
    first: list[int] = []
    qsl = [0]
    seq_lens: list[int] = []
    wanted: list[int] = []
    tables = np.zeros((len(seqs), max_blocks), dtype=np.int32)
    for s, (new_tokens, start, table) in enumerate(seqs):
        n, end = len(new_tokens), start + len(new_tokens)
        if n == 0:
            raise ValueError("forward: a sequence has no new tokens")
        if len(table) * block_size < end:
            raise ValueError(f"block table of {len(table)} blocks cannot hold {end} tokens")
        tables[s, :len(table)] = [int(b) for b in table]
        row0 = len(ids)
        ids.extend(int(t) for t in new_tokens)
        positions.extend(range(start, end))
        slots.extend(int(table[p // block_size]) * block_size + p % block_size
                     for p in range(start, end))
        owner.extend([s] * n)
        first.extend([row0] * n)
        qsl.append(len(ids))
        seq_lens.append(end)
        rows = n if want == "all" else 1 if want == "last" else int(want[s])
        wanted.extend(range(row0 + n - rows, row0 + n))
    i64 = np.int64
    return StepRows(np.array(ids, dtype=i64), np.array(positions, dtype=i64),
                    np.array(slots, dtype=i64), np.array(owner, dtype=i64),
                    np.array(first, dtype=i64), np.array(qsl, dtype=np.int32),
                    np.array(seq_lens, dtype=np.int32), tables, np.array(wanted, dtype=i64))


def run_rows(prog: CpuStepProgram, rows: StepRows, wanted: list[int], heads: int, *,
             x: Any = None, lora: Callable[[int, int], Any] | None = None,
             n_threads: int | None = None) -> np.ndarray:
    """float32 logits of rows ``wanted`` of a step's flattened ``rows`` (in that order), through
    C steps of :func:`group_rows` rows: the one place both the C model (``CModel.forward``) and
    the torch model's CPU step (``kiln.model.cpu_step.CpuStep``) run a step. ``x``: the rows'
    embeddings where the program holds none (else it looks the ids up); ``lora(a, b)``: the
    program's view of rows ``a:b``'s adapters (None: no adapter)."""
    ctx = rows.positions + 1

    def step(a: int, b: int, picked: list[int]) -> np.ndarray:
        return prog.step(None if x is None else x[a:b], ctx[a:b], rows.tables[rows.owner[a:b]],
                         rows.slots[a:b], np.array(picked, dtype=np.int64),
                         None if lora is None else lora(a, b),
                         np.maximum(rows.first[a:b], a) - a,
                         ids=rows.ids[a:b] if x is None else None, n_threads=n_threads)

    size = group_rows(heads, int(ctx.max()))
    return step_groups(int(rows.ids.shape[0]), size, wanted, prog.vocab, step)


def kv_block_bytes(cfg: ModelConfig, block_size: int, itemsize: int) -> int:
    """Bytes one KV block takes across all layers, K and V together, at ``itemsize`` bytes an
    element (``KVCache.bytes_per_block`` and :meth:`CModel.bytes_per_block`)."""
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * itemsize


def map_of(array: Any) -> mmap.mmap | None:
    """The anonymous map under a KV array (``kv_arrays``' view of it), else None."""
    seen = array
    while seen is not None and not isinstance(seen, mmap.mmap):
        # numpy's views lead to the buffer it was made from, a memoryview of the map
        seen = seen.obj if isinstance(seen, memoryview) else getattr(seen, "base", None)
    return seen


def release_pages(maps: Sequence[mmap.mmap]) -> int:
    """Give the KV maps' memory back to the system, keeping the maps (every array and the C
    program keep their addresses): MADV_REMOVE frees a shared anonymous map's pages, which
    read as zeros again, as when first mapped. Returns the bytes the maps span (0 where the
    system has no MADV_REMOVE, Linux's: nothing is released there)."""
    remove = getattr(mmap, "MADV_REMOVE", None)
    if remove is None:
        return 0
    for m in maps:
        m.madvise(remove)
    return sum(len(m) for m in maps)


def kv_map(size: int, maps: int) -> mmap.mmap:
    """An anonymous map of ``size`` bytes for one of a KV cache's ``maps`` buffers: zero pages,
    resident only once written, page-aligned (the C step's loads need 64 bytes). Python's
    anonymous maps are shared ones: smaps names them "/dev/zero (deleted)", which is how
    bench_peer measures the cache's resident part. ValueError past what the system maps."""
    try:
        return mmap.mmap(-1, size)
    except OSError as exc:  # more than the system will map (--kv-memory-mb too large)
        raise ValueError(f"the KV cache ({maps} maps of {size // (1024 * 1024)} MiB) cannot be "
                         f"mapped ({exc.strerror}); lower --kv-memory-mb") from exc


_KV_ITEMSIZE = {"float32": 4, "float16": 2}
_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model ``cfg`` describes, by HF name, and its shape (what
    ``kiln.model.weights.WeightSink`` checks a checkpoint against)."""
    h, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h),
                                       "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        pre = f"model.layers.{i}."
        rows = dict(zip(_PROJECTIONS, (q, kv, kv, h, inter, inter, h), strict=True))
        cols = dict(zip(_PROJECTIONS, (h, h, h, q, h, h, inter), strict=True))
        for p in _PROJECTIONS:
            out[f"{pre}{p}.weight"] = (rows[p], cols[p])
        out[f"{pre}input_layernorm.weight"] = (h,)
        out[f"{pre}post_attention_layernorm.weight"] = (h,)
        if cfg.qkv_bias:
            for p, n in (("q", q), ("k", kv), ("v", kv)):
                out[f"{pre}self_attn.{p}_proj.bias"] = (n,)
        if cfg.qk_norm:
            out[f"{pre}self_attn.q_norm.weight"] = (hd,)
            out[f"{pre}self_attn.k_norm.weight"] = (hd,)
    return out


class CModel:
    """A GGUF model's CPU-step weights (:meth:`load`), its KV cache arrays and its steps."""

    def __init__(self, config: ModelConfig, weights: CpuStepWeights, path: Path,
                 tiles: dict[str, tuple[str, np.ndarray]], metadata: dict[str, Any]) -> None:
        self.config = config
        self.weights = weights
        self.path = path
        self.tiles = tiles  # every matrix's tiles (the ones the weights hold), by GGUF name
        self.vocab_size = weights.head.out_features
        self._metadata: dict[str, Any] | None = metadata

    def take_metadata(self) -> dict[str, Any]:
        """The file's GGUF metadata (its tokenizer and chat template among it), once: the model
        keeps no reference to the file's map, whose pages (the whole file, read to tile it)
        would otherwise stay resident beside the tiles (100 MiB of the default model's 288 MiB
        RSS at health)."""
        meta, self._metadata = self._metadata, None
        if meta is None:
            raise ValueError("the metadata was taken already")
        return meta

    @classmethod
    def load(cls, path: Path, tiled: Tiled | None = None) -> CModel | None:
        """The model of the GGUF file at ``path`` for the C step, or None where it cannot run
        that way (module docstring); ``tiled``: its tiles made already (start-up's), which it
        uses and leaves as they are. A file it cannot read is None too: the torch load says
        what is wrong."""
        if not available():
            return None
        try:
            reader = tiled.reader if tiled is not None and tiled.reader else GGUFIndex(path)
            cfg = read_config(reader)
            if not cfg.plain_block:  # the C step runs the Llama block only (Gemma: torch)
                return None
            names = {t.name: hf_name(t.name) for t in reader.tensors if t.name != ROPE_FREQS}
        except (ValueError, OSError):  # UnsupportedModelError, WeightLoadError among them
            return None
        if cfg.num_heads % cfg.num_kv_heads or cfg.num_heads // cfg.num_kv_heads > MAX_GROUP:
            return None
        shapes = expected_shapes(cfg)
        tensors = [t for t in reader.tensors if t.name in names]
        if sorted(names.values()) != sorted(shapes) or any(
                len(t.shape) > 1 and unpackable(t) is not None for t in tensors):
            return None
        given: dict[str, tuple[str, np.ndarray]] = {} if tiled is None else tiled.tiles
        todo = [t for t in tensors if len(t.shape) > 1 and t.name not in given]
        packed: dict[str, PackedWeight] = {}
        small: dict[str, np.ndarray] = {}
        try:  # tile what start-up did not (one C call), then take every tensor in turn
            tiles = {**{t.name: given[t.name] for t in tensors if t.name in given},
                     **dict(zip([t.name for t in todo], tile_tensors(cfg, todo), strict=True))}
            for tensor in tensors:
                name = names[tensor.name]
                if len(tensor.shape) > 1:
                    fmt, arr = tiles[tensor.name]
                    pw = packed[name] = PackedWeight(cast(Format, fmt), arr)
                    held: tuple[int, ...] = (pw.out_features, pw.in_features)
                else:  # norms and biases: gguf-py's float32 values, as gguf_loader puts them
                    heads = row_permutation(cfg, tensor.name)
                    values = dequantize(tensor)
                    small[name] = values if heads is None else unpermute_qk(values, heads)
                    held = small[name].shape
                if held != shapes[name]:
                    return None
        except (ValueError, OSError):  # a tensor's data cannot be read
            return None
        embed = packed["model.embed_tokens.weight"]
        weights = step_weights(cfg, layer_products(cfg, packed), small, embed=embed,
                               head=embed if cfg.tie_word_embeddings else packed["lm_head.weight"])
        if weights is None:
            return None
        return cls(cfg, weights, Path(path), tiles, reader.metadata)

    # -- the plan, the KV cache, the steps ------------------------------------------------------

    @staticmethod
    def _kv_dtype(dtype: str) -> str:
        name = "float32" if dtype == "auto" else dtype
        if name not in KV_DTYPES:
            raise ValueError(f"KV cache dtype {dtype!r}: the C step reads {', '.join(KV_DTYPES)}")
        return name

    def bytes_per_block(self, block_size: int, dtype: str) -> int:
        """Bytes one block takes across all layers, K and V together (``KVCache``'s)."""
        return kv_block_bytes(self.config, block_size, _KV_ITEMSIZE[self._kv_dtype(dtype)])

    def kv_arrays(self, num_blocks: int, block_size: int, dtype: str
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per layer K and V ``[num_blocks, block_size, kv_heads, head_dim]`` arrays of
        ``dtype`` (``float32``, ``auto`` for it, or ``float16``), laid out as
        ``KVCache(..., heads_major=True, zero_pages=True)`` lays them out: each an anonymous
        memory map of ``[num_blocks, kv_heads, block_size, head_dim]`` seen through a permuted
        view (the map kept alive by the array)."""
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("kv_arrays: num_blocks and block_size must be positive")
        name = self._kv_dtype(dtype)
        cfg = self.config
        shape = (num_blocks, cfg.num_kv_heads, block_size, cfg.head_dim)
        size = int(np.prod(shape)) * _KV_ITEMSIZE[name]

        def one() -> np.ndarray:
            pages = kv_map(size, 2 * cfg.num_layers)
            return np.frombuffer(pages, dtype=name).reshape(shape).transpose(0, 2, 1, 3)

        return ([one() for _ in range(cfg.num_layers)], [one() for _ in range(cfg.num_layers)])

    def bind(self, k: list[np.ndarray], v: list[np.ndarray]) -> CpuStepProgram:
        """The C program of these weights over the KV arrays ``k``, ``v`` (:meth:`kv_arrays`)."""
        return self.weights.bind(k, v)

    def forward(self, prog: CpuStepProgram,
                seqs: Sequence[tuple[Sequence[int], int, Sequence[int]]],
                want: Literal["last", "all"] | Sequence[int] = "last",
                n_threads: int | None = None) -> np.ndarray:
        """float32 logits of a step of ``seqs``, each ``(new_token_ids, start_pos,
        block_table)`` as ``kiln.model.batch.build_forward_batch`` takes them: for each
        sequence's last new row (``want="last"``), every row (``"all"``), or its last
        ``want[s]`` rows (a drafted decode's, kiln.engine.speculative), in order. Runs as
        ``kiln.model.cpu_step.CpuStep.forward`` runs the same step (C steps of :func:`group_rows`
        rows), so the numbers are the torch-loaded model's bit for bit; writes the rows' K/V
        into ``prog``'s cache; ``n_threads``: the C calls' threads (default ``threads()``).
        IndexError for a token id outside the vocabulary."""
        if not prog.embeds:
            raise ValueError("forward: the program holds no embedding")
        rows = flatten(seqs, prog.block_size, want)
        return run_rows(prog, rows, rows.logit_rows.tolist(), self.weights.heads,
                        n_threads=n_threads)


__all__ = ["C_MAX_ROWS", "C_SCORES_BYTES", "CModel", "StepRows", "expected_shapes", "flatten",
           "group_rows", "kv_block_bytes", "kv_map", "run_rows", "step_groups"]
