"""Fused neural-network kernels: softmax, layer/group/RMS/batch norm, attention, pooling.

Each takes contiguous operands (copies are inserted only when the producer left a strided view;
attention reads any view whose rows are contiguous) and
computes half types in f32, converting at the edges as PyTorch's CPU kernels do.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torchburn.attention_shapes import grouped_heads
from torchburn.planning import Family

from ..planner import Planner
from ..values import FLOAT_DTYPES, Lazy, Tensorish, Value, contiguous_strides, domain_of, numel
from . import linalg, lower
from .elementwise import binary_expr, only_use, unary_expr

aten = torch.ops.aten


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _narrow(p: Planner, v: Value, dtype: torch.dtype) -> Tensorish:
    """Back to the node's dtype: a lazy conversion that fuses into whatever reads it."""
    if v.dtype == dtype:
        return v
    return Lazy("unary", ("identity", p.lazy(v, domain_of(v.dtype))), dtype, v.shape, domain_of(v.dtype))


def _softmax(p: Planner, x: Tensorish, dim: int, log: bool) -> Tensorish:
    meta = p.out_meta()
    cdt = _compute_dtype(meta.dtype)
    xv = p.contiguous(x, cdt)
    rank = max(xv.rank, 1)
    dim = dim % rank
    shape = xv.shape or (1,)
    outer = numel(shape[:dim])
    inner = numel(shape[dim + 1 :])
    out = p.new_value(xv.shape, cdt)
    p.emit(
        {
            "kind": "softmax",
            "input": xv.operand(),
            "out": out.operand(),
            "outer": outer,
            "n": shape[dim],
            "inner": inner,
            "log": log,
        },
        [xv],
        [out],
    )
    return _narrow(p, out, meta.dtype)


def _no_half_to_float(node: Any) -> bool | str:
    return "softmax with half_to_float" if node.args[2] else True


@lower(aten._softmax.default, family=Family.SOFTMAX, dtypes=FLOAT_DTYPES, check=_no_half_to_float)
def softmax(p: Planner, node: Any, x: Tensorish, dim: int, half_to_float: bool) -> Tensorish:
    return _softmax(p, x, dim, False)


@lower(aten._log_softmax.default, family=Family.SOFTMAX, dtypes=FLOAT_DTYPES, check=_no_half_to_float)
def log_softmax(p: Planner, node: Any, x: Tensorish, dim: int, half_to_float: bool) -> Tensorish:
    return _softmax(p, x, dim, True)


@lower(aten.native_layer_norm.default, family=Family.NORMALIZATION, dtypes=FLOAT_DTYPES)
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
    cdt = _compute_dtype(out_meta.dtype)
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
    return (_narrow(p, out, out_meta.dtype), _narrow(p, mean, mean_meta.dtype), _narrow(p, rstd, rstd_meta.dtype))


def _rms_norm(
    p: Planner, x: Tensorish, normalized_shape: list[int], weight: Tensorish | None, eps: float | None
) -> Value:
    dtype = x.dtype
    cdt = _compute_dtype(dtype)
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

    @lower(aten._fused_rms_norm.default, family=Family.NORMALIZATION, dtypes=FLOAT_DTYPES)
    def fused_rms_norm(
        p: Planner, node: Any, x: Tensorish, normalized_shape: list[int], weight: Tensorish | None, eps: float | None
    ) -> tuple[Tensorish, Value]:
        out_meta, rstd_meta = p.out_meta()
        out = _rms_norm(p, x, normalized_shape, weight, eps)
        rstd = _rstd_of(p, x, normalized_shape, eps, rstd_meta)
        return _narrow(p, out, out_meta.dtype), rstd


def _rstd_of(p: Planner, x: Tensorish, normalized_shape: list[int], eps: float | None, meta: Any) -> Value:
    """rstd output of _fused_rms_norm (used by backward only): 1/sqrt(mean(x²) + eps) per row."""
    from .reduction import reduce_values

    cdt = _compute_dtype(x.dtype)
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


