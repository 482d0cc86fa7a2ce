"""Convolution as an implicit GEMM: the matmul kernel reads its left operand as image patches."""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family, expr

from ..kernels import Launch, conv_source, params
from ..planner import Lazy, PlanError, Planner
from ..values import Value
from . import F32, FxNode, lower, shape_of
from .matmul import TILE, slices, sum_of_planes

aten = torch.ops.aten


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


@lower(aten.convolution.default, family=Family.CONV, check=_conv_check, dtypes=F32)
def _convolution(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value | Lazy:
    out = p.out_meta()
    x, w = _as_2d(p.materialize(args[0])), _as_2d(p.materialize(args[1]))
    bias = p.materialize(args[2]) if args[2] is not None else None
    # output_padding needs nothing here: the output shape (from PyTorch) already includes it
    stride, padding, dilation, transposed, _output_padding, groups = args[3:9]
    one_d = len(stride) == 1
    if one_d:  # height 1: unit stride, no padding
        stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
    result = p.new_value(shape_of(out), torch.float32)
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
    k = cin_g * kh * kw
    tiles = -(-cout_g // TILE) * -(-(n * oh * ow) // TILE) * groups
    splits, chunk = slices(tiles, k)
    if splits > 1:  # partial planes first; the sum (and the bias) after
        words[26:29] = [0, 0, 0]
        result = p.new_value((splits, *result.shape), torch.float32)
    words += [int(bool(transposed)), cout, chunk, splits]
    slots = [result.slot, x.slot, w.slot, (bias or x).slot]
    groups_xyz = (-(-cout_g // TILE), -(-(n * oh * ow) // TILE), groups * splits)
    p.launches.append(Launch("conv", conv_source(), slots, params(words), groups_xyz))
    if splits == 1:
        return result
    shape = shape_of(out)
    total = sum_of_planes(p, result, splits, shape, lambda meta, s: meta[s])
    if bias is not None:
        channel = bias.with_layout(bias.meta().view(bias.shape[0], *([1] * (len(shape) - 2))))
        total = expr.apply("add", total, p.lazy(channel, shape))
    return Lazy(total, torch.float32, shape)
