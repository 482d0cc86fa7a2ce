"""How closely a quantized model follows the fp32 one: teacher-forced over a long text, the share of
positions where both pick the same next token, and each model's perplexity on the text.

A quantized model computes a token's logits on one of two paths, and each is measured: ``prefill``
(many tokens per call: a prompt; dequantized weights against f32 activations) and ``decode`` (one
token per call, as generation produces every token after the first; activations quantized to
integers for integer dot products).

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

    @property
    def perplexity_change(self) -> float:
        return self.perplexity / self.reference_perplexity - 1.0

    def row(self) -> str:
        return (
            f"| {self.quant} | {self.path} | {self.tokens} | {100 * self.top1_agreement:.2f}% | {self.perplexity:.3f} "
            f"| {self.reference_perplexity:.3f} | {100 * self.perplexity_change:+.2f}% |"
        )


HEADER = (
    "| quant | path | tokens | top-1 agreement with fp32 | perplexity | fp32 perplexity | change |\n"
    "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
)


@torch.no_grad()
def compare(reference: LLM, candidate: LLM, ids: list[int], path: str = "prefill") -> Agreement:
    """Teacher-forced over ``ids``: predictions for positions 1.. from every prefix, the candidate's on
    ``path``; the fp32 reference's always in chunks."""
    if path not in PATHS:
        raise ValueError(f"path={path!r} is not one of {', '.join(PATHS)}")
    ref_cache = reference.model.new_cache(len(ids))
    cand_cache = candidate.model.new_cache(len(ids))
    agree, nll_ref, nll_cand, count = 0, 0.0, 0.0, 0
    for start in range(0, len(ids) - 1, CHUNK):
        chunk = torch.tensor(ids[start : min(start + CHUNK, len(ids) - 1)])
        target = torch.tensor(ids[start + 1 : start + 1 + len(chunk)])
        want = reference.model.forward(chunk, ref_cache)  # [T, V]
        if path == "prefill":
            got = candidate.model.forward(chunk, cand_cache)
        else:
            got = torch.cat([candidate.model.forward(chunk[i : i + 1], cand_cache) for i in range(len(chunk))])
        agree += int((want.argmax(-1) == got.argmax(-1)).sum())
        nll_ref += float(torch.nn.functional.cross_entropy(want, target, reduction="sum"))
        nll_cand += float(torch.nn.functional.cross_entropy(got, target, reduction="sum"))
        count += len(chunk)
    return Agreement(
        candidate.model.quant, path, count, agree / count, math.exp(nll_cand / count), math.exp(nll_ref / count)
    )
