"""Start-up's early tiling (kiln/model/native/early_tiles.py): a model loaded from the tiles a
thread made during the imports, from a GGUF file or an HF folder, is the model loaded without
them, bit for bit; the tiles are taken once, only for the model they came from; a file the
thread cannot read is reported by the loader as before; tiles are made early only where they
will be held."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kiln_kernels.cpu import available as kernels_available

import kiln.model.native.early_tiles as early_tiles
from bench.peers.hf_folder import write_folder
from kiln.model import KVCache, build_forward_batch, load_model
from kiln.model.checkpoint.config import UnsupportedModelError
from kiln.model.checkpoint.locate import model_path
from kiln.model.float32_copies import float32_state_dict
from kiln.model.native.early_tiles import Tiled, take_tiled, tile, tiles_will_be_held, tiling_beside
from tests.model.test_block_formats import k_config, raw_weights
from tests.model.test_hf_folder_from_gguf import bf16_gguf
from tests.tiny_models import write_tiny_gguf

pytestmark = pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")

# every kind of tiling: the repacked q4 (Q4_0, Q4_1) and q8 (Q8_0), blocks kept as they are
# (K-quants, Q5_0, F16); a llama file, so q and k rows are also put back in HF order
MIX = {"q_proj": "Q4_0", "k_proj": "Q4_1", "v_proj": "Q8_0", "o_proj": "Q5_0",
       "gate_proj": "Q4_K", "up_proj": "F16", "down_proj": "Q6_K", "head": "Q8_0"}


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = k_config("llama")
    tensors, blocks = raw_weights(cfg, MIX, seed=11)
    return write_tiny_gguf(tmp_path_factory.mktemp("tiles") / "mix.gguf", cfg, tensors,
                           blocks=blocks)


def logits(path: Path) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    lm = load_model(str(path))
    assert lm.model.plan.step == "c"
    cfg = lm.config
    ids = [1, 40, 41, 300, 7, 9, 2, 100]
    out = lm.model(build_forward_batch([(ids, 0, [0, 1])], 4, logits="all"),
                   KVCache(cfg, 4, 4, torch.float32, torch.device("cpu"), heads_major=True))
    return out, float32_state_dict(lm.model)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen2 HF folder of bf16 matrices (untied: its own lm_head)."""
    root = tmp_path_factory.mktemp("hf")
    gguf, _ = bf16_gguf(root / "tiny-BF16.gguf", "qwen2", False)
    return write_folder(gguf, root / "folder")


@pytest.mark.parametrize("which", ["gguf", "hf"])
def test_a_model_from_the_threads_tiles_is_the_same_model(which: str, mixed_gguf: Path,
                                                          hf_folder: Path) -> None:
    path = mixed_gguf if which == "gguf" else hf_folder
    plain_logits, plain_weights = logits(path)
    with tiling_beside(path):
        early_logits, early_weights = logits(path)
        assert take_tiled(path) is None  # the loader took them
    assert torch.equal(early_logits, plain_logits)
    assert plain_weights.keys() == early_weights.keys()
    for name, w in plain_weights.items():
        assert torch.equal(early_weights[name].view(torch.int32), w.view(torch.int32)), name


