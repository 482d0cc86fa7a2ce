"""Scaled-dot-product attention kept whole, planned one of two ways by its size:
- up to ``SCORES_IN_MEMORY`` scores, two tiled products around one softmax kernel (the scale, mask and
  causality fused into the softmax's input): on an H200 this ran an encoder layer's attention in half
  the time of the fused kernel, whose one-row-per-workgroup products cannot tile;
- beyond, the fused kernel (``attention.wgsl``), which never writes the L × S scores to memory.
Either way a row that sees no key (all masked) comes out as zeros, as in PyTorch's flash path."""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from torchburn.attention_shapes import grouped_heads
from torchburn.planning import Family, expr

from ..kernels import Launch, f32_bits, grid, params
from ..planner import Lazy, PlanError, Planner, constant
from ..shaders import source
from ..values import Value, broadcast_strides
from . import F32, FxNode, lower
from .matmul import matmul
from .softmax import softmax

aten = torch.ops.aten

MAX_HEAD = 256  # q/k head size the kernel stages; v's may be up to twice its 128 threads
SCORES_IN_MEMORY = 1 << 24  # at most this many scores (64 MB) are written out by the unfused plan


def _sdpa_check(spec: Any) -> bool | str:
    args = spec.args
    if len(args) > 3 and args[3]:
        return "dropout in attention"
    q, k, v = spec.inputs[:3]
    if q is None or k is None or v is None or q.rank != 4:
        return "attention needs 4-d q, k and v"
    if any(t.dtype != torch.float32 for t in (q, k, v)):
        return "attention in other than float32"
    heads = grouped_heads(q.shape, k.shape, v.shape)
    if isinstance(heads, str):
        return heads
    widths = [d for d in (q.shape[3], v.shape[3]) if isinstance(d, int)]  # symbolic: checked when planned
    if any(d > MAX_HEAD for d in widths):
        return f"attention heads wider than {MAX_HEAD}"
    mask = spec.kwargs.get("attn_mask")
    if mask is not None and mask.meta["val"].dtype not in (torch.float32, torch.bool):
        return "attention mask other than float32 or bool"
    return True


@lower(aten._scaled_dot_product_flash_attention_for_cpu.default, family=Family.ATTENTION, check=_sdpa_check, dtypes=F32)
def _sdpa(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> tuple[Value, Value]:
    q, k, v = (p.materialize(x) for x in args[:3])
    causal = bool(args[4]) if len(args) > 4 else bool(node.kwargs.get("is_causal", False))
    mask_arg = node.kwargs.get("attn_mask")
    scale = node.kwargs.get("scale")
    b, h, length, e = q.shape
    s, ev = k.shape[2], v.shape[3]
    if e > MAX_HEAD or ev > MAX_HEAD:
        raise PlanError(f"attention heads wider than {MAX_HEAD}")
    group = grouped_heads(q.shape, k.shape, v.shape)
    if isinstance(group, str):
        raise PlanError(group)
    if b * h * length * s <= SCORES_IN_MEMORY and not _lse_used(node):
        k, v = _repeat_heads(p, k, group), _repeat_heads(p, v, group)
        return _unfused(p, q, k, v, causal, kwargs.get("attn_mask"), scale), p.new_value((b, h, length), torch.float32)
    result = p.new_value((b, h, length, ev), torch.float32)
    lse = p.new_value((b, h, length), torch.float32)
    if result.numel == 0:
        return result, lse
    words = [b, h, length, s, e, ev, int(causal), 0, f32_bits(scale if scale is not None else 1 / math.sqrt(e))]
    words += [q.offset, *q.strides, k.offset, *k.strides, v.offset, *v.strides]
    mask_slot = q.slot
    mask_bool = False
    if mask_arg is not None:
        mask = p.materialize(kwargs["attn_mask"])
        mask_strides = broadcast_strides(mask, (b, h, length, s))
        words[7] = 1
        words += [mask.offset, *mask_strides]
        mask_slot = mask.slot
        mask_bool = mask.dtype == torch.bool
    else:
        words += [0, 0, 0, 0, 0]
    words.append(group)  # query heads per key/value head
    code = source("attention", MASK_TYPE="u32" if mask_bool else "f32", MASK_BOOL="true" if mask_bool else "false")
    slots = [result.slot, lse.slot, q.slot, k.slot, v.slot, mask_slot]
    p.launches.append(Launch("attention", code, slots, params(words), grid(b * h * length), writes=2))
    return result, lse


def _lse_used(node: FxNode) -> bool:
    """Whether anything reads the op's second output (the log-sum-exp), which only the fused kernel
    computes (inference graphs drop it)."""
    return any(user.args[1] != 0 for user in node.users if user.target is operator.getitem)


def _repeat_heads(p: Planner, x: Value, group: int) -> Value:
    """k or v [B, HK, S, D] with each head repeated ``group`` times: [B, HK·group, S, D] (a copy when
    grouped; the batched products need one head per query head)."""
    if group == 1:
        return x
    b, hk, s, d = x.shape
    expanded = p.dense(x.with_layout(x.meta().unsqueeze(2).expand(b, hk, group, s, d)))
    return expanded.with_layout(expanded.meta().view(b, hk * group, s, d))


def _batched(p: Planner, x: Value) -> Value:
    """[B, H, T, D] as [B·H, T, D] (a copy where the strides cannot merge B and H)."""
    b, h, t, d = x.shape
    try:
        return x.with_layout(x.meta().view(b * h, t, d))
    except RuntimeError:
        x = p.dense(x)
        return x.with_layout(x.meta().view(b * h, t, d))


def _unfused(p: Planner, q: Value, k: Value, v: Value, causal: bool, mask: Any, scale: float | None) -> Value:
    b, h, length, e = q.shape
    s = k.shape[2]
    kt = _batched(p, k)
    kt = kt.with_layout(kt.meta().transpose(1, 2))  # [B·H, E, S], read through strides
    scores = p.materialize(matmul(p, _batched(p, q), kt, None, scale if scale is not None else 1 / math.sqrt(e), 0.0))
    shape = (b, h, length, s)
    scores = scores.with_layout(scores.meta().view(shape))
    tree = p.lazy(scores, shape)
    neg_inf = constant(-math.inf, "f32")
    if mask is not None:
        m = p.lazy(p.materialize(mask), shape)
        if m.type == "bool":
            tree = expr.where(m, tree, neg_inf)
        else:
            tree = expr.apply("add", tree, expr.cast(m, "f32"))
    if causal:  # query i sees keys j <= i; the scores are contiguous, so j and i come from the index
        at = expr.position("int")
        key = expr.apply("remainder", at, constant(s, "int"))
        query = expr.apply("remainder", expr.apply("div_floor", at, constant(s, "int")), constant(length, "int"))
        tree = expr.where(expr.apply("gt", key, query), neg_inf, tree)
    masked = p.materialize(Lazy(tree, torch.float32, shape))
    probs = softmax(p, masked, 3, log=False)
    # a row with no key to see is NaN after softmax; PyTorch's flash path returns zeros there
    row = p.lazy(probs, shape)
    cleaned = p.materialize(
        Lazy(expr.where(expr.apply("is_nan", row), constant(0.0, "f32"), row), torch.float32, shape)
    )
    out = p.materialize(matmul(p, _batched(p, cleaned), _batched(p, v), None, 1.0, 0.0))
    return out.with_layout(out.meta().view(b, h, length, v.shape[3]))
