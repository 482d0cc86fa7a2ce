"""3-D convolutions as sums of 2-D ones over the depth taps, for engines whose convolution kernels are
1-D and 2-D (they add :data:`DECOMPOSITIONS` to their tables; other convolutions pass through).

A plain convolution reads, for depth tap ``kd``, the input depths ``kd * dilation + d * stride`` (after
padding): that strided slice, folded into the batch, meets the weight's 2-D slice ``w[:, :, kd]``, and
the taps' results add up. A transposed convolution runs each tap's 2-D transposed convolution on every
input depth and places the result at output depth ``d * stride + kd * dilation - padding``: zeros
interleaved for the stride, a shift for the tap, a crop for the padding. The gradients follow, as the
gradients of these ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _fold_depth(x: torch.Tensor) -> torch.Tensor:
    """[N, C, D, H, W] -> [N D, C, H, W]."""
    n, c, d, h, w = x.shape
    return x.permute(0, 2, 1, 3, 4).reshape(n * d, c, h, w)


def _unfold_depth(y: torch.Tensor, n: int) -> torch.Tensor:
    """[N D, C, H, W] -> [N, C, D, H, W]."""
    nd, c, h, w = y.shape
    return y.reshape(n, nd // n, c, h, w).permute(0, 2, 1, 3, 4)


def _plain(
    x: torch.Tensor, weight: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int], groups: int
) -> torch.Tensor:
    n, depth, taps = x.shape[0], x.shape[2], weight.shape[2]
    padded = aten.constant_pad_nd.default(x, [0, 0, 0, 0, padding[0], padding[0]])
    out_depth = (depth + 2 * padding[0] - dilation[0] * (taps - 1) - 1) // stride[0] + 1
    total: torch.Tensor | None = None
    for kd in range(taps):
        start = kd * dilation[0]
        slab = padded[:, :, start : start + (out_depth - 1) * stride[0] + 1 : stride[0]]  # [N, C, Do, H, W]
        part = aten.convolution.default(
            _fold_depth(slab), weight[:, :, kd], None, stride[1:], padding[1:], dilation[1:], False, [0, 0], groups
        )  # [N Do, O, Ho, Wo]
        total = part if total is None else total + part
    assert total is not None
    return _unfold_depth(total, n)


def _transposed(
    x: torch.Tensor,
    weight: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    output_padding: list[int],
    groups: int,
) -> torch.Tensor:
    n, depth, taps = x.shape[0], x.shape[2], weight.shape[2]
    span = (depth - 1) * stride[0] + 1  # input depths spread out by the stride
    full = span + dilation[0] * (taps - 1) + output_padding[0]  # before the padding's crop
    folded = _fold_depth(x)
    total: torch.Tensor | None = None
    for kd in range(taps):
        part = aten.convolution.default(
            folded, weight[:, :, kd], None, stride[1:], padding[1:], dilation[1:], True, output_padding[1:], groups
        )
        part = _unfold_depth(part, n)  # [N, O, D, Ho, Wo]
        if stride[0] > 1:  # d -> d * stride: zeros between the depths
            zeros = torch.zeros_like(part).unsqueeze(3).expand(-1, -1, -1, stride[0] - 1, -1, -1)
            part = torch.cat([part.unsqueeze(3), zeros], 3).flatten(2, 3)[:, :, :span]
        shift = kd * dilation[0]
        part = aten.constant_pad_nd.default(part, [0, 0, 0, 0, shift, full - span - shift])
        total = part if total is None else total + part
    assert total is not None
    return total[:, :, padding[0] : full - padding[0]]


def convolution_3d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
) -> Any:
    if weight.dim() != 5 or x.dim() != 5:
        return NotImplemented
    if transposed:
        y = _transposed(x, weight, stride, padding, dilation, output_padding, groups)
    else:
        y = _plain(x, weight, stride, padding, dilation, groups)
    return y if bias is None else y + bias.reshape(1, -1, 1, 1, 1)


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {aten.convolution.default: convolution_3d}
