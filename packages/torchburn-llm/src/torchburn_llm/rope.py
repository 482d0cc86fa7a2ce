"""Rotary position embeddings in the "rotate half" layout Hugging Face checkpoints are trained with."""

from __future__ import annotations

import math

import torch

from .config import ModelConfig


def inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """[head_dim / 2] rotation rates, rescaled as the config's ``rope_scaling`` says."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.rope_scaling
    if s.kind == "linear":
        return inv / s.factor
    if s.kind == "llama3":
        # Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth blend between
        wavelen = 2 * math.pi / inv
        low_wavelen = s.original_max_position / s.low_freq_factor
        high_wavelen = s.original_max_position / s.high_freq_factor
        scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
        blend = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        smoothed = (1 - blend) * scaled / s.factor + blend * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv


def cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [T, head_dim] for integer ``positions`` [T]."""
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((angles, angles), dim=-1)  # [T, D]
    return emb.cos(), emb.sin()


class RotaryTable:
    """cos and sin rows of every position used so far, computed once: a decode step then reads its row
    instead of running four torch operations (a tenth of a millisecond in a few-millisecond step). The
    table grows by doubling; its rows equal :func:`cos_sin`'s exactly (the same elementwise math)."""

    def __init__(self, inv_freq: torch.Tensor) -> None:
        self.inv_freq = inv_freq
        self.cos, self.sin = cos_sin(inv_freq, torch.arange(0))  # [N, D] each

    def rows(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous cos and sin [count, D] of positions ``start .. start + count``."""
        end = start + count
        if end > self.cos.shape[0]:
            self.cos, self.sin = cos_sin(self.inv_freq, torch.arange(max(end, 2 * self.cos.shape[0], 256)))
        return self.cos[start:end], self.sin[start:end]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [..., T, D] by position: pairs are (i, i + D/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
