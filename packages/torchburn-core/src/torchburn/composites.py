"""Core's own decompositions of composite ops PyTorch leaves whole (or decomposes only in part), into the
primitives every engine has: scans, gathers, ``index_put``, matmuls, reductions and elementwise math.

- writes at positions: ``masked_scatter`` (a running count picks each element's source), ``put`` and
  ``as_strided_scatter`` (an ``index_put`` on the flattened tensor), ``diagonal_scatter`` (a ``where``
  over the diagonal's plane), ``index_reduce`` and ``scatter(reduce=...)`` (a ``scatter_reduce``);
- products and distances: ``addbmm`` (a batched matmul summed over the batch), ``_trilinear`` (an
  ``einsum``), ``cdist``/``pdist`` (broadcast differences and a norm);
- ``embedding_bag`` in inference: gathers scattered into their bags;
- counting: ``histc`` (each element's bin, compared with every bin and summed);
- pooling: adaptive max pooling whose windows do not tile the input (PyTorch handles only the tiling
  case), as gathers of each window's rows and columns and an argmax;
- ``eye`` from int64 ranges, ``angle`` of a real tensor, ``max()``/``min()`` of a whole tensor as ``amax``/``amin``;
- ``scatter_reduce``'s ``include_self=False`` and ``mean`` from its plain form (:func:`scatter_reduce_by_parts`,
  for engines to add to their tables).

Each returns ``NotImplemented`` where it does not apply (the op then stays whole, and falls back where
the engine lacks it), including where the broadcast it builds would take more than :data:`MAX_ELEMENTS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

# the most elements an intermediate built here may have (a comparison table, a difference tensor)
MAX_ELEMENTS = 1 << 24


def _masked_scatter(x: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> Any:
    """``x`` with its masked positions (row-major order) replaced by ``source``'s leading elements."""
    if source.numel() == 0:
        return x.clone()  # nothing to write: the mask must select nothing
    flat_mask = torch.broadcast_to(mask, x.shape).reshape(-1)  # [N]
    taken = torch.cumsum(flat_mask.to(torch.int64), 0) - 1  # [N]: which source element a position takes
    values = source.reshape(-1)[taken.clamp(min=0)]
    return torch.where(flat_mask, values, x.reshape(-1)).reshape(x.shape)


