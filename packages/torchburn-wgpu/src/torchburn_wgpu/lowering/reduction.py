"""Reductions, softmax and layer norm: one workgroup per output row, folded across the workgroup."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchburn.planning import Family

from ..kernels import Launch, f32_bits, grid, params, reduce_source, softmax_source
from ..planner import Expr, Lazy, PlanError, Planner
from ..shaders import row_tree, source
from ..values import WGSL_TYPES, Value, contiguous, numel
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
    if x is None or x.dtype != torch.float32:
        return f"{kind} of a non-float32 tensor"
    dtype = spec.kwargs.get("dtype")
    return True if dtype in (None, torch.float32) else f"reduction to {dtype}"


def _dims(node: FxNode, args: Sequence[Any], rank: int) -> set[int]:
    """The reduced dims: a list, one int, or none given (all)."""
    arg = args[1] if len(args) > 1 and not isinstance(args[1], bool) else node.kwargs.get("dim")
    if arg is None or (isinstance(arg, (list, tuple)) and len(arg) == 0):
        return set(range(rank))
    if isinstance(arg, int):
        arg = [arg]
    return {d % max(rank, 1) for d in arg}


@lower(REDUCE, family=Family.REDUCTION, dtypes=ANY, check=_reduce_check)
def _reduce(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    out = p.out_meta()
    x = p.materialize(args[0])
    return reduce(p, REDUCE[node.target], x, _dims(node, args, x.rank), shape_of(out), out.dtype)


def reduce(p: Planner, kind: str, x: Value, dims: set[int], out_shape: tuple[int, ...], dtype: torch.dtype) -> Value:
    """``kind`` of ``x`` over ``dims``, as a new contiguous value of ``out_shape``."""
    kept = [d for d in range(x.rank) if d not in dims]
    red = sorted(dims)
    result = p.new_value(dtype, out_shape)
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


# keepdim: through the output's shape
@lower(aten.var.correction, family=Family.REDUCTION, dtypes=F32, check=_var_check, reads=("keepdim",))
def _var(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    """Two passes, as PyTorch does: the mean, then the mean square deviation from it (no cancellation)."""
    out = p.out_meta()
    x = p.materialize(args[0])
    dims = _dims(node, args, x.rank)
    keep_shape = tuple(1 if d in dims else s for d, s in enumerate(x.shape))
    n = numel([x.shape[d] for d in dims])
    correction = node.kwargs.get("correction", 1)
    correction = 1 if correction is None else float(correction)
    mean = reduce(p, "mean", x, dims, keep_shape, torch.float32)
    square = Lazy(
        Expr("f32", "(({0} - {1}) * ({0} - {1}))", (p.lazy(x, x.shape), p.lazy(mean, x.shape))), torch.float32, x.shape
    )
    total = reduce(p, "sum", p.materialize(square), dims, shape_of(out), torch.float32)
    divisor = max(n - correction, 0.0)
    return Lazy(
        Expr("f32", "({0} / {1})", (p.lazy(total, total.shape), p.lazy(divisor, total.shape))),
        torch.float32,
        total.shape,
    )


def _no_half_to_float(spec: Any) -> bool | str:
    return "softmax with half_to_float" if spec.args[2] else True


@lower([aten._softmax.default, aten._log_softmax.default], family=Family.SOFTMAX, check=_no_half_to_float, dtypes=F32)
def _softmax(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    return softmax(p, p.materialize(args[0]), args[1], log=node.target == aten._log_softmax.default)


def softmax(p: Planner, x: Value, dim: int, log: bool) -> Value:
    """Softmax (or log-softmax) of ``x`` along ``dim``, as a new contiguous value."""
    result = p.new_value(torch.float32, x.shape)
    if result.numel == 0:
        return result
    if x.rank == 0:
        x = Value(x.slot, x.dtype, (1,), (1,), x.offset, x.buffer_numel)
    dim = dim % x.rank
    outer = [d for d in range(x.rank) if d != dim]
    out_strides = contiguous(x.shape)
    rows = result.numel // x.shape[dim]
    words = [rows, x.shape[dim], x.offset, x.strides[dim], out_strides[dim]]
    words += [x.shape[d] for d in outer] + [x.strides[d] for d in outer] + [out_strides[d] for d in outer]
    code = softmax_source(len(outer), log, x.shape[dim], p.context.has("subgroups"))
    p.launches.append(Launch("softmax", code, [result.slot, x.slot], params(words), grid(rows)))
    return result


def normalize_rows(
    p: Planner,
    x: Value,
    length: int,
    eps: float,
    weight: Value | None,
    bias: Value | None,
    stats_shape: tuple[int, ...],
) -> tuple[Value, Value, Value]:
    """Each run of ``length`` elements of dense ``x`` normalized (then scaled and shifted per position
    by ``weight``/``bias``), with the rows' means and 1/std."""
    y = p.new_value(torch.float32, x.shape)
    mean = p.new_value(torch.float32, stats_shape)
    rstd = p.new_value(torch.float32, stats_shape)
    rows = x.numel // length if length else 0
    if rows == 0:
        return y, mean, rstd
    words = [rows, length, f32_bits(eps), int(weight is not None), int(bias is not None)]
    slots = [y.slot, mean.slot, rstd.slot, x.slot, (weight or x).slot, (bias or x).slot]
    code = source("layer_norm", **row_tree(p.context.has("subgroups")))
    p.launches.append(Launch("layer_norm", code, slots, params(words), grid(rows), writes=3))
    return y, mean, rstd


@lower(aten.native_layer_norm.default, family=Family.NORMALIZATION, dtypes=F32)
def _layer_norm(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> tuple[Value, Value, Value]:
    out = p.out_meta()
    x = p.dense(args[0])
    normalized, weight, bias, eps = args[1], args[2], args[3], float(args[4])
    length = 1
    for s in normalized:
        length *= int(s)
    w = p.dense(weight) if weight is not None else None
    b = p.dense(bias) if bias is not None else None
    return normalize_rows(p, x, length, eps, w, b, shape_of(out[1]))


@lower(aten.native_group_norm.default, family=Family.NORMALIZATION, dtypes=F32)
def _group_norm(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> tuple[Any, Value, Value]:
    """Each (sample, group) is a row of the layer-norm kernel; the per-channel affine that follows is
    an expression, fused into whatever reads the result."""
    out = p.out_meta()
    x = p.dense(args[0])
    weight, bias, _, c, hw, groups, eps = args[1:8]
    y, mean, rstd = normalize_rows(p, x, (c // groups) * hw, float(eps), None, None, shape_of(out[1]))
    if weight is None and bias is None:
        return y, mean, rstd
    shape = x.shape
    trailing = [1] * (len(shape) - 2)

    def per_channel(v: Any) -> Value:
        vector: Value = p.materialize(v)
        return vector.with_layout(vector.meta().view(vector.shape[0], *trailing))

    expr = p.lazy(y, shape)
    if weight is not None:
        expr = Expr("f32", "({0} * {1})", (expr, p.lazy(per_channel(weight), shape)))
    if bias is not None:
        expr = Expr("f32", "({0} + {1})", (expr, p.lazy(per_channel(bias), shape)))
    return Lazy(expr, torch.float32, shape), mean, rstd
