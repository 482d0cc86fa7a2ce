"""Choosing the next token from logits: greedy, or sampled with temperature, top-k, top-p, min-p, from a
seeded generator (the same seed gives the same text); before either, the logits are shifted by a
per-token bias, a repetition penalty over the whole context, and OpenAI's presence and frequency
penalties over the tokens this sampler has picked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

MAX_BIASED_TOKENS = 1024  # tokens one logit bias may name


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    # OpenAI's: subtracted from a token's logit once it has been picked (presence), and per pick (frequency)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit); -100 bans, +100 forces

    def __post_init__(self) -> None:
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (self.top_k >= 0, f"top_k must be >= 0 (0: no limit), got {self.top_k}"),
            (0 <= self.top_p <= 1, f"top_p must be in [0, 1] (0: only the most likely token), got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}"),
            (-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2 <= self.frequency_penalty <= 2, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (len(self.logit_bias) <= MAX_BIASED_TOKENS, f"logit_bias may name at most {MAX_BIASED_TOKENS} tokens"),
            (
                all(token >= 0 and -100 <= bias <= 100 for token, bias in self.logit_bias),
                "logit_bias maps token ids (>= 0) to biases in [-100, 100]",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def updated(self, **overrides: Any) -> SamplingParams:
        """These parameters with every override that is not None applied."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


class Sampler:
    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator = torch.Generator()
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        else:
            self.generator.seed()
        self.picked: Counter[int] = Counter()  # how often each token was picked, for OpenAI's penalties
        # the bias as (ids, values) tensors, built once rather than at every step
        self._bias = (
            (torch.tensor([t for t, _ in params.logit_bias]), torch.tensor([b for _, b in params.logit_bias]))
            if params.logit_bias
            else None
        )

    def __call__(self, logits: torch.Tensor, history: Sequence[int]) -> int:
        """The next token for ``logits`` [V], given the ids so far (for the repetition penalty)."""
        token = self._pick(self._shifted(logits.float(), history))
        self.picked[token] += 1
        return token

    def _shifted(self, logits: torch.Tensor, history: Sequence[int]) -> torch.Tensor:
        """``logits`` [V] with the bias and penalties applied (a copy where any applies)."""
        p = self.params
        if self._bias is not None:
            ids, biases = self._bias
            if int(ids.max()) >= logits.shape[0]:
                raise ValueError(f"logit_bias names a token outside the vocabulary of {logits.shape[0]}")
            logits = logits.clone()
            logits.index_add_(0, ids, biases.to(logits.dtype))
        if p.repetition_penalty != 1.0 and history:
            seen = torch.tensor(sorted(set(history)))
            picked = logits[seen]
            logits = logits.clone()
            # as in the CTRL paper and transformers: shrink positive logits, push negative ones down
            logits[seen] = torch.where(picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and self.picked:
            ids = torch.tensor(list(self.picked))
            counts = torch.tensor(list(self.picked.values()), dtype=logits.dtype)
            logits = logits.clone()
            logits[ids] -= counts * p.frequency_penalty + p.presence_penalty
        return logits

    def _pick(self, logits: torch.Tensor) -> int:
        p = self.params
        if p.temperature == 0 or p.top_p == 0:
            # numpy's argmax is vectorized (torch's CPU argmax takes ~0.1 ms over a 50k vocabulary);
            # both return the first of equal maxima, and a NaN as the maximum
            return int(logits.contiguous().numpy().argmax())
        logits = logits / p.temperature
        if 0 < p.top_k < logits.shape[0]:
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.min_p > 0:
            probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            before = torch.cumsum(sorted_probs, dim=0) - sorted_probs  # mass of the tokens ranked above
            sorted_probs = sorted_probs.masked_fill(before >= p.top_p, 0.0)  # the top token always stays
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        return int(torch.multinomial(probs / probs.sum(), 1, generator=self.generator))
