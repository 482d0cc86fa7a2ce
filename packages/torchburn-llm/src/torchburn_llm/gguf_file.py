"""Reading a ``.gguf`` file: its metadata as a model config, its tensors (dequantized) under Hugging
Face names, and its tokenizer and chat template.

llama.cpp's converter stores the q and k projections of Llama-architecture models with the rows of each
head reordered for its own rotary pairing (adjacent elements instead of first and second halves);
they are put back here, so the same forward pass serves both sources.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import ModelConfig, RopeScaling
from .errors import ModelLoadError
from .gguf_header import GGUFHeader

# GGUF architecture -> config.json model_type
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
PER_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
for _g, _h in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o")):
    PER_LAYER[f"attn_{_g}.weight"] = f"self_attn.{_h}_proj.weight"
    PER_LAYER[f"attn_{_g}.bias"] = f"self_attn.{_h}_proj.bias"


def hf_name(gguf_name: str) -> str:
    if gguf_name in TOP:
        return TOP[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in PER_LAYER:
        return f"model.layers.{parts[1]}.{PER_LAYER[parts[2]]}"
    return gguf_name  # unknown: the strict check names it


class GGUFCheckpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.header = GGUFHeader(path)
        self.fields = self.header.fields
        self._tensors = {hf_name(t.name): t for t in self.header.tensors}
        # GGUF lists dimensions fastest first; torch shapes are the reverse
        self.shapes = {n: tuple(int(d) for d in reversed(t.dims)) for n, t in self._tensors.items()}
        arch = self.field("general.architecture")
        if arch not in ARCHITECTURES:
            raise ModelLoadError(
                f"{path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
            )
        self.arch = str(arch)
        self.config = self._config()

    def field(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def _config(self) -> ModelConfig:
        a = self.arch
        heads = int(self.field(f"{a}.attention.head_count"))
        hidden = int(self.field(f"{a}.embedding_length"))
        kind = self.field(f"{a}.rope.scaling.type", "none")
        scaling = RopeScaling()
        if kind == "linear":
            scaling = RopeScaling("linear", factor=float(self.field(f"{a}.rope.scaling.factor")))
        elif kind not in ("none", None):
            raise ModelLoadError(f"{self.path}: rope scaling {kind!r} is not supported")
        eos = self.field("tokenizer.ggml.eos_token_id")
        vocab = self.field(f"{a}.vocab_size") or len(self.field("tokenizer.ggml.tokens", ()))
        return ModelConfig(
            model_type=ARCHITECTURES[a],
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(self.field(f"{a}.feed_forward_length")),
            num_layers=int(self.field(f"{a}.block_count")),
            num_heads=heads,
            num_kv_heads=int(self.field(f"{a}.attention.head_count_kv", heads)),
            head_dim=int(
                self.field(f"{a}.attention.key_length", 0)
                or self.field(f"{a}.rope.dimension_count", 0)
                or hidden // heads
            ),
            max_position=int(self.field(f"{a}.context_length", 2048)),
            rms_eps=float(self.field(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(self.field(f"{a}.rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            tie_embeddings="lm_head.weight" not in self._tensors,
            attention_bias=ARCHITECTURES[a] == "llama" and "model.layers.0.self_attn.q_proj.bias" in self._tensors,
            bos_token_id=self.field("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (int(eos),),
        )

    def load(self, names: list[str], progress: Callable[[int, int], None] | None = None) -> dict[str, torch.Tensor]:
        """The named tensors as fp32 (quantized ones dequantized), q/k rows in Hugging Face order."""
        from gguf import quants

        out: dict[str, torch.Tensor] = {}
        for name in names:
            kind, raw = self._raw(name)
            try:
                data = np.asarray(quants.dequantize(raw, kind), dtype=np.float32)
            except NotImplementedError as exc:
                raise ModelLoadError(f"{self.path}: tensor {self._tensors[name].name}: {exc}") from None
            if not data.flags.writeable:  # f32 tensors are views of the read-only file
                data = data.copy()
            out[name] = self._hf_rows(name, torch.from_numpy(data.reshape(self.shapes[name])))
            if progress is not None:
                progress(len(out), len(names))
        return out

    def q4_1_weights(self, name: str) -> Any:
        """The matrix ``name`` as native int4 weights taken straight from its Q4_1 blocks (q/k rows in
        Hugging Face order), or None when the file stores it in another type."""
        from gguf import GGMLQuantizationType
        from torchburn_native import _native

        t = self._tensors[name]
        if t.type != GGMLQuantizationType.Q4_1 or len(t.dims) != 2:
            return None
        _, raw = self._raw(name)  # [n, bytes of a row's blocks]
        blocks = self._hf_rows(name, torch.from_numpy(raw.copy())).contiguous()
        k, n = t.dims
        return _native.QMatrix.from_q4_1(blocks.data_ptr(), n, k)

    def _raw(self, name: str) -> tuple[Any, np.ndarray]:
        """The tensor's GGUF type and its bytes, [rows, bytes per row] (a row: the fastest dimension)."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        t = self._tensors[name]
        try:
            kind = GGMLQuantizationType(t.type)
            block, block_bytes = GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise ModelLoadError(f"{self.path}: tensor {t.name} has unknown GGUF type {t.type}") from None
        row = t.dims[0] if t.dims else 1
        if row % block:
            raise ModelLoadError(f"{self.path}: tensor {t.name}'s rows of {row} are not whole blocks of {block}")
        rows = int(np.prod(t.dims[1:], dtype=np.int64))
        return kind, self.header.tensor_bytes(t, row // block * block_bytes, rows)

    def _hf_rows(self, name: str, w: torch.Tensor) -> torch.Tensor:
        """``w``'s rows in Hugging Face order: llama.cpp reorders those of Llama q and k per head."""
        if self.arch == "llama" and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            return _unpermute_rows(w, self.config.num_heads if "q_proj" in name else self.config.num_kv_heads)
        return w

    def chat_template(self) -> str | None:
        template = self.field("tokenizer.chat_template")
        return None if template is None else str(template)


def _unpermute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head row order: it stores each head's rows as (half, pair) interleaved."""
    rows = w.shape[0]
    half = rows // heads // 2
    # stored [heads, half, 2, ...] -> original [heads, 2, half, ...]
    return w.reshape(heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
