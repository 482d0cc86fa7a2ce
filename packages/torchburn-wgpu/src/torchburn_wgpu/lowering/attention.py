"""Scaled-dot-product attention kept whole: one fused kernel (``attention.wgsl``) per call."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..kernels import Launch, f32_bits, grid, params
from ..planner import PlanError, Planner
from ..shaders import source
from ..values import Value, broadcast_strides
from . import FxNode, lower

aten = torch.ops.aten

MAX_HEAD = 256  # q/k head size the kernel stages; v's may be up to twice its 128 threads


def _sdpa_check(spec: Any) -> bool | str:
    args = spec.args
    if len(args) > 3 and args[3]:
        return "dropout in attention"
    q, k, v = spec.inputs[:3]
    if q is None or k is None or v is None or q.rank != 4:
        return "attention needs 4-d q, k and v"
    if any(t.dtype != torch.float32 for t in (q, k, v)):
        return "attention in other than float32"
    widths = [d for d in (q.shape[3], v.shape[3]) if isinstance(d, int)]  # symbolic: checked when planned
    if any(d > MAX_HEAD for d in widths):
        return f"attention heads wider than {MAX_HEAD}"
    mask = spec.kwargs.get("attn_mask")
    if mask is not None and mask.meta["val"].dtype not in (torch.float32, torch.bool):
        return "attention mask other than float32 or bool"
    return True


@lower(aten._scaled_dot_product_flash_attention_for_cpu.default, family="attention", check=_sdpa_check)
def _sdpa(p: Planner, node: FxNode, args: list[Any], out: Any) -> tuple[Value, Value]:
    q, k, v = (p.materialize(x) for x in args[:3])
    causal = bool(args[4]) if len(args) > 4 else bool(node.kwargs.get("is_causal", False))
    mask_arg = node.kwargs.get("attn_mask")
    scale = node.kwargs.get("scale")
    b, h, length, e = q.shape
    s, ev = k.shape[2], v.shape[3]
    if e > MAX_HEAD or ev > MAX_HEAD:
        raise PlanError(f"attention heads wider than {MAX_HEAD}")
    result = p.new_value(torch.float32, (b, h, length, ev))
    lse = p.new_value(torch.float32, (b, h, length))
    if result.numel == 0:
        return result, lse
    words = [b, h, length, s, e, ev, int(causal), 0, f32_bits(scale if scale is not None else 1 / math.sqrt(e))]
    words += [q.offset, *q.strides, k.offset, *k.strides, v.offset, *v.strides]
    mask_slot = q.slot
    mask_bool = False
    if mask_arg is not None:
        mask = p.materialize(p.kwargs["attn_mask"])
        mask_strides = broadcast_strides(mask, (b, h, length, s))
        words[7] = 1
        words += [mask.offset, *mask_strides]
        mask_slot = mask.slot
        mask_bool = mask.dtype == torch.bool
    else:
        words += [0, 0, 0, 0, 0]
    code = source("attention", MASK_TYPE="u32" if mask_bool else "f32", MASK_BOOL="true" if mask_bool else "false")
    slots = [result.slot, lse.slot, q.slot, k.slot, v.slot, mask_slot]
    p.launches.append(Launch("attention", code, slots, params(words), grid(b * h * length), writes=2))
    return result, lse
