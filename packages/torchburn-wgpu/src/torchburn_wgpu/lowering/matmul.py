"""Matrix products (mm, bmm, addmm, baddbmm): the tiled kernel of ``matmul.wgsl``, with split-k sums;
``_grouped_mm``'s mixture of experts in ``grouped_mm.wgsl``."""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import ComputeType, Expr, Family, expr

from ..kernels import B_STRIDED, B_VEC_ALONG_K, B_VEC_ALONG_N, Launch, f32_bits, grid, matmul_source, params
from ..planner import Lazy, Planner, constant
from ..shaders import source
from ..values import WGSL_TYPES, Value, broadcast_strides
from . import FLOATS, FxNode, lower

aten = torch.ops.aten


TILE = 128  # rows and columns of C per workgroup


# a product with fewer 128-tiles than this, over a k no longer than SMALL_TILE_MAX_K, runs on 64×64
# tiles (four times as many workgroups, each thread a 4×4 block) before k is split: attention's
# per-head products (32 heads of 128×128 scores are 32 workgroups of 128 for 132 multiprocessors on
# an H200). Kernel time on an H200, 128 -> 64: SDPA (4, 8, 128, 64) 90 -> 67 µs, mm 256³ 31 -> 16,
# Linear+ReLU 128x512 -> 1024 33 -> 25, the MLP 59 -> 37; but mm 1024³ 110 -> 149 (there the 4×4
# blocks' lower reuse costs more than split-k's extra pass: hence the bound on k)
SMALL_TILE = 64


SMALL_TILE_BELOW = 128


SMALL_TILE_MAX_K = 512


# workgroups worth having in flight: two per multiprocessor of a large GPU (132 on an H200)
TARGET_WORKGROUPS = 256


# split k no finer than this: each slice's partial plane costs a pass over C, but a workgroup that
# loops over a long k alone is bound by its load latency (on an H200, 64 against 256 took the
# 128x512 -> 1024 Linear from 68 to 26 µs of kernel time, the encoder layer's products from 464 to 394)
MIN_SLICE = 64


