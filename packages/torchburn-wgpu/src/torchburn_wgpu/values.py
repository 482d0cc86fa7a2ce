"""Tensors as a GPU program sees them while it is planned: a buffer slot plus a strided view of it.

A view op never moves data: it computes new sizes, strides and offset. To get those exactly as
PyTorch would (every view op, every corner case), the planner applies the op itself to a meta tensor
laid out like the value, and reads the result's layout back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchburn.planning import ComputeType, Layout, compute_type, meta_like, numel
from torchburn.planning import broadcast_strides as _broadcast_strides
from torchburn.planning import contiguous_strides as contiguous

__all__ = [
    "INTEGER_DTYPES",
    "KINDS",
    "SUPPORTED_DTYPES",
    "WGSL_TYPES",
    "WORD",
    "Value",
    "broadcast_strides",
    "contiguous",
    "element_bytes",
    "numel",
    "padded",
]

# how each supported dtype is stored in a WGSL array. WGSL has no 64-bit integers: int64 tensors
# (indices, positions, masks) live as i32, checked on upload (a value outside the 32-bit range is an
# error, never a wrapped index) and widened back on readback.
# float64 needs an adapter with `shader-f64` (checked when nodes are offered).
WGSL_TYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bool: "u32",
    torch.int64: "i32",
    torch.int32: "i32",
}
# what an expression of each dtype computes in: the shared compute types (torchburn.planning.expr);
# "int" is WGSL's i32 (float16 is stored as f16 and computed in f32, as PyTorch computes half on CPU)
KINDS: dict[torch.dtype, ComputeType] = {dtype: compute_type(dtype) for dtype in WGSL_TYPES}
SUPPORTED_DTYPES = frozenset(WGSL_TYPES)
INTEGER_DTYPES = frozenset({torch.int64, torch.int32})
WORD = 4  # bytes of every stored type but f64


def element_bytes(dtype: torch.dtype) -> int:
    return {torch.float64: 8, torch.float16: 2}.get(dtype, WORD)


def padded(nbytes: int) -> int:
    """Buffer sizes and copies go in whole 4-byte words, and none is under 16 bytes: a kernel that
    reads a buffer as ``array<vec4<...>>`` may not bind less than one vector."""
    return max(-(-nbytes // WORD) * WORD, 4 * WORD)


@dataclass(frozen=True)
class Value:
    """``shape``/``strides``/``offset`` (in elements) over the buffer in ``slot``, of ``numel`` elements."""

    slot: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    buffer_numel: int

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def wgsl_type(self) -> str:
        return WGSL_TYPES[self.dtype]

    def is_dense(self) -> bool:
        """Contiguous, from the start of its buffer, covering all of it: usable as a plain array."""
        return self.offset == 0 and self.numel == self.buffer_numel and self.strides == contiguous(self.shape)

    def meta(self) -> torch.Tensor:
        """A meta tensor with this value's layout, for computing view layouts with PyTorch itself."""
        return meta_like(self.dtype, Layout(self.shape, self.strides, self.offset), self.buffer_numel)

    def with_view(self, layout: Layout) -> Value:
        """This value's buffer seen through ``layout``."""
        return Value(self.slot, self.dtype, layout.shape, layout.strides, layout.offset, self.buffer_numel)

    def with_layout(self, t: torch.Tensor) -> Value:
        """This value's buffer seen through the layout of meta tensor ``t`` (a view of ``meta()``)."""
        return Value(self.slot, t.dtype, tuple(t.shape), tuple(t.stride()), int(t.storage_offset()), self.buffer_numel)


def broadcast_strides(value: Value, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides that read ``value`` as if broadcast to ``shape`` (size-1 and missing dims: stride 0)."""
    return _broadcast_strides(value.shape, value.strides, shape)
