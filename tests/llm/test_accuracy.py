"""The quantization targets on the embedded model, teacher-forced over 2,048 tokens of text against
fp32: int8 top-1 agreement >= 97% and perplexity within 1%; int4 >= 85% and within 15%; on both the
prefill path and the one-token decode path (where activations are quantized too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchburn_llm import LLM
from torchburn_llm import accuracy as acc


@pytest.mark.parametrize("path", acc.PATHS)
@pytest.mark.parametrize(("quant", "agreement", "perplexity"), [("int8", 0.97, 0.01), ("int4", 0.85, 0.15)])
def test_quantized_model_tracks_fp32(
    smollm2: LLM, smollm2_path: Path, quant: str, agreement: float, perplexity: float, path: str
) -> None:
    ids = smollm2.encode(acc.evaluation_text())[:2048]
    assert len(ids) == 2048
    candidate = LLM.from_pretrained(smollm2_path, quant=quant)
    result = acc.compare(smollm2, candidate, ids, path)
    assert result.tokens == 2047
    if path == "decode":
        assert candidate.model.native_steps == 2047, "the decode path runs the native decoder"
    else:
        assert candidate.model.native_prefills == 8, "the prefill path runs the native prefill (8 chunks)"
    assert result.top1_agreement >= agreement, result.row()
    assert abs(result.perplexity_change) <= perplexity, result.row()
