"""GGUF files run in their stored types (the default for a ``.gguf``): every matrix read in place from
the mapped file, against ``transformers`` on the same weights (``gguf``'s dequantization of the stored
bytes), on tiny models whose matrices take every supported type, and against the fp32 model on the
shipped file."""

from __future__ import annotations

import itertools
import math
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, RopeScalingType, quants
from torchburn_native import ggml

from helpers import LLAMA3_ROPE_SCALING, YARN_ROPE_PARAMETERS
from torchburn_llm import LLM, ModelLoadError, memory
from torchburn_llm.gguf_file import _unpermute_rows

transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN, INTER = 300, 256, 512  # K-quant rows are whole blocks of 256
# where each K-quant block keeps its f16 factors, and their ranges for weights of about 0.1-0.5
K_FACTORS = {
    "Q4_K": ((0, 2), 2e-4, 1e-3),
    "Q5_K": ((0, 2), 1e-4, 5e-4),
    "Q6_K": ((208,), 5e-5, 2e-4),
    "Q2_K": ((80, 82), 1e-3, 5e-3),
    "Q3_K": ((108,), 1e-3, 4e-3),
    "IQ4_NL": ((0,), 1e-3, 4e-3),
    "IQ4_XS": ((0,), 2.5e-5, 1e-4),  # times a 6-bit scale (less 32) of each 32
    "TQ2_0": ((64,), 0.1, 0.3),  # a type not computed in as stored
}


