"""Order-dependent passes along one dim: cumulative scans (cumsum, cumprod, logcumsumexp, cummax,
cummin), one ``scan.wgsl`` launch over the input made contiguous (floats accumulate in f32, integers
and bools in i32), and sorts (sort, argsort, topk), one ``sort.wgsl`` launch per line of up to
``SORT_MAX`` elements."""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family, Layout, expr

from ..kernels import SCAN_LINE_PER_THREAD, SCANS, SORT_MAX, Launch, grid, params, scan_source, sort_source
from ..planner import Lazy, Planner
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
    x = p.materialize(args[0])
    if x.dtype.is_floating_point and not values_meta.dtype.is_floating_point:
        # cumsum(floats, dtype=int32) (a histogram's counts to offsets): PyTorch converts the input to
        # the output's dtype first, truncating, then sums
        x = p.materialize(Lazy(expr.cast(p.lazy(x, x.shape), "int"), values_meta.dtype, x.shape))
    x = p.dense(x)
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


def _sort_check(spec: Any) -> bool | str:
    x = spec.inputs[0]
    if x is None or x.dtype not in F32 | INTS:
        return f"sort of {x.dtype if x is not None else 'a non-tensor'}"
    if spec.target is aten.topk.default and not spec.kwargs.get("sorted", spec.args[4] if len(spec.args) > 4 else True):
        return "topk sorted=False"
    dim = _sort_dim(spec.target, spec.args, spec.kwargs)
    length = x.shape[dim % x.rank] if x.rank else 1
    if not isinstance(length, int) or length > SORT_MAX:
        return f"sort of lines longer than {SORT_MAX} elements"
    return True


def _sort_dim(op: Any, args: Any, kwargs: Any) -> int:
    if op is aten.topk.default:
        return int(args[2]) if len(args) > 2 else int(kwargs.get("dim", -1))
    if op is aten.sort.stable:
        return int(kwargs.get("dim", -1))
    return int(args[1]) if len(args) > 1 else int(kwargs.get("dim", -1))


def _sorted(p: Planner, x_arg: Any, dim: int, descending: bool) -> tuple[Value, Value]:
    x = p.dense(p.materialize(x_arg))
    values = p.new_value(x.shape, x.dtype)
    positions = p.new_value(x.shape, torch.int64)
    if values.numel:
        lines, n, inner = _lines(x, dim)
        code = sort_source(WGSL_TYPES[x.dtype], n)
        words = [lines, n, inner, int(descending)]
        p.launches.append(
            Launch("sort", code, [values.slot, positions.slot, x.slot], params(words), grid(lines), writes=2)
        )
    return values, positions


# stable: every sort here is stable (positions break ties)
@lower([aten.sort.default, aten.sort.stable], family=Family.SCAN, dtypes=ANY, check=_sort_check, reads=("stable",))
def _sort(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> tuple[Value, Value]:
    positional = node.target is aten.sort.default  # sort.stable takes dim and descending by keyword only
    dim = kwargs.get("dim", args[1] if positional and len(args) > 1 else -1)
    descending = kwargs.get("descending", args[2] if positional and len(args) > 2 else False)
    return _sorted(p, args[0], int(dim), bool(descending))


# sorted: checked (only sorted=True is taken)
@lower(aten.topk.default, family=Family.SCAN, dtypes=ANY, check=_sort_check, reads=("sorted",))
def _topk(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> tuple[Value, Value]:
    k = int(args[1])
    dim = _sort_dim(node.target, args, node.kwargs)
    largest = bool(args[3] if len(args) > 3 else node.kwargs.get("largest", True))
    values, positions = _sorted(p, args[0], dim, descending=largest)
    rank = max(values.rank, 1)
    d = dim % rank
    if values.rank == 0:
        return values, positions
    shape = tuple(k if i == d else s for i, s in enumerate(values.shape))
    return values.with_view(Layout(shape, values.strides, values.offset)), positions.with_view(
        Layout(shape, positions.strides, positions.offset)
    )
