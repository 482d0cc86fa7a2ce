"""Parity with ``transformers`` in fp32 on tiny random models of every registered family: the same
logits for a prompt, for every decode step of the native decoder, and the same 32-token greedy
continuation through the KV cache; and the native decode and prefill of quantized weights against the
tensor-code path on the same weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers import LLAMA3_ROPE_SCALING, YARN_ROPE_PARAMETERS  # noqa: E402
from torchburn_llm import LLM  # noqa: E402

COMMON: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 112,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"tie_word_embeddings": True, "rope_theta": 10000.0}),
    "llama3_rope_scaling": (
        "LlamaConfig",
        {
            "rope_theta": 500000.0,
            "rope_scaling": {**LLAMA3_ROPE_SCALING},
        },
    ),
    "llama_attention_bias": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
    "mistral_window": ("MistralConfig", {"sliding_window": 8}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": False}),
    "gemma": ("GemmaConfig", {"head_dim": 16, "tie_word_embeddings": True}),
    # logit caps small enough to bend the scores; queries scaled by another size than the head's;
    # layer 0 windowed, layer 1 global
    "gemma2": (
        "Gemma2Config",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": 8,
            "attn_logit_softcapping": 4.0,
            "final_logit_softcapping": 3.0,
        },
    ),
    # windowed layer 0 rotating at its own base, global layer 1 at another, linearly scaled
    "gemma3": (
        "Gemma3TextConfig",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
            },
        },
    ),
    "phi3": ("Phi3Config", {"pad_token_id": 0}),
    # YaRN as Qwen2.5 documents it for long contexts: rates blended between kept and divided by 4,
    # the rotation scaled up (an original context of 32 so that the blend spans the tiny heads)
    "qwen2_yarn": (
        "Qwen2Config",
        {"rope_parameters": {**YARN_ROPE_PARAMETERS}},
    ),
    # half of each head rotated, longrope's short factors and attention factor (contexts up to 128)
    "phi3_longrope_partial": (
        "Phi3Config",
        {
            "pad_token_id": 0,
            "head_dim": 16,
            "max_position_embeddings": 256,
            "original_max_position_embeddings": 128,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.5, 2.0, 3.0],
                "long_factor": [2.0, 4.0, 8.0, 16.0],
            },
        },
    ),
}


def _tiny(tmp_path: Path, family: str, **overrides: Any) -> tuple[Any, Path]:
    config_cls, extra = FAMILIES[family]
    config = getattr(transformers, config_cls)(**{**COMMON, **extra, **overrides})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # larger than the default init, so logits are far from ties
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.normal_(1.0 if p.shape[0] == COMMON["hidden_size"] else 0, 0.1)
    folder = tmp_path / family
    model.save_pretrained(folder, safe_serialization=True)
    return model, folder


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_and_greedy_continuation_match_transformers(tmp_path: Path, family: str) -> None:
    reference, folder = _tiny(tmp_path, family)
    llm = LLM.from_pretrained(folder)
    assert reference.config.model_type in llm.architecture.model_types
    prompt = torch.randint(3, COMMON["vocab_size"], (12,), generator=torch.Generator().manual_seed(1))

    with torch.no_grad():
        want = reference(prompt[None]).logits[0]
    got = llm.model.forward(prompt, llm.model.new_cache(64))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    with torch.no_grad():
        ref_ids = reference.generate(
            prompt[None], max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :].tolist()
    llm.config = llm.config.__class__(**{**llm.config.__dict__, "eos_token_ids": ()})  # 32 tokens, no early stop
    assert llm.generate_ids(prompt.tolist(), max_new_tokens=32) == ref_ids


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_native_decode_steps_match_transformers(tmp_path: Path, family: str) -> None:
    # 8 heads over 96 positions: past 64 the decoder runs the heads in parallel (512 head-positions);
    # transformers sizes longrope's factors by hidden / heads, which 8 heads would change
    heads = 4 if "longrope" in family else 8
    reference, folder = _tiny(tmp_path, family, num_attention_heads=heads)
    llm = LLM.from_pretrained(folder)
    ids = torch.randint(3, COMMON["vocab_size"], (96,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = reference(ids[None]).logits[0]  # [96, V]
    model = llm.model
    cache = model.new_cache(128)
    model.forward(ids[:4], cache)  # prefill, then one native step per token (past Mistral's window of 8)
    got = torch.cat([model.forward(ids[i : i + 1], cache) for i in range(4, 96)])
    assert model.native_steps == 92
    torch.testing.assert_close(got, want[4:], rtol=1e-4, atol=1e-4)


def test_longrope_switches_to_the_long_factors_past_the_original_context(tmp_path: Path) -> None:
    # 140 positions in one pass: past the original 128, transformers rotates every position of that
    # pass with the long factors; so do both of the runtime's paths
    reference, folder = _tiny(tmp_path, "phi3_longrope_partial")
    model = LLM.from_pretrained(folder, quant="fp32").model
    ids = torch.randint(3, COMMON["vocab_size"], (140,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = reference(ids[None]).logits[0]
        short = reference(ids[None, :100]).logits[0]
    assert not torch.allclose(want[:100], short, atol=1e-3)  # the factors change the result
    for native in (False, True):
        model.native_prefill = native
        got = model.forward(ids, model.new_cache(160))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("family", ["llama_attention_bias", "qwen3"])
def test_native_decode_of_quantized_weights_matches_the_tensor_path(tmp_path: Path, family: str, quant: str) -> None:
    _, folder = _tiny(tmp_path, family, intermediate_size=96)  # quantized rows are whole blocks of 32
    model = LLM.from_pretrained(folder, quant=quant).model
    ids = torch.randint(3, COMMON["vocab_size"], (20,), generator=torch.Generator().manual_seed(3))
    steps = []
    for native in (True, False):
        model.native_decode = native
        cache = model.new_cache(32)
        model.forward(ids[:4], cache)
        steps.append(torch.cat([model.forward(ids[i : i + 1], cache) for i in range(4, 20)]))
    assert model.native_steps == 16
    # the same quantized kernels on both paths; only the order of f32 sums differs. That can move an
    # activation across a rounding step, and one int8 step of a block (int4's activations, and the
    # output projection's under both formats) moves a few logits visibly: bound the few and the mean;
    # a wrong decoder moves all of them
    scale = float(steps[1].abs().max())
    diff = (steps[0] - steps[1]).abs()
    assert float(diff.max()) <= 0.02 * scale and float(diff.mean()) <= 2e-3 * scale, (diff.max(), diff.mean())
    assert (steps[0].argmax(-1) == steps[1].argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("quant", ["fp32", "bf16", "int8", "int4"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_native_prefill_matches_the_tensor_path(tmp_path: Path, family: str, quant: str) -> None:
    _, folder = _tiny(tmp_path, family, intermediate_size=96)
    model = LLM.from_pretrained(folder, quant=quant).model
    assert model.native_prefill == (quant != "fp32")
    ids = torch.randint(3, COMMON["vocab_size"], (100,), generator=torch.Generator().manual_seed(4))
    runs = []
    for native in (True, False):
        model.native_prefill = native
        cache = model.new_cache(128)
        # 70 tokens (three blocks of queries), then 30 after them in the cache (past Mistral's window
        # of 8 on both sides of the cut); then the last-token-only form of a third prompt
        logits = torch.cat([model.forward(ids[:70], cache), model.forward(ids[70:], cache)])
        last = model.forward(ids[:9], model.new_cache(16), last_only=True)
        runs.append((logits, last, cache.keys[:, :, :100].clone(), cache.values[:, :, :100].clone()))
    assert model.native_prefills == 3
    (logits, last, keys, values), (want, want_last, want_keys, want_values) = runs
    # the same weights and (quantized) products on both paths; only the order of f32 sums differs
    scale = float(want.abs().max())
    torch.testing.assert_close(logits, want, rtol=0, atol=1e-4 * scale)
    torch.testing.assert_close(last, want_last, rtol=0, atol=1e-4 * scale)
    torch.testing.assert_close(keys, want_keys, rtol=0, atol=1e-4 * float(want_keys.abs().max()))
    torch.testing.assert_close(values, want_values, rtol=0, atol=1e-4 * float(want_values.abs().max()))
    assert last.shape == (1, COMMON["vocab_size"])
