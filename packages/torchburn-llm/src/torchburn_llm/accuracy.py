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
    if isinstance(reference, torch.Tensor):
        want = reference
    else:
        want = teacher_forced_logits(reference, ids, "prefill")
    got = teacher_forced_logits(candidate, ids, path)
    return compare_logits(want, got, ids, candidate.model.quant, path, reference_name)


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
    reference: torch.Tensor, got: torch.Tensor, ids: list[int], quant: str, path: str, reference_name: str
) -> Agreement:
    """Agreement of logits ``got`` [len(ids) - 1, V] with ``reference`` [len(ids) - 1 or more, V], both
    teacher-forced over ``ids``, and each one's perplexity on ``ids[1:]``."""
    count = len(ids) - 1
    if reference.shape[0] < count:
        raise ValueError(f"reference logits cover {reference.shape[0]} positions, {count} are compared")
    if got.shape[0] != count:
        raise ValueError(f"candidate logits cover {got.shape[0]} positions, {count} are compared")
    want = reference[:count]
    target = torch.tensor(ids[1:])
    agree = int((want.argmax(-1) == got.argmax(-1)).sum())
    nll_ref = float(torch.nn.functional.cross_entropy(want, target, reduction="sum"))
    nll_cand = float(torch.nn.functional.cross_entropy(got, target, reduction="sum"))
    return Agreement(
        quant, path, count, agree / count, math.exp(nll_cand / count), math.exp(nll_ref / count), reference_name
    )
