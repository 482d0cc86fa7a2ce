"""``Transformer.prefill_batch``: several sequences' prompts in one call, each over its own KV cache,
against running each prompt alone with ``forward``. A server admits requests that arrive together this
way; a prompt of the prompt kernels' length must get its lone run's last logits and keys and values
bit for bit (a prompt's answer must not depend on what arrived with it), for the shipped GGUF model
in its stored types and requantized, and for a tiny random model of every family (grouped-query Llama;
Gemma 2 and 3 with sliding windows, logit caps and a second rotary table; Qwen3's q/k norms; Phi-3's
partial rotation...) and a GGUF of many stored types."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llm.test_batch_decode import _prompts
from llm.test_gguf_stored import _tiny_gguf
from llm.test_parity import FAMILIES, _tiny
from torchburn_native.transformer import PROMPT_KERNEL_MIN_TOKENS

from torchburn_llm import LLM
from torchburn_llm.errors import ContextLengthError
from torchburn_llm.model import KVCache, Transformer

# (cached prefix, new tokens) per sequence: fresh prompts, prompts after a reused prefix (a server's
# prefix cache), one shorter than the prompt kernels take (it runs alone) and one past a window of 8
SHAPES = [(0, 12), (9, PROMPT_KERNEL_MIN_TOKENS), (0, 3), (5, 30), (0, PROMPT_KERNEL_MIN_TOKENS)]


def _with_prefix(model: Transformer, prefix: list[int], capacity: int) -> KVCache:
    cache = model.new_cache(capacity)
    if prefix:
        model.forward(torch.tensor(prefix), cache)
    return cache


def _check_batch_matches_alone(model: Transformer, seed: int) -> None:
    prompts = _prompts(model.cfg.vocab_size, [p + n for p, n in SHAPES], seed)
    capacity = max(len(p) for p in prompts) + 4

    alone = []
    for prompt, (cached, _) in zip(prompts, SHAPES, strict=True):
        cache = _with_prefix(model, prompt[:cached], capacity)
        logits = model.forward(torch.tensor(prompt[cached:]), cache, last_only=True)[-1]
        alone.append((logits, cache))

    caches = [
        _with_prefix(model, prompt[:cached], capacity) for prompt, (cached, _) in zip(prompts, SHAPES, strict=True)
    ]
    calls = model.native_batched_prefills
    rows = model.prefill_batch([p[cached:] for p, (cached, _) in zip(prompts, SHAPES, strict=True)], caches)

    assert rows.shape == (len(prompts), model.cfg.vocab_size)
    for i, (row, cache, (want, want_cache)) in enumerate(zip(rows, caches, alone, strict=True)):
        assert cache.length == want_cache.length == len(prompts[i])
        n = cache.length
        assert torch.equal(row, want), f"prompt {i}: logits differ by {float((row - want).abs().max())}"
        assert torch.equal(cache.keys[:, :, :n], want_cache.keys[:, :, :n]), f"prompt {i}: keys differ"
        assert torch.equal(cache.values[:, :, :n], want_cache.values[:, :, :n]), f"prompt {i}: values differ"
    together = sum(n >= PROMPT_KERNEL_MIN_TOKENS for _, n in SHAPES)
    assert model.native_batched_prefills == calls + (1 if model.native_prefill and together > 1 else 0)


@pytest.mark.parametrize("quant", ["stored", "int4", "int8"])
def test_shipped_model_prompts_together_match_prompts_alone(smollm2_path: Path, quant: str) -> None:
    llm = LLM.from_pretrained() if quant == "stored" else LLM.from_pretrained(smollm2_path, quant=quant)
    assert llm.model.native_prefill
    _check_batch_matches_alone(llm.model, seed=4)


@pytest.mark.parametrize(
    ("family", "quant"),
    [("llama", "int4"), ("gemma2", "int4"), *((family, "int8") for family in sorted(FAMILIES))],
)
def test_tiny_models_prompts_together_match_prompts_alone(tmp_path: Path, family: str, quant: str) -> None:
    _, folder = _tiny(tmp_path, family, intermediate_size=96)  # quantized rows are whole blocks of 32
    _check_batch_matches_alone(LLM.from_pretrained(folder, quant=quant).model, seed=5)


def test_tiny_gguf_of_many_stored_types_prompts_together_match_prompts_alone(tmp_path: Path) -> None:
    _, path = _tiny_gguf(tmp_path, "gemma2", ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_1", "Q5_K"])
    model = LLM.from_pretrained(path).model
    assert model.quant == "stored"
    _check_batch_matches_alone(model, seed=6)


def test_fp32_tensor_path_runs_prompts_one_by_one(tmp_path: Path) -> None:
    _, folder = _tiny(tmp_path, "llama")
    model = LLM.from_pretrained(folder, quant="fp32").model
    assert not model.native_prefill
    _check_batch_matches_alone(model, seed=7)
    assert model.native_batched_prefills == 0


def test_mismatched_prompts_are_refused_and_change_nothing(tmp_path: Path) -> None:
    _, folder = _tiny(tmp_path, "llama", intermediate_size=96)
    model = LLM.from_pretrained(folder, quant="int8").model
    vocab = model.cfg.vocab_size
    a, b, small = model.new_cache(16), model.new_cache(16), model.new_cache(9)
    long = list(range(3, 13))
    with pytest.raises(ValueError, match="2 prompts for 1 KV caches"):
        model.prefill_batch([long, long], [a])
    with pytest.raises(ValueError, match="the same cache appears twice"):
        model.prefill_batch([long, long], [a, a])
    with pytest.raises(ValueError, match="prompt 1 has no tokens"):
        model.prefill_batch([long, []], [a, b])
    with pytest.raises(ValueError, match=rf"prompt 0: token ids must lie in \[0, {vocab}\), got -1\.\.12"):
        model.prefill_batch([[-1, *long], long], [a, b])
    with pytest.raises(ContextLengthError, match="exceed the KV cache's 9 positions"):
        model.prefill_batch([long, long], [a, small])
    assert (a.length, b.length, small.length) == (0, 0, 0)
    assert model.native_batched_prefills == 0


def test_native_prefill_batch_checks_every_prompt(tmp_path: Path) -> None:
    _, folder = _tiny(tmp_path, "llama", intermediate_size=96)
    model = LLM.from_pretrained(folder, quant="int8").model
    decoder = model.native_decoder()
    vocab, width = model.cfg.vocab_size, decoder.dims.rotary_width
    caches = [model.new_cache(12), model.new_cache(12)]
    keys, values = [c.keys for c in caches], [c.values for c in caches]
    prompts = [list(range(3, 11)), list(range(5, 14))]  # 8 and 9 tokens
    cos, sin = torch.zeros(17, width), torch.zeros(17, width)
    logits = torch.empty(2, vocab)
    with pytest.raises(ValueError, match="at least one prompt"):
        decoder.prefill_batch([], [], [], [], cos[:0], sin[:0], logits[:0])
    with pytest.raises(ValueError, match="2 prompts, 1 starts, 2 key caches and 2 value caches"):
        decoder.prefill_batch(prompts, [0], keys, values, cos, sin, logits)
    with pytest.raises(IndexError, match=f"prompt 1: token id {vocab} is out of bounds"):
        decoder.prefill_batch([prompts[0], [*prompts[1][:-1], vocab]], [0, 0], keys, values, cos, sin, logits)
    with pytest.raises(IndexError, match=r"prompt 1: positions 4\.\.13 do not fit a KV cache of 12 positions"):
        decoder.prefill_batch(prompts, [0, 4], keys, values, cos, sin, logits)
    with pytest.raises(IndexError, match="must not be negative"):
        decoder.prefill_batch(prompts, [0, -1], keys, values, cos, sin, logits)
    with pytest.raises(ValueError, match=f"rotary cos rows must be a contiguous f32 CPU tensor of 17x{width}"):
        decoder.prefill_batch(prompts, [0, 0], keys, values, cos[:16], sin, logits)
    with pytest.raises(ValueError, match=f"logits must be a contiguous f32 CPU tensor of 2x{vocab}"):
        decoder.prefill_batch(prompts, [0, 0], keys, values, cos, sin, logits[:1])
    with pytest.raises(ValueError, match="sequence 1's keys and values share memory"):
        decoder.prefill_batch(prompts, [0, 0], keys, [values[0], keys[1]], cos, sin, logits)
    with pytest.raises(ValueError, match="prompt 0 has no tokens"):
        decoder.prefill_batch([[], prompts[1]], [0, 0], keys, values, cos[:9], sin[:9], logits)
