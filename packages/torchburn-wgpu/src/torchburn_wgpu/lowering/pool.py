"""Max and average pooling (``pool.wgsl``), 2-d and 1-d (as height 1)."""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family

from ..kernels import Launch, grid, params
from ..planner import Planner
from ..shaders import source
from ..values import Value
from . import F32, FxNode, lower, shape_of

aten = torch.ops.aten


def _pair(v: Any, default: list[int]) -> list[int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return list(default)
    if isinstance(v, int):
        return [v, v]
    return list(v) * (2 // len(v)) if len(v) == 1 else list(v)


def _pool(
    p: Planner,
    x: Value,
    out_shape: tuple[int, ...],
    kernel: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    is_max: bool,
    count_pad: bool,
    divisor: int,
) -> tuple[Value, Value]:
    values = p.new_value(out_shape, torch.float32)
    # average pooling binds a one-word stand-in: every binding the shader declares must be bound
    indices = p.new_value(out_shape if is_max else (1,), torch.int64)
    if values.numel == 0:
        return values, indices
    if x.rank == 3:  # [C, H, W]: a batch of one
        x = x.with_layout(x.meta().unsqueeze(0))
    _, c, h, w = x.shape
    oh, ow = out_shape[-2], out_shape[-1]
    words = [values.numel, c, h, w, oh, ow, *kernel, *stride, *padding, *dilation]
    words += [x.offset, *x.strides, int(count_pad), divisor]
    slots = [values.slot, indices.slot, x.slot]
    code = source("pool", MAX="true" if is_max else "false")
    p.launches.append(Launch("pool", code, slots, params(words), grid(-(-values.numel // 256)), writes=2))
    return values, indices


def _pool_check(spec: Any) -> bool | str:
    x = spec.inputs[0]
    return True if x is not None and x.rank in (3, 4) else "pooling of other than 2-d images"


# ceil_mode: through the output's shape; the kernel clips windows (and their divisor) at the edge
@lower(
    aten.max_pool2d_with_indices.default,
    family=Family.POOL,
    dtypes=frozenset({torch.float32, torch.int64}),
    check=_pool_check,
    reads=("ceil_mode",),
)
def _max_pool(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> tuple[Value, Value]:
    out = p.out_meta()
    x = p.materialize(args[0])
    kernel = _pair(args[1], [])
    stride = _pair(args[2] if len(args) > 2 else None, kernel)
    padding = _pair(args[3] if len(args) > 3 else None, [0, 0])
    dilation = _pair(args[4] if len(args) > 4 else None, [1, 1])
    return _pool(p, x, shape_of(out[0]), kernel, stride, padding, dilation, True, False, 0)


@lower(aten.avg_pool2d.default, family=Family.POOL, check=_pool_check, reads=("ceil_mode",), dtypes=F32)
def _avg_pool(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    out = p.out_meta()
    x = p.materialize(args[0])
    kernel = _pair(args[1], [])
    stride = _pair(args[2] if len(args) > 2 else None, kernel)
    padding = _pair(args[3] if len(args) > 3 else None, [0, 0])
    count_pad = bool(args[5]) if len(args) > 5 else True
    divisor = args[6] if len(args) > 6 and args[6] is not None else 0
    values, _ = _pool(p, x, shape_of(out), kernel, stride, padding, [1, 1], False, count_pad, int(divisor))
    return values
