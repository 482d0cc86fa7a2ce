"""Decompositions core applies for the ops an engine does not lower itself.

Core ATen's decomposition table (applied for every engine) leaves some composite ops whole, because
inductor lowers them directly: batch norm in training mode, ``addmv``, the ``*_copy`` views, grid
sampling, 3-D max pooling... An engine that lowers one of these keeps it. For an engine that does not,
core rewrites it with PyTorch's own decomposition into ops the engine is more likely to have, so one
primitive an engine implements (a reduction, a gather, a view) covers many ops; what is still missing
after that falls back as before, node by node.

Only decompositions that produce ATen ops are listed: those that lower to ``prims`` (``lgamma``,
``flip``, ``var_mean``...) would leave the engine nothing it knows, and PyTorch's ``bucketize`` reads
tensor values while it is traced, which a graph of fake tensors cannot give. Where PyTorch has nothing
usable, core has its own (:data:`OWN`): ``flip`` as gathers, ``searchsorted`` as a comparison and a
sum, the gradients of convolution and attention as convolutions and matmuls, ``torch.special``'s
functions as elementwise arithmetic (:mod:`.special_functions`), order statistics as a sort and a gather
(:mod:`.order_statistics`), resampling and 3-D average pooling
as matrix products (:mod:`.separable`), small LU and Cholesky factorisations and
solves unrolled (:mod:`.linalg`), and a few composites more (:mod:`.composites`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import decomposition_table as _torch_table

from . import composites, linalg, order_statistics, separable, special_functions

aten = torch.ops.aten

WHEN_MISSING: tuple[Any, ...] = (
    # batch norm in training mode -> var_mean, then a scale and shift
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit.default,
    aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_functional.default,
    aten._batch_norm_with_update_functional.default,
    aten.native_group_norm.default,
    # products and distances -> matmul and reductions
    aten.addmv.default,
    aten.dist.default,
    # copies of views -> the view, then a copy
    aten.view_copy.default,
    aten.permute_copy.default,
    aten.narrow_copy.default,
    aten.unbind_copy.int,
    aten.expand_copy.default,
    # scatters into views -> index arithmetic and where (diagonal_scatter's writes in place: not here)
    aten.slice_scatter.default,
    # sampling and pooling -> gathers, where and reductions
    aten.grid_sampler_2d.default,
    aten.max_pool3d_with_indices.default,
    aten._adaptive_avg_pool2d.default,
    aten.adaptive_max_pool3d.default,
    aten.upsample_bicubic2d.default,
    aten.upsample_trilinear3d.default,
    # bit-level math -> arithmetic
    aten.ldexp.Tensor,
    # repetition -> expand and a copy
    aten.repeat.default,
    # training's gradients -> the forward ops' own primitives
    aten.max_pool2d_with_indices_backward.default,  # a scatter-add of the gradients to the argmax
)


def _weight_gradient(
    x: torch.Tensor,
    grad: torch.Tensor,
    kernel: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    """``w_grad[o, c, k] = sum_n sum_i x[n, c, i*stride + k*dilation - padding] * grad[n, o, i]`` for
    ``x`` [N, C, *S] and ``grad`` [N, O, *S_out]: one grouped convolution in which the batch is the
    summed channel dim and ``grad`` the kernel (stride and dilation trade places), then the kernel's
    window of its output. Returns [O, C / groups, *kernel]."""
    n, c = x.shape[:2]
    o = grad.shape[1]
    spatial = list(range(3, 3 + len(kernel)))
    # [N, C, *S] -> [C/g, g*N, *S]: group j's samples are input channels j*N .. (j+1)*N
    x_t = (
        x.reshape(n, groups, c // groups, *x.shape[2:])
        .permute(2, 1, 0, *spatial)
        .reshape(c // groups, groups * n, *x.shape[2:])
    )
    # [N, O, *S_out] -> [O, N, *S_out]: output channel o reads its own group's samples
    grad_t = (
        grad.reshape(n, groups, o // groups, *grad.shape[2:]).permute(1, 2, 0, *spatial).reshape(o, n, *grad.shape[2:])
    )
    zeros = [0] * len(kernel)
    full: torch.Tensor = aten.convolution.default(x_t, grad_t, None, dilation, padding, stride, False, zeros, groups)
    for d, k in enumerate(kernel):
        full = full.narrow(2 + d, 0, k)  # [C/g, O, *kernel]
    return full.transpose(0, 1)


def _convolution_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: Any,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
    output_mask: list[bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The gradients of a convolution as convolutions: the input's through the transposed product
    (or, for a transposed convolution, the plain one), the weight's by :func:`_weight_gradient`, the
    bias's as a sum."""
    kernel = list(weight.shape[2:])
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if transposed:
            zeros = [0] * len(kernel)
            grad_input = aten.convolution.default(
                grad_output, weight, None, stride, padding, dilation, False, zeros, groups
            )
        else:
            # output padding gives back the input positions the forward's stride rounded away
            extra = [
                input.shape[2 + d]
                - ((grad_output.shape[2 + d] - 1) * stride[d] - 2 * padding[d] + dilation[d] * (kernel[d] - 1) + 1)
                for d in range(len(kernel))
            ]
            grad_input = aten.convolution.default(
                grad_output, weight, None, stride, padding, dilation, True, extra, groups
            )
    if output_mask[1]:
        if transposed:  # the transposed convolution's kernel meets the roles of input and gradient swapped
            grad_weight = _weight_gradient(grad_output, input, kernel, stride, padding, dilation, groups)
        else:
            grad_weight = _weight_gradient(input, grad_output, kernel, stride, padding, dilation, groups)
    if output_mask[2]:
        grad_bias = grad_output.sum([0, *range(2, grad_output.dim())])
    return grad_input, grad_weight, grad_bias


