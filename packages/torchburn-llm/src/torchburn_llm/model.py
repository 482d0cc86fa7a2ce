"""The decoder forward pass shared by every registered family, over a preallocated KV cache.

One sequence at a time. ``forward(ids)`` runs the new tokens [T] through every layer at the positions
after those already cached (prefill: T = the prompt; decode: T = 1) and returns their logits [T, vocab].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .architectures import Architecture
from .config import ModelConfig
from .errors import ContextLengthError
from .rope import cos_sin, inverse_frequencies, rotate


class KVCache:
    """Keys and values of every layer for up to ``capacity`` positions, allocated once."""

    def __init__(self, cfg: ModelConfig, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"KV cache capacity must be at least 1, got {capacity}")
        shape = (cfg.num_layers, cfg.num_kv_heads, capacity, cfg.head_dim)  # [L, KVH, S, D]
        self.keys = torch.zeros(shape)
        self.values = torch.zeros(shape)
        self.capacity = capacity
        self.length = 0  # positions filled

    def check_room(self, new: int) -> None:
        if self.length + new > self.capacity:
            raise ContextLengthError(
                f"{self.length} cached + {new} new tokens exceed the KV cache's {self.capacity} positions"
            )

    def reset(self, length: int = 0) -> None:
        """Forget positions from ``length`` on (0: everything)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        self.length = length


@dataclass
class _Layer:
    ln_attn: torch.Tensor
    ln_mlp: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    bq: torch.Tensor | None
    bk: torch.Tensor | None
    bv: torch.Tensor | None
    bo: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    gate_b: torch.Tensor | None
    up_b: torch.Tensor | None
    down_b: torch.Tensor | None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class Transformer:
    """fp32 weights held as torch tensors; the forward pass is plain tensor code (the reference path)."""

    def __init__(self, arch: Architecture, cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> None:
        self.arch, self.cfg = arch, cfg
        self.embed = tensors["model.embed_tokens.weight"]  # [V, H]
        self.norm = tensors["model.norm.weight"]
        self.lm_head = self.embed if cfg.tie_embeddings else tensors["lm_head.weight"]
        self.inv_freq = inverse_frequencies(cfg)

        def opt(name: str) -> torch.Tensor | None:
            return tensors.get(name)

        self.layers = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            self.layers.append(
                _Layer(
                    tensors[p + "input_layernorm.weight"],
                    tensors[p + "post_attention_layernorm.weight"],
                    tensors[a + "q_proj.weight"],
                    tensors[a + "k_proj.weight"],
                    tensors[a + "v_proj.weight"],
                    tensors[a + "o_proj.weight"],
                    opt(a + "q_proj.bias"),
                    opt(a + "k_proj.bias"),
                    opt(a + "v_proj.bias"),
                    opt(a + "o_proj.bias"),
                    opt(a + "q_norm.weight"),
                    opt(a + "k_norm.weight"),
                    tensors[m + "gate_proj.weight"],
                    tensors[m + "up_proj.weight"],
                    tensors[m + "down_proj.weight"],
                    opt(m + "gate_proj.bias"),
                    opt(m + "up_proj.bias"),
                    opt(m + "down_proj.bias"),
                )
            )

    def new_cache(self, capacity: int | None = None) -> KVCache:
        return KVCache(self.cfg, capacity or self.cfg.max_position)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits [T, V] of the new tokens ``ids`` [T]; their keys and values join ``cache``."""
        t = int(ids.shape[0])
        cache.check_room(t)
        if t == 0:
            return torch.empty(0, self.cfg.vocab_size)
        if int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.cfg.vocab_size}), got {ids.min()}..{ids.max()}")
        start = cache.length
        positions = torch.arange(start, start + t)
        cos, sin = cos_sin(self.inv_freq, positions)  # [T, D]
        mask = self._mask(positions, start + t)  # [T, S]
        x = self.embed[ids]  # [T, H]
        for li, layer in enumerate(self.layers):
            x = x + self._attention(li, layer, rms_norm(x, layer.ln_attn, self.cfg.rms_eps), cos, sin, mask, cache)
            x = x + self._mlp(layer, rms_norm(x, layer.ln_mlp, self.cfg.rms_eps))
        cache.length = start + t
        return F.linear(rms_norm(x, self.norm, self.cfg.rms_eps), self.lm_head)  # [T, V]

    def _mask(self, positions: torch.Tensor, length: int) -> torch.Tensor:
        """Additive mask [T, S]: a query sees keys at or before its position (within the window)."""
        keys = torch.arange(length)[None, :]
        allowed = keys <= positions[:, None]
        if self.cfg.sliding_window is not None:
            allowed &= keys > positions[:, None] - self.cfg.sliding_window
        return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))

    def _attention(
        self,
        li: int,
        w: _Layer,
        x: torch.Tensor,  # [T, H]
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache,
    ) -> torch.Tensor:
        cfg = self.cfg
        t, d, kvh = x.shape[0], cfg.head_dim, cfg.num_kv_heads
        group = cfg.num_heads // kvh
        q = F.linear(x, w.wq, w.bq).view(t, cfg.num_heads, d).transpose(0, 1)  # [Hq, T, D]
        k = F.linear(x, w.wk, w.bk).view(t, kvh, d).transpose(0, 1)  # [KVH, T, D]
        v = F.linear(x, w.wv, w.bv).view(t, kvh, d).transpose(0, 1)
        if w.q_norm is not None and w.k_norm is not None:
            q, k = rms_norm(q, w.q_norm, cfg.rms_eps), rms_norm(k, w.k_norm, cfg.rms_eps)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        start = cache.length
        cache.keys[li, :, start : start + t] = k
        cache.values[li, :, start : start + t] = v
        keys = cache.keys[li, :, : start + t]  # [KVH, S, D]
        values = cache.values[li, :, : start + t]
        q = q.reshape(kvh, group * t, d)  # queries of one KV head side by side: [KVH, G·T, D]
        scores = (q @ keys.transpose(1, 2)) * d**-0.5  # [KVH, G·T, S]
        scores = scores.view(kvh, group, t, -1) + mask  # [KVH, G, T, S]
        out = torch.softmax(scores, dim=-1) @ values[:, None]  # [KVH, G, T, D]
        out = out.reshape(cfg.num_heads, t, d).transpose(0, 1).reshape(t, cfg.num_heads * d)  # [T, Hq·D]
        return F.linear(out, w.wo, w.bo)

    def _mlp(self, w: _Layer, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(x, w.gate, w.gate_b)) * F.linear(x, w.up, w.up_b), w.down, w.down_b)
