"""Normalizations: layer and group norm (one row-folding kernel, ``shaders/norm.wgsl``), inference batch
norm (a per-channel scale and shift, fused with its neighbours as an expression).
"""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family, expr

from ..kernels import Launch, f32_bits, grid, params
from ..planner import Lazy, Planner, constant
from ..shaders import row_tree, source
from ..values import Value
from . import F32, FxNode, lower, shape_of
from .elementwise import operands, result

aten = torch.ops.aten


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
    y = p.new_value(x.shape, torch.float32)
    mean = p.new_value(stats_shape, torch.float32)
    rstd = p.new_value(stats_shape, torch.float32)
    rows = x.numel // length if length else 0
    if rows == 0:
        return y, mean, rstd
    words = [rows, length, f32_bits(eps), int(weight is not None), int(bias is not None)]
    slots = [y.slot, mean.slot, rstd.slot, x.slot, (weight or x).slot, (bias or x).slot]
    code = source("norm", **row_tree(p.context.has("subgroups")))
    p.launches.append(Launch("norm", code, slots, params(words), grid(rows), writes=3))
    return y, mean, rstd


@lower(aten.native_layer_norm.default, family=Family.NORM, dtypes=F32)
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


@lower(aten.native_group_norm.default, family=Family.NORM, dtypes=F32)
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

    tree = p.lazy(y, shape)
    if weight is not None:
        tree = expr.apply("mul", tree, p.lazy(per_channel(weight), shape))
    if bias is not None:
        tree = expr.apply("add", tree, p.lazy(per_channel(bias), shape))
    return Lazy(tree, torch.float32, shape), mean, rstd


# momentum only updates the running statistics, which inference leaves alone
@lower(aten._native_batch_norm_legit_no_training.default, family=Family.NORM, reads=("momentum",), dtypes=F32)
def _batch_norm(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> tuple[Lazy, Value, Value]:
    """Inference batch norm is a per-channel scale and shift: an expression, fused with its neighbours
    (a following ReLU, a residual add) into one sweep."""
    out = p.out_meta()
    x, weight, bias, mean, var = args[:5]
    eps = float(args[6])
    shape = shape_of(out[0])
    channel = (len(shape) - 2) * [1]

    def per_channel(v: Any) -> Any:
        # [C] seen as [C, 1, 1...] so that it broadcasts along dim 1 of x
        if v is None:
            return None
        v = p.materialize(v)
        return v.with_layout(v.meta().view(v.shape[0], *channel))

    xs, means, variances = operands(p, [x, per_channel(mean), per_channel(var)], shape, "f32")
    inverse_std = expr.apply("rsqrt", expr.apply("add", variances, constant(eps, "f32")))
    tree = expr.apply("mul", expr.apply("sub", xs, means), inverse_std)
    if weight is not None:
        (w,) = operands(p, [per_channel(weight)], shape, "f32")
        tree = expr.apply("mul", tree, w)
    if bias is not None:
        (b,) = operands(p, [per_channel(bias)], shape, "f32")
        tree = expr.apply("add", tree, b)
    y = result(tree, out[0])
    return y, p.new_value(shape_of(out[1]), torch.float32), p.new_value(shape_of(out[2]), torch.float32)