def _put(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> Any:
    """``x`` seen flat, with ``source`` written (or added) at ``index`` (negative counts from the end)."""
    count = x.numel()
    flat_index = index.reshape(-1)
    flat_index = torch.where(flat_index < 0, flat_index + count, flat_index)
    written = aten.index_put.default(x.reshape(-1), [flat_index], source.reshape(-1), accumulate)
    return written.reshape(x.shape)


def _addbmm(x: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: float = 1, alpha: float = 1) -> Any:
    """``beta x + alpha sum_b batch1[b] @ batch2[b]``; with ``beta = 0`` ``x`` is ignored (NaN too)."""
    products = torch.bmm(batch1, batch2).sum(0)  # [N, P]
    if alpha != 1:
        products = products * alpha
    if beta == 0:
        return products  # the result takes the products' shape; x (NaN too) is not read
    return x * beta + products if beta != 1 else x + products


def _pairwise_norm(difference: torch.Tensor, p: float) -> torch.Tensor:
    """The p-norm of ``difference`` over its last dim, as ``torch.cdist`` defines it for every p >= 0."""
    if p == 0:
        return (difference != 0).sum(-1).to(difference.dtype)
    magnitude = difference.abs()
    if math.isinf(p):
        return magnitude.amax(-1)
    if p == 1:
        return magnitude.sum(-1)
    if p == 2:
        return (magnitude * magnitude).sum(-1).sqrt()
    return magnitude.pow(p).sum(-1).pow(1.0 / p)


def _cdist(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None = None) -> Any:
    """Distances between the rows of ``x1`` [.., P, M] and ``x2`` [.., R, M]: [.., P, R]."""
    if p < 0 or x1.shape[-1] == 0:
        return NotImplemented
    difference = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # [.., P, R, M]
    if difference.numel() > MAX_ELEMENTS:
        return NotImplemented
    return _pairwise_norm(difference, p)


def _pdist(x: torch.Tensor, p: float = 2) -> Any:
    """Distances between each pair of rows i < j of ``x`` [N, M], in row-major order of the pairs."""
    n = x.shape[0]
    if p < 0 or x.shape[1] == 0 or n * n * max(n, x.shape[1]) > MAX_ELEMENTS:
        return NotImplemented
    if n < 2:
        return x.new_zeros(0)
    # pair t is (i, j): row i's pairs start at S(i) = i (2n - i - 1) / 2, so i counts the rows r >= 1
    # with S(r) <= t, and j = t - S(i) + i + 1
    t = torch.arange(n * (n - 1) // 2, device=x.device)  # [T]
    r = torch.arange(n, device=x.device)  # [N]
    starts = r * (2 * n - r - 1) // 2  # [N]
    first = (starts[1:] <= t.unsqueeze(1)).sum(1)  # [T]
    second = t - starts[first] + first + 1
    return _pairwise_norm(x[first] - x[second], p)


def _histc(x: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Any:
    """Counts of ``x`` in ``bins`` equal bins over [min, max] (the data's range when both are 0, widened
    by 1 each way when that is one value); elements outside are not counted, ``max`` falls in the last."""
    if x.numel() * bins > MAX_ELEMENTS or bins <= 0:
        return NotImplemented
    values = x.reshape(-1)
    low: torch.Tensor | float = min
    high: torch.Tensor | float = max
    if min == max:
        if values.numel() == 0:
            return torch.zeros(bins, dtype=x.dtype, device=x.device)
        data_low, data_high = values.amin(), values.amax()
        same = data_low == data_high
        low, high = torch.where(same, data_low - 1, data_low), torch.where(same, data_high + 1, data_high)
    inside = (values >= low) & (values <= high)
    # PyTorch's bin arithmetic: (x - low) * bins / (high - low), truncated; the top edge joins the last bin
    position = ((values - low) * bins / (high - low)).to(torch.int64).clamp(max=bins - 1)  # [N]
    every_bin = torch.arange(bins, device=x.device)
    hits = (position.unsqueeze(1) == every_bin) & inside.unsqueeze(1)  # [N, bins]
    return hits.sum(0).to(x.dtype)


def _trilinear(
    i1: torch.Tensor,
    i2: torch.Tensor,
    i3: torch.Tensor,
    expand1: list[int],
    expand2: list[int],
    expand3: list[int],
    sumdim: list[int],
    unroll_dim: int = 1,
) -> Any:
    """The product of three operands, each missing the dims ``expand*`` names, summed over ``sumdim``:
    one ``einsum`` (which contracts pairwise through matmuls, never forming the full product)."""
    rank = i1.dim() + len(expand1)
    if rank > 26:
        return NotImplemented
    letters = "abcdefghijklmnopqrstuvwxyz"[:rank]

    def subscript(expanded: list[int]) -> str:
        return "".join(c for d, c in enumerate(letters) if d not in expanded)

    summed = set(sumdim)
    output = "".join(c for d, c in enumerate(letters) if d not in summed)
    equation = f"{subscript(expand1)},{subscript(expand2)},{subscript(expand3)}->{output}"
    return torch.einsum(equation, i1, i2, i3)


def _embedding_bag_forward_only(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: torch.Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> Any:
    """Bags of embedding rows reduced by sum (mode 0), mean (1) or max (2): each index's bag is the
    number of offsets at or before its position; rows are gathered, weighted, and scattered into their
    bag. Only the bags come out exact; the bookkeeping outputs (which inference never reads) are the bag
    of each index, each bag's size and zeros."""
    if indices.dim() != 1 or weight.dim() != 2:
        return NotImplemented
    count, width = indices.shape[0], weight.shape[1]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    starts = offsets[:bags]
    position = torch.arange(count, device=indices.device)
    bag = (starts.unsqueeze(0) <= position.unsqueeze(1)).sum(1) - 1  # [count]
    keep = torch.ones_like(indices, dtype=torch.bool) if padding_idx < 0 else indices != padding_idx
    rows = weight.index_select(0, indices)  # [count, width]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1)
    sizes = torch.zeros(bags, dtype=torch.int64, device=weight.device).scatter_add(0, bag, keep.to(torch.int64))
    spread = bag.unsqueeze(1).expand(count, width)
    if mode == 2:
        lowest = torch.full_like(rows, -math.inf)
        start = torch.full((bags, width), -math.inf, dtype=weight.dtype, device=weight.device)
        best = start.scatter_reduce(0, spread, torch.where(keep.unsqueeze(1), rows, lowest), "amax")
        out = torch.where(sizes.unsqueeze(1) > 0, best, torch.zeros_like(best))
    else:
        kept = torch.where(keep.unsqueeze(1), rows, torch.zeros_like(rows))
        out = torch.zeros((bags, width), dtype=weight.dtype, device=weight.device).scatter_add(0, spread, kept)
        if mode == 1:
            out = out / sizes.clamp(min=1).unsqueeze(1).to(out.dtype)
    return out, bag, sizes, torch.zeros((bags, width), dtype=torch.int64, device=weight.device)


def _window_rows(size: int, out: int, device: torch.device) -> torch.Tensor:
    """Adaptive pooling's windows along one dim as positions [out, K] (K the widest window): window i
    covers floor(i size / out) .. ceil((i + 1) size / out) - 1; narrower ones repeat their last row,
    which changes neither the maximum nor which position holds it first."""
    widest = max(-(-(i + 1) * size // out) - i * size // out for i in range(out))
    i = torch.arange(out, device=device).unsqueeze(1)  # [out, 1]
    k = torch.arange(widest, device=device)  # [K]
    starts, ends = i * size // out, ((i + 1) * size + out - 1) // out
    return torch.minimum(starts + k, ends - 1)


def _adaptive_max_pool2d(x: torch.Tensor, output_size: list[int]) -> Any:
    """The maximum of each adaptive window of ``x`` [.., H, W] and its position (h W + w) in the plane."""
    height, width = x.shape[-2:]
    out_h, out_w = output_size
    if out_h == 0 or out_w == 0 or height == 0 or width == 0:
        return NotImplemented
    if x.numel() // (height * width) * out_h * out_w * -(-height // out_h + 1) * -(-width // out_w + 1) > MAX_ELEMENTS:
        return NotImplemented
    rows, cols = _window_rows(height, out_h, x.device), _window_rows(width, out_w, x.device)  # [Ho, Kh], [Wo, Kw]
    kh, kw = rows.shape[1], cols.shape[1]
    picked = x.index_select(-2, rows.reshape(-1)).index_select(-1, cols.reshape(-1))  # [.., Ho Kh, Wo Kw]
    lead = list(x.shape[:-2])
    windows = picked.reshape(*lead, out_h, kh, out_w, kw).transpose(-3, -2)  # [.., Ho, Wo, Kh, Kw]
    values, arg = windows.reshape(*lead, out_h, out_w, kh * kw).max(-1)  # [.., Ho, Wo]
    # each window entry's position in the plane, [Ho, Wo, Kh Kw]
    plane = (rows[:, None, :, None] * width + cols[None, :, None, :]).reshape(out_h, out_w, kh * kw)
    where = plane.expand(*lead, out_h, out_w, kh * kw).gather(-1, arg.unsqueeze(-1)).squeeze(-1)
    return values, where


def _adaptive_max_pool2d_any(x: torch.Tensor, output_size: list[int]) -> Any:
    """PyTorch's decomposition where the windows tile the input (a max pooling), else :func:`_adaptive_max_pool2d`."""
    from torch._decomp import decomposition_table

    tiled = decomposition_table[aten.adaptive_max_pool2d.default](x, output_size)
    return _adaptive_max_pool2d(x, output_size) if tiled is NotImplemented else tiled


def scatter_reduce_by_parts(
    x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, *, include_self: bool = True
) -> Any:
    """``scatter_reduce`` without ``self`` at the written positions, or as a ``mean``, from the plain form
    (``include_self=True`` with sum, prod, amax or amin): written positions first take the reduction's
    identity; a mean is a sum over a count. For engines whose scatter has only the plain form."""
    if include_self and reduce != "mean":
        return NotImplemented
    if not x.is_floating_point():
        return NotImplemented  # integer identities and integer means: left to the op
    identity = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "amax": -math.inf, "amin": math.inf}[reduce]
    # scatters of a tensor (not of a scalar, which fewer engines have)
    base = x if include_self else x.scatter(dim, index, torch.full_like(index, identity, dtype=x.dtype))
    if reduce != "mean":
        return aten.scatter_reduce.two(base, dim, index, src, reduce, include_self=True)
    total = aten.scatter_reduce.two(base, dim, index, src, "sum", include_self=True)
    ones = torch.ones_like(x)
    counts = ones if include_self else ones.scatter(dim, index, torch.zeros_like(index, dtype=x.dtype))
    counts = counts.scatter_add(dim, index, torch.ones_like(src))
    return torch.where(counts > 0, total / counts, total)


_SCATTER_REDUCTIONS = {"add": "sum", "multiply": "prod"}


def _scatter_with_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, src: Any, *, reduce: str) -> Any:
    """``scatter`` with ``reduce`` ('add' or 'multiply') as the ``scatter_reduce`` that includes ``self``;
    a tensor source takes part only where ``index`` reaches, a scalar one is that value everywhere."""
    if reduce not in _SCATTER_REDUCTIONS:
        return NotImplemented
    if isinstance(src, torch.Tensor):
        src = src[tuple(slice(0, extent) for extent in index.shape)]
    else:
        src = torch.full_like(index, src, dtype=x.dtype)
    return aten.scatter_reduce.two(x, dim, index, src, _SCATTER_REDUCTIONS[reduce], include_self=True)


def _index_reduce(
    x: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    source: torch.Tensor,
    reduce: str,
    *,
    include_self: bool = True,
) -> Any:
    """``scatter_reduce`` with ``index`` [K] spread over ``source``'s other dims (0-d operands as one element)."""
    if source.dim() == 0:
        out = _index_reduce(x.reshape(1), 0, index.reshape(1), source.reshape(1), reduce, include_self=include_self)
        return out.reshape(())
    dim = dim % source.dim()
    shape = [1] * source.dim()
    shape[dim] = -1
    spread = index.reshape(shape).expand(source.shape)
    return aten.scatter_reduce.two(x, dim, spread, source, reduce, include_self=include_self)


def _diagonal_scatter(x: torch.Tensor, src: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    """``x`` with its diagonal (``offset``, over ``dim1`` and ``dim2``) replaced by ``src``: each position
    of the (dim1, dim2) plane takes ``src``'s entry for its diagonal step where it lies on the diagonal."""
    dim1, dim2 = dim1 % x.dim(), dim2 % x.dim()
    rows, cols = x.shape[dim1], x.shape[dim2]
    length = src.shape[-1]
    if length == 0:
        return x.clone()
    i = torch.arange(rows, device=x.device).unsqueeze(1)  # [rows, 1]
    j = torch.arange(cols, device=x.device)  # [cols]
    on = (j - i) == offset  # [rows, cols]
    step = torch.clamp(i if offset >= 0 else j, max=length - 1).expand(rows, cols)
    plane = src.index_select(-1, step.reshape(-1)).reshape(*src.shape[:-1], rows, cols)
    plane = plane.movedim((-2, -1), (dim1, dim2))  # the plane's dims where x has them
    mask_shape = [1] * x.dim()
    mask_shape[dim1], mask_shape[dim2] = rows, cols
    mask = on.reshape(mask_shape) if dim1 < dim2 else on.t().reshape(mask_shape)
    return torch.where(mask, plane, x)


def _as_strided_scatter(
    x: torch.Tensor, src: torch.Tensor, size: list[int], stride: list[int], storage_offset: int | None = None
) -> Any:
    """``x`` (seen as contiguous) with the elements of its ``as_strided`` view replaced by ``src``: the
    view's positions are the same view of the element numbers, written by one ``index_put``."""
    positions = torch.arange(x.numel(), device=x.device).as_strided(size, stride, storage_offset or 0)
    written = aten.index_put.default(x.reshape(-1), [positions.reshape(-1)], src.reshape(-1))
    return written.reshape(x.shape)


def _eye(
    n: int,
    m: int | None = None,
    *,
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: bool | None = None,
) -> Any:
    """The identity as a comparison of two int64 ranges (PyTorch's own counts in uint8, which not every
    engine stores)."""
    m = n if m is None else m
    rows = torch.arange(n, device=device).unsqueeze(1)
    return (rows == torch.arange(m, device=device)).to(dtype or torch.get_default_dtype())


def _max_of_all(x: torch.Tensor) -> Any:
    return torch.amax(x)  # NaN anywhere gives NaN, an empty tensor PyTorch's error, as max() does


def _min_of_all(x: torch.Tensor) -> Any:
    return torch.amin(x)


def _angle(x: torch.Tensor) -> Any:
    """The angle of a real number: pi for negatives, 0 otherwise, NaN for NaN."""
    if x.is_complex():
        return NotImplemented
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    return torch.where(x < 0, math.pi, torch.where(torch.isnan(x), x, 0.0))


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.index_reduce.default: _index_reduce,
    aten.scatter.reduce: _scatter_with_reduce,
    aten.scatter.value_reduce: _scatter_with_reduce,
    aten.diagonal_scatter.default: _diagonal_scatter,
    aten.as_strided_scatter.default: _as_strided_scatter,
    aten.eye.default: _eye,
    aten.eye.m: _eye,
    aten.max.default: _max_of_all,
    aten.min.default: _min_of_all,
    aten.masked_scatter.default: _masked_scatter,
    aten.put.default: _put,
    aten.addbmm.default: _addbmm,
    aten._cdist_forward.default: _cdist,
    aten._pdist_forward.default: _pdist,
    aten.histc.default: _histc,
    aten._trilinear.default: _trilinear,
    aten._embedding_bag_forward_only.default: _embedding_bag_forward_only,
    aten.adaptive_max_pool2d.default: _adaptive_max_pool2d_any,
    aten.angle.default: _angle,
}
