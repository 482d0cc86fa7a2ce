"""How closely a quantized model follows a reference: teacher-forced over a long text, the share of
positions where both pick the same next token, and each one's perplexity on the text. The reference is
the fp32 model, or another runtime's logits on the same file (llama.cpp's, see ``llamacpp_peer``).

A quantized model computes a token's logits on one of two paths, and each is measured: ``prefill``
(many tokens per call: a prompt; dequantized weights against f32 activations) and ``decode`` (one
token per call, as generation produces every token after the first; activations quantized to
integers for integer dot products).

Top-1 agreement alone overstates a difference: where the reference's best two logits are nearly tied,
any change of rounding may swap them. Each row therefore also gives the largest reference margin (its top
logit minus its second) at a position where the two disagree, and, when the reference comes with a second
computation of its own (llama.cpp's decode path beside its prompt path), the agreement over the positions
where the reference agrees with itself: the ones its own rounding does not decide.

The text is the Python language reference as every Python installation ships it
(``pydoc_data.topics``): plain English prose with some code, and nothing to download.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .llm import LLM

CHUNK = 256  # tokens per forward pass; the KV cache carries the context across chunks
PATHS = ("prefill", "decode")


def evaluation_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


@dataclass(frozen=True)
class Agreement:
    quant: str
    path: str
    tokens: int
    top1_agreement: float
    perplexity: float
    reference_perplexity: float
    reference: str = "fp32"
    # the largest top-1 minus top-2 margin of the reference's logits where the two pick differently
    # (0.0 when they never do): small values say the misses are near-ties
    largest_missed_margin: float = 0.0
    # agreement over the positions where the reference agrees with a second computation of its own;
    # None when there is none
    stable_agreement: float | None = None
    stable_positions: int = 0

    @property
    def perplexity_change(self) -> float:
        return self.perplexity / self.reference_perplexity - 1.0

    def row(self) -> str:
        return (
            f"| {self.quant} | {self.path} | {self.reference} | {self.tokens} | {100 * self.top1_agreement:.2f}% "
            f"| {self.perplexity:.3f} | {self.reference_perplexity:.3f} | {100 * self.perplexity_change:+.2f}% "
            f"| {self.largest_missed_margin:.3f} | {self._stable_cell()} |"
        )

    def _stable_cell(self) -> str:
        if self.stable_agreement is None:
            return "-"
        return f"{100 * self.stable_agreement:.2f}% of {self.stable_positions}"


HEADER = (
    "| quant | path | reference | tokens | top-1 agreement | perplexity | reference perplexity | change "
    "| largest missed margin | top-1 where the reference agrees with itself |\n"
    "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


@torch.no_grad()
def compare(
    reference: LLM | torch.Tensor,
    candidate: LLM,
    ids: list[int],
    path: str = "prefill",
    reference_name: str = "fp32",
    stable: torch.Tensor | None = None,
) -> Agreement:
    """Teacher-forced over ``ids``: predictions for positions 1.. from every prefix, the candidate's on
    ``path``; the reference's in chunks, or given as logits [len(ids) - 1 or more, V] computed elsewhere.
    ``stable`` [len(ids) - 1] bool marks the positions the reference's own rounding does not decide."""
    if path not in PATHS:
        raise ValueError(f"path={path!r} is not one of {', '.join(PATHS)}")
    if isinstance(reference, torch.Tensor):
        want = reference
    else:
        want = teacher_forced_logits(reference, ids, "prefill")
    got = teacher_forced_logits(candidate, ids, path)
    return compare_logits(want, got, ids, candidate.model.quant, path, reference_name, stable)


@torch.no_grad()
def teacher_forced_logits(llm: LLM, ids: list[int], path: str) -> torch.Tensor:
    """``llm``'s logits [len(ids) - 1, V] at every position of ``ids[:-1]``, each from its prefix, on
    ``path``: ``CHUNK`` tokens per forward pass (prefill) or one (decode), over one KV cache."""
    cache = llm.model.new_cache(len(ids))
    rows = []
    for start in range(0, len(ids) - 1, CHUNK):
        chunk = torch.tensor(ids[start : min(start + CHUNK, len(ids) - 1)])
        if path == "prefill":
            rows.append(llm.model.forward(chunk, cache))
        else:
            rows += [llm.model.forward(chunk[i : i + 1], cache) for i in range(len(chunk))]
    return torch.cat(rows)


def compare_logits(
    reference: torch.Tensor,
    got: torch.Tensor,
    ids: list[int],
    quant: str,
    path: str,
    reference_name: str,
    stable: torch.Tensor | None = None,
) -> Agreement:
    """Agreement of logits ``got`` [len(ids) - 1, V] with ``reference`` [len(ids) - 1 or more, V], both
    teacher-forced over ``ids``, and each one's perplexity on ``ids[1:]``; with ``stable``
    [len(ids) - 1] bool, also the agreement over the positions it marks."""
    count = len(ids) - 1
    if reference.shape[0] < count:
        raise ValueError(f"reference logits cover {reference.shape[0]} positions, {count} are compared")
    if got.shape[0] != count:
        raise ValueError(f"candidate logits cover {got.shape[0]} positions, {count} are compared")
    if stable is not None and stable.shape != (count,):
        raise ValueError(f"the stable mask covers {tuple(stable.shape)} positions, {count} are compared")
    want = reference[:count]
    target = torch.tensor(ids[1:])
    same = want.argmax(-1) == got.argmax(-1)  # [count]
    top2 = want.topk(2, dim=-1).values  # [count, 2]
    margins = (top2[:, 0] - top2[:, 1])[~same]
    nll_ref = float(torch.nn.functional.cross_entropy(want, target, reduction="sum"))
    nll_cand = float(torch.nn.functional.cross_entropy(got, target, reduction="sum"))
    stable_agreement, stable_positions = None, 0
    if stable is not None:
        stable_positions = int(stable.sum())
        stable_agreement = int(same[stable].sum()) / max(stable_positions, 1)
    return Agreement(
        quant,
        path,
        count,
        int(same.sum()) / count,
        math.exp(nll_cand / count),
        math.exp(nll_ref / count),
        reference_name,
        float(margins.max()) if margins.numel() else 0.0,
        stable_agreement,
        stable_positions,
    )


def self_agreement(reference: torch.Tensor, second: torch.Tensor, count: int) -> torch.Tensor:
    """[count] bool: the positions where two computations of the reference pick the same top-1."""
    return reference[:count].argmax(-1) == second[:count].argmax(-1)
