"""Separable resampling and pooling as matrix products: antialiased bilinear/bicubic resizing, 3-D
average pooling and 3-D adaptive average pooling.

Each of these computes every output along a dim as a weighted sum of an input window along that dim,
with weights that depend only on positions, and the weights of a 2-D or 3-D window are the products of
the per-dim ones. So the op is the input multiplied along each spatial dim by a small [out, in] weight
matrix, built here from ``arange`` grids (traced as elementwise ops, never read from values), and an
engine runs it as matmuls. The weights follow PyTorch's CPU kernels: antialiased resizing's triangle or
Keys cubic filter stretched by the scale and normalised per output; pooling's window counts, clipped
the way ``count_include_pad`` says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

aten = torch.ops.aten


def _along(x: torch.Tensor, dim: int, weights: torch.Tensor) -> torch.Tensor:
    """``x`` with ``dim`` (size in) replaced by ``weights`` [out, in] applied along it (size out)."""
    moved = x.movedim(dim, -1)  # [.., in]
    return torch.matmul(moved, weights.t()).movedim(-1, dim)


# ---- antialiased resizing -------------------------------------------------------------------------
def _triangle(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(1 - x.abs(), min=0)


def _keys_cubic(x: torch.Tensor) -> torch.Tensor:
    """Keys' cubic convolution kernel with a = -0.5 (PyTorch's antialiasing bicubic filter)."""
    a = -0.5
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def _resize_weights(
    size: int,
    out: int,
    align_corners: bool,
    scale: float | None,
    taps: int,
    kernel: Callable[[torch.Tensor], torch.Tensor],
    like: torch.Tensor,
) -> torch.Tensor:
    """The [out, size] weights of antialiased resizing along one dim, in ``like``'s dtype."""
    if align_corners:
        ratio = (size - 1) / (out - 1) if out > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else size / out
    support = taps / 2 * ratio if ratio >= 1 else taps / 2
    stretch = 1 / ratio if ratio >= 1 else 1.0  # a downscale widens the filter
    dtype = like.dtype
    i = torch.arange(out, device=like.device, dtype=dtype).unsqueeze(1)  # [out, 1]
    j = torch.arange(size, device=like.device, dtype=dtype)  # [size]
    center = ratio * (i + 0.5)
    first = torch.clamp((center - support + 0.5).to(torch.int64), min=0)
    last = torch.clamp((center + support + 0.5).to(torch.int64), max=size)  # one past
    jj = j.to(torch.int64)
    inside = (jj >= first) & (jj < last)  # [out, size]
    w = torch.where(inside, kernel((j - center + 0.5) * stretch), torch.zeros_like(center))
    total = w.sum(1, keepdim=True)
    return torch.where(total != 0, w / total, w)


def _resize_aa(
    x: torch.Tensor,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None,
    scales_w: float | None,
    taps: int,
    kernel: Callable[[torch.Tensor], torch.Tensor],
) -> Any:
    if not x.is_floating_point() or x.dim() != 4:
        return NotImplemented
    dtype = x.dtype
    work = x.float() if dtype in (torch.float16, torch.bfloat16) else x
    height, width = x.shape[-2:]
    rows = _resize_weights(height, output_size[0], align_corners, scales_h, taps, kernel, work)
    cols = _resize_weights(width, output_size[1], align_corners, scales_w, taps, kernel, work)
    return _along(_along(work, -1, cols), -2, rows).to(dtype)


def _upsample_bilinear2d_aa(
    x: torch.Tensor,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> Any:
    return _resize_aa(x, output_size, align_corners, scales_h, scales_w, 2, _triangle)


def _upsample_bicubic2d_aa(
    x: torch.Tensor,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> Any:
    return _resize_aa(x, output_size, align_corners, scales_h, scales_w, 4, _keys_cubic)


# ---- 3-D average pooling --------------------------------------------------------------------------
def _window_weights(
    starts: torch.Tensor, ends: torch.Tensor, size: int, divisor: torch.Tensor | None, like: torch.Tensor
) -> torch.Tensor:
    """[out, size]: 1 / divisor (or 1) on each output's window [start, end) of the input, else 0."""
    j = torch.arange(size, device=like.device).unsqueeze(0)  # [1, size]
    inside = (j >= starts.unsqueeze(1)) & (j < ends.unsqueeze(1))
    one = torch.ones((), dtype=like.dtype, device=like.device)
    scale = one if divisor is None else one / divisor.to(like.dtype).unsqueeze(1)
    return torch.where(inside, scale, torch.zeros((), dtype=like.dtype, device=like.device))


def _pool_size(size: int, kernel: int, stride: int, padding: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size, with ceil mode's rule that a window may not start in the right padding."""
    span = size + 2 * padding - kernel
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def _triple(values: Sequence[int]) -> list[int]:
    return list(values) * 3 if len(values) == 1 else list(values)


def _avg_pool3d(
    x: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Any:
    if not x.is_floating_point() or x.dim() not in (4, 5):
        return NotImplemented
    kernels, pads = _triple(kernel_size), _triple(padding)
    strides = _triple(stride) if stride else kernels
    out = x
    for axis, (k, s, p) in enumerate(zip(kernels, strides, pads, strict=True)):
        dim = x.dim() - 3 + axis
        size = x.shape[dim]
        count = _pool_size(size, k, s, p, ceil_mode)
        starts = torch.arange(count, device=x.device) * s - p
        ends = torch.clamp(starts + k, max=size + p)  # the padded window
        clipped_starts, clipped_ends = torch.clamp(starts, min=0), torch.clamp(ends, max=size)
        if divisor_override:
            divisor = None
        else:
            divisor = ends - starts if count_include_pad else clipped_ends - clipped_starts
        out = _along(out, dim, _window_weights(clipped_starts, clipped_ends, size, divisor, x))
    return out / divisor_override if divisor_override else out


def _adaptive_avg_pool3d(x: torch.Tensor, output_size: Sequence[int]) -> Any:
    if not x.is_floating_point() or x.dim() not in (4, 5):
        return NotImplemented
    out = x
    for axis, count in enumerate(output_size):
        dim = x.dim() - 3 + axis
        size = x.shape[dim]
        i = torch.arange(count, device=x.device)
        starts, ends = i * size // count, ((i + 1) * size + count - 1) // count
        out = _along(out, dim, _window_weights(starts, ends, size, ends - starts, x))
    return out


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten._upsample_bilinear2d_aa.default: _upsample_bilinear2d_aa,
    aten._upsample_bicubic2d_aa.default: _upsample_bicubic2d_aa,
    aten.avg_pool3d.default: _avg_pool3d,
    aten._adaptive_avg_pool3d.default: _adaptive_avg_pool3d,
}
