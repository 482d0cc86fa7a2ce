"""Views are new sizes, strides and offset over the same buffer (computed by PyTorch itself on a meta
tensor laid out like the value); ``cat`` and ``constant_pad_nd`` write their parts into windows of one
new buffer, each part by the kernel that computes it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchburn.engines.base import NodeSpec, TensorSpec
from torchburn.planning import ORDER_KEEPING, VIEW_OPS, Family, Layout, as_strided_source, expr, view_layouts

from ..planner import Lazy, Planner, constant
from ..values import KINDS, Value
from . import ALL, FxNode, lower, shape_of

aten = torch.ops.aten


def _on(x: Value, layouts: Layout | list[Layout]) -> Value | list[Value]:
    """``x``'s buffer seen through each view layout."""
    if isinstance(layouts, list):
        return [x.with_view(layout) for layout in layouts]
    return x.with_view(layouts)


def _reshaped(lazy: Lazy, node: FxNode, args: Sequence[Any]) -> Lazy | None:
    """``lazy`` seen through the order-keeping view ``node``: every load re-strided to the new shape
    (the output's linear index, which templates may use, is unchanged); None where a load's strides
    cannot express it."""

    def view(t: torch.Tensor) -> torch.Tensor:
        return node.target(t, *args[1:], **node.kwargs)  # type: ignore[no-any-return]

    shape = tuple(view(torch.empty(lazy.shape, dtype=lazy.dtype, device="meta")).shape)

    def restrided(leaf: Value) -> Value:
        if leaf.shape != lazy.shape:
            raise RuntimeError("a load laid out over another shape")
        return leaf.with_layout(view(leaf.meta()))

    try:
        return Lazy(expr.map_leaves(lazy.expr, restrided), lazy.dtype, shape)
    except RuntimeError:
        return None


# a fused elementwise result passes through order-keeping views unmaterialized (a Linear's split-k sum
# and bias, reshaped back to [batch, tokens, features], then meeting the residual add, stays one kernel)
@lower(VIEW_OPS, family=Family.VIEW, dtypes=ALL, reads=("implicit",))  # expand's implicit only says how it came about
def _view(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Any:
    if isinstance(args[0], Lazy) and node.target in ORDER_KEEPING:
        reshaped = _reshaped(args[0], node, args)
        if reshaped is not None:
            return reshaped
    x = p.materialize(args[0])
    try:
        return _on(x, view_layouts(node.target, x.meta(), *args[1:], **kwargs))
    except RuntimeError:
        # a reshape that strides cannot express (e.g. merging dims of a transposed view): copy first
        x = p.dense(x)
        return _on(x, view_layouts(node.target, x.meta(), *args[1:], **kwargs))


def _as_strided_check(node: NodeSpec) -> bool | str:
    plan = as_strided_source(node.inputs[0], *node.args[1:], **node.kwargs)
    return plan if isinstance(plan, str) else True


@lower(aten.as_strided.default, family=Family.VIEW, dtypes=ALL, check=_as_strided_check)
def _as_strided(
    p: Planner, node: FxNode, x: Any, size: list[int], stride: list[int], storage_offset: int | None = None
) -> Value:
    # the input's storage block, rebuilt in a buffer of our own (a view when x is already contiguous)
    plan = as_strided_source(TensorSpec.of(node.args[0].meta["val"]), size, stride, storage_offset)
    assert not isinstance(plan, str), plan  # the check declined such nodes
    value = p.materialize(x)
    block = p.dense(value.with_layout(value.meta().permute(plan.order)))
    return block.with_view(Layout(tuple(size), tuple(stride), block.offset + plan.offset))


@lower(aten.cat.default, family=Family.VIEW, dtypes=ALL)
def _cat(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    out = p.out_meta()
    result = p.new_value(shape_of(out), out.dtype)
    dim = args[1] if len(args) > 1 else node.kwargs.get("dim", 0)
    dim = dim % max(len(result.shape), 1)
    start = 0
    for part in args[0]:
        if isinstance(part, (Value, Lazy)) and part.numel > 0:
            size = part.shape[dim]
            window = result.with_layout(result.meta().narrow(dim, start, size))
            p.materialize(_converted(p, part, out.dtype), out=window)
            start += size
    return result


def _converted(p: Planner, x: Value | Lazy, dtype: torch.dtype) -> Value | Lazy:
    """``x`` as ``dtype`` (``cat`` promotes its parts to a common dtype)."""
    if x.dtype == dtype:
        return x
    return Lazy(expr.cast(p.lazy(x, x.shape), KINDS[dtype]), dtype, x.shape)


@lower(aten.constant_pad_nd.default, family=Family.VIEW, dtypes=ALL)
def _pad(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    out = p.out_meta()
    x, pads = args[0], list(args[1])
    value = args[2] if len(args) > 2 else node.kwargs.get("value", 0)
    result = p.new_value(shape_of(out), out.dtype)
    kind = KINDS[out.dtype]
    p.materialize(Lazy(constant(value, kind), out.dtype, result.shape), out=result)
    # the interior: pads come in (left, right) pairs from the last dim backwards; negative ones crop
    window = result.meta()
    source = p.materialize(x) if isinstance(x, Lazy) else x
    src_meta = source.meta()
    for i in range(len(pads) // 2):
        dim = result.rank - 1 - i
        left, right = pads[2 * i], pads[2 * i + 1]
        keep = src_meta.shape[dim] + min(left, 0) + min(right, 0)
        src_meta = src_meta.narrow(dim, max(-left, 0), keep)
        window = window.narrow(dim, max(left, 0), keep)
    if window.numel() > 0:
        interior = source.with_layout(src_meta)
        p.materialize(Lazy(p.lazy(interior, interior.shape), out.dtype, interior.shape), out=result.with_layout(window))
    return result
