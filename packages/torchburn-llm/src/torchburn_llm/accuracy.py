"""How closely a quantized model follows a reference: teacher-forced over a long text, the share of
positions where both pick the same next token, and each one's perplexity on the text. The reference is
the fp32 model, or another runtime's logits on the same file (llama.cpp's, see ``llamacpp_peer``).

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
    reference: str = "fp32"

    @property
    def perplexity_change(self) -> float:
        return self.perplexity / self.reference_perplexity - 1.0

    def row(self) -> str:
        return (
            f"| {self.quant} | {self.path} | {self.reference} | {self.tokens} | {100 * self.top1_agreement:.2f}% "
            f"| {self.perplexity:.3f} | {self.reference_perplexity:.3f} | {100 * self.perplexity_change:+.2f}% |"
        )


HEADER = (
    "| quant | path | reference | tokens | top-1 agreement | perplexity | reference perplexity | change |\n"
    "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"
)


@torch.no_grad()
def compare(
    reference: LLM | torch.Tensor, candidate: LLM, ids: list[int], path: str = "prefill", reference_name: str = "fp32"
) -> Agreement:
    """Teacher-forced over ``ids``: predictions for positions 1.. from every prefix, the candidate's on
    ``path``; the reference's in chunks, or given as logits [len(ids) - 1 or more, V] computed elsewhere."""
    if path not in PATHS:
        raise ValueError(f"path={path!r} is not one of {', '.join(PATHS)}")
    if isinstance(reference, torch.Tensor) and reference.shape[0] < len(ids) - 1:
        raise ValueError(f"reference logits cover {reference.shape[0]} positions, {len(ids) - 1} are compared")
    ref_cache = None if isinstance(reference, torch.Tensor) else reference.model.new_cache(len(ids))
    cand_cache = candidate.model.new_cache(len(ids))
    agree, nll_ref, nll_cand, count = 0, 0.0, 0.0, 0
    for start in range(0, len(ids) - 1, CHUNK):
        chunk = torch.tensor(ids[start : min(start + CHUNK, len(ids) - 1)])
        target = torch.tensor(ids[start + 1 : start + 1 + len(chunk)])
        if isinstance(reference, torch.Tensor):
            want = reference[start : start + len(chunk)]
        else:
            assert ref_cache is not None
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
        candidate.model.quant,
        path,
        count,
        agree / count,
        math.exp(nll_cand / count),
        math.exp(nll_ref / count),
        reference_name,
    )
