"""kiln.model.checkpoint.gguf_index against gguf-py's GGUFReader (the reference): the same metadata
values and the same tensors, byte for byte; malformed files refused with a ValueError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from kiln.model.checkpoint.gguf_index import GGUFIndex


def reference_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def assert_same(path: Path) -> GGUFIndex:
    ix, ref = GGUFIndex(path), gguf.GGUFReader(str(path))
    want = reference_metadata(ref)
    assert list(ix.metadata) == list(want)
    for key, value in want.items():
        got = ix.metadata[key]
        assert got == value and type(got) is type(value), key
        if isinstance(value, list):
            assert [type(v) for v in got] == [type(v) for v in value], key
    assert ix.data_offset == ref.data_offset
    assert len(ix.tensors) == len(ref.tensors)
    for a, b in zip(ix.tensors, ref.tensors, strict=True):
        assert (a.name, a.tensor_type.name, int(a.tensor_type), list(a.shape), a.n_elements,
                a.n_bytes, a.data_offset) == (
            b.name, b.tensor_type.name, int(b.tensor_type), b.shape.tolist(), int(b.n_elements),
            int(b.n_bytes),
            b.data_offset), a.name
        assert (a.data.dtype, a.data.shape) == (b.data.dtype, b.data.shape), a.name
        assert np.array_equal(a.data.view(np.uint8), np.asarray(b.data).view(np.uint8)), a.name
    return ix


def test_default_model_reads_as_gguf_py_reads_it() -> None:
    from kiln.model.checkpoint.locate import default_model_path

    ix = assert_same(Path(default_model_path()))
    assert len(ix.metadata) > 20 and len(ix.metadata["tokenizer.ggml.tokens"]) == 49152


def test_every_value_type_and_tensor_type(tmp_path: Path) -> None:
    """A file with each scalar type, arrays of numbers, strings and bools, an alignment other
    than the default, and tensors of plain and block types."""
    path = tmp_path / "all.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.strs", ["a", "", "ünï"])
    w.add_array("t.bools", [True, False])
    w.add_custom_alignment(64)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 7)).astype(np.float16))
    w.add_tensor("i32", np.arange(6, dtype=np.int32))
    q = gguf.GGMLQuantizationType.Q8_0
    w.add_tensor("q8", gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), q),
                 raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ix = assert_same(path)
    assert ix.metadata["t.strs"] == ["a", "", "ünï"] and ix.data_offset % 64 == 0
    assert [t.shape for t in ix.tensors] == [(5, 3), (7, 2), (6,), (64, 4)]


@pytest.mark.parametrize("cut", [0, 3, 10, 30, 200])
def test_truncated_or_foreign_files_are_refused(tmp_path: Path, cut: int) -> None:
    from kiln.model.checkpoint.locate import default_model_path

    whole = Path(default_model_path()).read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(whole[:cut] if cut else b"PK\x03\x04" + whole[4:200])
    with pytest.raises(ValueError):
        GGUFIndex(bad)


def test_a_tensor_past_the_end_is_refused(tmp_path: Path) -> None:
    from kiln.model.checkpoint.locate import default_model_path

    src = GGUFIndex(default_model_path())
    bad = tmp_path / "short.gguf"
    bad.write_bytes(Path(default_model_path()).read_bytes()[:src.data_offset + 1000])
    with pytest.raises(ValueError, match="past the end"):
        GGUFIndex(bad)


def test_the_type_table_is_gguf_pys() -> None:
    """kiln.model.checkpoint.gguf_index's own GGML type table (so that reading an index does not
    import gguf-py): the same names, numbers and block sizes as gguf-py's."""
    from kiln.model.checkpoint.gguf_index import GGML_BLOCK_SIZES, GGMLType

    theirs = {t.name: (t.value, gguf.GGML_QUANT_SIZES.get(t)) for t in gguf.GGMLQuantizationType}
    ours = {t.name: (t.value, GGML_BLOCK_SIZES.get(t)) for t in GGMLType}
    assert ours == theirs
