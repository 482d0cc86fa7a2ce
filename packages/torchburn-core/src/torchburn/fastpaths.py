"""PyTorch's fused inference fast paths written out as plain ops, for engines to add to their tables.

``nn.TransformerEncoderLayer`` in inference takes a fused path (``aten._transformer_encoder_layer_fwd``)
that no kernel library implements; written out here as layer norm, linear, sdpa and activation, each
of which an engine runs fused anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def _attention_mask(mask: torch.Tensor | None, mask_type: int | None, b: int, h: int, t: int) -> torch.Tensor | None:
    if mask is None:
        return None
    if mask_type == 1:  # key padding mask [B, S]
        mask = mask.view(b, 1, 1, t)
    elif mask_type == 0:  # attention mask [L, S]
        mask = mask.view(1, 1, t, t)
    # merged masks (type 2) are already [B, H, L, S]
    if mask.dtype == torch.bool:
        return mask.logical_not()  # nn.MultiheadAttention: True = masked out; sdpa: True = attend
    return mask


def transformer_encoder_layer_fwd(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: torch.Tensor,
    norm_bias_1: torch.Tensor,
    norm_weight_2: torch.Tensor,
    norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor,
    ffn_bias_1: torch.Tensor,
    ffn_weight_2: torch.Tensor,
    ffn_bias_2: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_type: int | None = None,
) -> torch.Tensor:
    batched = src.dim() == 3
    x = src if batched else src.unsqueeze(0)
    b, t, e = x.shape
    head = e // num_heads
    attn_mask = _attention_mask(mask, mask_type, b, num_heads, t)

    def self_attention(h: torch.Tensor) -> torch.Tensor:
        qkv = F.linear(h, qkv_weight, qkv_bias).view(b, t, 3, num_heads, head).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=attn_mask)  # [B, H, T, D]
        return F.linear(o.transpose(1, 2).reshape(b, t, e), proj_weight, proj_bias)

    def feed_forward(h: torch.Tensor) -> torch.Tensor:
        h = F.linear(h, ffn_weight_1, ffn_bias_1)
        h = F.gelu(h) if use_gelu else F.relu(h)
        return F.linear(h, ffn_weight_2, ffn_bias_2)

    if norm_first:
        x = x + self_attention(F.layer_norm(x, (e,), norm_weight_1, norm_bias_1, eps))
        x = x + feed_forward(F.layer_norm(x, (e,), norm_weight_2, norm_bias_2, eps))
    else:
        x = F.layer_norm(x + self_attention(x), (e,), norm_weight_1, norm_bias_1, eps)
        x = F.layer_norm(x + feed_forward(x), (e,), norm_weight_2, norm_bias_2, eps)
    return x if batched else x.squeeze(0)


FAST_PATHS: dict[Any, Callable[..., Any]] = {
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
}
