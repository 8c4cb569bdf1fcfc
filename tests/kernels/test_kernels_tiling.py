"""kiln_kernels/cpu/tiling/tile.c against its numpy reference (kiln_kernels/tiling.py): the same
tiles byte for byte for every GGML type the products read, with and without a row order, in
one call for many tensors, or shared by threads that each claim what is left; every fp16 scale
converted as numpy converts it."""

from __future__ import annotations

import threading

import kiln_kernels.tiling
import numpy as np
import pytest
import torch
from kiln_kernels.cpu.loader import tiling_library
from kiln_kernels.quant import pack_ggml, tile_rows
from kiln_kernels.testing import random_raw
from kiln_kernels.tiling import GGML_TYPES, TileWork, tile_ggml_reference, tile_many

pytestmark = pytest.mark.skipif(tiling_library() is None, reason="no C compiler for tile.c")


def raw_rows(ggml_type: str, n: int, k: int, seed: int) -> np.ndarray:
    return random_raw(ggml_type, n, k, seed=seed).numpy()


@pytest.mark.parametrize("ggml_type", sorted(GGML_TYPES))
def test_c_tiles_equal_the_reference(ggml_type: str) -> None:
    qk = GGML_TYPES[ggml_type][0]
    raw = raw_rows(ggml_type, 12, 2 * qk, seed=len(ggml_type))
    order = np.random.default_rng(1).permutation(12).astype(np.int64)
    (fmt, plain), (fmt2, ordered) = tile_many([(raw, ggml_type, None), (raw, ggml_type, order)])
    want_fmt, want = tile_ggml_reference(raw, ggml_type)
    assert fmt == fmt2 == want_fmt
    assert plain.shape == want.shape and plain.tobytes() == want.tobytes()
    assert ordered.tobytes() == tile_ggml_reference(raw[order], ggml_type)[1].tobytes()
    assert plain.tobytes() != ordered.tobytes()  # the order was applied


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_threads_sharing_the_work_make_the_same_tiles(threads: int) -> None:
    """A file's worth of tensors of every type, of different sizes (the largest are claimed
    first), run by several threads at once: every tensor's tiles are the reference's, each
    tiled once (a second run claims nothing), in the items' order."""
    rng = np.random.default_rng(5)
    items = []
    for i, ggml_type in enumerate(sorted(GGML_TYPES) * 3):
        n = 4 * int(rng.integers(1, 9))
        order = rng.permutation(n).astype(np.int64) if i % 2 else None
        items.append((raw_rows(ggml_type, n, GGML_TYPES[ggml_type][0] * int(rng.integers(1, 4)),
                               seed=i), ggml_type, order))
    work = TileWork(items)
    runners = [threading.Thread(target=work.run) for _ in range(threads - 1)]
    for t in runners:
        t.start()
    work.run()
    for t in runners:
        t.join()
    for (raw, ggml_type, order), (fmt, tiles) in zip(items, work.tiles, strict=True):
        want_fmt, want = tile_ggml_reference(raw if order is None else raw[order], ggml_type)
        assert fmt == want_fmt and tiles.tobytes() == want.tobytes(), ggml_type
    for _, tiled in work.tiles:
        tiled.fill(0)
    work.run()  # every job was claimed: nothing is tiled again
    assert all(not tiled.any() for _, tiled in work.tiles)


def test_every_fp16_scale_converts_as_numpy_does() -> None:
    """Q8_0 and Q4_1 blocks whose scale fields run through all 65,536 halves (zeros, subnormals,
    infinities, NaNs with their payloads), and Q4_0's m = -8 d from them."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(-1, 2)
    for ggml_type, fields in (("Q8_0", (0,)), ("Q4_1", (0, 2)), ("Q4_0", (0,))):
        size = GGML_TYPES[ggml_type][1]
        blocks = np.random.default_rng(7).integers(0, 256, (1 << 16, size), dtype=np.uint8)
        for at in fields:
            blocks[:, at:at + 2] = halves[::-1] if at else halves
        raw = blocks.reshape(1024, 64 * size)  # 1,024 rows of 64 blocks
        got = tile_many([(raw, ggml_type, None)])[0][1]
        with np.errstate(invalid="ignore"):  # -8 times a signalling NaN, in the reference
            want = tile_ggml_reference(raw, ggml_type)[1]
        assert got.tobytes() == want.tobytes(), ggml_type


def test_pack_ggml_matches_the_torch_layout_reference() -> None:
    """The tiles the products read (through tile.c) are the torch reference's q8 layout."""
    raw = random_raw("Q8_0", 8, 64, seed=3)
    pw = pack_ggml(raw, "Q8_0")
    blocks = raw.reshape(8, 2, 34)
    d = blocks[:, :, :2].contiguous().view(torch.float16).squeeze(-1).float()
    assert torch.equal(pw.tiles, tile_rows("q8", blocks[:, :, 2:].reshape(8, 64), d))


def test_without_a_compiler_numpy_tiles_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in where tile.c cannot be built: the same tiles, the same refusals."""
    items = [(raw_rows(t, 8, GGML_TYPES[t][0], seed=4), t,
              np.array([1, 0, 3, 2, 5, 4, 7, 6]) if t == "Q4_K" else None)
             for t in ("Q4_0", "Q8_0", "Q4_K", "F16")]
    want = tile_many(items)
    monkeypatch.setattr(kiln_kernels.tiling, "tiling_library", lambda: None)
    got = tile_many(items)
    assert [(f, t.tobytes()) for f, t in got] == [(f, t.tobytes()) for f, t in want]
    with pytest.raises(ValueError):
        tile_many([(items[0][0], "Q4_0", np.arange(1, 9))])


@pytest.mark.parametrize("bad", ["rows", "type", "width", "order"])
def test_bad_input_is_refused_before_the_call(bad: str) -> None:
    raw = raw_rows("Q4_K", 8, 256, seed=2)
    item = {"rows": (raw[:6], "Q4_K", None), "type": (raw, "IQ2_XS", None),
            "width": (raw[:, :-1], "Q4_K", None),
            "order": (raw, "Q4_K", np.array([0, 1, 2, 3, 4, 5, 6, 8]))}[bad]
    with pytest.raises(ValueError):
        tile_many([item])
