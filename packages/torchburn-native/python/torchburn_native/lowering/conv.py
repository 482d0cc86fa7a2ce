"""Convolution (1-D and 2-D, grouped, transposed), with an epilogue that later nodes fold into: batch
norm, a residual add and ReLU run on each output tile as the convolution writes it (``kernels/conv.rs``).
"""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family

from ..planner import Planner
from ..values import Tensorish, Value
from . import lower

aten = torch.ops.aten


CONV_DTYPES = {torch.float32, torch.float64}


def conv_epilogue(p: Planner, x: Value) -> tuple[dict[str, Any], int] | None:
    """The epilogue of the forward 2-D convolution whose whole output ``x`` is (made empty if it has
    none yet), and that convolution's instruction index; None if ``x`` is no such output. Steps
    attached to it run on each output tile as the convolution writes it (``kernels/conv.rs``
    ``Epilogue``): batch norm, then a residual, then relu."""
    producer = p.producer.get(id(x.buffer))
    if producer is None or x.dtype not in (torch.float32, torch.float64):
        return None
    instr = p.instrs[producer]
    if instr["kind"] != "conv2d" or instr["transposed"]:
        return None
    out = instr["out"]
    if out["buf"] is not x.buffer or out["offset"] != 0 or x.offset != 0:
        return None
    if not x.is_contiguous or list(x.shape) != list(out["shape"]):
        return None
    if instr["epilogue"] is None:
        instr["epilogue"] = {"norm": None, "residual": None, "relu": False}
    return instr["epilogue"], producer


def _conv_check(node: Any) -> bool | str:
    inp = node.inputs[0]
    if inp is None or inp.rank not in (3, 4):
        return "only 1-D and 2-D convolutions are supported"
    return True


@lower(aten.convolution.default, family=Family.CONV, dtypes=CONV_DTYPES, check=_conv_check)
def convolution(
    p: Planner,
    node: Any,
    x: Tensorish,
    weight: Tensorish,
    bias: Tensorish | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
) -> Value:
    meta = p.out_meta()
    xv = p.contiguous(x)
    wv = p.contiguous(weight)
    bv = p.contiguous(bias) if bias is not None else None
    out = p.new_value(tuple(meta.shape), meta.dtype)
    if xv.rank == 3:
        # conv1d is conv2d over a height of one
        def as4(v: Value) -> dict[str, Any]:
            shape = (v.shape[0], v.shape[1], 1, v.shape[2])
            return v.operand(shape, (v.strides[0], v.strides[1], v.shape[2], v.strides[2]))

        x_op, w_op, o_op = as4(xv), as4(wv), as4(out)
        stride, padding, dilation = [1, stride[0]], [0, padding[0]], [1, dilation[0]]
        output_padding = [0, output_padding[0]]
    else:
        x_op, w_op, o_op = xv.operand(), wv.operand(), out.operand()
    taps = None
    if xv.rank == 4 and _shifted_conv_pays(xv, wv, stride, padding, dilation, transposed, groups):
        c_out, c_in, kh, kw = wv.shape
        # the weight tap-major, [kh·kw, c_out, c_in], kept per version of the weight like Linear's
        tap_major = wv.with_view(
            (kh, kw, c_out, c_in), (wv.strides[2], wv.strides[3], wv.strides[0], wv.strides[1]), wv.offset
        )
        copy = p.row_major_copy(tap_major)
        taps = copy.with_view((kh * kw, c_out, c_in), (c_out * c_in, c_in, 1), copy.offset)
    instr = {
        "kind": "conv2d",
        "input": x_op,
        "weight": w_op,
        "weight_taps": taps.operand() if taps is not None else None,
        "bias": bv.operand() if bv is not None else None,
        "out": o_op,
        "stride": list(stride),
        "padding": list(padding),
        "dilation": list(dilation),
        "groups": int(groups),
        "transposed": bool(transposed),
        "output_padding": list(output_padding),
        "epilogue": None,
    }
    p.emit(instr, [xv, wv, bv, taps], [out])
    return out


# planes at least this wide (and tall) run "same" convolutions as shifted GEMMs: the padded grid's
# extra columns cost (w + k - 1) / w, which at ResNet's 7×7 planes lost to im2col (1.65x slower in a
# first measurement); at 56², 28² and 14² they won (a 3×3 layer 2-12% faster, same process)
SHIFTED_CONV_MIN_SIDE = 12


# and at least this many input channels, the depth of each tap's product
SHIFTED_CONV_MIN_CHANNELS = 16


# and an image's zero-padded copy no larger than this: the kernel keeps it in a per-thread buffer
SHIFTED_CONV_MAX_PADDED_BYTES = 16 << 20


def _shifted_conv_pays(
    xv: Value,
    wv: Value,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    groups: int,
) -> bool:
    """Whether a 2-D convolution runs as shifted GEMMs (``kernels/conv_shifted.rs``): stride 1, no
    dilation, one group, odd kernels padded to keep the size, on planes and channel counts where that
    beats im2col, with a weight that is a region input (its tap-major copy is kept per version)."""
    _, c_in, kh, kw = wv.shape
    _, _, h, w = xv.shape
    return (
        not transposed
        and groups == 1
        and wv.buffer.kind == "in"
        and xv.dtype in (torch.float32, torch.float64)
        and list(stride) == [1, 1]
        and list(dilation) == [1, 1]
        and kh % 2 == 1
        and kw % 2 == 1
        and kh * kw > 1
        and list(padding) == [kh // 2, kw // 2]
        and min(h, w) >= SHIFTED_CONV_MIN_SIDE
        and c_in >= SHIFTED_CONV_MIN_CHANNELS
        and c_in * (h + kh - 1) * (w + kw - 1) * xv.dtype.itemsize <= SHIFTED_CONV_MAX_PADDED_BYTES
    )
