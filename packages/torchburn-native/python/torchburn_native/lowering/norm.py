"""Normalizations: layer, RMS, group and inference batch norm (folded into a preceding convolution's
epilogue where it can be). Half types compute in f32, converting at the edges as PyTorch's CPU kernels do.
"""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family

from ..planner import Planner
from ..values import FLOAT_DTYPES, Tensorish, Value, domain_of, numel
from . import lower
from .conv import conv_epilogue
from .elementwise import binary_expr, only_use, unary_expr
from .halves import compute_dtype, narrow

aten = torch.ops.aten


@lower(aten.native_layer_norm.default, family=Family.NORM, dtypes=FLOAT_DTYPES)
def layer_norm(
    p: Planner,
    node: Any,
    x: Tensorish,
    normalized_shape: list[int],
    weight: Tensorish | None,
    bias: Tensorish | None,
    eps: float,
) -> tuple[Tensorish, ...]:
    out_meta, mean_meta, rstd_meta = p.out_meta()
    cdt = compute_dtype(out_meta.dtype)
    xv = p.contiguous(x, cdt)
    n = numel(tuple(normalized_shape))
    rows = xv.numel // n if n else 0
    wv = p.contiguous(weight, cdt) if weight is not None else None
    bv = p.contiguous(bias, cdt) if bias is not None else None
    out = p.new_value(xv.shape, cdt)
    mean = p.new_value(tuple(mean_meta.shape), cdt)
    rstd = p.new_value(tuple(rstd_meta.shape), cdt)
    p.emit(
        {
            "kind": "layer_norm",
            "input": xv.operand(),
            "weight": wv.operand() if wv is not None else None,
            "bias": bv.operand() if bv is not None else None,
            "out": out.operand(),
            "mean": mean.operand(),
            "rstd": rstd.operand(),
            "rows": rows,
            "n": n,
            "eps": float(eps),
        },
        [xv, wv, bv],
        [out, mean, rstd],
    )
    return (narrow(p, out, out_meta.dtype), narrow(p, mean, mean_meta.dtype), narrow(p, rstd, rstd_meta.dtype))


def _rms_norm(
    p: Planner, x: Tensorish, normalized_shape: list[int], weight: Tensorish | None, eps: float | None
) -> Value:
    dtype = x.dtype
    cdt = compute_dtype(dtype)
    xv = p.contiguous(x, cdt)
    n = numel(tuple(normalized_shape))
    wv = p.contiguous(weight, cdt) if weight is not None else None
    out = p.new_value(xv.shape, cdt)
    if eps is None:
        eps = torch.finfo(dtype).eps
    p.emit(
        {
            "kind": "rms_norm",
            "input": xv.operand(),
            "weight": wv.operand() if wv is not None else None,
            "out": out.operand(),
            "rows": xv.numel // n if n else 0,
            "n": n,
            "eps": float(eps),
        },
        [xv, wv],
        [out],
    )
    return out


if hasattr(aten, "_fused_rms_norm"):

    @lower(aten._fused_rms_norm.default, family=Family.NORM, dtypes=FLOAT_DTYPES)
    def fused_rms_norm(
        p: Planner, node: Any, x: Tensorish, normalized_shape: list[int], weight: Tensorish | None, eps: float | None
    ) -> tuple[Tensorish, Value]:
        out_meta, rstd_meta = p.out_meta()
        out = _rms_norm(p, x, normalized_shape, weight, eps)
        rstd = _rstd_of(p, x, normalized_shape, eps, rstd_meta)
        return narrow(p, out, out_meta.dtype), rstd


def _rstd_of(p: Planner, x: Tensorish, normalized_shape: list[int], eps: float | None, meta: Any) -> Value:
    """rstd output of _fused_rms_norm (used by backward only): 1/sqrt(mean(x²) + eps) per row."""
    from .reduce import reduce_values

    cdt = compute_dtype(x.dtype)
    d = domain_of(cdt)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    sq = unary_expr(p, "square", x, cdt)
    k = len(normalized_shape)
    dims = list(range(len(x.shape) - k, len(x.shape)))
    ms = reduce_values(p, p.materialize(sq), dims, True, "sum", cdt, scale=1.0 / max(numel(tuple(normalized_shape)), 1))
    r = unary_expr(p, "rsqrt", binary_expr(p, "add", ms, float(eps), cdt), cdt)
    assert r.domain == d
    return p.materialize(r, dtype=meta.dtype)


@lower(aten.native_group_norm.default, family=Family.NORM, dtypes=FLOAT_DTYPES)
def group_norm(
    p: Planner,
    node: Any,
    x: Tensorish,
    weight: Tensorish | None,
    bias: Tensorish | None,
    n: int,
    c: int,
    hw: int,
    groups: int,
    eps: float,
) -> tuple[Tensorish, ...]:
    out_meta, mean_meta, rstd_meta = p.out_meta()
    cdt = compute_dtype(out_meta.dtype)
    xv = p.contiguous(x, cdt)
    wv = p.contiguous(weight, cdt) if weight is not None else None
    bv = p.contiguous(bias, cdt) if bias is not None else None
    out = p.new_value(xv.shape, cdt)
    mean = p.new_value(tuple(mean_meta.shape), cdt)
    rstd = p.new_value(tuple(rstd_meta.shape), cdt)
    p.emit(
        {
            "kind": "group_norm",
            "input": xv.operand(),
            "weight": wv.operand() if wv is not None else None,
            "bias": bv.operand() if bv is not None else None,
            "out": out.operand(),
            "mean": mean.operand(),
            "rstd": rstd.operand(),
            "n": int(n),
            "c": int(c),
            "hw": int(hw),
            "groups": int(groups),
            "eps": float(eps),
        },
        [xv, wv, bv],
        [out, mean, rstd],
    )
    return (narrow(p, out, out_meta.dtype), narrow(p, mean, mean_meta.dtype), narrow(p, rstd, rstd_meta.dtype))