def _flash_attention_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> Any:
    """Attention's gradients from its saved output and log-sum-exp, as matmuls and elementwise ops
    (FlashAttention's backward, unfused): ``P = exp(S - lse)``, ``dV = Pᵀ dO``,
    ``dS = P (dO Vᵀ - rowsum(dO O))``, ``dQ = dS K scale``, ``dK = dSᵀ Q scale``. Key and value heads
    shared by groups of query heads get the sum over their group. With dropout the mask is gone: the
    op stays whole (and falls back where the engine lacks it)."""
    if dropout_p != 0.0:
        return NotImplemented
    dtype = query.dtype
    # q: [B, H, L, E], k: [B, Hk, S, E], v: [B, Hk, S, Ev], out and grad_out: [B, H, L, Ev], lse: [B, H, L]
    q, k, v, o, d_o = (t.float() for t in (query, key, value, out, grad_out))
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale  # [B, H, L, S]
    if is_causal:
        length, source = scores.shape[-2:]
        allowed = torch.ones(length, source, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.float()
    lse = logsumexp.float().unsqueeze(-1)
    # rows that attend to nothing (lse = -inf) have no gradient
    probs = torch.where(lse == float("-inf"), 0.0, torch.exp(scores - lse))
    d_v = probs.transpose(-2, -1) @ d_o
    d_scores = probs * (d_o @ v.transpose(-2, -1) - (d_o * o).sum(-1, keepdim=True))
    d_q = d_scores @ k * scale
    d_k = d_scores.transpose(-2, -1) @ q * scale
    if group > 1:
        d_k = d_k.reshape(d_k.shape[0], kv_heads, group, *d_k.shape[2:]).sum(2)
        d_v = d_v.reshape(d_v.shape[0], kv_heads, group, *d_v.shape[2:]).sum(2)
    return d_q.to(dtype), d_k.to(dtype), d_v.to(dtype)


def _flip(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """``flip`` as a gather along each flipped dim (PyTorch's own decomposition ends in a prim)."""
    for d in dims:
        size = x.shape[d]
        x = aten.index_select.default(x, d, torch.arange(size - 1, -1, -1, device=x.device))
    return x if dims else x.clone()


def _as_strided_copy(x: torch.Tensor, size: list[int], stride: list[int], storage_offset: int | None = None) -> Any:
    return aten.as_strided.default(x, size, stride, storage_offset).clone(memory_format=torch.contiguous_format)


def _nonzero_static(x: torch.Tensor, *, size: int, fill_value: int = -1) -> torch.Tensor:
    """The first ``size`` nonzero positions of ``x`` in row-major order ([size, x.dim()], int64), padded
    with ``fill_value``: each nonzero element's rank among them (a cumulative sum) is its row of the
    result, written by one ``index_put``; elements past ``size`` and the zeros write to one extra row,
    dropped at the end."""
    rank = x.dim()
    if rank == 0:
        return torch.full((size, 0), fill_value, dtype=torch.int64, device=x.device)
    nonzero = x.reshape(-1) != 0  # [N]
    row = torch.cumsum(nonzero, 0) - 1  # [N]: the rank of each nonzero among them
    row = torch.where(nonzero & (row < size), row, size)
    position = torch.arange(nonzero.shape[0], device=x.device)
    coordinates, step = [], 1
    for extent in reversed(x.shape):
        coordinates.append(torch.div(position, step, rounding_mode="floor") % extent)
        step *= extent
    found = torch.stack(coordinates[::-1], 1)  # [N, rank]
    out = torch.full((size + 1, rank), fill_value, dtype=torch.int64, device=x.device)
    written: torch.Tensor = aten.index_put.default(out, [row], found)
    return written[:size]


# the most comparisons a searchsorted is decomposed into (inputs × sequence length): beyond it the
# op stays whole, since the comparison tensor would take that many bytes
SEARCH_COMPARISONS = 1 << 24


def _searchsorted(
    sorted_sequence: torch.Tensor,
    input: torch.Tensor,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: torch.Tensor | None = None,
) -> Any:
    """Each value's insertion position as the count of sequence elements before it (``< value``, or
    ``<= value`` on the right side): one broadcast comparison and a sum, for sequences and inputs
    small enough (see :data:`SEARCH_COMPARISONS`)."""
    length = sorted_sequence.shape[-1]
    if not isinstance(input.numel(), int) or not isinstance(length, int):
        return NotImplemented
    if input.numel() * length > SEARCH_COMPARISONS:
        return NotImplemented
    if side is not None:
        right = side == "right"
    sequence = sorted_sequence if sorter is None else sorted_sequence.gather(-1, sorter)
    if sequence.dim() > 1:
        sequence = sequence.unsqueeze(-2)  # [..., 1, M] against [..., K, 1]
    values = input.unsqueeze(-1)
    # negated, so that a NaN value counts every element before it and lands at the end, as in eager
    before = ~(sequence > values) if right else ~(sequence >= values)
    return before.sum(-1).to(torch.int32 if out_int32 else torch.int64)


def _bucketize(input: torch.Tensor, boundaries: torch.Tensor, *, out_int32: bool = False, right: bool = False) -> Any:
    return _searchsorted(boundaries, input, out_int32=out_int32, right=right)


# core's own decompositions (PyTorch has none for these, or none into ATen ops), used like those of
# WHEN_MISSING
OWN: dict[Any, Callable[..., Any]] = {
    aten.flip.default: _flip,
    aten.nonzero_static.default: _nonzero_static,
    aten.searchsorted.Tensor: _searchsorted,
    aten.bucketize.Tensor: _bucketize,
    aten.as_strided_copy.default: _as_strided_copy,
    aten.convolution_backward.default: _convolution_backward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _flash_attention_backward,
    **composites.DECOMPOSITIONS,
    **linalg.DECOMPOSITIONS,
    **order_statistics.DECOMPOSITIONS,
    **separable.DECOMPOSITIONS,
    **special_functions.DECOMPOSITIONS,
}


@functools.cache
def _available() -> dict[Any, Callable[..., Any]]:
    return {**{op: _torch_table[op] for op in WHEN_MISSING if op in _torch_table}, **OWN}


def for_missing_ops(lowered: Any, keep_whole: frozenset[Any]) -> dict[Any, Callable[..., Any]]:
    """The decompositions of :data:`WHEN_MISSING` for the ops not in ``lowered`` (an engine's op
    registry, or any container of ops) nor kept whole by the engine, and those of other libraries'
    ops into ones the engine lowers (:func:`_library_ops`)."""
    table = {op: fn for op, fn in _available().items() if op not in lowered and op not in keep_whole}
    table.update({op: fn for op, (needs, fn) in _library_ops().items() if needs in lowered and op not in lowered})
    return table


def _library_ops() -> dict[Any, tuple[Any, Callable[..., Any]]]:
    """Ops other libraries register, with the ATen op each becomes where the engine lowers that one.

    transformers' mixtures of experts (Mixtral, Qwen MoE, OLMoE...) multiply each expert's tokens by
    its weights through ``transformers::grouped_mm_fallback`` when compiled in f32 (and through
    ``_grouped_mm`` itself in bf16): the same product as ATen's grouped one over offsets, with the
    rows past the last offset zero (ATen's leaves them unwritten; the engines zero them)."""
    found: dict[Any, tuple[Any, Callable[..., Any]]] = {}
    library = getattr(torch.ops, "transformers", None)
    grouped = getattr(library, "grouped_mm_fallback", None) if library is not None else None
    if grouped is not None and hasattr(aten, "_grouped_mm"):
        found[grouped.default] = (aten._grouped_mm.default, _grouped_mm_by_offsets)
    return found


def _grouped_mm_by_offsets(rows: torch.Tensor, weights: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    # [S, K] rows sorted by group, [G, K, N] weights, [G] cumulative row counts -> [S, N]
    out: torch.Tensor = aten._grouped_mm.default(rows, weights, offs.to(torch.int32))
    return out
