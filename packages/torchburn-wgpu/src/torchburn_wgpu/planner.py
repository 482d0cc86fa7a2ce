"""Turns a region's ATen graph, for one set of concrete input layouts, into a list of kernel launches.

Elementwise nodes do not launch anything when planned: they build an expression (``Lazy``) over
the buffers they read. A chain of them becomes one generated kernel when something needs the result
in memory: a matmul, a reduction, a view, a region output, or a second consumer. So ``x*w+b`` then
GELU is one sweep over memory, not four.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .kernels import Launch, elementwise_source, f32_literal, f64_literal, grid, params
from .values import KINDS, WGSL_TYPES, Value, broadcast_strides, contiguous, numel


class PlanError(Exception):
    """A node this engine accepted cannot be planned for these concrete layouts."""


@dataclass(frozen=True, eq=False)
class Expr:
    """A node of a fused elementwise expression: a load of ``leaf``, or ``template`` over ``args``.

    ``template`` is WGSL with ``{0}``, ``{1}``... for the arguments (and may use ``i``, the output's
    linear index); ``kind`` is what it yields: "f32", "i32" or "bool". Compared by identity: a shared
    sub-expression is computed once.
    """

    kind: str
    template: str = ""
    args: tuple[Expr, ...] = ()
    leaf: Value | None = None


@dataclass(frozen=True)
class Lazy:
    """An elementwise result not yet in memory: ``expr`` evaluated at every index of ``shape``."""

    expr: Expr
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return numel(self.shape)


Tensorish = Value | Lazy


@dataclass
class Slot:
    dtype: torch.dtype
    numel: int
    input_index: int | None = None  # the region input it holds, if any


@dataclass
class Planner:
    max_bindings: int  # storage buffers a kernel may bind (the adapter's per-stage limit)
    slots: list[Slot] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    error_slot: int | None = None  # a word kernels set when an index is out of range
    # the keyword arguments of the node being lowered, tensors as planner values (e.g. attn_mask)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def error_flag(self) -> int:
        """The slot of the region's error flag, made on first use."""
        if self.error_slot is None:
            self.error_slot = self.new_slot(torch.int32, 1)
        return self.error_slot

    def new_slot(self, dtype: torch.dtype, numel: int, input_index: int | None = None) -> int:
        self.slots.append(Slot(dtype, numel, input_index))
        return len(self.slots) - 1

    def new_value(self, dtype: torch.dtype, shape: Sequence[int]) -> Value:
        shape = tuple(int(s) for s in shape)
        n = numel(shape)
        return Value(self.new_slot(dtype, n), dtype, shape, contiguous(shape), 0, n)

    # ---- elementwise ----------------------------------------------------------------------------
    def lazy(self, x: Tensorish | float | bool, shape: tuple[int, ...]) -> Expr:
        """``x`` as an expression of its own kind over ``shape`` (broadcast); scalars become constants."""
        if isinstance(x, bool):
            return Expr("bool", "true" if x else "false")
        if isinstance(x, int):
            if not -(2**31) <= x < 2**31:
                raise PlanError(f"integer constant {x} does not fit the 32-bit integers this engine computes in")
            return Expr("i32", f"i32({x})")
        if isinstance(x, float):
            return Expr("f32", f32_literal(x))
        if isinstance(x, Lazy):
            if x.shape == shape:
                return x.expr
            x = self.materialize(x)
        leaf = Value(x.slot, x.dtype, shape, broadcast_strides(x, shape), x.offset, x.buffer_numel)
        return Expr(KINDS[x.dtype], leaf=leaf)

    def materialize(self, x: Tensorish, out: Value | None = None) -> Value:
        """``x`` in memory: a Value as is, a Lazy by one generated kernel (into ``out`` if given, a view
        of another buffer, as ``cat`` needs; else into a new contiguous buffer)."""
        if isinstance(x, Value) and out is None:
            return x
        expr = x.expr if isinstance(x, Lazy) else self.lazy(x, x.shape)
        if out is None:
            out = self.new_value(x.dtype, x.shape)
        if out.numel == 0:
            return out
        leaves = _leaves(expr)
        slots = list(dict.fromkeys(leaf.slot for leaf in leaves))
        if len(slots) + 2 > self.max_bindings:
            raise PlanError(
                f"a fused kernel would bind {len(slots) + 2} buffers; the adapter allows {self.max_bindings}"
            )
        body = _render(expr, leaves, slots, out)
        rank = len(out.shape)
        words: list[int] = [out.numel, *out.shape]
        for leaf in leaves:
            words += [leaf.offset, *leaf.strides]
        words += [out.offset, *out.strides]
        types = [WGSL_TYPES[self.slots[s].dtype] for s in slots]
        source = elementwise_source(out.wgsl_type, types, rank, body)
        threads = -(-out.numel // ELEMENTS_PER_THREAD)
        self.launches.append(Launch("elementwise", source, [out.slot, *slots], params(words), grid(-(-threads // 256))))
        return out

    def dense(self, x: Tensorish) -> Value:
        """``x`` as a contiguous buffer of its own (a copy where it is a strided view)."""
        if isinstance(x, Value) and x.is_dense():
            return x
        if isinstance(x, Value):
            return self.materialize(Lazy(self.lazy(x, x.shape), x.dtype, x.shape))
        return self.materialize(x)


# WGSL conversions between expression kinds, as PyTorch converts dtypes (float to int truncates)
CASTS = {
    ("bool", "f32"): "select(0.0, 1.0, {0})",
    ("bool", "i32"): "select(0i, 1i, {0})",
    ("bool", "f64"): "select(0.0lf, 1.0lf, {0})",
    ("i32", "f32"): "f32({0})",
    ("i32", "f64"): "f64({0})",
    ("f32", "i32"): "i32({0})",
    ("f32", "f64"): "f64({0})",
    ("f64", "f32"): "f32({0})",
    ("f64", "i32"): "i32({0})",
    ("f32", "bool"): "({0} != 0.0)",
    ("f64", "bool"): "({0} != 0.0lf)",
    ("i32", "bool"): "({0} != 0i)",
}


def constant(value: float | int | bool, kind: str) -> Expr:
    """A Python scalar as an exact constant of ``kind``."""
    if kind == "bool":
        return Expr("bool", "true" if value else "false")
    if kind == "i32":
        if float(value) != int(value) or not -(2**31) <= int(value) < 2**31:
            raise PlanError(f"constant {value} is not a 32-bit integer")
        return Expr("i32", f"i32({int(value)})")
    if kind == "f64":
        return Expr("f64", f64_literal(float(value)))
    return Expr("f32", f32_literal(float(value)))


def cast(expr: Expr, kind: str) -> Expr:
    """``expr`` converted to ``kind`` ("f32", "i32" or "bool")."""
    if expr.kind == kind:
        return expr
    return Expr(kind, CASTS[(expr.kind, kind)], (expr,))


def _leaves(expr: Expr) -> list[Value]:
    """The distinct loads of ``expr`` in first-use order."""
    order: dict[Value, None] = {}

    def walk(e: Expr) -> None:
        if e.leaf is not None:
            order.setdefault(e.leaf)
            return
        for a in e.args:
            walk(a)

    walk(expr)
    return list(order)


def _row_major(strides: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether these strides walk ``shape`` in plain row-major order (size-1 dims may have any)."""
    return all(size == 1 or st == want for size, st, want in zip(shape, strides, contiguous(shape), strict=True))


ELEMENTS_PER_THREAD = 4  # each thread computes this many outputs, a launch's width apart
INDEX = "@i"  # how an expression template names the output's linear index


def _render(expr: Expr, leaves: list[Value], slots: list[int], out: Value) -> str:
    """WGSL statements computing ``expr`` at ELEMENTS_PER_THREAD indices and storing the results.

    Every load of every copy comes before any store: the compiler may not move a load above a store
    to another binding (they could alias), so this order is what lets a thread have several loads in
    flight. An operand (or the output) laid out row-major like the output is addressed as offset +
    index, with none of the per-dim division of ``offset_of``: the common case, and the one that
    decides how close an elementwise kernel gets to the memory bandwidth."""
    leaf_index = {leaf: k for k, leaf in enumerate(leaves)}
    n_leaves = len(leaves)
    rank = len(out.shape)

    def address(k: int, strides: tuple[int, ...], index: str) -> str:
        if _row_major(strides, out.shape):
            return f"params[{1 + rank + k * (rank + 1)}u] + {index}"
        return f"offset_of({k}u, {index})"

    lines = ["    let width = groups.x * groups.y * 256u;"]
    stores: list[str] = []
    for copy in range(ELEMENTS_PER_THREAD):
        index = f"i{copy}"
        # past the end, a copy recomputes the last element (never stored): loads stay in bounds
        lines.append(f"    let {index} = min(t + {copy}u * width, params[0] - 1u);")
        names: dict[int, str] = {}

        def name(e: Expr, index: str = index, names: dict[int, str] = names, copy: int = copy) -> str:
            key = id(e)
            if key in names:
                return names[key]
            if e.leaf is not None:
                k = leaf_index[e.leaf]
                binding = slots.index(e.leaf.slot)
                load = f"in{binding}[{address(k, e.leaf.strides, index)}]"
                if e.leaf.dtype == torch.float16:
                    load = f"f32({load})"  # half is computed in f32
                code = f"({load} != 0u)" if e.kind == "bool" else load
            elif not e.args:  # a constant, or the index itself: inline
                names[key] = e.template.replace(INDEX, index)
                return names[key]
            else:
                code = e.template.replace(INDEX, index).format(*(name(a) for a in e.args))
            n = f"e{copy}_{len(names)}"
            names[key] = n
            lines.append(f"    let {n} = {code};")
            return n

        result = name(cast(expr, KINDS[out.dtype]))
        if out.dtype == torch.bool:
            result = f"select(0u, 1u, {result})"
        elif out.dtype == torch.float16:
            result = f"f16({result})"
        target = address(n_leaves, out.strides, index)
        stores.append(f"    if (t + {copy}u * width < params[0]) {{ out[{target}] = {result}; }}")
    return "\n".join(lines + stores)