@lower(aten.native_group_norm.default, family=Family.NORMALIZATION, dtypes=FLOAT_DTYPES)
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
    cdt = _compute_dtype(out_meta.dtype)
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
    return (_narrow(p, out, out_meta.dtype), _narrow(p, mean, mean_meta.dtype), _narrow(p, rstd, rstd_meta.dtype))


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
    found = linalg.conv_epilogue(p, x)
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
    cdt = _compute_dtype(dtype)
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
    family=Family.NORMALIZATION,
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
    family=Family.NORMALIZATION,
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


def _sdpa_check(node: Any) -> bool | str:
    args = node.args
    if len(args) > 3 and args[3]:
        return "dropout in attention not supported"
    q, k, v = node.inputs[:3]
    if q is None or k is None or v is None or not q.rank == k.rank == v.rank == 4:
        return "attention needs 4-D q/k/v"
    if any(t.dtype != torch.float32 for t in (q, k, v)):
        return "attention runs in float32 only"
    heads = grouped_heads(q.shape, k.shape, v.shape)
    if isinstance(heads, str):
        return heads
    mask = node.kwargs.get("attn_mask")
    if mask is not None and mask.meta["val"].dtype not in (torch.float32, torch.bool):
        return "attention mask must be float32 or bool"
    return True


@lower(aten._scaled_dot_product_flash_attention_for_cpu.default, family=Family.ATTENTION, check=_sdpa_check)
def sdpa(
    p: Planner,
    node: Any,
    q: Tensorish,
    k: Tensorish,
    v: Tensorish,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Tensorish | None = None,
    scale: float | None = None,
) -> tuple[Value, Value]:
    qv, kv, vv = _rows_in_place(p, q), _rows_in_place(p, k), _rows_in_place(p, v)
    b, h, tq, d = qv.shape
    tk, dv = kv.shape[2], vv.shape[3]
    out = _attention_output(p, node, (b, h, tq, dv))
    lse = p.new_value((b, h, tq), torch.float32)
    mask_op = None
    maskv = None
    if attn_mask is not None:
        from ..planner import broadcast_strides

        maskv = p.value(attn_mask)
        mask_op = maskv.operand((b, h, tq, tk), broadcast_strides(maskv, (b, h, tq, tk)))
    p.emit(
        {
            "kind": "sdpa",
            "q": qv.operand(),
            "k": kv.operand(),
            "v": vv.operand(),
            "mask": mask_op,
            "out": out.operand(),
            "lse": lse.operand(),
            "causal": bool(is_causal),
            "scale": float(scale) if scale is not None else 1.0 / math.sqrt(d),
        },
        [qv, kv, vv, maskv],
        [out, lse],
    )
    return out, lse


def _attention_output(p: Planner, node: Any, shape: tuple[int, int, int, int]) -> Value:
    """Attention's output, laid out as PyTorch lays it out: in the query's order of heads and rows.
    For q sliced from a fused [b, t, 3, h, d] projection that is [b, t, h, dv], and the usual
    ``out.transpose(1, 2).reshape(b, t, h * dv)`` after it is then a view, not a copy."""
    b, h, tq, dv = shape
    out = p.new_value((b, tq, h, dv), torch.float32)
    heads_inner = (tq * h * dv, dv, h * dv, 1)
    meta = p.meta_env.get(node)
    if isinstance(meta, (tuple, list)) and tuple(meta[0].stride()) == heads_inner and h > 1 and tq > 1:
        return out.with_view(shape, heads_inner, out.offset)
    return out.with_view(shape, contiguous_strides(shape), out.offset)


def _rows_in_place(p: Planner, x: Tensorish) -> Value:
    """An attention operand as it lies when each row is contiguous (q, k and v sliced from one fused
    projection are read where they are), else a contiguous copy."""
    if isinstance(x, Value) and x.dtype == torch.float32 and min(x.strides) >= 0:
        if x.shape[-1] <= 1 or x.strides[-1] == 1:
            return x
    return p.contiguous(x)


