"""Indexing: embedding, index_select, gather, advanced indexing, scatter, index_put, slice/select_scatter."""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family

from ..planner import Planner, broadcast_shapes, broadcast_strides
from ..values import SUPPORTED_DTYPES, Tensorish, Value, domain_of
from . import lower
from .views import view_by

aten = torch.ops.aten
ANY = SUPPORTED_DTYPES
INDEX_DTYPES = {torch.int64, torch.int32}


def _copy_of(p: Planner, x: Tensorish) -> Value:
    """A fresh contiguous copy to update in place (the graph is functional: the input stays intact)."""
    v = p.value(x)
    out = p.new_value(v.shape, v.dtype)
    p.materialize(p.lazy(v, domain_of(v.dtype)), into=out)
    return out


def _flat_index(p: Planner, idx: Tensorish) -> Value:
    v = p.contiguous(idx)
    return v.with_view((v.numel,), (1,), v.offset)


def _index_select(p: Planner, x: Tensorish, dim: int, idx: Tensorish) -> Value:
    meta = p.out_meta()
    xv = p.contiguous(x)
    dim = dim % max(xv.rank, 1)
    iv = _flat_index(p, idx)
    out = p.new_value(tuple(meta.shape), meta.dtype)
    p.emit(
        {"kind": "index_select", "input": xv.operand(), "index": iv.operand(), "out": out.operand(), "dim": dim},
        [xv, iv],
        [out],
    )
    return out


@lower(
    aten.embedding.default,
    family=Family.INDEX,
    reads=("padding_idx", "scale_grad_by_freq", "sparse"),  # they change only the gradient
    check=lambda n: (
        True if n.inputs[1] and n.inputs[1].dtype in INDEX_DTYPES else "embedding indices must be int32/int64"
    ),
)
def embedding(p: Planner, node: Any, weight: Tensorish, idx: Tensorish, *args: Any) -> Value:
    meta = p.out_meta()
    out = _index_select_rows(p, weight, idx)
    return out.with_view(tuple(meta.shape), out.strides if out.rank == len(meta.shape) else _cs(meta.shape), out.offset)


def _cs(shape: Any) -> tuple[int, ...]:
    from ..values import contiguous_strides

    return contiguous_strides(tuple(shape))


def _index_select_rows(p: Planner, weight: Tensorish, idx: Tensorish) -> Value:
    wv = p.contiguous(weight)
    iv = _flat_index(p, idx)
    out = p.new_value((iv.numel, *wv.shape[1:]), wv.dtype)
    p.emit(
        {"kind": "index_select", "input": wv.operand(), "index": iv.operand(), "out": out.operand(), "dim": 0},
        [wv, iv],
        [out],
    )
    return out


@lower(aten.index_select.default, family=Family.INDEX)
def index_select(p: Planner, node: Any, x: Tensorish, dim: int, idx: Tensorish) -> Value:
    return _index_select(p, x, dim, idx)


# sparse_grad changes only the gradient's layout
@lower(aten.gather.default, family=Family.INDEX, reads=("sparse_grad",))
def gather(p: Planner, node: Any, x: Tensorish, dim: int, idx: Tensorish, sparse_grad: bool = False) -> Value:
    xv = p.value(x)
    iv = p.value(idx)
    dim = dim % max(xv.rank, 1)
    out = p.new_value(iv.shape, xv.dtype)
    p.emit(
        {"kind": "gather", "input": xv.operand(), "index": iv.operand(), "out": out.operand(), "dim": dim},
        [xv, iv],
        [out],
    )
    return out


def _index_layout(node: Any) -> bool | str:
    indices = node.args[1]
    present = [i for i, t in enumerate(indices) if t is not None]
    if not present:
        return "index without index tensors"
    if present != list(range(present[0], present[-1] + 1)):
        return "non-adjacent advanced indices not supported"
    for t in indices:
        if t is not None and t.meta["val"].dtype not in INDEX_DTYPES:
            return "boolean-mask indexing not supported (data-dependent shape)"
    return True


@lower(aten.index.Tensor, family=Family.INDEX, check=_index_layout)
def index(p: Planner, node: Any, x: Tensorish, indices: list[Tensorish | None]) -> Value:
    meta = p.out_meta()
    xv = p.value(x)
    present = [i for i, t in enumerate(indices) if t is not None]
    first = present[0]
    tensors = [p.value(indices[i]) for i in present]  # type: ignore[arg-type]
    bshape = broadcast_shapes(*(t.shape for t in tensors))
    out = p.new_value(tuple(meta.shape), xv.dtype)
    p.emit(
        {
            "kind": "index",
            "input": xv.operand(),
            "indices": [t.operand(bshape, broadcast_strides(t, bshape)) for t in tensors],
            "out": out.operand(),
            "first": first,
        },
        [xv, *tensors],
        [out],
    )
    return out


def _scatter(
    p: Planner,
    x: Tensorish,
    dim: int,
    idx: Tensorish,
    src: Any,
    accumulate: bool,
    reduce: str | None = None,
    include_self: bool = True,
) -> Value:
    out = _copy_of(p, x)
    iv = p.value(idx)
    if isinstance(src, (int, float, bool)):
        sv = p.materialize(p.filled(src, out.dtype, iv.shape))
    else:
        sv = p.value(src)
        if sv.dtype != out.dtype:
            sv = p.contiguous(sv, out.dtype)
        sv = sv.with_view(iv.shape, sv.strides, sv.offset)
    p.emit(
        {
            "kind": "scatter",
            "out": out.operand(),
            "index": iv.operand(),
            "src": sv.operand(),
            "dim": dim % out.rank,
            "accumulate": accumulate,
            "reduce": reduce,
            "include_self": include_self,
        },
        [out, iv, sv],
        [out],
    )
    return out


