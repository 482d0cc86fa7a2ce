"""The GGUF header reader against the ``gguf`` package's own reader and writer: every field and tensor of
the shipped model, a file with every value type, and damaged files (a clear error, never a crash)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from torchburn_llm.errors import ModelLoadError
from torchburn_llm.gguf_header import GGUFHeader


def test_fields_and_tensors_of_the_shipped_model_match_the_gguf_reader(smollm2_path: Path) -> None:
    reference = GGUFReader(str(smollm2_path))
    ours = GGUFHeader(smollm2_path)
    keys = [k for k in reference.fields if not k.startswith("GGUF.")]  # the reader's own header entries
    assert sorted(ours.fields) == sorted(keys)
    for key in keys:
        assert ours.fields[key] == reference.fields[key].contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    for info, t in zip(ours.tensors, reference.tensors, strict=True):
        assert info.dims == tuple(int(d) for d in t.shape) and info.type == int(t.tensor_type), info.name
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        got = ours.tensor_bytes(info, raw.size, 1).reshape(-1)
        assert np.array_equal(got, raw), info.name


def _write(path: Path, fields: dict[str, tuple[Any, GGUFValueType | None]]) -> None:
    writer = GGUFWriter(path, "llama")
    for key, (value, kind) in fields.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        else:
            assert kind is not None
            writer.add_key_value(key, value, kind)
    writer.add_tensor("a", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("b", np.ones((2, 5), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_every_value_type_reads_back(tmp_path: Path) -> None:
    fields: dict[str, tuple[Any, GGUFValueType | None]] = {
        "t.u8": (200, GGUFValueType.UINT8),
        "t.i8": (-100, GGUFValueType.INT8),
        "t.u16": (60000, GGUFValueType.UINT16),
        "t.i16": (-30000, GGUFValueType.INT16),
        "t.u32": (4_000_000_000, GGUFValueType.UINT32),
        "t.i32": (-2_000_000_000, GGUFValueType.INT32),
        "t.u64": (2**63 + 5, GGUFValueType.UINT64),
        "t.i64": (-(2**62), GGUFValueType.INT64),
        "t.f32": (0.25, GGUFValueType.FLOAT32),
        "t.f64": (1e-300, GGUFValueType.FLOAT64),
        "t.bool": (True, GGUFValueType.BOOL),
        "t.str": ("héllo ☃", GGUFValueType.STRING),
        "t.ints": ([1, -2, 3], None),
        "t.floats": ([0.5, 1.5], None),
        "t.strs": (["a", "", "ü b"], None),
    }
    path = tmp_path / "types.gguf"
    _write(path, fields)
    ours = GGUFHeader(path)
    reference = GGUFReader(str(path))
    for key, (value, _) in fields.items():
        assert ours.fields[key] == reference.fields[key].contents() == value, key
    a, b = ours.tensors
    assert (a.name, a.dims, a.type) == ("a", (4, 3), int(GGMLQuantizationType.F32))
    assert (b.name, b.dims, b.type) == ("b", (5, 2), int(GGMLQuantizationType.F16))
    assert np.array_equal(ours.tensor_bytes(a, 16, 3).view(np.float32), np.arange(12, dtype=np.float32).reshape(3, 4))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: b"", "not a GGUF file"),
        (lambda data: b"GGML" + data[4:], "not a GGUF file"),
        (lambda data: data[:4] + (99).to_bytes(4, "little") + data[8:], "version 99"),
        (lambda data: data[:40], "not a readable GGUF file"),
        (lambda data: data[:300], "not a readable GGUF file"),
        (lambda data: data[:-20], "runs past the end"),
    ],
)
def test_damaged_files_give_a_clear_error(tmp_path: Path, damage: Any, message: str) -> None:
    good = tmp_path / "good.gguf"
    _write(good, {"t.strs": (["x" * 50] * 8, None), "general.name": ("tiny", GGUFValueType.STRING)})
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(damage(good.read_bytes()))
    with pytest.raises(ModelLoadError, match=message):
        header = GGUFHeader(bad)
        for info in header.tensors:  # the last tensor's bytes are cut off
            header.tensor_bytes(info, 16 if info.name == "a" else 10, 3 if info.name == "a" else 2)
    assert good.read_bytes()[:4] == b"GGUF"  # the reader never writes