def _store(kind: str, w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``w`` [n, k] stored as ``kind``: quantized by ``gguf``, or, for the K-quants, IQ4 and TQ2_0 (which
    ``gguf`` does not quantize), random well-formed blocks in its place. Returns the stored bytes [n, row bytes]."""
    qtype = GGMLQuantizationType[kind]
    if kind == "F32":
        return w.astype(np.float32).view(np.uint8)
    if kind == "F16":
        return w.astype(np.float16).view(np.uint8)
    if kind not in K_FACTORS:
        return quants.quantize(w.astype(np.float32), qtype)
    n, k = w.shape
    elements, nbytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, k // elements, nbytes), dtype=np.uint8)
    fields, low, high = K_FACTORS[kind]
    for at in fields:
        factor = rng.uniform(low, high, (n, k // elements)) * rng.choice([-1, 1], (n, k // elements))
        raw[:, :, at : at + 2] = factor.astype(np.float16)[..., None].view(np.uint8)
    return raw.reshape(n, -1)


def _dequantized(kind: str, raw: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
    return torch.from_numpy(np.asarray(quants.dequantize(raw, GGMLQuantizationType[kind]), dtype=np.float32)).reshape(
        shape
    )


HEAD_DIM = HIDDEN // 8
# per family: the transformers config class, the GGUF architecture, the config's own settings
GGUF_FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "llama", {}),
    # Llama 3.1's rescaled rotary rates, which llama.cpp's converter stores as a rope_freqs tensor; a
    # short original context so that most of the tiny model's rates are rescaled
    "llama3.1": (
        "LlamaConfig",
        "llama",
        {"rope_scaling": {**LLAMA3_ROPE_SCALING}},
    ),
    "qwen2": ("Qwen2Config", "qwen2", {"tie_word_embeddings": True}),
    # YaRN in llama.cpp's metadata (rope.scaling.type, factor, original_context_length)
    "qwen2_yarn": (
        "Qwen2Config",
        "qwen2",
        {"rope_parameters": {**YARN_ROPE_PARAMETERS}},
    ),
    # llama.cpp fixes Gemma 2's layers as windowed, global; its query scale as the head size's
    "gemma2": (
        "Gemma2Config",
        "gemma2",
        {
            "head_dim": HEAD_DIM,
            "query_pre_attn_scalar": HEAD_DIM,
            "sliding_window": 8,
            "attn_logit_softcapping": 4.0,
            "final_logit_softcapping": 3.0,
        },
    ),
    # two layers: both windowed, as llama.cpp's every-sixth-global pattern makes them
    "gemma3": (
        "Gemma3TextConfig",
        "gemma3",
        {"head_dim": HEAD_DIM, "query_pre_attn_scalar": HEAD_DIM, "sliding_window": 8},
    ),
    "phi3": ("Phi3Config", "phi3", {"pad_token_id": 0}),
}
# Hugging Face layer tensor -> GGUF, where a family names it otherwise than Llama
GGUF_PARTS: dict[str, dict[str, str]] = {
    "gemma2": {
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    },
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj.weight": "ffn_up.weight"},
}
GGUF_PARTS["gemma3"] = {
    **GGUF_PARTS["gemma2"],
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}


def _llama3_rate_divisors(scaling: dict[str, Any], base: float) -> np.ndarray:
    """What llama.cpp's converter writes for Llama 3.1: per rotary pair, the number its rate is divided
    by. Rates turning faster than the original context over high_freq_factor keep theirs, slower than
    it over low_freq_factor are divided by the factor, and those between blend the two."""
    low_wavelength = scaling["original_max_position_embeddings"] / scaling["low_freq_factor"]
    high_wavelength = scaling["original_max_position_embeddings"] / scaling["high_freq_factor"]
    divisors = []
    for i in range(0, HEAD_DIM, 2):
        wavelength = 2 * math.pi * base ** (i / HEAD_DIM)
        if wavelength < high_wavelength:
            divisors.append(1.0)
        elif wavelength > low_wavelength:
            divisors.append(scaling["factor"])
        else:
            smooth = (scaling["original_max_position_embeddings"] / wavelength - scaling["low_freq_factor"]) / (
                scaling["high_freq_factor"] - scaling["low_freq_factor"]
            )
            divisors.append(1 / ((1 - smooth) / scaling["factor"] + smooth))
    return np.array(divisors, dtype=np.float32)


def _tiny_gguf(tmp_path: Path, family: str, types: list[str]) -> tuple[Any, Path]:
    """A tiny ``family`` model (2 layers, grouped-query attention) written as GGUF with its matrices in
    ``types`` by turns, and the ``transformers`` model holding exactly the weights the file stores."""
    config_cls, arch, settings = GGUF_FAMILIES[family]
    config = getattr(transformers, config_cls)(
        **{
            "vocab_size": VOCAB,
            "hidden_size": HIDDEN,
            "intermediate_size": INTER,
            "num_hidden_layers": 2,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            **settings,
        }
    )
    gemma = family.startswith("gemma")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    rng = np.random.default_rng(0)
    heads = {"q_proj": 8, "k_proj": 2}
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    hf_parts = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
        **GGUF_PARTS.get(family, {}),
    }
    writer = GGUFWriter(tmp_path / f"{family}.gguf", arch)
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(8)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(1e6 if family == "gemma3" else 10000.0)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    if "sliding_window" in settings:
        writer.add_sliding_window(settings["sliding_window"])
    if "attn_logit_softcapping" in settings:
        writer.add_attn_logit_softcapping(settings["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(settings["final_logit_softcapping"])
    if "rope_scaling" in settings:
        writer.add_tensor("rope_freqs.weight", _llama3_rate_divisors(settings["rope_scaling"], 10000.0))
    if settings.get("rope_parameters", {}).get("rope_type") == "yarn":
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(settings["rope_parameters"]["factor"])
        writer.add_rope_scaling_orig_ctx_len(settings["rope_parameters"]["original_max_position_embeddings"])
    writer.add_tokenizer_model("gpt2")
    letters = ["t", *"0123456789"]
    writer.add_token_list(letters + [f"t{i}" for i in range(VOCAB - len(letters))])
    writer.add_token_merges(["t 0"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    kinds = itertools.cycle(types)
    state = model.state_dict()
    with torch.no_grad():
        for hf, value in state.items():
            if config.tie_word_embeddings and hf == "lm_head.weight":
                continue  # tied
            if hf in names:
                name = names[hf]
            else:
                layer, part = hf.removeprefix("model.layers.").split(".", 1)
                stem = next(v for p, v in hf_parts.items() if part.startswith(p.removesuffix(".weight")))
                name = f"blk.{layer}.{stem}" + ("" if stem.endswith(".weight") else part[part.rindex(".") :])
            w = value.detach().clone()
            if w.dim() == 1:
                w = w.normal_(0.0 if gemma or "norm" not in hf else 1.0, 0.1)
                # Gemma's norms scale by 1 + w; llama.cpp's converter stores the sum
                writer.add_tensor(name, (w + 1 if gemma and "norm" in hf else w).numpy().astype(np.float32))
                value.copy_(w)
                continue
            w.normal_(0, 0.2)
            proj = next((p for p in heads if p in hf), None)
            if arch == "llama" and proj is not None:  # llama.cpp's per-head row order for its rotary pairs
                rows = w.shape[0]
                w = w.reshape(heads[proj], 2, rows // heads[proj] // 2, -1).transpose(1, 2).reshape(rows, -1)
            kind = next(kinds)
            raw = _store(kind, w.numpy(), rng)
            writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType[kind])
            stored = _dequantized(kind, raw, tuple(w.shape))
            if arch == "llama" and proj is not None:
                stored = _unpermute_rows(stored, heads[proj])
            value.copy_(stored)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tmp_path / f"{family}.gguf"


@pytest.mark.parametrize("family", sorted(GGUF_FAMILIES))
def test_every_stored_type_matches_transformers(tmp_path: Path, family: str) -> None:
    reference, path = _tiny_gguf(tmp_path, family, list(ggml.TYPES))
    llm = LLM.from_pretrained(path)
    model = llm.model
    assert model.quant == "stored"
    linears = [model.lm_head] + [
        getattr(layer, p) for layer in model.layers for p in ("q", "k", "v", "o", "gate", "up", "down")
    ]
    assert all(lin.stored is not None and lin.weight is None for lin in linears)
    # the file's matrices took the types by turns (Phi-3's fused ones: fewer matrices than types)
    matrices = [n for n, w in reference.state_dict().items() if w.dim() == 2]
    matrices = [n for n in matrices if not (reference.config.tie_word_embeddings and n == "lm_head.weight")]
    want_kinds = set(itertools.islice(itertools.cycle(ggml.TYPES), len(matrices)))
    assert {lin.quant for lin in linears} | {model.embed.kind} == want_kinds  # type: ignore[union-attr]
    ids = torch.randint(3, VOCAB, (24,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = reference(ids[None]).logits[0]  # [T, V]
    cache = model.new_cache(64)
    prefill = model.forward(ids[:16], cache)  # native prefill
    steps = torch.cat([model.forward(ids[i : i + 1], cache) for i in range(16, 24)])  # native decode
    assert model.native_prefills == 1 and model.native_steps == 8
    got = torch.cat([prefill, steps])
    # the same weights; only the activations' int8 rounding (per block, as llama.cpp's) differs
    scale = float(want.abs().max())
    diff = (got - want).abs()
    assert float(diff.max()) <= 0.05 * scale and float(diff.mean()) <= 0.01 * scale, (diff.max(), diff.mean(), scale)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


def test_native_and_tensor_paths_agree_on_stored_weights(tmp_path: Path) -> None:
    _, path = _tiny_gguf(tmp_path, "llama", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
    model = LLM.from_pretrained(path).model
    ids = torch.randint(3, VOCAB, (20,), generator=torch.Generator().manual_seed(2))
    runs = []
    for native in (True, False):
        model.native_decode = model.native_prefill = native
        cache = model.new_cache(32)
        first = model.forward(ids[:12], cache)
        runs.append(torch.cat([first, *(model.forward(ids[i : i + 1], cache) for i in range(12, 20))]))
    # the same kernels and activation rounding on both paths; only the order of f32 sums differs, which
    # can move an activation across an int8 step now and then: bound the few and the mean
    scale = float(runs[1].abs().max())
    diff = (runs[0] - runs[1]).abs()
    assert float(diff.max()) <= 0.02 * scale and float(diff.mean()) <= 2e-3 * scale, (diff.max(), diff.mean())


def test_types_not_computed_as_stored_run_dequantized_with_a_warning(tmp_path: Path) -> None:
    reference, path = _tiny_gguf(tmp_path, "qwen2", ["Q4_K", "TQ2_0"])
    with pytest.warns(UserWarning, match=r"of GGUF type\(s\) TQ2_0, which run dequantized to fp32"):
        llm = LLM.from_pretrained(path)
    kinds = {lin.quant for layer in llm.model.layers for lin in (layer.q, layer.down)}
    assert kinds == {"Q4_K", "fp32"}
    ids = torch.randint(3, VOCAB, (10,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = reference(ids[None]).logits[0]
    got = llm.model.forward(ids, llm.model.new_cache(16))
    assert float((got - want).abs().max()) <= 0.05 * float(want.abs().max())


def test_a_dequantization_larger_than_free_memory_is_refused_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, path = _tiny_gguf(tmp_path, "qwen2", ["Q4_K", "TQ2_0"])
    monkeypatch.setattr(memory, "available_bytes", lambda: 10_000)  # a machine with 10 kB to spare
    with pytest.warns(UserWarning), pytest.raises(ModelLoadError, match=r"dequantizing \d+ tensors to fp32 needs"):
        LLM.from_pretrained(path)
    with pytest.raises(ModelLoadError, match="use a file whose matrices are of types computed in as stored"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            LLM.from_pretrained(path)
    with pytest.raises(ModelLoadError, match=r"quant='stored' .* keeps its matrices as stored"):
        LLM.from_pretrained(path, quant="fp32")


def test_a_folder_larger_than_free_memory_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference, _ = _tiny_gguf(tmp_path, "qwen2", ["F32"])
    folder = tmp_path / "hf"
    reference.save_pretrained(folder, safe_serialization=True)
    monkeypatch.setattr(memory, "available_bytes", lambda: 10_000)
    for quant in ("fp32", "int4"):
        with pytest.raises(ModelLoadError, match=rf"holding its \d+ tensors in {quant} needs"):
            LLM.from_pretrained(folder, quant=quant)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 30)
    assert LLM.from_pretrained(folder).config.hidden_size == HIDDEN


def test_a_folder_is_converted_one_tensor_at_a_time(tmp_path: Path) -> None:
    from torchburn_llm import loader
    from torchburn_llm.architectures import architecture_for
    from torchburn_llm.config import ModelConfig
    from torchburn_llm.model import Transformer
    from torchburn_llm.weights import SafetensorsCheckpoint

    reference, _ = _tiny_gguf(tmp_path, "phi3", ["F32"])  # fused matrices, read under their parts' names
    folder = tmp_path / "hf"
    reference.save_pretrained(folder, safe_serialization=True)
    cfg = ModelConfig.from_dict(reference.config.to_dict())
    arch = architecture_for(cfg.model_type)
    checkpoint = SafetensorsCheckpoint(folder)
    names = [n for n in checkpoint.shapes if n in arch.tensors(cfg) or n == "lm_head.weight"]
    reads: list[str] = []
    lazy = loader._lazy_tensors(arch, cfg, checkpoint, names, None)
    original = lazy._read
    lazy._read = lambda name: reads.append(name) or original(name)  # type: ignore[method-assign]
    model = Transformer(arch, cfg, lazy, "int4")
    # every projection was read once and converted; only what the model keeps in fp32 stays alive
    projections = [n for n in lazy if n.endswith("_proj.weight")]
    assert sorted(n for n in reads if n.endswith("_proj.weight")) == sorted(projections)
    assert not [n for n in lazy._alive if n.endswith("_proj.weight")]
    assert "model.embed_tokens.weight" in lazy._alive
    # and it is the model the whole checkpoint read at once gives, bit for bit; in fp32, transformers'
    ids = torch.randint(3, VOCAB, (10,), generator=torch.Generator().manual_seed(5))
    whole = arch.shift_norms(arch.split_fused(cfg, checkpoint.load(names)))
    got = model.forward(ids, model.new_cache(16))
    assert torch.equal(got, Transformer(arch, cfg, whole, "int4").forward(ids, model.new_cache(16)))
    fp32 = Transformer(arch, cfg, loader._lazy_tensors(arch, cfg, checkpoint, names, None), "fp32")
    with torch.no_grad():
        want = reference(ids[None]).logits[0]
    torch.testing.assert_close(fp32.forward(ids, fp32.new_cache(16)), want, rtol=1e-4, atol=1e-4)


def test_free_memory_is_read_from_the_system() -> None:
    import psutil

    got, want = memory.available_bytes(), psutil.virtual_memory().available
    assert got is not None and abs(got - want) <= 0.1 * want


def test_the_shipped_file_runs_as_stored_and_tracks_fp32(smollm2_path: Path, smollm2: LLM) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every matrix of the file is computed in as stored
        stored = LLM.from_pretrained(smollm2_path)
    model = stored.model
    assert model.quant == "stored" and isinstance(model.embed, ggml.GgmlMatrix)
    kinds = {getattr(layer, p).quant for layer in model.layers for p in ("q", "k", "v", "o", "gate", "up", "down")}
    assert kinds == {"Q4_1"} and model.lm_head.quant == "Q8_0"  # tied to the Q8_0 embedding
    # the weights read per token are the file's bytes: nothing dequantized or copied
    assert model.weight_bytes < smollm2_path.stat().st_size < 1.2 * model.weight_bytes
    ids = stored.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4).ids
    ids_t = torch.tensor(ids)
    got = model.forward(ids_t, model.new_cache(len(ids)))
    want = smollm2.model.forward(ids_t, smollm2.model.new_cache(len(ids)))
    # int8 activations (llama.cpp's rounding) move a 30-layer model's logits by about 1% of their range:
    # rounding fp32 activations the same way in Python moves them as far, so bound that, not less
    scale = float(want.abs().max())
    diff = (got - want).abs()
    assert float(diff.mean()) <= 0.015 * scale and float(diff.max()) <= 0.1 * scale, (diff.mean(), diff.max())
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


def test_a_folder_refuses_stored(tmp_path: Path) -> None:
    reference, _ = _tiny_gguf(tmp_path, "qwen2", ["F32"])
    folder = tmp_path / "hf"
    reference.save_pretrained(folder, safe_serialization=True)
    with pytest.raises(ValueError, match="keeps a GGUF file's own types"):
        LLM.from_pretrained(folder, quant="stored")


@pytest.mark.parametrize("family", ["gemma2", "phi3", "llama3.1"])
def test_converted_quants_of_other_families_read_their_layout(tmp_path: Path, family: str) -> None:
    # the dequantizing path: Gemma's stored norm sums, Phi-3's fused matrices split after loading, and
    # Llama 3.1's stored rotary rate divisors
    reference, path = _tiny_gguf(tmp_path, family, ["F32"])
    model = LLM.from_pretrained(path, quant="fp32").model
    ids = torch.randint(3, VOCAB, (12,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = reference(ids[None]).logits[0]
    cache = model.new_cache(16)
    got = torch.cat([model.forward(ids[:8], cache), *(model.forward(ids[i : i + 1], cache) for i in range(8, 12))])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_bad_rotary_scaling_metadata_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    this = sys.modules[__name__]
    for sub in ("short", "zero", "yarn"):
        (tmp_path / sub).mkdir()
    # Llama 3.1's divisors of the wrong length, and zero
    monkeypatch.setattr(this, "_llama3_rate_divisors", lambda *_: np.ones(3, np.float32))
    _, path = _tiny_gguf(tmp_path / "short", "llama3.1", ["F32"])
    with pytest.raises(ModelLoadError, match=r"rope_freqs.weight must be an f32 vector of \d+ factors"):
        LLM.from_pretrained(path)
    monkeypatch.setattr(this, "_llama3_rate_divisors", lambda *_: np.zeros(HEAD_DIM // 2, np.float32))
    _, path = _tiny_gguf(tmp_path / "zero", "llama3.1", ["F32"])
    with pytest.raises(ModelLoadError, match=r"rope_freqs must be a finite number above 0"):
        LLM.from_pretrained(path)
    # YaRN without its original context length
    monkeypatch.setattr(GGUFWriter, "add_rope_scaling_orig_ctx_len", lambda *_: None)
    _, path = _tiny_gguf(tmp_path / "yarn", "qwen2_yarn", ["F32"])
    with pytest.raises(ModelLoadError, match=r"'yarn' needs qwen2\.rope\.scaling\.original_context_length"):
        LLM.from_pretrained(path)
