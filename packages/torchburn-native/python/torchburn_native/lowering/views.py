"""Views (no data movement: a new shape/stride/offset over the same buffer) and copies that only move
data (cat, stack, pad, repeat)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchburn.engines.base import NodeSpec, TensorSpec
from torchburn.planning import VIEW_OPS, Family, Layout, as_strided_source, meta_like, view_layouts

from ..planner import Planner
from ..values import SUPPORTED_DTYPES, Tensorish, Value, contiguous_strides, domain_of
from . import TABLE, lower

aten = torch.ops.aten
ANY = SUPPORTED_DTYPES


def view_by(p: Planner, x: Tensorish, fn: Callable[..., Any]) -> Any:
    """Apply a view op to ``x``'s layout with PyTorch's own meta kernels: they know every stride rule."""
    v = p.value(x)
    try:
        layouts = view_layouts(fn, meta_like(v.dtype, Layout(v.shape, v.strides, v.offset)))
    except (RuntimeError, ValueError):
        # a layout PyTorch could view (it had a contiguous copy) but ours cannot: copy, then view
        v = p.contiguous(v)
        layouts = view_layouts(fn, meta_like(v.dtype, Layout(v.shape, v.strides, v.offset)))

    def wrap(layout: Layout) -> Value:
        return v.with_view(layout.shape, layout.strides, layout.offset)

    if isinstance(layouts, list):
        return [wrap(layout) for layout in layouts]
    return wrap(layouts)


def _view_op(op: Any) -> Callable[..., Any]:
    def lowering(p: Planner, node: Any, x: Tensorish, *args: Any, **kwargs: Any) -> Any:
        return view_by(p, x, lambda t: op(t, *args, **kwargs))

    return lowering


for _op in VIEW_OPS:
    if _op in TABLE:
        continue  # lowered without a view already (alias: the value itself, see elementwise.clone)
    # expand's ``implicit`` only records how the expand came about
    lower(_op, family=Family.VIEW, dtypes=ANY, reads=("implicit",) if _op is aten.expand.default else ())(_view_op(_op))


def _as_strided_check(node: NodeSpec) -> bool | str:
    plan = as_strided_source(node.inputs[0], *node.args[1:], **node.kwargs)
    return plan if isinstance(plan, str) else True


@lower(aten.as_strided.default, family=Family.VIEW, dtypes=ANY, check=_as_strided_check)
def as_strided(
    p: Planner, node: Any, x: Tensorish, size: list[int], stride: list[int], storage_offset: int | None = None
) -> Value:
    # the input's storage block, rebuilt in our own buffer (a view when x is already contiguous)
    plan = as_strided_source(TensorSpec.of(node.args[0].meta["val"]), size, stride, storage_offset)
    assert not isinstance(plan, str), plan  # the check declined such nodes
    block = p.contiguous(view_by(p, x, lambda t: t.permute(plan.order)))
    return block.with_view(tuple(size), tuple(stride), block.offset + plan.offset)


@lower(aten.cat.default, family=Family.COPY, dtypes=ANY)
def cat(p: Planner, node: Any, tensors: list[Tensorish], dim: int = 0) -> Value:
    meta = p.out_meta()
    out = p.new_value(tuple(meta.shape), meta.dtype)
    rank = out.rank
    dim = dim % rank if rank else 0
    start = 0
    for t in (p.value(x) for x in tensors):
        if t.rank == 1 and t.shape[0] == 0 and rank != 1:
            continue  # legacy: 1-D empty tensors are skipped by cat
        size = t.shape[dim]
        if size:
            dest = out.with_view(t.shape, out.strides, out.offset + start * out.strides[dim])
            p.materialize(p.lazy(t, domain_of(out.dtype)), into=_as_shape(dest, out, dim, size))
        start += size
    return out


def _as_shape(dest: Value, out: Value, dim: int, size: int) -> Value:
    shape = list(out.shape)
    shape[dim] = size
    return dest.with_view(tuple(shape), out.strides, dest.offset)


@lower(aten.stack.default, family=Family.COPY, dtypes=ANY)
def stack(p: Planner, node: Any, tensors: list[Tensorish], dim: int = 0) -> Value:
    meta = p.out_meta()
    out = p.new_value(tuple(meta.shape), meta.dtype)
    dim = dim % out.rank
    for i, t in enumerate(tensors):
        shape = list(out.shape)
        shape[dim] = 1
        dest = out.with_view(tuple(shape), out.strides, i * out.strides[dim])
        squeezed = dest.with_view(
            tuple(s for j, s in enumerate(dest.shape) if j != dim),
            tuple(s for j, s in enumerate(dest.strides) if j != dim),
            dest.offset,
        )
        p.materialize(p.lazy(t, domain_of(out.dtype)), into=squeezed)
    return out


@lower(aten.constant_pad_nd.default, family=Family.COPY, dtypes=ANY)
def constant_pad_nd(p: Planner, node: Any, x: Tensorish, pad: list[int], value: float = 0) -> Value:
    meta = p.out_meta()
    out = p.new_value(tuple(meta.shape), meta.dtype)
    p.materialize(p.filled(value, out.dtype, out.shape), into=out)
    src = p.value(x)
    # pad pairs run from the last dim backwards; negative pads crop the source
    src_shape, src_strides, src_off = list(src.shape), list(src.strides), src.offset
    dst_shape, dst_off = list(out.shape), out.offset
    for i in range(len(pad) // 2):
        dim = out.rank - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo < 0:
            src_off += -lo * src_strides[dim]
            src_shape[dim] += lo
        else:
            dst_off += lo * out.strides[dim]
        if hi < 0:
            src_shape[dim] += hi
        dst_shape[dim] = max(src_shape[dim], 0)
    if all(s > 0 for s in src_shape):
        inner = src.with_view(tuple(src_shape), tuple(src_strides), src_off)
        dest = out.with_view(tuple(src_shape), out.strides, dst_off)
        p.materialize(p.lazy(inner, domain_of(out.dtype)), into=dest)
    return out


@lower(aten.repeat.default, family=Family.COPY, dtypes=ANY)
def repeat(p: Planner, node: Any, x: Tensorish, repeats: list[int]) -> Value:
    meta = p.out_meta()
    out = p.new_value(tuple(meta.shape), meta.dtype)
    v = p.value(x)
    lead = len(repeats) - v.rank
    shape = (1,) * lead + v.shape
    strides = (0,) * lead + v.strides
    # view out as (r0, s0, r1, s1, ...): repetition k of dim i is the (k, :) slab
    inter_shape: list[int] = []
    src_strides: list[int] = []
    for r, s, st in zip(repeats, shape, strides, strict=True):
        inter_shape += [r, s]
        src_strides += [0, st]
    if out.numel:
        dest = out.with_view(tuple(inter_shape), contiguous_strides(tuple(inter_shape)), out.offset)
        src = v.with_view(tuple(inter_shape), tuple(src_strides), v.offset)
        p.materialize(p.lazy(src, domain_of(out.dtype)), into=dest)
    return out


@lower(aten.flip.default, family=Family.COPY, dtypes=ANY)
def flip(p: Planner, node: Any, x: Tensorish, dims: list[int]) -> Value:
    """A copy read backwards: each flipped dim walks its stride negated from its last element."""
    v = p.value(x)
    strides, offset = list(v.strides), v.offset
    for d in {d % max(v.rank, 1) for d in dims} if v.rank else ():
        if v.shape[d] > 1:
            offset += (v.shape[d] - 1) * strides[d]
            strides[d] = -strides[d]
    backwards = v.with_view(v.shape, tuple(strides), offset)
    return p.materialize(p.lazy(backwards, domain_of(v.dtype)), copy=True)
