"""Softmax and log-softmax over one dimension: one workgroup per row, the max and sum folded in one pass."""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family

from ..kernels import Launch, grid, params, softmax_source
from ..planner import Planner
from ..values import Value, contiguous
from . import F32, FxNode, lower

aten = torch.ops.aten


def _no_half_to_float(spec: Any) -> bool | str:
    return "softmax with half_to_float" if spec.args[2] else True


@lower([aten._softmax.default, aten._log_softmax.default], family=Family.SOFTMAX, check=_no_half_to_float, dtypes=F32)
def _softmax(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    return softmax(p, p.materialize(args[0]), args[1], log=node.target == aten._log_softmax.default)


def softmax(p: Planner, x: Value, dim: int, log: bool) -> Value:
    """Softmax (or log-softmax) of ``x`` along ``dim``, as a new contiguous value."""
    result = p.new_value(x.shape, torch.float32)
    if result.numel == 0:
        return result
    if x.rank == 0:
        x = Value(x.slot, x.dtype, (1,), (1,), x.offset, x.buffer_numel)
    dim = dim % x.rank
    outer = [d for d in range(x.rank) if d != dim]
    out_strides = contiguous(x.shape)
    rows = result.numel // x.shape[dim]
    words = [rows, x.shape[dim], x.offset, x.strides[dim], out_strides[dim]]
    words += [x.shape[d] for d in outer] + [x.strides[d] for d in outer] + [out_strides[d] for d in outer]
    code = softmax_source(len(outer), log, x.shape[dim], p.context.has("subgroups"))
    p.launches.append(Launch("softmax", code, [result.slot, x.slot], params(words), grid(rows)))
    return result
