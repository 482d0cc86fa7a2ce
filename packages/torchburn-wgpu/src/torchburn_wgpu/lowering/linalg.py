"""Matrix products and convolutions: the tiled kernels of ``matmul.wgsl`` and ``conv.wgsl``."""

from __future__ import annotations

from typing import Any

import torch

from ..kernels import Launch, conv_source, f32_bits, matmul_source, params
from ..planner import PlanError, Planner
from ..values import WGSL_TYPES, Value, broadcast_strides
from . import FLOATS, FxNode, lower, shape_of

aten = torch.ops.aten


def matmul(p: Planner, a: Value, b: Value, bias: Value | None, alpha: float, beta: float) -> Value:
    """``alpha · a @ b + beta · bias`` for a [M, K] @ [K, N] or batched [B, M, K] @ [B, N, K] product."""
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    batch = a.shape[0] if a.rank == 3 else 1
    out = p.new_value(a.dtype, (batch, m, n) if a.rank == 3 else (m, n))
    if out.numel == 0:
        return out

    def batch_stride(v: Value) -> int:
        return v.strides[0] if v.rank == 3 else 0

    words = [m, n, k, a.offset, batch_stride(a), a.strides[-2], a.strides[-1]]
    words += [b.offset, batch_stride(b), b.strides[-2], b.strides[-1]]
    if bias is not None:
        words += [bias.offset, batch_stride(bias), bias.strides[-2], bias.strides[-1], 1]
    else:
        words += [0, 0, 0, 0, 0]
    words += [f32_bits(alpha), f32_bits(beta)]
    slots = [out.slot, a.slot, b.slot, (bias or a).slot]
    code = matmul_source(WGSL_TYPES[a.dtype])
    p.launches.append(Launch("matmul", code, slots, params(words), (-(-n // 128), -(-m // 128), batch)))
    return out


@lower([aten.mm.default, aten.bmm.default], family="matmul", dtypes=FLOATS)
def _mm(p: Planner, node: FxNode, args: list[Any], out: Any) -> Value:
    return matmul(p, p.materialize(args[0]), p.materialize(args[1]), None, 1.0, 0.0)


@lower(aten.addmm.default, family="matmul", dtypes=FLOATS)
def _addmm(p: Planner, node: FxNode, args: list[Any], out: Any) -> Value:
    bias, a, b = (p.materialize(x) for x in args[:3])
    shape = (a.shape[0], b.shape[1])
    bias = Value(bias.slot, bias.dtype, shape, broadcast_strides(bias, shape), bias.offset, bias.buffer_numel)
    return matmul(p, a, b, bias, float(node.kwargs.get("alpha", 1.0)), float(node.kwargs.get("beta", 1.0)))


def _conv_check(spec: Any) -> bool | str:
    x = spec.inputs[0]
    if x is None or x.rank not in (3, 4):
        return "convolution other than 1-d or 2-d"
    return True


def _as_2d(v: Value) -> Value:
    """A 1-d convolution's [N, C, L] operand as [N, C, 1, L]."""
    if v.rank == 4:
        return v
    return v.with_layout(v.meta().unsqueeze(2))


@lower(aten.convolution.default, family="conv", check=_conv_check)
def _convolution(p: Planner, node: FxNode, args: list[Any], out: Any) -> Value:
    x, w = _as_2d(p.materialize(args[0])), _as_2d(p.materialize(args[1]))
    bias = p.materialize(args[2]) if args[2] is not None else None
    # output_padding needs nothing here: the output shape (from PyTorch) already includes it
    stride, padding, dilation, transposed, _output_padding, groups = args[3:9]
    one_d = len(stride) == 1
    if one_d:  # height 1: unit stride, no padding
        stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
    result = p.new_value(torch.float32, shape_of(out))
    if result.numel == 0:
        return result
    n, cin, h, width = x.shape
    oh, ow = (1, result.shape[-1]) if one_d else result.shape[-2:]
    kh, kw = w.shape[2], w.shape[3]
    cin_g = cin // groups
    cout = result.shape[1]
    cout_g = cout // groups
    if any(s <= 0 for s in stride):
        raise PlanError("convolution with a non-positive stride")
    words = [n * oh * ow, cout_g, cin_g * kh * kw, cin_g, h, width, oh, ow, kh, kw]
    words += [*stride, *padding, *dilation]
    words += [x.offset, *x.strides, w.offset, *w.strides]
    words += [1, bias.offset, bias.strides[0]] if bias is not None else [0, 0, 0]
    words += [int(bool(transposed)), cout]
    slots = [result.slot, x.slot, w.slot, (bias or x).slot]
    groups_xyz = (-(-cout_g // 128), -(-(n * oh * ow) // 128), groups)
    p.launches.append(Launch("conv", conv_source(), slots, params(words), groups_xyz))
    return result