def _per_channel(p: Planner, t: Tensorish, rank: int) -> Value:
    """A [C] parameter as a [C, 1, ..., 1] view that broadcasts over an N,C,... tensor."""
    v = p.value(t)
    return v.with_view((v.shape[0],) + (1,) * (rank - 2), (v.strides[0],) + (0,) * (rank - 2), v.offset)


def _batch_norm_into_conv(
    p: Planner, node: Any, x: Tensorish, params: tuple[Any, Any, Tensorish, Tensorish], eps: float
) -> bool:
    """Batch norm right after a convolution whose output nothing else reads: the convolution applies
    it to each output tile as it writes it (``kernels/conv.rs`` ``Epilogue``). True if attached."""
    if not isinstance(x, Value) or p.out_meta()[0].dtype != x.dtype or not only_use(p, node.args[0], x):
        return False
    found = conv_epilogue(p, x)
    if found is None:
        return False
    epilogue, conv = found
    channels = x.shape[1]
    # every parameter must be in memory before the convolution runs: a graph input, or made earlier
    # (an expression not yet written would be made after it)
    usable = all(
        v is None
        or (
            isinstance(v, Value)
            and v.dtype == x.dtype
            and v.is_contiguous
            and v.rank == 1
            and v.numel == channels
            and p.producer.get(id(v.buffer), -1) < conv
        )
        for v in params
    )
    weight, bias, mean, var = (v if isinstance(v, Value) else None for v in params)
    if not usable or mean is None or var is None or epilogue != {"norm": None, "residual": None, "relu": False}:
        return False
    for v in (weight, bias, mean, var):
        if v is not None:
            v.buffer.touch(conv)
    epilogue["norm"] = {
        "mean": mean.operand(),
        "var": var.operand(),
        "weight": weight.operand() if weight is not None else None,
        "bias": bias.operand() if bias is not None else None,
        "eps": float(eps),
    }
    return True


def _batch_norm_eval(
    p: Planner,
    node: Any,
    x: Tensorish,
    weight: Any,
    bias: Any,
    mean: Tensorish,
    var: Tensorish,
    eps: float,
) -> tuple[Tensorish, Value, Value]:
    out_meta, m1, m2 = p.out_meta()
    dtype = out_meta.dtype
    rank = len(x.shape)
    stats = (p.new_value(tuple(m1.shape), m1.dtype), p.new_value(tuple(m2.shape), m2.dtype))
    if _batch_norm_into_conv(p, node, x, (weight, bias, mean, var), eps):
        assert isinstance(x, Value)
        return x, *stats
    # Per channel, once, as PyTorch's CPU kernel does: scale = weight / sqrt(var + eps) and
    # shift = bias - mean · scale. The sweep over x is then a multiply and an add per element, where
    # the textbook form also takes a reciprocal square root and three more operations per element.
    cdt = compute_dtype(dtype)
    scale: Tensorish = unary_expr(p, "rsqrt", binary_expr(p, "add", var, float(eps), cdt), cdt)
    if weight is not None:
        scale = binary_expr(p, "mul", scale, weight, cdt)
    scale = p.materialize(p.lazy(scale, domain_of(cdt)), dtype=cdt)
    shift: Tensorish = unary_expr(p, "neg", binary_expr(p, "mul", mean, scale, cdt), cdt)
    if bias is not None:
        shift = binary_expr(p, "add", shift, bias, cdt)
    shift = p.materialize(p.lazy(shift, domain_of(cdt)), dtype=cdt)
    y = binary_expr(p, "mul", x, _per_channel(p, scale, rank), dtype, domain_of(cdt))
    y = binary_expr(p, "add", y, _per_channel(p, shift, rank), dtype, domain_of(cdt))
    return y, *stats


def _bn_check(node: Any) -> bool | str:
    if node.target is aten.native_batch_norm.default and node.args[5]:
        return "training-mode batch norm not supported"
    return True


# momentum only updates the running statistics, which inference leaves alone (training is declined)
@lower(
    aten._native_batch_norm_legit_no_training.default,
    family=Family.NORM,
    dtypes=FLOAT_DTYPES,
    reads=("momentum",),
)
def batch_norm_no_training(
    p: Planner,
    node: Any,
    x: Tensorish,
    weight: Any,
    bias: Any,
    mean: Tensorish,
    var: Tensorish,
    momentum: float,
    eps: float,
) -> tuple[Tensorish, Value, Value]:
    return _batch_norm_eval(p, node, x, weight, bias, mean, var, eps)


@lower(
    aten.native_batch_norm.default,
    family=Family.NORM,
    dtypes=FLOAT_DTYPES,
    check=_bn_check,
    reads=("momentum",),
)
def native_batch_norm(
    p: Planner,
    node: Any,
    x: Tensorish,
    weight: Any,
    bias: Any,
    mean: Tensorish,
    var: Tensorish,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[Tensorish, Value, Value]:
    return _batch_norm_eval(p, node, x, weight, bias, mean, var, eps)
