"""Decompositions core applies for the ops an engine does not lower itself.

Core ATen's decomposition table (applied for every engine) leaves some composite ops whole, because
inductor lowers them directly: batch norm in training mode, ``addmv``, the ``*_copy`` views, grid
sampling, 3-D max pooling... An engine that lowers one of these keeps it. For an engine that does not,
core rewrites it with PyTorch's own decomposition into ops the engine is more likely to have, so one
primitive an engine implements (a reduction, a gather, a view) covers many ops; what is still missing
after that falls back as before, node by node.

Only decompositions that produce ATen ops are listed: those that lower to ``prims`` (``lgamma``,
``flip``, ``var_mean``...) would leave the engine nothing it knows, and ``bucketize``'s reads tensor
values while it is traced, which a graph of fake tensors cannot give.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import decomposition_table as _torch_table

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
    aten.upsample_bicubic2d.default,
    aten.upsample_trilinear3d.default,
    # bit-level math -> arithmetic
    aten.ldexp.Tensor,
)


@functools.cache
def _available() -> dict[Any, Callable[..., Any]]:
    return {op: _torch_table[op] for op in WHEN_MISSING if op in _torch_table}


def for_missing_ops(lowered: Any, keep_whole: frozenset[Any]) -> dict[Any, Callable[..., Any]]:
    """The decompositions of :data:`WHEN_MISSING` for the ops not in ``lowered`` (an engine's op
    registry, or any container of ops) nor kept whole by the engine."""
    return {op: fn for op, fn in _available().items() if op not in lowered and op not in keep_whole}
