"""The header of a ``.gguf`` file: its metadata as plain Python values and where each tensor's bytes lie.

``gguf.GGUFReader`` builds a numpy view for every part of every field, which for a tokenizer of 49k
tokens and 49k merges is about a million views and five seconds at load; this reads the same header
with ``struct`` in a tenth of a second. Tensor data stay in a read-only memory map; the ``gguf``
package still supplies the quantization types and their dequantizers.
"""

from __future__ import annotations

import itertools
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
STRING, ARRAY = 8, 9
# value type -> struct format (little-endian)
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# value type -> numpy dtype, for arrays of numbers
NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 4  # arrays of arrays: GGUF files in use nest at most one deep


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # fastest-varying first, as GGUF lists them
    type: int  # a gguf.GGMLQuantizationType value
    offset: int  # from the start of the data section


class GGUFHeader:
    """Metadata ``fields`` (key -> str / int / float / bool / list) and ``tensors`` of one GGUF file.

    Every count, length, dimension and offset is checked against the file's size before it sizes a loop or
    a read: a header cannot claim more than the file holds. Tensors must be of a known type, have 1 to 4
    dimensions, lie inside the data section at aligned offsets and not overlap; names and keys are unique."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as exc:  # an empty file cannot be mapped
                raise ModelLoadError(f"{path} is not a GGUF file: {exc}") from exc
        self._pos = 0
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc

    def _parse(self) -> None:
        if self._map[:4] != MAGIC:
            raise ModelLoadError(f"{self.path} is not a GGUF file (it does not start with {MAGIC!r})")
        version, n_tensors, n_fields = struct.unpack_from("<IQQ", self._map, 4)
        if version not in VERSIONS:
            raise ModelLoadError(f"{self.path}: GGUF version {version} is not supported (supported: 2, 3)")
        self._pos = 24
        # the smallest field is a key length, a type and one byte; the smallest tensor entry a name length,
        # one dimension, a type and an offset
        self._room(n_fields, 8 + 4 + 1, "metadata fields")
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self._string()
            if key in self.fields:
                raise ValueError(f"metadata key {key!r} appears twice")
            self.fields[key] = self._value(self._scalar("<I"), 0)
        self._room(n_tensors, 8 + 4 + 8 + 4 + 8, "tensors")
        self.tensors: list[TensorInfo] = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._scalar("<I")
            if not 1 <= n_dims <= MAX_DIMS:
                raise ValueError(f"tensor {name!r} has {n_dims} dimensions (GGUF tensors have 1 to {MAX_DIMS})")
            dims = struct.unpack_from(f"<{n_dims}Q", self._map, self._pos)
            self._pos += 8 * n_dims
            kind, offset = self._scalar("<I"), self._scalar("<Q")
            self.tensors.append(TensorInfo(name, tuple(dims), kind, offset))
        alignment = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if (
            isinstance(alignment, bool)
            or not isinstance(alignment, int)
            or alignment <= 0
            or alignment & (alignment - 1)
        ):
            raise ModelLoadError(f"{self.path}: general.alignment {alignment!r} is not a power of two")
        self.data_start = -(-self._pos // alignment) * alignment
        self._check_tensors(alignment)

    def _check_tensors(self, alignment: int) -> None:
        """Each tensor's bytes inside the file, at an aligned offset, apart from every other's."""
        from gguf import GGML_QUANT_SIZES

        sizes = {int(kind): size for kind, size in GGML_QUANT_SIZES.items()}  # (block, bytes of a block)
        names: set[str] = set()
        spans = []
        for t in self.tensors:
            if t.name in names:
                raise ValueError(f"tensor {t.name!r} appears twice")
            names.add(t.name)
            if t.type not in sizes:
                raise ValueError(f"tensor {t.name!r} has unknown GGUF type {t.type}")
            block, block_bytes = sizes[t.type]
            if any(d < 1 for d in t.dims):
                raise ValueError(f"tensor {t.name!r} has a dimension of 0 ({t.dims})")
            if t.dims[0] % block:
                raise ValueError(f"tensor {t.name!r}'s rows of {t.dims[0]} are not whole blocks of {block}")
            if t.offset % alignment:
                raise ValueError(f"tensor {t.name!r} starts at offset {t.offset}, not a multiple of {alignment}")
            size = t.dims[0] // block * block_bytes * math.prod(t.dims[1:])
            if self.data_start + t.offset + size > len(self._map):
                raise ValueError(f"tensor {t.name!r} runs past the end of the file (truncated?)")
            spans.append((t.offset, t.offset + size, t.name))
        spans.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(spans):
            if start < end:
                raise ValueError(f"tensors {first!r} and {second!r} overlap")

    def _room(self, count: int, least: int, what: str) -> None:
        """Refuse a count of entries of at least ``least`` bytes each that the rest of the file cannot hold."""
        left = len(self._map) - self._pos
        if count * least > left:
            raise ValueError(f"the header claims {count} {what}, more than the {left} bytes left can hold")

    def _scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        (length,) = struct.unpack_from("<Q", self._map, self._pos)
        start = self._pos + 8
        if start + length > len(self._map):
            raise ValueError(f"a string of {length} bytes at offset {self._pos} runs past the end of the file")
        self._pos = start + length
        return self._map[start : self._pos].decode("utf-8")

    def _value(self, kind: int, depth: int) -> Any:
        if kind == STRING:
            return self._string()
        if kind == ARRAY:
            if depth >= MAX_NESTING:
                raise ValueError(f"arrays nest more than {MAX_NESTING} deep at offset {self._pos}")
            item, count = struct.unpack_from("<IQ", self._map, self._pos)
            self._pos += 12
            if item in NUMPY:
                dtype = np.dtype(NUMPY[item])
                end = self._pos + count * dtype.itemsize
                if end > len(self._map):
                    raise ValueError(f"an array of {count} values at offset {self._pos} runs past the end of the file")
                values = np.frombuffer(self._map, dtype, count, self._pos).tolist()
                self._pos = end
                return values
            self._room(count, 8 if item == STRING else 12, "array items")
            return [self._value(item, depth + 1) for _ in range(count)]
        fmt = SCALARS.get(kind)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {kind} at offset {self._pos}")
        return self._scalar(fmt)

    def tensor_bytes(self, info: TensorInfo, row_bytes: int, rows: int) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 array [rows, row_bytes] over the memory map."""
        start = self.data_start + info.offset
        if start + rows * row_bytes > len(self._map):
            raise ModelLoadError(f"{self.path}: tensor {info.name} runs past the end of the file (truncated?)")
        return np.frombuffer(self._map, np.uint8, rows * row_bytes, start).reshape(rows, row_bytes)
