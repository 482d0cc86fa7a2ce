"""Turns a region's ATen graph, at concrete input sizes, into a flat program for the Rust runtime.

One pass over the nodes: each node's lowering (``lowering/``) returns a ``Value`` (memory) or a ``Lazy``
(an elementwise expression). Lazies are fused into their consumers and written to memory only when
something needs memory: a non-elementwise consumer, a second user, or a region output. Then the memory
plan places every intermediate in one arena by liveness, and buffers that end up as region outputs are
written straight into the output tensors the caller allocates.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from torchburn.planning import GraphWalk, LoweringTable, PlanContext, PlanError, expr, extent
from torchburn.planning import broadcast_strides as _broadcast_strides

from . import expr_code
from .values import (
    DOMAIN_TYPES,
    DTYPE_NAMES,
    Buffer,
    Domain,
    Lazy,
    Tensorish,
    Value,
    contiguous_strides,
    domain_of,
    numel,
)

ARENA_ALIGN = 64  # cache line: no two buffers share one, and SIMD loads stay aligned

# the engine's lowerings (filled by ``lowering/``, one module per family)
TABLE = LoweringTable("native")

__all__ = ["TABLE", "DerivedInput", "OutputSpec", "PlanError", "PlannedProgram", "Planner"]


@dataclass(frozen=True)
class OutputSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    strides: tuple[int, ...]


@dataclass(frozen=True)
class PlannedProgram:
    plan_json: str
    in_bytes: list[int]
    out_specs: list[OutputSpec]
    out_bytes: list[int]
    n_instrs: int
    constants: tuple[torch.Tensor, ...] = ()  # tensors the graph holds (get_attr), passed after the inputs
    intermediate_bytes: int = 0  # what the arena would need without reuse
    # row-major copies the caller makes of column-major GEMM operands (see ``Planner.row_major_copy``),
    # passed after the constants: (index among inputs+constants, shape, strides, storage offset)
    derived: tuple[DerivedInput, ...] = ()


@dataclass(frozen=True)
class DerivedInput:
    source: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    # 0: one row-major copy; P > 0 (2-D only): panels of P columns, each a contiguous row-major
    # ``rows × P`` block, the last zero-padded (the ``b_panel`` layout of a matmul instruction)
    panel: int = 0
    # M > 0 (2-D f32 only): the ``k × n`` view packed by MKL for products with M rows of A, in
    # ``packed_bytes`` bytes (the ``b_packed`` operand of a matmul instruction); ``panel`` is then 0
    packed_rows: int = 0
    packed_bytes: int = 0

    @property
    def numel(self) -> int:
        if self.packed_rows:
            return -(-self.packed_bytes // 4)
        if self.panel:
            rows, cols = self.shape
            return -(-cols // self.panel) * rows * self.panel
        return math.prod(self.shape)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*shapes))  # type: ignore[no-untyped-call]


def broadcast_strides(value: Value, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides that read ``value`` as if expanded to ``shape`` (0 on broadcast dimensions)."""
    return _broadcast_strides(value.shape, value.strides, shape)


