"""Order statistics (``median``, ``nanmedian``, ``kthvalue``) as a stable sort and a gather, and ``mode``
as counts of equal elements, for engines that have a sort but not these ops.

A stable ascending sort puts NaN after every number (PyTorch's order) and keeps equal values in their
original order, so the k-th smallest value is at sorted position k - 1 and its index is the sorted
indices' entry there. ``median`` is the lower median, and NaN when its line holds one (the first NaN's
position after sorting); ``nanmedian`` ignores NaN, taking the lower median of the numbers, and is NaN
only for a line of NaN (whose index PyTorch leaves to its selection algorithm; here it is the first).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _sorted(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = aten.sort.stable(x, stable=True, dim=dim)
    return values, indices


def _pick(
    values: torch.Tensor, indices: torch.Tensor, position: torch.Tensor, dim: int, keepdim: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sorted entries at ``position`` (keepdim-shaped, one per line) along ``dim``."""
    value, index = values.gather(dim, position), indices.gather(dim, position)
    if not keepdim:
        value, index = value.squeeze(dim), index.squeeze(dim)
    return value, index


def _line_positions(x: torch.Tensor, dim: int, skip_nan: bool) -> torch.Tensor:
    """Each line's median position after sorting (keepdim-shaped, int64): the lower median of its
    numbers, or with NaN present the first NaN (for ``median``) or still of the numbers (``nanmedian``)."""
    numbers = (~torch.isnan(x)).sum(dim, keepdim=True)  # [.., 1, ..]
    if skip_nan:
        return torch.clamp((numbers - 1) // 2, min=0)
    size = x.shape[dim]
    return torch.where(numbers < size, numbers, (numbers - 1) // 2)


def _median_dim(x: torch.Tensor, dim: int = 0, keepdim: bool = False, *, skip_nan: bool = False) -> Any:
    if x.dim() == 0:
        return x.clone(), torch.zeros_like(x, dtype=torch.int64)
    if x.numel() == 0:
        return NotImplemented  # PyTorch raises for an empty line; leave it to the op
    dim = dim % x.dim()
    values, indices = _sorted(x, dim)
    return _pick(values, indices, _line_positions(x, dim, skip_nan), dim, keepdim)


def _median(x: torch.Tensor, *, skip_nan: bool = False) -> Any:
    if x.numel() == 0:
        return NotImplemented
    value, _ = _median_dim(x.reshape(-1), 0, False, skip_nan=skip_nan)
    return value


def _nanmedian_dim(x: torch.Tensor, dim: int = 0, keepdim: bool = False) -> Any:
    return _median_dim(x, dim, keepdim, skip_nan=True)


def _nanmedian(x: torch.Tensor) -> Any:
    return _median(x, skip_nan=True)


def _kthvalue(x: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False) -> Any:
    if x.dim() == 0:
        return NotImplemented if k != 1 else (x.clone(), torch.zeros_like(x, dtype=torch.int64))
    dim = dim % x.dim()
    if not 1 <= k <= x.shape[dim]:
        return NotImplemented  # out of range: PyTorch's error
    values, indices = _sorted(x, dim)
    shape = list(x.shape)
    shape[dim] = 1
    position = torch.full(shape, k - 1, dtype=torch.int64, device=x.device)
    return _pick(values, indices, position, dim, keepdim)


# the most element comparisons ``mode`` makes (elements x line length)
MODE_COMPARISONS = 1 << 24


def _mode(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> Any:
    """The most frequent value of each line (the smallest among equally frequent ones) and its last
    position, as PyTorch's kernel gives: each element's count of equal elements along the line. (With
    NaN in a line PyTorch's sort order, and so its index, is unspecified; NaN never counts as a value.)"""
    if x.dim() == 0:
        return x.clone(), torch.zeros_like(x, dtype=torch.int64)
    dim = dim % x.dim()
    size = x.shape[dim]
    if size == 0 or x.numel() * size > MODE_COMPARISONS or x.dtype == torch.bool:
        return NotImplemented
    lines = x.movedim(dim, -1)  # [.., n]
    counts = (lines.unsqueeze(-1) == lines.unsqueeze(-2)).sum(-1)  # [.., n]
    frequent = counts == counts.amax(-1, keepdim=True)
    largest = math.inf if x.is_floating_point() else torch.iinfo(x.dtype).max
    value = torch.where(frequent, lines, largest).amin(-1, keepdim=True)  # [.., 1]
    position = torch.arange(size, device=x.device)
    index = torch.where(lines == value, position, -1).amax(-1, keepdim=True)
    value, index = value.movedim(-1, dim), index.movedim(-1, dim)
    return (value, index) if keepdim else (value.squeeze(dim), index.squeeze(dim))


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.mode.default: _mode,
    aten.median.default: _median,
    aten.median.dim: _median_dim,
    aten.nanmedian.default: _nanmedian,
    aten.nanmedian.dim: _nanmedian_dim,
    aten.kthvalue.default: _kthvalue,
}