@lower(aten.scatter.src, aten.scatter.value, family=Family.INDEX)
def scatter(p: Planner, node: Any, x: Tensorish, dim: int, idx: Tensorish, src: Any) -> Value:
    return _scatter(p, x, dim, idx, src, False)


def _reduces_floats(spec: Any) -> bool | str:
    x = spec.tensor_inputs[0]
    return True if x.dtype in (torch.float32, torch.float64) else f"scatter/index reduce of {x.dtype}"


@lower(aten.scatter_reduce.two, family=Family.INDEX, check=_reduces_floats)
def scatter_reduce(
    p: Planner,
    node: Any,
    x: Tensorish,
    dim: int,
    idx: Tensorish,
    src: Tensorish,
    reduce: str,
    *,
    include_self: bool = True,
) -> Value:
    return _scatter(p, x, dim, idx, src, False, reduce, include_self)


@lower(aten.index_reduce.default, family=Family.INDEX, check=_reduces_floats)
def index_reduce(
    p: Planner,
    node: Any,
    x: Tensorish,
    dim: int,
    index: Tensorish,
    source: Tensorish,
    reduce: str,
    *,
    include_self: bool = True,
) -> Value:
    """A scatter_reduce whose index is ``index[i]`` at every element of ``source`` at position i of ``dim``
    (the 1-D index seen through zero strides)."""
    sv, iv = p.value(source), p.value(index)
    if sv.rank == 0:  # PyTorch treats 0-d operands as one element along dim 0
        xv = p.value(x)
        one = [v.with_view((1,), (1,), v.offset) for v in (xv, sv, iv)]
        out = _scatter(p, one[0], 0, one[2], one[1], False, reduce, include_self)
        return out.with_view((), (), out.offset)
    d = dim % sv.rank
    strides = [0] * sv.rank
    strides[d] = iv.strides[0] if iv.rank else 0
    spread = iv.with_view(sv.shape, tuple(strides), iv.offset)
    return _scatter(p, x, d, spread, sv, False, reduce, include_self)


@lower(aten.scatter_add.default, family=Family.INDEX)
def scatter_add(p: Planner, node: Any, x: Tensorish, dim: int, idx: Tensorish, src: Any) -> Value:
    return _scatter(p, x, dim, idx, src, True)


def _index_put_layout(node: Any) -> bool | str:
    indices = node.args[1]
    if not indices or all(t is None for t in indices):
        return "index_put without an index tensor"
    for t in indices:
        if t is not None and t.meta["val"].dtype not in INDEX_DTYPES:
            return "boolean-mask index_put not supported"
    return True


@lower(aten.index_put.default, family=Family.INDEX, check=_index_put_layout)
def index_put(
    p: Planner, node: Any, x: Tensorish, indices: list[Tensorish | None], values: Tensorish, accumulate: bool = False
) -> Value:
    out = _copy_of(p, x)
    indexed = [d for d, t in enumerate(indices) if t is not None]
    tensors = [p.value(t) for t in indices if t is not None]
    rest = [d for d in range(out.rank) if d not in indexed]
    # the instruction takes index tensors on the leading dims: it writes through a view of the copy
    # with the indexed dims moved to the front
    order = indexed + rest
    front = out.with_view(tuple(out.shape[d] for d in order), tuple(out.strides[d] for d in order), out.offset)
    bshape = broadcast_shapes(*(t.shape for t in tensors))
    # PyTorch's shape of x[indices], which values broadcast to: the index dims in place of adjacent
    # indexed dims, else first
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    pre = [d for d in rest if d < indexed[0]] if adjacent else []
    post = [d for d in rest if d not in pre]
    natural = (*(out.shape[d] for d in pre), *bshape, *(out.shape[d] for d in post))
    vv = p.value(values)
    if vv.dtype != out.dtype:
        vv = p.contiguous(vv, out.dtype)
    steps = broadcast_strides(vv, natural)
    # values in the instruction's order: the index dims, then the rest in order
    n_pre, n_b = len(pre), len(bshape)
    value_strides = (*steps[n_pre : n_pre + n_b], *steps[:n_pre], *steps[n_pre + n_b :])
    target = (*bshape, *(out.shape[d] for d in rest))
    p.emit(
        {
            "kind": "index_put",
            "out": front.operand(),
            "indices": [t.operand(bshape, broadcast_strides(t, bshape)) for t in tensors],
            "values": vv.operand(target, value_strides),
            "accumulate": bool(accumulate),
        },
        [out, vv, *tensors],
        [out],
    )
    return out


@lower(aten.slice_scatter.default, family=Family.INDEX)
def slice_scatter(
    p: Planner, node: Any, x: Tensorish, src: Tensorish, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> Value:
    out = _copy_of(p, x)
    dest = view_by(p, out, lambda t: aten.slice.Tensor(t, dim, start, end, step))
    p.materialize(p.lazy(src, domain_of(out.dtype)), into=dest)
    return out


@lower(aten.select_scatter.default, family=Family.INDEX)
def select_scatter(p: Planner, node: Any, x: Tensorish, src: Tensorish, dim: int, index: int) -> Value:
    out = _copy_of(p, x)
    dest = view_by(p, out, lambda t: aten.select.int(t, dim, index))
    p.materialize(p.lazy(src, domain_of(out.dtype)), into=dest)
    return out
