"""Reductions: the reduced dims are permuted to the back (a stride permutation) and folded in Rust."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchburn.planning import Family

from ..planner import Planner
from ..values import SUPPORTED_DTYPES, Tensorish, Value, contiguous_strides, numel
from . import lower

aten = torch.ops.aten
ANY = SUPPORTED_DTYPES


def _dims(rank: int, dims: Any) -> list[int]:
    if dims is None or (isinstance(dims, Sequence) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % max(rank, 1) for d in dims}) if rank else []


def reduce_values(
    p: Planner,
    x: Tensorish,
    dims: Any,
    keepdim: bool,
    op: str,
    out_dtype: torch.dtype,
    scale: float = 1.0,
    correction: float = 0.0,
) -> Value:
    return _reduce(p, x, dims, keepdim, op, out_dtype, scale, correction)[0]


def _reduce(
    p: Planner,
    x: Tensorish,
    dims: Any,
    keepdim: bool,
    op: str,
    out_dtype: torch.dtype,
    scale: float = 1.0,
    correction: float = 0.0,
    mean_dtype: torch.dtype | None = None,
) -> tuple[Value, Value | None]:
    """One reduce instruction; a variance with ``mean_dtype`` also writes its blocks' means (returned
    second), so ``var_mean`` reads its input once."""
    v = p.value(x)
    rank = v.rank
    red = _dims(rank, dims)
    kept = [d for d in range(rank) if d not in red]
    order = kept + red
    shape = tuple(v.shape[d] for d in order) or (1,)
    strides = tuple(v.strides[d] for d in order) or (0,)
    kept_shape = tuple(v.shape[d] for d in kept)
    kept_strides = contiguous_strides(kept_shape) or (1,)
    out = p.new_value(kept_shape, out_dtype)
    instr: dict[str, Any] = {
        "kind": "reduce",
        "input": v.operand(shape, strides),
        "out": out.operand(kept_shape or (1,), kept_strides),
        "kept": len(kept) if rank else 1,
        "op": op,
        "scale": scale,
        "correction": correction,
    }
    outs = [out]
    mean = None
    if mean_dtype is not None:
        mean = p.new_value(kept_shape, mean_dtype)
        instr["mean_out"] = mean.operand(kept_shape or (1,), kept_strides)
        outs.append(mean)
    p.emit(instr, [v], outs)
    if keepdim:
        full = tuple(1 if d in red else v.shape[d] for d in range(rank))
        full_strides = contiguous_strides(full)
        out = out.with_view(full, full_strides, out.offset)
        mean = None if mean is None else mean.with_view(full, full_strides, mean.offset)
    return out, mean


def _count(x: Tensorish, dims: Any) -> int:
    red = _dims(len(x.shape), dims)
    return numel(tuple(x.shape[d] for d in red))


@lower(aten.sum.dim_IntList, aten.sum.default, family=Family.REDUCE, dtypes=ANY)
def sum_(p: Planner, node: Any, x: Tensorish, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Value:
    return reduce_values(p, x, dims, keepdim, "sum", p.out_meta().dtype)


@lower(aten.mean.dim, aten.mean.default, family=Family.REDUCE, dtypes=ANY)
def mean(p: Planner, node: Any, x: Tensorish, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Value:
    n = _count(x, dims)
    return reduce_values(p, x, dims, keepdim, "sum", p.out_meta().dtype, scale=1.0 / n if n else float("nan"))


@lower(aten.prod.dim_int, aten.prod.default, family=Family.REDUCE, dtypes=ANY)
def prod(p: Planner, node: Any, x: Tensorish, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Value:
    return reduce_values(p, x, dim, keepdim, "prod", p.out_meta().dtype)


def _nonempty(node: Any) -> bool | str:
    spec = node.inputs[0]
    if spec is not None and any(isinstance(s, int) and s == 0 for s in spec.shape):
        return "max/min of an empty tensor has no value"
    return True


@lower(aten.amax.default, aten.max.default, family=Family.REDUCE, dtypes=ANY, check=_nonempty)
def amax(p: Planner, node: Any, x: Tensorish, dims: Any = None, keepdim: bool = False) -> Value:
    return reduce_values(p, x, dims, keepdim, "max", p.out_meta().dtype)


@lower(aten.amin.default, aten.min.default, family=Family.REDUCE, dtypes=ANY, check=_nonempty)
def amin(p: Planner, node: Any, x: Tensorish, dims: Any = None, keepdim: bool = False) -> Value:
    return reduce_values(p, x, dims, keepdim, "min", p.out_meta().dtype)


@lower(aten.max.dim, family=Family.REDUCE, dtypes=ANY, check=_nonempty)
def max_dim(p: Planner, node: Any, x: Tensorish, dim: int, keepdim: bool = False) -> tuple[Value, Value]:
    vals, _ = p.out_meta()
    return reduce_values(p, x, dim, keepdim, "max", vals.dtype), reduce_values(
        p, x, dim, keepdim, "arg_max", torch.int64
    )


@lower(aten.min.dim, family=Family.REDUCE, dtypes=ANY, check=_nonempty)
def min_dim(p: Planner, node: Any, x: Tensorish, dim: int, keepdim: bool = False) -> tuple[Value, Value]:
    vals, _ = p.out_meta()
    return reduce_values(p, x, dim, keepdim, "min", vals.dtype), reduce_values(
        p, x, dim, keepdim, "arg_min", torch.int64
    )


@lower(aten.argmax.default, family=Family.REDUCE, dtypes=ANY, check=_nonempty)
def argmax(p: Planner, node: Any, x: Tensorish, dim: int | None = None, keepdim: bool = False) -> Value:
    if dim is None:
        flat = p.contiguous(x)
        flat = flat.with_view((flat.numel,), (1,), flat.offset)
        r = reduce_values(p, flat, [0], False, "arg_max", torch.int64)
        return r.with_view((1,) * len(x.shape), (1,) * len(x.shape), r.offset) if keepdim else r
    return reduce_values(p, x, dim, keepdim, "arg_max", torch.int64)


@lower(aten.argmin.default, family=Family.REDUCE, dtypes=ANY, check=_nonempty)
def argmin(p: Planner, node: Any, x: Tensorish, dim: int | None = None, keepdim: bool = False) -> Value:
    if dim is None:
        flat = p.contiguous(x)
        flat = flat.with_view((flat.numel,), (1,), flat.offset)
        r = reduce_values(p, flat, [0], False, "arg_min", torch.int64)
        return r.with_view((1,) * len(x.shape), (1,) * len(x.shape), r.offset) if keepdim else r
    return reduce_values(p, x, dim, keepdim, "arg_min", torch.int64)


@lower(aten.var.correction, family=Family.REDUCE, dtypes={torch.float32, torch.float64, torch.float16, torch.bfloat16})
def var(
    p: Planner, node: Any, x: Tensorish, dims: Any = None, *, correction: float | None = None, keepdim: bool = False
) -> Value:
    c = 1.0 if correction is None else float(correction)
    return reduce_values(p, x, dims, keepdim, "var", p.out_meta().dtype, correction=c)


@lower(aten.any.dim, aten.any.dims, aten.any.default, family=Family.REDUCE, dtypes=ANY)
def any_(p: Planner, node: Any, x: Tensorish, dims: Any = None, keepdim: bool = False) -> Value:
    return reduce_values(p, x, dims, keepdim, "any", torch.bool)


@lower(aten.all.dim, aten.all.dims, aten.all.default, family=Family.REDUCE, dtypes=ANY)
def all_(p: Planner, node: Any, x: Tensorish, dims: Any = None, keepdim: bool = False) -> Value:
    return reduce_values(p, x, dims, keepdim, "all", torch.bool)


@lower(
    aten.var_mean.correction, family=Family.REDUCE, dtypes={torch.float32, torch.float64, torch.float16, torch.bfloat16}
)
def var_mean(
    p: Planner, node: Any, x: Tensorish, dims: Any = None, *, correction: float | None = None, keepdim: bool = False
) -> tuple[Value, Value]:
    var_meta, mean_meta = p.out_meta()
    c = 1.0 if correction is None else float(correction)
    variance, average = _reduce(p, x, dims, keepdim, "var", var_meta.dtype, correction=c, mean_dtype=mean_meta.dtype)
    assert average is not None
    return variance, average
