"""Cumulative scans along one dim (cumsum, cumprod, logcumsumexp, cummax, cummin): one ``scan.wgsl``
launch over the input made contiguous; floats accumulate in f32, integers and bools in i32."""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family

from ..kernels import SCAN_LINE_PER_THREAD, SCANS, Launch, grid, params, scan_source
from ..planner import Planner
from ..values import KINDS, WGSL_TYPES, Value, numel
from . import ANY, F32, INTS, FxNode, lower

aten = torch.ops.aten

SCAN_OPS = {
    aten.cumsum.default: "sum",
    aten.cumprod.default: "prod",
    aten.logcumsumexp.default: "logsumexp",
    aten.cummax.default: "max",
    aten.cummin.default: "min",
}


def _accumulator(dtype: torch.dtype) -> str:
    return "f32" if KINDS[dtype] == "f32" else "i32"


def _scan_check(spec: Any) -> bool | str:
    op = SCAN_OPS[spec.target]
    out = spec.outputs[0]
    if out is None or out.dtype not in F32 | INTS:
        return f"cumulative {op} to {out.dtype if out is not None else 'nothing'}"
    if _accumulator(out.dtype) not in SCANS[op]:
        return f"cumulative {op} of integers"
    x = spec.inputs[0]
    if x is not None and x.dtype.is_floating_point and not out.dtype.is_floating_point:
        return f"cumulative {op} of floats to {out.dtype}"
    return True


def _lines(x: Value, dim: int) -> tuple[int, int, int]:
    """``x`` as [outer, n, inner] around ``dim``: (lines, n, inner)."""
    shape = x.shape or (1,)
    dim = dim % len(shape)
    n, inner = shape[dim], numel(shape[dim + 1 :])
    return numel(shape[:dim]) * inner, n, inner


# dtype (cumsum, cumprod): through the output's dtype, which the accumulator follows
@lower(SCAN_OPS, family=Family.SCAN, dtypes=ANY, check=_scan_check, reads=("dtype",))
def _scan(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Any:
    op = SCAN_OPS[node.target]
    outs = p.out_meta()
    values_meta = outs[0] if op in ("max", "min") else outs
    x = p.dense(p.materialize(args[0]))
    acc = _accumulator(values_meta.dtype)
    values = p.new_value(x.shape, values_meta.dtype)
    positions = p.new_value(x.shape, torch.int64) if op in ("max", "min") else None
    written = [values.slot] + ([positions.slot] if positions is not None else [])
    if values.numel:
        lines, n, inner = _lines(x, args[1])
        code = scan_source(op, WGSL_TYPES[x.dtype], acc, n)
        groups = grid(-(-lines // 256) if n <= SCAN_LINE_PER_THREAD else lines)
        launch = Launch("scan", code, [*written, x.slot], params([lines, n, inner]), groups, writes=len(written))
        p.launches.append(launch)
    return (values, positions) if positions is not None else values