def slices(tiles: int, k: int) -> tuple[int, int]:
    """(slices, depth of each) for a product of ``tiles`` output tiles over ``k``: whole 16-deep steps."""
    chunk = -(-k // k_splits(tiles, k))
    chunk = max(-(-chunk // 16) * 16, 16)
    return max(-(-k // chunk), 1), chunk


def k_splits(tiles: int, k: int) -> int:
    """How many slices of k a product with ``tiles`` output tiles is split into (1: none)."""
    if tiles >= TARGET_WORKGROUPS // 2:
        return 1
    return max(1, min(-(-TARGET_WORKGROUPS // max(tiles, 1)), k // MIN_SLICE))


def sum_of_planes(p: Planner, partial: Value, splits: int, shape: tuple[int, ...], plane_of: Any) -> Expr:
    """The sum over slices of a split-k product's partial planes, as one expression over ``shape``."""
    total: Expr | None = None
    for s in range(splits):
        view = plane_of(partial.meta(), s)
        term = p.lazy(partial.with_layout(view), shape)
        total = term if total is None else expr.apply("add", total, term)
    assert total is not None
    return total


def matmul(p: Planner, a: Value, b: Value, bias: Value | None, alpha: float, beta: float) -> Value | Lazy:
    """``alpha · a @ b + beta · bias`` for a [M, K] @ [K, N] or batched [B, M, K] @ [B, N, K] product."""
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    batch = a.shape[0] if a.rank == 3 else 1
    shape = (batch, m, n) if a.rank == 3 else (m, n)
    few = -(-n // TILE) * -(-m // TILE) * batch < SMALL_TILE_BELOW
    tile = SMALL_TILE if few and k <= SMALL_TILE_MAX_K else TILE
    tiles = -(-n // tile) * -(-m // tile) * batch
    splits, chunk = slices(tiles, k)
    out = p.new_value((batch * splits, m, n) if splits > 1 else shape, a.dtype)
    if out.numel == 0:
        return p.new_value(shape, a.dtype)

    def batch_stride(v: Value) -> int:
        return v.strides[0] if v.rank == 3 else 0

    words = [m, n, k, a.offset, batch_stride(a), a.strides[-2], a.strides[-1]]
    words += [b.offset, batch_stride(b), b.strides[-2], b.strides[-1]]
    fused_bias = bias is not None and splits == 1
    if fused_bias and bias is not None:
        words += [bias.offset, batch_stride(bias), bias.strides[-2], bias.strides[-1], 1]
    else:
        words += [0, 0, 0, 0, 0]
    scale = alpha if splits == 1 else 1.0
    words += [f32_bits(scale), f32_bits(beta), chunk, splits]
    slots = [out.slot, a.slot, b.slot, (bias if fused_bias and bias is not None else a).slot, a.slot, b.slot]

    # four at a time along whichever dim an operand is contiguous in, where every run of four starts
    # on a 16-byte boundary; element by element (through the strides) otherwise
    def aligned(*values: int) -> bool:
        return all(v % 4 == 0 for v in values)

    a_vec = a.strides[-1] == 1 and aligned(a.offset, batch_stride(a), a.strides[-2], k)
    b_mode = B_STRIDED
    if b.strides[-1] == 1 and aligned(b.offset, batch_stride(b), b.strides[-2], n):
        b_mode = B_VEC_ALONG_N
    elif b.strides[-2] == 1 and aligned(b.offset, batch_stride(b), b.strides[-1], k):
        b_mode = B_VEC_ALONG_K
    code = matmul_source(WGSL_TYPES[a.dtype], a_vec, b_mode, tile)
    p.launches.append(Launch("matmul", code, slots, params(words), (-(-n // tile), -(-m // tile), batch * splits)))
    if splits == 1:
        return out

    # planes are [batch, slice]-major: slice s of batch i is plane i·splits + s
    def plane(meta: torch.Tensor, s: int) -> torch.Tensor:
        planes = meta.view(batch, splits, m, n)[:, s]
        return planes if a.rank == 3 else planes[0]

    kind: ComputeType = "f64" if a.dtype == torch.float64 else "f32"
    total = sum_of_planes(p, out, splits, shape, plane)
    if alpha != 1.0:
        total = expr.apply("mul", total, constant(alpha, kind))
    if bias is not None:
        term = expr.apply("mul", expr.cast(p.lazy(bias, shape), kind), constant(beta, kind))
        total = expr.apply("add", total, term)
    return Lazy(total, a.dtype, shape)


@lower([aten.mm.default, aten.bmm.default], family=Family.MATMUL, dtypes=FLOATS)
def _mm(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value | Lazy:
    return matmul(p, p.materialize(args[0]), p.materialize(args[1]), None, 1.0, 0.0)


@lower(aten.addmm.default, family=Family.MATMUL, dtypes=FLOATS)
def _addmm(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value | Lazy:
    bias, a, b = (p.materialize(x) for x in args[:3])
    shape = (a.shape[0], b.shape[1])
    bias = Value(bias.slot, bias.dtype, shape, broadcast_strides(bias, shape), bias.offset, bias.buffer_numel)
    return matmul(p, a, b, bias, float(node.kwargs.get("alpha", 1.0)), float(node.kwargs.get("beta", 1.0)))


def _grouped_rows(node: FxNode) -> bool | str:
    """``_grouped_mm``'s mixture-of-experts form only: f32 rows [S, K] in groups by integer offsets, one
    [K, N] matrix of [G, K, N] per group."""
    a, b = (x.meta["val"] for x in node.args[:2])
    offs = node.args[2] if len(node.args) > 2 else node.kwargs.get("offs")
    if offs is None or a.dim() != 2 or b.dim() != 3:
        return "grouped_mm: only [S, K] rows grouped by offsets over [G, K, N] matrices"
    if a.dtype != torch.float32 or b.dtype != a.dtype or offs.meta["val"].dtype not in (torch.int32, torch.int64):
        return "grouped_mm: float32 operands and integer offsets"
    if any(x is not None for x in (*node.args[3:], node.kwargs.get("bias"), node.kwargs.get("out_dtype"))):
        return "grouped_mm with a bias or an output dtype"
    return True


@lower(aten._grouped_mm.default, family=Family.MATMUL, check=_grouped_rows)
def _grouped_mm(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    offsets = args[2] if len(args) > 2 else kwargs["offs"]
    a, b, offs = p.materialize(args[0]), p.materialize(args[1]), p.materialize(offsets)
    rows, k = a.shape  # a [S, K], b [G, K, N], offs [G]
    g, n = b.shape[0], b.shape[2]
    out = p.new_value((rows, n), a.dtype)  # [S, N]
    words = [rows, n, k, g, a.offset, a.strides[0], a.strides[1]]
    words += [b.offset, *b.strides, offs.offset, offs.strides[0], out.offset, *out.strides]
    code = source("grouped_mm", TYPE=WGSL_TYPES[a.dtype])
    slots = [out.slot, a.slot, b.slot, offs.slot]
    p.launches.append(Launch("grouped_mm", code, slots, params(words), grid(-(-rows * n // 256))))
    return out
