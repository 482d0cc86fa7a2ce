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
from .halves import compute_dtype, narrow

aten = torch.ops.aten


CONV_DTYPES = {torch.float32, torch.float64, torch.bfloat16, torch.float16}


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
) -> Tensorish:
    meta = p.out_meta()
    dtype = compute_dtype(meta.dtype)  # half types convolve in float32
    if bias is None and not transposed and groups == 1 and dtype == meta.dtype:
        grad_weight = _weight_gradient(p, node, x, weight, stride, padding, dilation, tuple(meta.shape))
        if grad_weight is not None:
            return grad_weight
    xv = p.contiguous(x, dtype)
    wv = p.contiguous(weight, dtype)
    bv = p.contiguous(bias, dtype) if bias is not None else None
    out = p.new_value(tuple(meta.shape), dtype)
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
    return narrow(p, out, meta.dtype)


def _batch_major(v: Tensorish) -> Value | None:
    """``v`` [A, B, H, W] as the contiguous [B, A, H, W] tensor it is a view of (its first two dims
    swapped), or None."""
    if not isinstance(v, Value) or v.rank != 4:
        return None
    a, b, h, w = v.shape
    swapped = v.with_view((b, a, h, w), (v.strides[1], v.strides[0], v.strides[2], v.strides[3]), v.offset)
    return swapped if swapped.is_contiguous else None


def _weight_gradient(
    p: Planner,
    node: Any,
    x: Tensorish,
    weight: Tensorish,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    out_shape: tuple[int, ...],
) -> Value | None:
    """A convolution over views whose batch and channel dims are swapped is the weight gradient of
    a forward convolution (core writes it so: ``decompositions._weight_gradient``): ``x`` [C, N, H, W]
    is that convolution's input and ``weight`` [O, N, Ho, Wo] its output gradient, the stride here its
    dilation and the dilation here its stride. Computed from the NCHW tensors as they lie into an
    [O, C, kh, kw] buffer (``kernels/conv_weight_grad.rs``), returned as the [C, O, kh, kw] view
    asked for, so neither operand nor the result is copied. None where the layouts are otherwise."""
    x_nchw, grad_nchw = _batch_major(x), _batch_major(weight)
    if x_nchw is None or grad_nchw is None or len(out_shape) != 4:
        return None
    assert isinstance(x, Value) and isinstance(weight, Value)
    if x.is_contiguous and weight.is_contiguous and weight.shape[2] * weight.shape[3] <= out_shape[2] * out_shape[3]:
        return None  # a plain convolution of a batch that happens to have one image
    c, o, full_h, full_w = out_shape
    # the taps past the forward's kernel that core's product computes are sliced away by its readers
    kh, kw = _taps_read(p, node, full_h, full_w)
    # the [C, O, full_h, full_w] view reaches past its last row into slack the readers never see
    slack = (full_h - kh) * kw + (full_w - kw)
    buffer = p.new_value((o * c * kh * kw + slack,), x.dtype)
    out = buffer.with_view((o, c, kh, kw), (c * kh * kw, kh * kw, kw, 1), buffer.offset)
    p.emit(
        {
            "kind": "conv2d_weight_grad",
            "input": x_nchw.operand(),
            "grad": grad_nchw.operand(),
            "out": out.operand(),
            "stride": list(dilation),
            "padding": list(padding),
            "dilation": list(stride),
        },
        [x_nchw, grad_nchw],
        [out],
    )
    return out.with_view((c, o, full_h, full_w), (kh * kw, c * kh * kw, kw, 1), out.offset)


def _taps_read(p: Planner, node: Any, full_h: int, full_w: int) -> tuple[int, int]:
    """How many rows and columns of taps (from the first) the readers of ``node``'s
    [C, O, full_h, full_w] output read: fewer than all where every reader sees it through slices of
    the tap dims from 0 (core's weight gradient narrowing its product to the kernel)."""
    if node in p.output_users or not node.users:
        return full_h, full_w
    read = [0, 0]

    def visit(n: Any, extent: tuple[int, int]) -> bool:
        for user in n.users:
            if user.target is not aten.slice.Tensor or user.args[0] is not n or user.kwargs:
                read[0], read[1] = max(read[0], extent[0]), max(read[1], extent[1])
                continue
            dim, start, end, step = (*user.args[1:], None, None, None, None)[:4]
            dim = (dim or 0) % 4
            if (start or 0) != 0 or (step or 1) != 1:
                return False
            narrowed = list(extent)
            if dim >= 2 and end is not None:
                narrowed[dim - 2] = max(0, min(int(end), extent[dim - 2]))
            after = (narrowed[0], narrowed[1])
            if user in p.output_users:
                read[0], read[1] = max(read[0], after[0]), max(read[1], after[1])
            if not visit(user, after):
                return False
        return True

    if not visit(node, (full_h, full_w)) or 0 in read:
        return full_h, full_w
    return read[0], read[1]


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
