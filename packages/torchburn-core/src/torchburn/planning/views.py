"""View ops: the ATen ops that only re-describe a tensor's memory (sizes, strides, offset), shared by every
engine, and how to compute a view's layout exactly as PyTorch would: apply the op to a meta tensor laid
out like the value and read the result's layout back (every view op, every corner case, for free)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

aten = torch.ops.aten

VIEW_OPS = (
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.alias.default,
    aten.expand.default,
    aten.permute.default,
    aten.transpose.int,
    aten.t.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.unsqueeze.default,
    aten.slice.Tensor,
    aten.select.int,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.unbind.int,
    aten.narrow.default,
    aten.diagonal.default,
    aten.unfold.default,
)

# views that keep every element at its row-major position (a fused expression can pass through them)
ORDER_KEEPING = frozenset(
    {
        aten.view.default,
        aten._unsafe_view.default,
        aten.reshape.default,
        aten.unsqueeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.squeeze.default,
        aten.alias.default,
    }
)


class Layout(NamedTuple):
    """Sizes, strides and storage offset (in elements) of a strided tensor."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


def meta_like(dtype: torch.dtype, layout: Layout, storage_numel: int | None = None) -> torch.Tensor:
    """A meta tensor with this layout over a storage of ``storage_numel`` elements (by default, just
    enough for the layout)."""
    if storage_numel is None:
        storage_numel = layout.offset + extent(layout.shape, layout.strides)
    base = torch.empty(max(storage_numel, 1), dtype=dtype, device="meta")
    return base.as_strided(layout.shape, layout.strides, layout.offset)


def layout_of(t: torch.Tensor) -> Layout:
    return Layout(tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride()), int(t.storage_offset()))


def view_layouts(op: Any, meta: torch.Tensor, *args: Any, **kwargs: Any) -> Layout | list[Layout]:
    """The layout (or, for ``split``/``unbind``, the layouts) ``op`` gives a tensor laid out as ``meta``;
    raises ``RuntimeError`` where the op would have to copy (a ``reshape`` of a non-viewable layout)."""
    result = op(meta, *args, **kwargs)
    if isinstance(result, (list, tuple)):
        views = [layout_of(r) for r in result]
        for r in result:
            _check_view(r, meta)
        return views
    _check_view(result, meta)
    return layout_of(result)


def _check_view(result: torch.Tensor, base: torch.Tensor) -> None:
    if result.untyped_storage()._cdata != base.untyped_storage()._cdata:
        raise RuntimeError("this layout cannot be viewed that way without a copy")


def extent(shape: tuple[int, ...] | list[int], strides: tuple[int, ...] | list[int]) -> int:
    """Elements a strided view spans from its first element (0 for an empty tensor)."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, strides, strict=True))


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    strides: list[int] = []
    acc = 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def numel(shape: tuple[int, ...] | list[int]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def broadcast_strides(shape: tuple[int, ...], strides: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """Strides that read a tensor of ``shape``/``strides`` as if broadcast to ``target`` (size-1 and
    missing dims: stride 0); raises ``ValueError`` where the shapes do not broadcast."""
    lead = len(target) - len(shape)
    if lead < 0:
        raise ValueError(f"cannot broadcast shape {shape} to {target}")
    out = [0] * lead
    for size, stride, want in zip(shape, strides, target[lead:], strict=True):
        if size == want:
            out.append(stride if size != 1 else 0)
        elif size == 1:
            out.append(0)
        else:
            raise ValueError(f"cannot broadcast shape {shape} to {target}")
    return tuple(out)


class StridedSource(NamedTuple):
    """How ``as_strided`` reads its input: the input permuted to ``order`` and made contiguous is the
    input's block of storage element for element, and the view starts ``offset`` elements into it."""

    order: tuple[int, ...]
    offset: int


def storage_order(shape: tuple[Any, ...], strides: tuple[Any, ...]) -> tuple[int, ...] | None:
    """The dims of a tensor outermost first (by stride) when its elements fill one block of its storage
    exactly, with no gap and no element seen twice; None otherwise (or for symbolic sizes)."""
    if any(not isinstance(v, int) for v in (*shape, *strides)):
        return None
    dims = tuple(sorted(range(len(shape)), key=lambda d: strides[d], reverse=True))
    if numel(tuple(shape)) == 0:
        return dims
    expected = 1
    for d in reversed(dims):
        if shape[d] == 1:
            continue  # a size-1 dim's stride is never used to address anything
        if strides[d] != expected:
            return None
        expected *= shape[d]
    return dims


def as_strided_source(x: Any, size: Any, stride: Any, storage_offset: Any = None) -> StridedSource | str:
    """Plan ``as_strided(x, size, stride, storage_offset)`` on an engine that has no storage beside its
    own buffers, given ``x``'s ``TensorSpec`` (dtype, shape, stride, storage_offset as the graph traced
    it). ``as_strided`` addresses ``x``'s *storage*: that is expressible when ``x`` fills one block of
    storage densely (then the block is ``x`` permuted into storage order, made contiguous) and the view
    stays inside that block. Otherwise the reason, for the partitioner's decline."""
    values = (*size, *stride, storage_offset if storage_offset is not None else 0, x.storage_offset)
    if any(not isinstance(v, int) for v in values):
        return "as_strided with symbolic sizes, strides or offset"
    order = storage_order(tuple(x.shape), tuple(x.stride))
    if order is None:
        return "as_strided of a tensor that does not fill its block of storage densely (a gap or an overlap)"
    offset = (x.storage_offset if storage_offset is None else storage_offset) - x.storage_offset
    if any(s < 0 for s in stride):
        return "as_strided with a negative stride"
    span = extent(tuple(size), tuple(stride))
    if offset < 0 or (span and offset + span > numel(tuple(x.shape))):
        return "as_strided reaching storage outside its input's elements"
    return StridedSource(order, offset)
