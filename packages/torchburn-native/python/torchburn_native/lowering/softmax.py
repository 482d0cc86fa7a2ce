"""Softmax and log-softmax over one dimension, in one fused pass per row; half types compute in f32."""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family

from ..planner import Planner
from ..values import FLOAT_DTYPES, Tensorish, numel
from . import lower
from .halves import compute_dtype, narrow

aten = torch.ops.aten


def _softmax(p: Planner, x: Tensorish, dim: int, log: bool) -> Tensorish:
    meta = p.out_meta()
    cdt = compute_dtype(meta.dtype)
    xv = p.contiguous(x, cdt)
    rank = max(xv.rank, 1)
    dim = dim % rank
    shape = xv.shape or (1,)
    outer = numel(shape[:dim])
    inner = numel(shape[dim + 1 :])
    out = p.new_value(xv.shape, cdt)
    p.emit(
        {
            "kind": "softmax",
            "input": xv.operand(),
            "out": out.operand(),
            "outer": outer,
            "n": shape[dim],
            "inner": inner,
            "log": log,
        },
        [xv],
        [out],
    )
    return narrow(p, out, meta.dtype)


def _no_half_to_float(node: Any) -> bool | str:
    return "softmax with half_to_float" if node.args[2] else True


@lower(aten._softmax.default, family=Family.SOFTMAX, dtypes=FLOAT_DTYPES, check=_no_half_to_float)
def softmax(p: Planner, node: Any, x: Tensorish, dim: int, half_to_float: bool) -> Tensorish:
    return _softmax(p, x, dim, False)


@lower(aten._log_softmax.default, family=Family.SOFTMAX, dtypes=FLOAT_DTYPES, check=_no_half_to_float)
def log_softmax(p: Planner, node: Any, x: Tensorish, dim: int, half_to_float: bool) -> Tensorish:
    return _softmax(p, x, dim, True)