def coalesce(
    shape: tuple[int, ...], stride_sets: list[tuple[int, ...]]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Merge adjacent dimensions that every operand walks as one (fewer, longer runs in the kernel)."""
    if not shape:
        return (1,), [(0,) for _ in stride_sets]
    dims = [i for i, s in enumerate(shape) if s != 1] or [len(shape) - 1]
    out_shape = [shape[dims[0]]]
    out_strides = [[st[dims[0]]] for st in stride_sets]
    for d in dims[1:]:
        mergeable = all(o[-1] == st[d] * shape[d] for o, st in zip(out_strides, stride_sets, strict=True))
        if mergeable:
            out_shape[-1] *= shape[d]
            for o, st in zip(out_strides, stride_sets, strict=True):
                o[-1] = st[d]
        else:
            out_shape.append(shape[d])
            for o, st in zip(out_strides, stride_sets, strict=True):
                o.append(st[d])
    return tuple(out_shape), [tuple(o) for o in out_strides]


class Planner(GraphWalk):
    """Plans one region at concrete input layouts into a flat Rust program (see the module docs)."""

    table = TABLE

    def __init__(self, gm: torch.fx.GraphModule, args: Sequence[Any], context: PlanContext | None = None) -> None:
        super().__init__(gm, args, context)
        self.instrs: list[dict[str, Any]] = []
        self.buffers: list[Buffer] = []
        self.producer: dict[int, int] = {}  # id(Buffer) -> index of the instruction that wrote it
        self.in_bytes: list[int] = []
        self.constants: list[torch.Tensor] = []
        self.derived: list[DerivedInput] = []

    # ---- buffers -------------------------------------------------------------------------------
    def new_value(self, shape: Sequence[int], dtype: torch.dtype) -> Value:
        shape = tuple(int(s) for s in shape)
        nbytes = max(numel(shape), 1) * _itemsize(dtype)
        buf = Buffer("tmp", len(self.buffers), nbytes)
        self.buffers.append(buf)
        return Value(buf, dtype, shape, contiguous_strides(shape))

    def emit(self, instr: dict[str, Any], reads: Sequence[Value | None], writes: Sequence[Value | None]) -> int:
        index = len(self.instrs)
        for v in (*reads, *writes):
            if v is not None:
                v.buffer.touch(index)
        for v in writes:
            if v is not None:
                self.producer[id(v.buffer)] = index
        self.instrs.append(instr)
        return index

    # ---- lazy expressions ----------------------------------------------------------------------
    def lazy(self, x: Tensorish | float | int | bool, domain: Domain) -> Lazy:
        """``x`` as an operand of an expression computed in ``domain``."""
        if isinstance(x, Lazy):
            if x.domain == domain:
                return x
            x = self.materialize(x)
        node_type = DOMAIN_TYPES[domain]
        if isinstance(x, Value):
            return Lazy(expr.load(x, node_type), x.dtype, x.shape, domain)
        if isinstance(x, bool):
            return Lazy(expr.const(int(x), node_type), torch.bool, (), domain)
        if isinstance(x, int):
            return Lazy(expr.const(x, node_type), torch.int64, (), domain)
        if isinstance(x, float):
            return Lazy(expr.const(x, node_type), torch.float32, (), domain)
        raise PlanError(f"cannot use {type(x).__name__} as a tensor operand")

    def converted(self, x: Tensorish, dtype: torch.dtype) -> Lazy:
        """``x`` read in its own dtype's domain and stored as ``dtype``: a conversion fused into its reader."""
        src = self.lazy(x, domain_of(x.dtype))
        return Lazy(expr.apply("identity", src.expr), dtype, src.shape, src.domain)

    def filled(self, value: float | int | bool, dtype: torch.dtype, shape: tuple[int, ...]) -> Lazy:
        """``value`` at every index of ``shape``, stored as ``dtype``."""
        d = domain_of(dtype)
        return Lazy(expr.const(value, DOMAIN_TYPES[d]), dtype, shape, d)

    def value(self, x: Tensorish) -> Value:
        return x if isinstance(x, Value) else self.materialize(x)

    def is_lazy(self, value: Any) -> bool:
        return isinstance(value, Lazy)

    def contiguous(self, x: Tensorish, dtype: torch.dtype | None = None) -> Value:
        """``x`` as a contiguous Value of ``dtype`` (copying or converting only when it is not already)."""
        dtype = dtype or x.dtype
        if isinstance(x, Value) and x.is_contiguous and x.dtype == dtype:
            return x
        return self.materialize(self.lazy(x, domain_of(dtype)), dtype=dtype, copy=True)

    def materialize(
        self, lazy: Lazy, dtype: torch.dtype | None = None, into: Value | None = None, copy: bool = False
    ) -> Value:
        """Write an expression to memory with one fused elementwise instruction."""
        loaded = lazy.expr.leaf if lazy.expr.op == "load" else None
        if loaded is not None and into is None and not copy and dtype in (None, loaded.dtype):
            return loaded  # type: ignore[no-any-return]
        dtype = dtype or lazy.dtype
        out = into if into is not None else self.new_value(lazy.shape, dtype)
        shape = out.shape
        code, loads, nregs = expr_code.steps(lazy.expr)
        code.append({"op": "store", "a": nregs - 1, "output": 0})
        stride_sets = [broadcast_strides(v, shape) for v in loads] + [out.strides]
        iter_shape, coalesced = coalesce(shape, stride_sets)
        if any(c["op"] == "iota" for c in code) and (len(iter_shape) != 1 or not out.is_contiguous):
            raise PlanError("iota (arange) is only planned as its own 1-D contiguous instruction")
        inputs = [v.operand(iter_shape, st) for v, st in zip(loads, coalesced[:-1], strict=True)]
        output = out.operand(iter_shape, coalesced[-1])
        instr = {
            "kind": "elementwise",
            "domain": lazy.domain,
            "shape": list(iter_shape),
            "inputs": inputs,
            "outputs": [output],
            "code": code,
            "nregs": nregs,
        }
        self.emit(instr, loads, [out])
        return out

    # ---- binding the region's inputs (see GraphWalk) ----------------------------------------------
    def meta_of(self, node: torch.fx.Node) -> Any:
        return self.meta_env[node]

    def bind_input(self, position: int, tensor_index: int, tensor: torch.Tensor) -> tuple[Any, torch.Tensor]:
        if tensor.dtype not in DTYPE_NAMES:
            raise PlanError(f"input dtype {tensor.dtype} not supported")
        buf = Buffer("in", tensor_index, extent(tuple(tensor.shape), tensor.stride()) * tensor.element_size())
        self.in_bytes.append(buf.nbytes)
        # inputs are read where they lie, in their own strides
        value = Value(buf, tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()), 0)
        return value, torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")

    def bind_constant(self, node: torch.fx.Node, tensor: torch.Tensor) -> Any:
        if tensor.dtype not in DTYPE_NAMES or tensor.device.type != "cpu":
            raise PlanError(f"graph constant {node.target} is not a supported CPU tensor")
        # constants are passed after the inputs
        buf = Buffer("in", len(self.in_bytes), extent(tuple(tensor.shape), tensor.stride()) * tensor.element_size())
        self.in_bytes.append(buf.nbytes)
        self.constants.append(tensor)
        return Value(buf, tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()), 0)

    def run(self) -> PlannedProgram:
        return self._finish(self.walk())

    def packed_copy(self, v: Value, rows: int, nbytes: int) -> dict[str, Any]:
        """The operand of a copy of the 2-D f32 region input ``v`` (``k × n``) that the caller packs
        with MKL for products with ``rows`` rows of A, once per version of that tensor (see
        ``kernels/gemm_packed.rs``): ``nbytes`` bytes, read as a flat f32 operand."""
        spec = DerivedInput(v.buffer.index, v.shape, v.strides, v.offset, 0, rows, nbytes)
        copy = Value(self._derived_buffer(spec, spec.numel * 4), torch.float32, (spec.numel,), (1,))
        return copy.operand()

    def row_major_copy(self, v: Value, panel: int = 0) -> Value:
        """A row-major copy of the region input that ``v`` views, made by the caller once per version of
        that tensor (a Linear weight read as ``w.t()`` is column-major: a GEMM would repack it every call).
        With ``panel`` P (2-D ``v``), the copy is laid out in panels of P columns (see ``DerivedInput``);
        the value's strides are then those within a panel, ``(P, 1)``, and only a matmul instruction
        told ``b_panel`` P may read it.
        """
        spec = DerivedInput(v.buffer.index, v.shape, v.strides, v.offset, panel)
        buf = self._derived_buffer(spec, max(spec.numel, 1) * _itemsize(v.dtype))
        return Value(buf, v.dtype, v.shape, (panel, 1) if panel else contiguous_strides(v.shape))

    def _derived_buffer(self, spec: DerivedInput, nbytes: int) -> Buffer:
        """The region input the caller fills with the copy ``spec`` describes: one per distinct copy,
        numbered after the inputs and constants."""
        if spec in self.derived:
            index = len(self.in_bytes) - len(self.derived) + self.derived.index(spec)
            return Buffer("in", index, nbytes)
        self.in_bytes.append(nbytes)
        self.derived.append(spec)
        return Buffer("in", len(self.in_bytes) - 1, nbytes)

    # ---- outputs and memory plan ---------------------------------------------------------------
    def _finish(self, results: list[Any]) -> PlannedProgram:
        out_specs: list[OutputSpec] = []
        claimed: set[int] = set()
        for j, v in enumerate(results):
            if isinstance(v, Lazy):
                v = self.materialize(v)
            if not isinstance(v, Value):
                raise PlanError(f"region output {j} is not a tensor")
            out_specs.append(OutputSpec(v.shape, v.dtype, contiguous_strides(v.shape)))
            buf = v.buffer
            whole = v.offset == 0 and v.is_contiguous and buf.nbytes == max(v.numel, 1) * _itemsize(v.dtype)
            if buf.kind == "tmp" and whole and id(buf) not in claimed:
                # the intermediate becomes the output tensor itself: written in place, no copy
                buf.kind, buf.index = "out", j
                claimed.add(id(buf))
            else:
                dest = Value(
                    Buffer("out", j, max(v.numel, 1) * _itemsize(v.dtype)),
                    v.dtype,
                    v.shape,
                    contiguous_strides(v.shape),
                )
                self.materialize(self.lazy(v, domain_of(v.dtype)), into=dest)
        arena = self._place_tmp_buffers()
        plan = {
            "n_inputs": len(self.in_bytes),
            "n_outputs": len(out_specs),
            "arena_bytes": arena,
            "instrs": self.instrs,
        }
        text = json.dumps(_finite_json(plan), default=_json_default, separators=(",", ":"), allow_nan=False)
        out_bytes = [max(numel(s.shape), 1) * _itemsize(s.dtype) for s in out_specs]
        unplanned = sum(_align(b.nbytes) for b in self.buffers if b.kind == "tmp" and b.first_use >= 0)
        return PlannedProgram(
            text,
            self.in_bytes,
            out_specs,
            out_bytes,
            len(self.instrs),
            tuple(self.constants),
            unplanned,
            tuple(self.derived),
        )

    def _place_tmp_buffers(self) -> int:
        """Greedy best-fit by size: buffers whose lifetimes overlap never share bytes."""
        tmps = [b for b in self.buffers if b.kind == "tmp" and b.first_use >= 0]
        placed: list[Buffer] = []
        arena = 0
        for buf in sorted(tmps, key=lambda b: -b.nbytes):
            size = _align(buf.nbytes)
            busy = sorted(
                (p.arena_offset, p.arena_offset + _align(p.nbytes))
                for p in placed
                if p.first_use <= buf.last_use and buf.first_use <= p.last_use
            )
            offset = 0
            for lo, hi in busy:
                if offset + size <= lo:
                    break
                offset = max(offset, hi)
            buf.arena_offset = offset
            placed.append(buf)
            arena = max(arena, offset + size)
        return arena


def _align(n: int) -> int:
    return (n + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size() if dtype not in _ITEMSIZE else _ITEMSIZE[dtype]


_ITEMSIZE = {
    torch.float32: 4,
    torch.float64: 8,
    torch.float16: 2,
    torch.bfloat16: 2,
    torch.int64: 8,
    torch.int32: 4,
    torch.int16: 2,
    torch.int8: 1,
    torch.uint8: 1,
    torch.bool: 1,
}


def _finite_json(obj: Any) -> Any:
    """JSON has no NaN or infinities: write them as the strings the runtime's parser accepts."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _finite_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite_json(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Buffer):
        return obj.to_json()
    raise TypeError(f"not serializable: {obj!r}")
