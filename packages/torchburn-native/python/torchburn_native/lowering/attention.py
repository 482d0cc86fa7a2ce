"""Fused scaled-dot-product attention (``aten._scaled_dot_product_flash_attention_for_cpu``), grouped-query
attention included; operands are read where they lie when their rows are contiguous. bfloat16 and float16
attention runs in float32 (as PyTorch's CPU kernel accumulates) and is stored back in its own dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torchburn.attention_shapes import grouped_heads
from torchburn.planning import Family

from ..planner import PlanError, Planner
from ..values import Tensorish, Value, contiguous_strides
from . import lower

aten = torch.ops.aten
ATTENTION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _sdpa_check(node: Any) -> bool | str:
    args = node.args
    if len(args) > 3 and args[3]:
        return "dropout in attention not supported"
    q, k, v = node.inputs[:3]
    if q is None or k is None or v is None or not q.rank == k.rank == v.rank == 4:
        return "attention needs 4-D q/k/v"
    if len({q.dtype, k.dtype, v.dtype}) != 1 or q.dtype not in ATTENTION_DTYPES:
        return "attention takes q, k and v of one dtype: float32, bfloat16 or float16"
    heads = grouped_heads(q.shape, k.shape, v.shape)
    if isinstance(heads, str):
        return heads
    mask = node.kwargs.get("attn_mask")
    if mask is not None and mask.meta["val"].dtype not in (*ATTENTION_DTYPES, torch.bool):
        return "attention mask must be a float or bool"
    return True


@lower(aten._scaled_dot_product_flash_attention_for_cpu.default, family=Family.ATTENTION, check=_sdpa_check)
def sdpa(
    p: Planner,
    node: Any,
    q: Tensorish,
    k: Tensorish,
    v: Tensorish,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Tensorish | None = None,
    scale: float | None = None,
) -> tuple[Value, Value]:
    qv, kv, vv = _rows_in_place(p, q), _rows_in_place(p, k), _rows_in_place(p, v)
    heads = grouped_heads(qv.shape, kv.shape, vv.shape)  # again, with the sizes of this call
    if isinstance(heads, str):
        raise PlanError(heads)
    b, h, tq, d = qv.shape
    tk, dv = kv.shape[2], vv.shape[3]
    out = _attention_output(p, node, (b, h, tq, dv), torch.float32)
    lse = p.new_value((b, h, tq), torch.float32)
    mask_op = None
    maskv = None
    if attn_mask is not None:
        from ..planner import broadcast_strides

        maskv = p.value(attn_mask)
        if maskv.dtype in (torch.bfloat16, torch.float16):
            maskv = p.contiguous(maskv, torch.float32)
        mask_op = maskv.operand((b, h, tq, tk), broadcast_strides(maskv, (b, h, tq, tk)))
    p.emit(
        {
            "kind": "sdpa",
            "q": qv.operand(),
            "k": kv.operand(),
            "v": vv.operand(),
            "mask": mask_op,
            "out": out.operand(),
            "lse": lse.operand(),
            "causal": bool(is_causal),
            "scale": float(scale) if scale is not None else 1.0 / math.sqrt(d),
        },
        [qv, kv, vv, maskv],
        [out, lse],
    )
    if q.dtype == torch.float32:
        return out, lse
    stored = _attention_output(p, node, (b, h, tq, dv), q.dtype)
    p.materialize(p.converted(out, q.dtype), into=stored)
    return stored, lse


def _attention_output(p: Planner, node: Any, shape: tuple[int, int, int, int], dtype: torch.dtype) -> Value:
    """Attention's output, laid out as PyTorch lays it out: in the query's order of heads and rows.
    For q sliced from a fused [b, t, 3, h, d] projection that is [b, t, h, dv], and the usual
    ``out.transpose(1, 2).reshape(b, t, h * dv)`` after it is then a view, not a copy."""
    b, h, tq, dv = shape
    out = p.new_value((b, tq, h, dv), dtype)
    heads_inner = (tq * h * dv, dv, h * dv, 1)
    meta = p.meta_env.get(node)
    if isinstance(meta, (tuple, list)) and tuple(meta[0].stride()) == heads_inner and h > 1 and tq > 1:
        return out.with_view(shape, heads_inner, out.offset)
    return out.with_view(shape, contiguous_strides(shape), out.offset)


def _rows_in_place(p: Planner, x: Tensorish) -> Value:
    """An attention operand as it lies when each row is contiguous (q, k and v sliced from one fused
    projection are read where they are), else a contiguous copy."""
    if isinstance(x, Value) and x.dtype == torch.float32 and min(x.strides) >= 0:
        if x.shape[-1] <= 1 or x.strides[-1] == 1:
            return x
    return p.contiguous(x, torch.float32)
