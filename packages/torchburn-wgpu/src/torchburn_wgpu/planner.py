"""Turns a region's ATen graph, for one set of concrete input layouts, into a list of kernel launches.

Elementwise nodes do not launch anything when planned: they build an expression (``Lazy``) over
the buffers they read. A chain of them becomes one generated kernel when something needs the result
in memory: a matmul, a reduction, a view, a region output, or a second consumer. So ``x*w+b`` then
GELU is one sweep over memory, not four.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from torchburn.planning import ComputeType, Expr, GraphWalk, LoweringTable, PlanContext, PlanError, expr

from . import expr_code
from .kernels import Launch, elementwise_source, grid, params
from .values import KINDS, SUPPORTED_DTYPES, WGSL_TYPES, Value, broadcast_strides, contiguous, numel

# the engine's lowerings (filled by ``lowering/``, one module per family)
TABLE = LoweringTable("wgpu")
# the PlanContext limit planning reads: storage buffers one kernel may bind
MAX_BINDINGS = "max-storage-buffers-per-shader-stage"
# the dtype a computed value of each compute type is stored as between kernels
STORAGE_DTYPES: dict[ComputeType, torch.dtype] = {
    "f32": torch.float32,
    "f64": torch.float64,
    "int": torch.int32,
    "bool": torch.bool,
}

__all__ = ["TABLE", "Lazy", "PlanError", "Planner", "Slot", "Tensorish", "constant"]


@dataclass(frozen=True)
class Lazy:
    """An elementwise result not yet in memory: ``expr`` (the shared expression node of
    :mod:`torchburn.planning.expr`, whose loads are ``Value``s) at every index of ``shape``."""

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


class Planner(GraphWalk):
    """Plans one region at concrete input layouts into kernel launches (see the module docs)."""

    table = TABLE

    def __init__(self, gm: torch.fx.GraphModule, args: Sequence[Any], context: PlanContext) -> None:
        super().__init__(gm, args, context)
        # storage buffers a kernel may bind (the adapter's per-stage limit)
        self.max_bindings = context.limit(MAX_BINDINGS, 8)
        self.slots: list[Slot] = []
        self.launches: list[Launch] = []
        self.error_slot: int | None = None  # a word kernels set when an index is out of range

    def bind_input(self, position: int, tensor_index: int, tensor: torch.Tensor) -> tuple[Any, torch.Tensor]:
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise PlanError(f"input of dtype {tensor.dtype}")
        shape = tuple(tensor.shape)
        n = tensor.numel()
        # inputs are uploaded as contiguous copies of their logical values
        value = Value(self.new_slot(tensor.dtype, n, position), tensor.dtype, shape, contiguous(shape), 0, n)
        return value, torch.empty(shape, dtype=tensor.dtype, device="meta")

    def is_lazy(self, value: Any) -> bool:
        return isinstance(value, Lazy)

    def error_flag(self) -> int:
        """The slot of the region's error flag, made on first use."""
        if self.error_slot is None:
            self.error_slot = self.new_slot(torch.int32, 1)
        return self.error_slot

    def new_slot(self, dtype: torch.dtype, numel: int, input_index: int | None = None) -> int:
        self.slots.append(Slot(dtype, numel, input_index))
        return len(self.slots) - 1

    def new_value(self, shape: Sequence[int], dtype: torch.dtype) -> Value:
        shape = tuple(int(s) for s in shape)
        n = numel(shape)
        return Value(self.new_slot(dtype, n), dtype, shape, contiguous(shape), 0, n)

    # ---- elementwise ----------------------------------------------------------------------------
    def lazy(self, x: Tensorish | float | bool, shape: tuple[int, ...]) -> Expr:
        """``x`` as an expression of its own type over ``shape`` (broadcast); scalars become constants."""
        if isinstance(x, bool):
            return expr.const(x, "bool")
        if isinstance(x, int):
            if not -(2**31) <= x < 2**31:
                raise PlanError(f"integer constant {x} does not fit the 32-bit integers this engine computes in")
            return expr.const(x, "int")
        if isinstance(x, float):
            return expr.const(x, "f32")
        if isinstance(x, Lazy):
            if x.shape == shape:
                return x.expr
            x = self.materialize(x)
        leaf = Value(x.slot, x.dtype, shape, broadcast_strides(x, shape), x.offset, x.buffer_numel)
        return expr.load(leaf, KINDS[x.dtype])

    def materialize(self, x: Tensorish, out: Value | None = None) -> Value:
        """``x`` in memory: a Value as is, a Lazy by one generated kernel (into ``out`` if given, a view
        of another buffer, as ``cat`` needs; else into a new contiguous buffer)."""
        if isinstance(x, Value) and out is None:
            return x
        tree = x.expr if isinstance(x, Lazy) else self.lazy(x, x.shape)
        if out is None:
            out = self.new_value(x.shape, x.dtype)
        if out.numel == 0:
            return out
        leaves: list[Value] = expr.leaves(tree)
        slots = list(dict.fromkeys(leaf.slot for leaf in leaves))
        if len(slots) + 2 > self.max_bindings:
            tree = self._fit_bindings(tree, out.shape)
            leaves = expr.leaves(tree)
            slots = list(dict.fromkeys(leaf.slot for leaf in leaves))
        if len(slots) + 2 > self.max_bindings:
            raise PlanError(
                f"a fused kernel would bind {len(slots) + 2} buffers; the adapter allows {self.max_bindings}"
            )
        rank = len(out.shape)
        inners = _vector_inners(leaves, slots, out)
        if inners is None:
            body = _render(tree, leaves, slots, out)
            words: list[int] = [out.numel, *out.shape]
            for leaf in leaves:
                words += [leaf.offset, *leaf.strides]
            words += [out.offset, *out.strides]
            types = [WGSL_TYPES[self.slots[s].dtype] for s in slots]
            out_type = out.wgsl_type
            threads = -(-out.numel // ELEMENTS_PER_THREAD)
        else:
            # four elements per load and store: per operand, where its 4-aligned run starts (in vectors)
            # and how many vectors it repeats after (0 for a scalar)
            body = _render_vector(tree, leaves, slots, out, inners)
            words = [out.numel // 4, *out.shape]
            for leaf, inner in zip(leaves, inners, strict=True):
                words += [leaf.offset if inner == 1 else leaf.offset // 4, inner // 4, *[0] * (rank - 1)]
            words += [out.offset // 4, *[0] * rank]
            vector_slots = {leaf.slot for leaf, inner in zip(leaves, inners, strict=True) if inner > 1}
            types = [
                _vec4(WGSL_TYPES[self.slots[s].dtype]) if s in vector_slots else WGSL_TYPES[self.slots[s].dtype]
                for s in slots
            ]
            out_type = _vec4(out.wgsl_type)
            threads = -(-out.numel // (4 * VECTORS_PER_THREAD))
        source = elementwise_source(out_type, types, rank, body)
        self.launches.append(Launch("elementwise", source, [out.slot, *slots], params(words), grid(-(-threads // 256))))
        return out

    def _fit_bindings(self, tree: Expr, shape: tuple[int, ...]) -> Expr:
        """``tree`` rewritten so that one kernel binds at most the adapter's buffers: wherever a node
        reads more than that, its widest operands are computed into buffers of their own first (a long
        chain of selections over many values becomes several kernels instead of a plan error)."""
        limit = self.max_bindings - 2  # the output and the parameters take two
        done: dict[int, Expr] = {}
        reads: dict[int, frozenset[int]] = {}
        for e in expr.nodes(tree):
            if e.op == "load":
                done[id(e)], reads[id(e)] = e, frozenset({e.leaf.slot})
                continue
            args = [done[id(a)] for a in e.args]
            sets = [reads[id(a)] for a in e.args]
            union = frozenset().union(*sets)
            for k in sorted(range(len(args)), key=lambda k: -len(sets[k])):
                if len(union) <= limit or len(sets[k]) <= 1:
                    break
                value = self.materialize(Lazy(args[k], STORAGE_DTYPES[args[k].type], shape))
                args[k], sets[k] = self.lazy(value, shape), frozenset({value.slot})
                union = frozenset().union(*sets)
            changed = any(new is not old for new, old in zip(args, e.args, strict=True))
            done[id(e)] = Expr(e.op, e.type, tuple(args), leaf=e.leaf, value=e.value) if changed else e
            reads[id(e)] = union
        return done[id(tree)]

    def dense(self, x: Tensorish) -> Value:
        """``x`` as a contiguous buffer of its own (a copy where it is a strided view)."""
        if isinstance(x, Value) and x.is_dense():
            return x
        if isinstance(x, Value):
            return self.materialize(Lazy(self.lazy(x, x.shape), x.dtype, x.shape))
        return self.materialize(x)


def constant(value: float | int | bool, kind: ComputeType) -> Expr:
    """A Python scalar as an exact constant of ``kind``."""
    if kind == "int" and (float(value) != int(value) or not -(2**31) <= int(value) < 2**31):
        raise PlanError(f"constant {value} is not a 32-bit integer")
    return expr.const(value, kind)


def _row_major(strides: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether these strides walk ``shape`` in plain row-major order (size-1 dims may have any)."""
    return all(size == 1 or st == want for size, st, want in zip(shape, strides, contiguous(shape), strict=True))


ELEMENTS_PER_THREAD = 4  # each thread computes this many outputs, a launch's width apart
VECTORS_PER_THREAD = 2  # on the vec4 path: this many vec4 outputs, a launch's width apart
# dtypes stored in 4-byte words, which the vec4 path loads and stores four at a time
VECTOR_DTYPES = frozenset({torch.float32, torch.int32, torch.int64, torch.bool})


def _vec4(wgsl_type: str) -> str:
    return f"vec4<{wgsl_type}>"


def _inner_run(leaf: Value, shape: tuple[int, ...]) -> int | None:
    """How many elements of ``shape`` (row-major) ``leaf`` walks contiguously before it starts over:
    the output's numel for an operand laid out like it, the trailing dims' extent for one broadcast
    over the leading dims (a bias), 1 for a scalar; None for any other layout."""
    run = 1
    dims = [(size, stride) for size, stride in zip(shape, leaf.strides, strict=True) if size != 1]
    while dims and dims[-1][1] == run:
        run *= dims.pop()[0]
    if any(stride != 0 for _, stride in dims):
        return None
    return run


def _vector_inners(leaves: list[Value], slots: list[int], out: Value) -> list[int] | None:
    """Per operand, its contiguous run (see ``_inner_run``) when the kernel can move four elements
    per load and store; None when it cannot: a dtype not stored in words, an output or operand not
    starting on a 4-element boundary, a run that is not a whole number of vectors, or a buffer read
    both as vectors and as a scalar."""
    if out.dtype not in VECTOR_DTYPES or out.numel % 4 or out.offset % 4 or not _row_major(out.strides, out.shape):
        return None
    inners: list[int] = []
    scalar_slots, vector_slots = set(), set()
    for leaf in leaves:
        run = _inner_run(leaf, out.shape)
        if leaf.dtype not in VECTOR_DTYPES or run is None:
            return None
        if run == 1:
            scalar_slots.add(leaf.slot)
        elif run % 4 or leaf.offset % 4:
            return None
        else:
            vector_slots.add(leaf.slot)
        inners.append(run)
    return None if scalar_slots & vector_slots else inners


def _namer(lines: list[str], prefix: str, index: str, load: Callable[[Value], str]) -> Callable[[Expr], str]:
    """A function that emits the WGSL for an expression into ``lines`` (each shared sub-expression
    once, by the code table of ``expr_code``) and returns the name of its value; ``load`` gives an
    operand's stored value, ``index`` the output's linear index."""
    names: dict[int, str] = {}

    def name(e: Expr) -> str:
        key = id(e)
        if key in names:
            return names[key]
        if e.op == "load":
            code = load(e.leaf)
            if e.leaf.dtype == torch.float16:
                code = f"f32({code})"  # half is computed in f32
            if e.type == "bool":
                code = f"({code} != 0u)"
        elif not e.args:  # a constant, or the index itself: inline
            names[key] = expr_code.literal(e, index)
            return names[key]
        else:
            code = expr_code.template(e).format(*(name(a) for a in e.args))
        n = f"{prefix}_{len(names)}"
        names[key] = n
        lines.append(f"    let {n} = {code};")
        return n

    return name


def _stored(tree: Expr, out: Value, name: Callable[[Expr], str]) -> str:
    """``tree`` converted to what ``out`` stores."""
    result = name(expr.cast(tree, KINDS[out.dtype]))
    if out.dtype == torch.bool:
        return f"select(0u, 1u, {result})"
    if out.dtype == torch.float16:
        return f"f16({result})"
    return result


# the threads of a launch cover the outputs (vectors) once per copy, a launch's width apart
WIDTH = "    let width = groups.x * groups.y * 256u;"


def _copy_index(name: str, copy: int) -> str:
    """``name`` = the position of a thread's ``copy``-th output (vector); past the end the last one,
    recomputed and never stored, so that loads stay in bounds."""
    return f"    let {name} = min(t + {copy}u * width, params[0] - 1u);"


def _guarded_store(copy: int, target: str, value: str) -> str:
    return f"    if (t + {copy}u * width < params[0]) {{ out[{target}] = {value}; }}"


def _render(tree: Expr, leaves: list[Value], slots: list[int], out: Value) -> str:
    """WGSL statements computing ``tree`` at ELEMENTS_PER_THREAD indices and storing the results.

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

    lines = [WIDTH]
    stores: list[str] = []
    for copy in range(ELEMENTS_PER_THREAD):
        index = f"i{copy}"
        lines.append(_copy_index(index, copy))

        def load(leaf: Value, index: str = index) -> str:
            k = leaf_index[leaf]
            return f"in{slots.index(leaf.slot)}[{address(k, leaf.strides, index)}]"

        result = _stored(tree, out, _namer(lines, f"e{copy}", index, load))
        stores.append(_guarded_store(copy, address(n_leaves, out.strides, index), result))
    return "\n".join(lines + stores)


def _render_vector(tree: Expr, leaves: list[Value], slots: list[int], out: Value, inners: list[int]) -> str:
    """WGSL statements computing ``tree`` at VECTORS_PER_THREAD runs of four elements: each operand
    is loaded as one vec4 (or once, as a scalar), the expression is computed per lane, and the four
    results are stored as one vec4. Wider loads and stores are what let a kernel over a few
    megabytes get close to the bandwidth: at 1M elements the same GELU took 4.3-5.2 µs this way
    against 5.2-6.2 with a scalar per load on an H200 (docs/bench/gpu-h200-elementwise-shapes.log).
    ``params`` holds, per operand, its first vector (its element for a scalar) and its run in vectors."""
    rank = len(out.shape)

    def word(k: int, at: int = 0) -> str:
        return f"params[{1 + rank + k * (rank + 1) + at}u]"

    lines = [WIDTH]
    stores: list[str] = []
    for copy in range(VECTORS_PER_THREAD):
        q = f"q{copy}"
        lines.append(_copy_index(q, copy))
        # per operand, what each lane reads: the scalar itself, or its lane of the loaded vector
        lane_of: dict[Value, str] = {}
        for k, (leaf, inner) in enumerate(zip(leaves, inners, strict=True)):
            if inner == 1:
                address = word(k)
            elif inner == out.numel:
                address = f"{word(k)} + {q}"
            else:
                address = f"{word(k)} + {q} % {word(k, 1)}"
            lane_of[leaf] = f"v{copy}_{k}" if inner == 1 else f"v{copy}_{k}[{{lane}}]"
            lines.append(f"    let v{copy}_{k} = in{slots.index(leaf.slot)}[{address}];")
        lanes = []
        for lane in range(4):

            def load(leaf: Value, lane: int = lane, lane_of: dict[Value, str] = lane_of) -> str:
                return lane_of[leaf].format(lane=lane)

            lanes.append(_stored(tree, out, _namer(lines, f"e{copy}_{lane}", f"({q} * 4u + {lane}u)", load)))
        vector = f"{_vec4(WGSL_TYPES[out.dtype])}({', '.join(lanes)})"
        stores.append(_guarded_store(copy, f"{word(len(leaves))} + {q}", vector))
    return "\n".join(lines + stores)
