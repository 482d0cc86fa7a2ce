"""2-D pooling (max with indices, average, adaptive average) and upsampling (bilinear, nearest), on
contiguous NCHW (or CHW) inputs."""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family

from ..planner import Planner
from ..values import Tensorish, Value
from . import lower
from .halves import compute_dtype

aten = torch.ops.aten


def _as4d(v: Value) -> tuple[Value, bool]:
    if v.rank == 3:
        return v.with_view((1, *v.shape), (0, *v.strides), v.offset), True
    return v, False


def _pool_pairs(x: list[int] | int, default: list[int]) -> list[int]:
    if isinstance(x, int):
        return [x, x]
    if not x:
        return default
    return [x[0], x[0]] if len(x) == 1 else [x[0], x[1]]


def _pool_input_dtype(node: Any) -> bool | str:
    spec = node.inputs[0]
    if spec is None or spec.dtype not in (torch.float32, torch.float64):
        return "pooling runs on float32/float64"
    return True


def _max_pool_input_dtype(node: Any) -> bool | str:
    spec = node.inputs[0]
    if spec is None or spec.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return "max pooling runs on float32/float64/bfloat16/float16"
    return True


# ceil_mode: through the output's shape; the kernel clips windows at the input's edge
# bfloat16 and float16 through float32, which holds every one of their values: the maximum is exact
@lower(aten.max_pool2d_with_indices.default, family=Family.POOL, check=_max_pool_input_dtype, reads=("ceil_mode",))
def max_pool2d(
    p: Planner,
    node: Any,
    x: Tensorish,
    kernel: list[int],
    stride: list[int] | None = None,
    padding: list[int] | int = 0,
    dilation: list[int] | int = 1,
    ceil_mode: bool = False,
) -> tuple[Value, Value]:
    out_meta, idx_meta = p.out_meta()
    dtype = compute_dtype(out_meta.dtype)
    xv, _ = _as4d(p.contiguous(x, dtype))
    k = _pool_pairs(kernel, [1, 1])
    out = p.new_value(tuple(out_meta.shape), dtype)
    idx = p.new_value(tuple(idx_meta.shape), torch.int64)
    ov, _ = _as4d(out)
    iv, _ = _as4d(idx)
    wants_indices = any(u.args[1] == 1 for u in node.users)
    p.emit(
        {
            "kind": "max_pool2d",
            "input": xv.operand(),
            "out": ov.operand(),
            "indices": iv.operand() if wants_indices else None,
            "kernel": k,
            "stride": _pool_pairs(stride or kernel, k),
            "padding": _pool_pairs(padding, [0, 0]),
            "dilation": _pool_pairs(dilation, [1, 1]),
        },
        [xv],
        [ov, iv if wants_indices else None],
    )
    if dtype != out_meta.dtype:
        return p.materialize(p.converted(out, out_meta.dtype)), idx
    return out, idx


# ceil_mode: through the output's shape; the kernel clips windows (and their divisor) at the edge
@lower(aten.avg_pool2d.default, family=Family.POOL, dtypes={torch.float32, torch.float64}, reads=("ceil_mode",))
def avg_pool2d(
    p: Planner,
    node: Any,
    x: Tensorish,
    kernel: list[int],
    stride: list[int] | None = None,
    padding: list[int] | int = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Value:
    meta = p.out_meta()
    xv, _ = _as4d(p.contiguous(x))
    k = _pool_pairs(kernel, [1, 1])
    out = p.new_value(tuple(meta.shape), meta.dtype)
    ov, _ = _as4d(out)
    p.emit(
        {
            "kind": "avg_pool2d",
            "input": xv.operand(),
            "out": ov.operand(),
            "kernel": k,
            "stride": _pool_pairs(stride or kernel, k),
            "padding": _pool_pairs(padding, [0, 0]),
            "count_include_pad": bool(count_include_pad),
            "divisor_override": divisor_override,
        },
        [xv],
        [ov],
    )
    return out


@lower(
    aten._adaptive_avg_pool2d.default,
    aten.adaptive_avg_pool2d.default,
    family=Family.POOL,
    dtypes={torch.float32, torch.float64},
    reads=("output_size",),  # the output's shape
)
def adaptive_avg_pool2d(p: Planner, node: Any, x: Tensorish, output_size: list[int]) -> Value:
    meta = p.out_meta()
    xv, _ = _as4d(p.contiguous(x))
    out = p.new_value(tuple(meta.shape), meta.dtype)
    ov, _ = _as4d(out)
    p.emit({"kind": "adaptive_avg_pool2d", "input": xv.operand(), "out": ov.operand()}, [xv], [ov])
    return out


def _upsample(
    p: Planner, x: Tensorish, mode: str, align_corners: bool, scales_h: float | None, scales_w: float | None
) -> Value:
    meta = p.out_meta()
    xv = p.contiguous(x)
    out = p.new_value(tuple(meta.shape), meta.dtype)
    p.emit(
        {
            "kind": "upsample2d",
            "input": xv.operand(),
            "out": out.operand(),
            "mode": mode,
            "align_corners": bool(align_corners),
            "scales": [scales_h, scales_w],
        },
        [xv],
        [out],
    )
    return out


def _nonempty_planes(node: Any) -> bool | str:
    x = node.inputs[0]
    if x is None or len(x.shape) != 4:
        return "upsampling needs a 4-D input"
    if x.shape[0] * x.shape[1] > 0 and (x.shape[2] == 0 or x.shape[3] == 0):
        return "upsampling of empty planes"
    return True


@lower(
    aten.upsample_bilinear2d.default,
    family=Family.POOL,
    dtypes={torch.float32, torch.float64},
    check=_nonempty_planes,
    reads=("output_size",),  # the output's shape
)
def upsample_bilinear2d(
    p: Planner,
    node: Any,
    input: Tensorish,
    output_size: list[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> Value:
    return _upsample(p, input, "bilinear", align_corners, scales_h, scales_w)


@lower(
    aten.upsample_nearest2d.default,
    family=Family.POOL,
    dtypes={torch.float32, torch.float64},
    check=_nonempty_planes,
    reads=("output_size",),  # the output's shape
)
def upsample_nearest2d(
    p: Planner,
    node: Any,
    input: Tensorish,
    output_size: list[int],
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> Value:
    return _upsample(p, input, "nearest", False, scales_h, scales_w)


@lower(
    aten._upsample_nearest_exact2d.default,
    family=Family.POOL,
    dtypes={torch.float32, torch.float64},
    check=_nonempty_planes,
    reads=("output_size",),  # the output's shape
)
def upsample_nearest_exact2d(
    p: Planner,
    node: Any,
    input: Tensorish,
    output_size: list[int],
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> Value:
    return _upsample(p, input, "nearest_exact", False, scales_h, scales_w)
