"""What the planner manipulates: buffers, strided views of them (``Value``), and deferred elementwise
expressions (``Lazy``) that are fused into one sweep when something finally needs their memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from torchburn.planning import ComputeType, Expr, compute_type, contiguous_strides, numel

__all__ = [
    "DTYPE_NAMES",
    "FLOAT_DTYPES",
    "SUPPORTED_DTYPES",
    "Buffer",
    "Domain",
    "Lazy",
    "Tensorish",
    "Value",
    "contiguous_strides",
    "domain_of",
    "numel",
]

BufferKind = Literal["in", "out", "tmp"]
Domain = Literal["f32", "f64", "i64"]

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}
SUPPORTED_DTYPES = frozenset(DTYPE_NAMES)
FLOAT_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})


# the shared compute types (torchburn.planning.expr) as the elementwise machine has them: integers and
# bools in i64
_DOMAINS: dict[str, Domain] = {"f64": "f64", "f32": "f32", "int": "i64", "bool": "i64"}


# the shared compute type of the nodes of an expression computed in each domain
DOMAIN_TYPES: dict[Domain, ComputeType] = {"f32": "f32", "f64": "f64", "i64": "int"}


def domain_of(dtype: torch.dtype) -> Domain:
    """The compute type of the elementwise machine for a storage dtype (halves compute in f32, as eager)."""
    return _DOMAINS[compute_type(dtype)]


@dataclass(eq=False)
class Buffer:
    """A block of memory: a region input, a region output, or an arena slot placed by the memory plan."""

    kind: BufferKind
    index: int  # input/output position; for tmp a serial number
    nbytes: int
    arena_offset: int = -1
    first_use: int = -1  # instruction indices, for liveness
    last_use: int = -1

    def touch(self, instr: int) -> None:
        if self.first_use < 0:
            self.first_use = instr
        self.last_use = max(self.last_use, instr)

    def to_json(self) -> dict[str, int]:
        if self.kind == "in":
            return {"In": self.index}
        if self.kind == "out":
            return {"Out": self.index}
        assert self.arena_offset >= 0, "memory plan did not place this buffer"
        return {"Tmp": self.arena_offset}


@dataclass(frozen=True, eq=False)
class Value:
    """A strided view of a buffer: what a materialized tensor is during planning."""

    buffer: Buffer
    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in reversed(list(zip(self.shape, self.strides, strict=True))):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def with_view(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Value:
        return Value(self.buffer, self.dtype, tuple(shape), tuple(strides), offset)

    def operand(self, shape: tuple[int, ...] | None = None, strides: tuple[int, ...] | None = None) -> dict[str, Any]:
        return {
            "buf": self.buffer,  # resolved to JSON after the memory plan
            "dtype": DTYPE_NAMES[self.dtype],
            "offset": self.offset,
            "shape": list(self.shape if shape is None else shape),
            "strides": list(self.strides if strides is None else strides),
        }


@dataclass(eq=False)
class Lazy:
    """An elementwise expression not yet written to memory: ``expr`` (the shared expression node of
    :mod:`torchburn.planning.expr`, whose loads are ``Value``s) at every index of ``shape``, computed in
    ``domain`` and stored as ``dtype``. One fused instruction computes in one domain, so every node of
    ``expr`` does (a predicate's bool is 0 or 1 there)."""

    expr: Expr
    dtype: torch.dtype
    shape: tuple[int, ...]
    domain: Domain


Tensorish = Value | Lazy
