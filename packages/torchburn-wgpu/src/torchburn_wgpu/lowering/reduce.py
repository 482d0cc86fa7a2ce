"""Reductions (sum, mean, amax, argmax, var, ...): one workgroup per output row, folded across the workgroup."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchburn.planning import Family, Layout, expr

from ..kernels import INT_REDUCTIONS, Launch, grid, params, reduce_source
from ..planner import Lazy, PlanError, Planner
from ..values import INTEGER_DTYPES, WGSL_TYPES, Value, contiguous, numel
from . import ANY, F32, FxNode, lower, shape_of

aten = torch.ops.aten


REDUCE = {
    aten.sum.dim_IntList: "sum",
    aten.sum.default: "sum",
    aten.mean.dim: "mean",
    aten.mean.default: "mean",
    aten.amax.default: "amax",
    aten.amin.default: "amin",
    aten.any.dim: "any",
    aten.any.dims: "any",
    aten.any.default: "any",
    aten.all.dim: "all",
    aten.all.dims: "all",
    aten.all.default: "all",
    aten.argmax.default: "argmax",
    aten.argmin.default: "argmin",
    aten.prod.dim_int: "prod",
    aten.prod.default: "prod",
}


def _reduce_check(spec: Any) -> bool | str:
    kind = REDUCE[spec.target]
    x = spec.inputs[0]
    if kind in ("any", "all"):
        return True
    if x is None:
        return f"{kind} of a non-tensor"
    dtype = spec.kwargs.get("dtype")
    if x.dtype == torch.float32:
        return True if dtype in (None, torch.float32) else f"reduction to {dtype}"
    if x.dtype in INTEGER_DTYPES | {torch.bool} and kind in INT_REDUCTIONS:
        # computed in i32, like every integer the engine holds; a bool's amax/amin would be a bool
        if x.dtype == torch.bool and kind in ("amax", "amin"):
            return f"{kind} of a bool tensor"
        return True if dtype in (None, torch.int64) else f"reduction to {dtype}"
    return f"{kind} of a {x.dtype} tensor"


def _dims(node: FxNode, args: Sequence[Any], rank: int) -> set[int]:
    """The reduced dims: a list, one int, or none given (all). A 0-d tensor has none to reduce: its dim
    0 (or -1) names the tensor itself."""
    if rank == 0:
        return set()
    arg = args[1] if len(args) > 1 and not isinstance(args[1], bool) else node.kwargs.get("dim")
    if arg is None or (isinstance(arg, (list, tuple)) and len(arg) == 0):
        return set(range(rank))
    if isinstance(arg, int):
        arg = [arg]
    return {d % max(rank, 1) for d in arg}


@lower(REDUCE, family=Family.REDUCE, dtypes=ANY, check=_reduce_check)
def _reduce(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    out = p.out_meta()
    x = p.materialize(args[0])
    return reduce(p, REDUCE[node.target], x, _dims(node, args, x.rank), shape_of(out), out.dtype)


def reduce(p: Planner, kind: str, x: Value, dims: set[int], out_shape: tuple[int, ...], dtype: torch.dtype) -> Value:
    """``kind`` of ``x`` over ``dims``, as a new contiguous value of ``out_shape``."""
    kept = [d for d in range(x.rank) if d not in dims]
    red = sorted(dims)
    result = p.new_value(out_shape, dtype)
    if result.numel == 0:
        return result
    n_red = numel([x.shape[d] for d in red])
    if n_red == 0 and kind in ("amax", "amin", "argmax", "argmin"):
        raise PlanError(f"{kind} over zero elements")
    words = [result.numel, n_red, x.offset]
    words += [x.shape[d] for d in kept] + [x.strides[d] for d in kept]
    words += [x.shape[d] for d in red] + [x.strides[d] for d in red]
    code = reduce_source(kind, WGSL_TYPES[x.dtype], len(kept), len(red))
    p.launches.append(Launch("reduce", code, [result.slot, x.slot], params(words), grid(result.numel)))
    return result


def _var_check(spec: Any) -> bool | str:
    x = spec.inputs[0]
    return True if x is not None and x.dtype == torch.float32 else "variance of a non-float32 tensor"


def _variance(
    p: Planner, node: FxNode, args: Sequence[Any], out_shape: tuple[int, ...], correction: Any
) -> tuple[Lazy, Value]:
    """(variance, mean): two passes, as PyTorch does: the mean, then the mean square deviation from it
    (no cancellation). The mean is kept in the reduced dims' place, for ``var_mean`` to reshape."""
    x = p.materialize(args[0])
    dims = _dims(node, args, x.rank)
    keep_shape = tuple(1 if d in dims else s for d, s in enumerate(x.shape))
    n = numel([x.shape[d] for d in dims])
    correction = 1 if correction is None else float(correction)
    mean = reduce(p, "mean", x, dims, keep_shape, torch.float32)
    centred = expr.apply("sub", expr.cast(p.lazy(x, x.shape), "f32"), p.lazy(mean, x.shape))
    square = Lazy(expr.apply("square", centred), torch.float32, x.shape)
    total = reduce(p, "sum", p.materialize(square), dims, out_shape, torch.float32)
    divisor = max(n - correction, 0.0)
    quotient = expr.apply("div", p.lazy(total, total.shape), p.lazy(divisor, total.shape))
    return Lazy(quotient, torch.float32, total.shape), mean


# keepdim: through the output's shape
@lower(aten.var.correction, family=Family.REDUCE, dtypes=F32, check=_var_check, reads=("keepdim",))
def _var(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    return _variance(p, node, args, shape_of(p.out_meta()), node.kwargs.get("correction", 1))[0]


# keepdim: through the outputs' shape
@lower(aten.var_mean.correction, family=Family.REDUCE, dtypes=F32, check=_var_check, reads=("keepdim",))
def _var_mean(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> tuple[Lazy, Value]:
    var_meta, mean_meta = p.out_meta()
    variance, mean = _variance(p, node, args, shape_of(var_meta), node.kwargs.get("correction", 1))
    return variance, mean.with_view(Layout(shape_of(mean_meta), contiguous(shape_of(mean_meta)), mean.offset))


EXTREMES = {aten.max.dim: ("amax", "argmax"), aten.min.dim: ("amin", "argmin")}


def _extreme_check(spec: Any) -> bool | str:
    x = spec.inputs[0]
    if x is None or (x.dtype != torch.float32 and x.dtype not in INTEGER_DTYPES):
        return f"{spec.target} of a {x.dtype if x is not None else 'non-tensor'}"
    return True


# keepdim: through the outputs' shape
@lower(EXTREMES, family=Family.REDUCE, dtypes=ANY, check=_extreme_check, reads=("keepdim",))
def _extreme(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> tuple[Value, Value]:
    """max.dim / min.dim: the value and its first position (a NaN wins, as in eager), one pass each."""
    values_meta, indices_meta = p.out_meta()
    x = p.materialize(args[0])
    dims = _dims(node, args, x.rank)
    value_kind, index_kind = EXTREMES[node.target]
    values = reduce(p, value_kind, x, dims, shape_of(values_meta), values_meta.dtype)
    return values, reduce(p, index_kind, x, dims, shape_of(indices_meta), torch.int64)
