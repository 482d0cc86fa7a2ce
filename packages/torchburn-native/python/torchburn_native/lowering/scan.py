"""Order-dependent passes along one dim: cumulative scans (cumsum, cumprod, logcumsumexp, cummax,
cummin) and sorts (sort, argsort, msort, topk), each one ``scan`` or ``sort`` instruction over the
input made contiguous; half types compute in f32, as eager."""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family

from ..planner import PlanError, Planner
from ..values import Tensorish, Value, numel
from . import lower
from .halves import compute_dtype, narrow

aten = torch.ops.aten

FLOATS = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
NUMBERS = FLOATS | {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the instruction runs in: f32/f64 for floats, i64 for integers."""
    return compute_dtype(dtype) if dtype.is_floating_point else torch.int64


def _lines(x: Value, dim: int) -> tuple[int, int, int, int]:
    """``x`` as [outer, n, inner] around ``dim``: (dim, outer, n, inner)."""
    rank = max(x.rank, 1)
    dim = dim % rank
    shape = x.shape or (1,)
    return dim, numel(shape[:dim]), shape[dim], numel(shape[dim + 1 :])


def _scan(p: Planner, x: Tensorish, dim: int, op: str, out_dtype: torch.dtype, indices: bool) -> Any:
    work = _work_dtype(out_dtype)
    xv = p.contiguous(x, work)
    _, outer, n, inner = _lines(xv, dim)
    out = p.new_value(xv.shape, work)
    idx = p.new_value(xv.shape, torch.int64) if indices else None
    p.emit(
        {
            "kind": "scan",
            "input": xv.operand(),
            "out": out.operand(),
            "indices": idx.operand() if idx is not None else None,
            "outer": outer,
            "n": n,
            "inner": inner,
            "op": op,
        },
        [xv],
        [out] + ([idx] if idx is not None else []),
    )
    values = narrow(p, out, out_dtype) if out_dtype != work else out
    return (values, idx) if indices else values


@lower(aten.cumsum.default, family=Family.SCAN, dtypes=NUMBERS | {torch.bool})
def cumsum(p: Planner, node: Any, x: Tensorish, dim: int, *, dtype: Any = None) -> Any:
    return _scan(p, x, dim, "sum", p.out_meta().dtype, False)


@lower(aten.cumprod.default, family=Family.SCAN, dtypes=NUMBERS | {torch.bool})
def cumprod(p: Planner, node: Any, x: Tensorish, dim: int, *, dtype: Any = None) -> Any:
    return _scan(p, x, dim, "prod", p.out_meta().dtype, False)


@lower(aten.logcumsumexp.default, family=Family.SCAN, dtypes=FLOATS)
def logcumsumexp(p: Planner, node: Any, x: Tensorish, dim: int) -> Any:
    return _scan(p, x, dim, "logsumexp", p.out_meta().dtype, False)


@lower(aten.cummax.default, family=Family.SCAN, dtypes=NUMBERS)
def cummax(p: Planner, node: Any, x: Tensorish, dim: int) -> Any:
    return _scan(p, x, dim, "max", p.out_meta()[0].dtype, True)


@lower(aten.cummin.default, family=Family.SCAN, dtypes=NUMBERS)
def cummin(p: Planner, node: Any, x: Tensorish, dim: int) -> Any:
    return _scan(p, x, dim, "min", p.out_meta()[0].dtype, True)


def _sort(p: Planner, x: Tensorish, dim: int, k: int, descending: bool) -> tuple[Tensorish, Value]:
    values_meta = p.out_meta()[0]
    work = _work_dtype(values_meta.dtype)
    xv = p.contiguous(x, work)
    dim, outer, n, inner = _lines(xv, dim)
    if not 0 <= k <= n:
        raise PlanError(f"top-k of {k} from a dim of {n}")
    shape = list(xv.shape or (1,))
    shape[dim] = k
    out_shape = tuple(shape) if xv.rank else ()
    values = p.new_value(out_shape, work)
    indices = p.new_value(out_shape, torch.int64)
    p.emit(
        {
            "kind": "sort",
            "input": xv.operand(),
            "values": values.operand(),
            "indices": indices.operand(),
            "outer": outer,
            "n": n,
            "inner": inner,
            "k": k,
            "descending": descending,
        },
        [xv],
        [values, indices],
    )
    return (narrow(p, values, values_meta.dtype) if values_meta.dtype != work else values), indices


@lower(aten.sort.default, family=Family.SCAN, dtypes=NUMBERS)
def sort(p: Planner, node: Any, x: Tensorish, dim: int = -1, descending: bool = False) -> Any:
    return _sort(p, x, dim, x.shape[dim] if x.shape else 1, descending)


# PyTorch's CPU sort is stable whatever ``stable`` says, and so is this one
@lower(aten.sort.stable, family=Family.SCAN, dtypes=NUMBERS, reads=("stable",))
def sort_stable(
    p: Planner, node: Any, x: Tensorish, *, stable: Any = None, dim: int = -1, descending: bool = False
) -> Any:
    return _sort(p, x, dim, x.shape[dim] if x.shape else 1, descending)


def _sorted_topk(node: Any) -> bool | str:
    return True if node.kwargs.get("sorted", node.args[4] if len(node.args) > 4 else True) else "topk sorted=False"


@lower(aten.topk.default, family=Family.SCAN, dtypes=NUMBERS, check=_sorted_topk)
def topk(p: Planner, node: Any, x: Tensorish, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    return _sort(p, x, dim, int(k), largest)