def _as4d(v: Value) -> tuple[Value, bool]:
    if v.rank == 3:
        return v.with_view((1, *v.shape), (0, *v.strides), v.offset), True
    return v, False


def _pool_pairs(x: list[int] | int, default: list[int]) -> list[int]:
    if isinstance(x, int):
        return [x, x]
    if not x:
        return default
    return [x[0], x[0]] if len(x) == 1 else [x[0], x[1]]


def _pool_input_dtype(node: Any) -> bool | str:
    spec = node.inputs[0]
    if spec is None or spec.dtype not in (torch.float32, torch.float64):
        return "pooling runs on float32/float64"
    return True


# ceil_mode: through the output's shape; the kernel clips windows at the input's edge
@lower(aten.max_pool2d_with_indices.default, family=Family.POOLING, check=_pool_input_dtype, reads=("ceil_mode",))
def max_pool2d(
    p: Planner,
    node: Any,
    x: Tensorish,
    kernel: list[int],
    stride: list[int] | None = None,
    padding: list[int] | int = 0,
    dilation: list[int] | int = 1,
    ceil_mode: bool = False,
) -> tuple[Value, Value]:
    out_meta, idx_meta = p.out_meta()
    xv, _ = _as4d(p.contiguous(x))
    k = _pool_pairs(kernel, [1, 1])
    out = p.new_value(tuple(out_meta.shape), out_meta.dtype)
    idx = p.new_value(tuple(idx_meta.shape), torch.int64)
    ov, _ = _as4d(out)
    iv, _ = _as4d(idx)
    wants_indices = any(u.args[1] == 1 for u in node.users)
    p.emit(
        {
            "kind": "max_pool2d",
            "input": xv.operand(),
            "out": ov.operand(),
            "indices": iv.operand() if wants_indices else None,
            "kernel": k,
            "stride": _pool_pairs(stride or kernel, k),
            "padding": _pool_pairs(padding, [0, 0]),
            "dilation": _pool_pairs(dilation, [1, 1]),
        },
        [xv],
        [ov, iv if wants_indices else None],
    )
    return out, idx


# ceil_mode: through the output's shape; the kernel clips windows (and their divisor) at the edge
@lower(aten.avg_pool2d.default, family=Family.POOLING, dtypes={torch.float32, torch.float64}, reads=("ceil_mode",))
def avg_pool2d(
    p: Planner,
    node: Any,
    x: Tensorish,
    kernel: list[int],
    stride: list[int] | None = None,
    padding: list[int] | int = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Value:
    meta = p.out_meta()
    xv, _ = _as4d(p.contiguous(x))
    k = _pool_pairs(kernel, [1, 1])
    out = p.new_value(tuple(meta.shape), meta.dtype)
    ov, _ = _as4d(out)
    p.emit(
        {
            "kind": "avg_pool2d",
            "input": xv.operand(),
            "out": ov.operand(),
            "kernel": k,
            "stride": _pool_pairs(stride or kernel, k),
            "padding": _pool_pairs(padding, [0, 0]),
            "count_include_pad": bool(count_include_pad),
            "divisor_override": divisor_override,
        },
        [xv],
        [ov],
    )
    return out


@lower(
    aten._adaptive_avg_pool2d.default,
    aten.adaptive_avg_pool2d.default,
    family=Family.POOLING,
    dtypes={torch.float32, torch.float64},
    reads=("output_size",),  # the output's shape
)
def adaptive_avg_pool2d(p: Planner, node: Any, x: Tensorish, output_size: list[int]) -> Value:
    meta = p.out_meta()
    xv, _ = _as4d(p.contiguous(x))
    out = p.new_value(tuple(meta.shape), meta.dtype)
    ov, _ = _as4d(out)
    p.emit({"kind": "adaptive_avg_pool2d", "input": xv.operand(), "out": ov.operand()}, [xv], [ov])
    return out