def test_tiles_are_taken_for_their_own_file_only(mixed_gguf: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    other.write_bytes(mixed_gguf.read_bytes())
    with tiling_beside(mixed_gguf):
        assert take_tiled(other) is None
        got = take_tiled(mixed_gguf)
        assert isinstance(got, Tiled) and got.path == mixed_gguf.resolve()
        # every matrix the kernels hold was tiled: the 7 projections of each layer and the head
        want = tile(mixed_gguf).tiles
        assert sorted(got.tiles) == sorted(want) and len(want) == 7 * 2 + 2
        for name, (fmt, tiles) in want.items():
            assert got.tiles[name][0] == fmt and (got.tiles[name][1] == tiles).all(), name
        assert take_tiled(mixed_gguf) is None  # taken once
    with tiling_beside(None):
        assert take_tiled(mixed_gguf) is None


def test_a_file_the_thread_cannot_read_is_reported_by_the_loader(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 16)
    with pytest.raises(UnsupportedModelError) as plain:
        load_model(str(broken))
    with tiling_beside(broken), pytest.raises(UnsupportedModelError) as early:
        load_model(str(broken))
    assert str(early.value) == str(plain.value)


def test_an_hf_folders_half_matrices_are_tiled(hf_folder: Path) -> None:
    """The 7 projections of each layer, the embedding and the untied head, as bf16 blocks."""
    got = tile(hf_folder)
    assert got.reader is None
    names = sorted(got.tiles)
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names
    assert len(names) == 7 * 2 + 2 and {fmt for fmt, _ in got.tiles.values()} == {"bf16"}


def test_model_path_names_gguf_files_and_hf_folders(mixed_gguf: Path, hf_folder: Path,
                                                    tmp_path: Path) -> None:
    assert model_path(str(mixed_gguf)) == mixed_gguf
    assert model_path(str(hf_folder)) == hf_folder
    assert model_path(str(tmp_path / "missing.gguf")) is None
    assert model_path(str(tmp_path)) is None  # a folder without config.json
    (tmp_path / "weights.bin").write_bytes(b"GGUF\x03\x00\x00\x00")
    assert model_path(str(tmp_path / "weights.bin")) == tmp_path / "weights.bin"
    (tmp_path / "notes.txt").write_text("not a model")
    assert model_path(str(tmp_path / "notes.txt")) is None


def test_tiles_are_made_early_only_where_the_loader_will_hold_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A float32 model on the CPU with the packed kernels on; on a GPU, in bfloat16 or with the
    kernels off each tile would be dequantized and dropped (a passing copy of the file)."""
    monkeypatch.setattr(early_tiles, "_GPU_NODES", (tmp_path / "nvidiactl",))
    assert tiles_will_be_held(None, None, True) and tiles_will_be_held("auto", "float32", True)
    assert tiles_will_be_held("cpu", "auto", True)
    assert not tiles_will_be_held("cpu", None, False)
    assert not tiles_will_be_held("cpu", "bfloat16", True)
    assert not tiles_will_be_held("cuda", None, True)
    assert not tiles_will_be_held("cuda:0", None, True)
    (tmp_path / "nvidiactl").touch()  # a machine with a GPU: "auto" is CUDA there
    assert not tiles_will_be_held("auto", None, True) and tiles_will_be_held("cpu", None, True)


def test_a_sharded_folder_is_tiled_across_its_shards(hf_folder: Path, tmp_path: Path) -> None:
    """Two shards and their index: every half matrix of both is tiled early, and the model
    from those tiles is the model loaded without them."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for f in hf_folder.iterdir():
        if f.suffix == ".json":
            shutil.copy(f, sharded / f.name)
    state = load_file(str(hf_folder / "model.safetensors"))
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: state[n] for n in part}, str(sharded / file), metadata={"format": "pt"})
    weight_map = {n: file for file, part in halves.items() for n in part}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert sorted(tile(sharded).tiles) == sorted(tile(hf_folder).tiles)
    plain_logits, _ = logits(hf_folder)
    with tiling_beside(sharded):
        early_logits, _ = logits(sharded)
        assert take_tiled(sharded) is None
    assert torch.equal(early_logits, plain_logits)


@pytest.mark.parametrize("dtype", [None, "auto", "float32", "bfloat16", "float16"])
@pytest.mark.parametrize("quant_kernels", [True, False])
def test_the_guess_follows_the_plans_decision_on_the_cpu(dtype: str | None,
                                                         quant_kernels: bool) -> None:
    """tiles_will_be_held restates kiln.model.native.plan.pack_weights for settings, before torch is
    imported; on the CPU (where the C library builds, as here) the two must not drift apart."""
    from kiln.model.devices import resolve_device, resolve_dtype
    from kiln.model.native.plan import pack_weights

    cpu = resolve_device("cpu")
    decided = pack_weights(resolve_dtype(dtype, cpu), cpu, quant_kernels=quant_kernels)
    assert tiles_will_be_held("cpu", dtype, quant_kernels) == decided
