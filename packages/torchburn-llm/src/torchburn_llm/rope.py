"""Rotary position embeddings in the "rotate half" layout Hugging Face checkpoints are trained with."""

from __future__ import annotations

import math

import torch

from .config import ModelConfig, RopeScaling


def _exponents(d: int) -> torch.Tensor:
    return torch.arange(0, d, 2, dtype=torch.int64).float() / d  # [d / 2]


def inverse_frequencies(cfg: ModelConfig, long: bool = False) -> torch.Tensor:
    """[rotary width / 2] rotation rates, rescaled as the config's ``rope_scaling`` says (``long``: the
    longrope factors for contexts past the original length)."""
    d = cfg.rotary_width
    s = cfg.rope_scaling
    if s.kind == "longrope":
        factors = torch.tensor(s.long_factor if long else s.short_factor, dtype=torch.float32)
        return 1.0 / (factors * cfg.rope_theta ** _exponents(d))
    inv = 1.0 / (cfg.rope_theta ** _exponents(d))
    if s.kind == "yarn":
        return _yarn(inv, s, d, cfg.rope_theta)
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


def _yarn(inv: torch.Tensor, s: RopeScaling, d: int, base: float) -> torch.Tensor:
    """YaRN's rates: pair i keeps its rate where it turns more than ``beta_fast`` times over the
    original context, is divided by the factor where it turns fewer than ``beta_slow`` times, and
    blends the two linearly in between (the boundaries as pair indices, floored and ceiled)."""

    def pair_turning(turns: float) -> float:  # the pair index at which a rate turns `turns` times
        return d * math.log(s.original_max_position / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_turning(s.beta_fast), pair_turning(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # a ramp of one step, not a division by zero
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp  # [d / 2]: 1 where the rate is kept, 0 where divided
    return (inv / s.factor) * (1 - kept) + inv * kept


def local_inverse_frequencies(cfg: ModelConfig) -> torch.Tensor | None:
    """The rates of the windowed layers where they rotate at their own base (Gemma 3), unscaled."""
    if cfg.local_rope_theta is None:
        return None
    return 1.0 / (cfg.local_rope_theta ** _exponents(cfg.rotary_width))


def cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [T, D] for integer ``positions`` [T], times ``scale`` (longrope's)."""
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((angles, angles), dim=-1)  # [T, D]
    if scale == 1.0:
        return emb.cos(), emb.sin()
    return emb.cos() * scale, emb.sin() * scale


class RotaryTable:
    """cos and sin rows of every position used so far, computed once: a decode step then reads its row
    instead of running four torch operations (a tenth of a millisecond in a few-millisecond step). The
    table grows by doubling; its rows equal :func:`cos_sin`'s exactly (the same elementwise math).

    With ``long`` (longrope's rates and the original context length), a call whose positions reach
    past that length reads rows made with the long rates, as ``transformers`` switches per forward
    pass; positions cached before keep the rotation they were stored with."""

    def __init__(
        self, inv_freq: torch.Tensor, scale: float = 1.0, long: tuple[torch.Tensor, int] | None = None
    ) -> None:
        self.scale = scale
        self._tables = [_Rows(inv_freq, scale)] + ([_Rows(long[0], scale)] if long else [])
        self._switch = long[1] if long else None

    @staticmethod
    def of(cfg: ModelConfig) -> RotaryTable:
        s = cfg.rope_scaling
        if s.kind == "longrope":
            long = (inverse_frequencies(cfg, long=True), s.original_max_position)
            return RotaryTable(inverse_frequencies(cfg), s.attention_factor, long)
        if s.kind == "yarn":
            return RotaryTable(inverse_frequencies(cfg), s.attention_factor)
        return RotaryTable(inverse_frequencies(cfg))

    @property
    def inv_freq(self) -> torch.Tensor:
        return self._tables[0].inv_freq

    def rows(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Contiguous cos and sin [count, D] of positions ``start .. start + count``."""
        end = start + count
        table = self._tables[1 if self._switch is not None and end > self._switch else 0]
        return table.rows(start, end)

    def rows_at(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [len(positions), D] of each position on its own, as ``rows(p, 1)`` gives them: one
        step of each of several sequences (past longrope's switch a position reads the long rates,
        as that step alone would)."""
        index = torch.tensor(positions)
        end = max(positions) + 1
        short = self._tables[0].rows(0, end)
        if self._switch is None or end <= self._switch:
            return short[0][index], short[1][index]
        long = self._tables[1].rows(0, end)
        past = (index + 1 > self._switch)[:, None]
        return torch.where(past, long[0][index], short[0][index]), torch.where(past, long[1][index], short[1][index])


class _Rows:
    def __init__(self, inv_freq: torch.Tensor, scale: float) -> None:
        self.inv_freq, self.scale = inv_freq, scale
        self.cos, self.sin = cos_sin(inv_freq, torch.arange(0), scale)  # [N, D] each

    def rows(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        if end > self.cos.shape[0]:
            positions = torch.arange(max(end, 2 * self.cos.shape[0], 256))
            self.cos, self.sin = cos_sin(self.inv_freq, positions, self.scale)
        return self.cos[start:end], self.sin[start:end]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [..., T, D] by position: pairs are (i, i + D/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
