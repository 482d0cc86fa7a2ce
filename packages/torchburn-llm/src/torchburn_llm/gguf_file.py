"""Reading a ``.gguf`` file: its metadata as a model config, its tensors (dequantized) under Hugging
Face names, and its tokenizer and chat template.

llama.cpp's converter stores the q and k projections of Llama-architecture models with the rows of each
head reordered for its own rotary pairing (adjacent elements instead of first and second halves);
they are put back here, so the same forward pass serves both sources.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .checks import MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, real, shown, text, token_id, token_ids, whole
from .config import ModelConfig, RopeScaling, longrope_attention_factor, yarn_attention_factor
from .errors import ModelLoadError
from .gguf_header import GGUFHeader, TensorInfo

if TYPE_CHECKING:
    from torchburn_native.ggml import GgmlMatrix
    from torchburn_native.transformer import QMatrix

# GGUF architecture -> config.json model_type
ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
}
# Gemma 2/3 layers every how many are global (the rest windowed), as llama.cpp fixes them
GEMMA_GLOBAL_EVERY = {"gemma2": 2, "gemma3": 6}
# Gemma 2/3 27B scale queries by hidden / heads rather than the head size (llama.cpp tells them by depth)
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}

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


# where a family's layer tensors mean something else than Llama's
PER_LAYER_OF = {
    "gemma2": {
        "ffn_norm.weight": "pre_feedforward_layernorm.weight",
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    },
    "phi3": {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"},
}
PER_LAYER_OF["gemma3"] = PER_LAYER_OF["gemma2"]


def hf_name(gguf_name: str, arch: str = "llama") -> str:
    if gguf_name in TOP:
        return TOP[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk":
        name = PER_LAYER_OF.get(arch, {}).get(parts[2]) or PER_LAYER.get(parts[2])
        if name is not None:
            return f"model.layers.{parts[1]}.{name}"
    return gguf_name  # unknown: the strict check names it


# token texts that end a turn in the chat templates of the families in use (llama.cpp stops on the same)
TURN_ENDS = frozenset(
    {
        "<|eot_id|>",  # Llama 3
        "<|eom_id|>",  # Llama 3.1 tool calls
        "<|im_end|>",  # ChatML: Qwen, SmolLM
        "<|end|>",  # Phi-3
        "<end_of_turn>",  # Gemma
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
    }
)


class GGUFCheckpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.header = GGUFHeader(path)
        self.fields = self.header.fields
        arch = self.field("general.architecture")
        if arch not in ARCHITECTURES:
            raise ModelLoadError(
                f"{path}: GGUF architecture {shown(arch)} is not supported; supported: {', '.join(ARCHITECTURES)}"
            )
        self.arch = str(arch)
        self._tensors: dict[str, TensorInfo] = {}
        # Phi-3's longrope factors and Llama 3.1's rescaled frequencies: read into the config, not
        # weights of the forward pass
        self._rope_factors: dict[str, TensorInfo] = {}
        for t in self.header.tensors:
            if t.name in ("rope_factors_long.weight", "rope_factors_short.weight", "rope_freqs.weight"):
                self._rope_factors[t.name] = t
                continue
            name = hf_name(t.name, self.arch)
            if name in self._tensors:  # e.g. "token_embd.weight" and "model.embed_tokens.weight"
                raise ModelLoadError(f"{path}: tensors {self._tensors[name].name} and {t.name} are both {name}")
            self._tensors[name] = t
        # GGUF lists dimensions fastest first; torch shapes are the reverse
        self.shapes = {n: tuple(int(d) for d in reversed(t.dims)) for n, t in self._tensors.items()}
        self.config = self._config()

    def field(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def _config(self) -> ModelConfig:
        """The metadata as a config, each number checked under its GGUF key as :meth:`ModelConfig.from_dict`
        checks config.json's."""
        a, source = self.arch, str(self.path)

        def need(key: str) -> Any:
            value = self.field(key)
            if value is None:
                raise ModelLoadError(f"{source}: required GGUF metadata {key} is missing")
            return value

        tokens = self.field("tokenizer.ggml.tokens")
        if self.field(f"{a}.vocab_size") is not None:
            vocab = whole(self.field(f"{a}.vocab_size"), f"{a}.vocab_size", source, high=MAX_VOCAB)
        elif isinstance(tokens, list):
            vocab = whole(len(tokens), "the length of tokenizer.ggml.tokens", source, high=MAX_VOCAB)
        else:
            raise ModelLoadError(f"{source}: neither {a}.vocab_size nor tokenizer.ggml.tokens says the vocabulary size")
        if isinstance(tokens, list) and len(tokens) > vocab:
            raise ModelLoadError(
                f"{source}: tokenizer.ggml.tokens lists {len(tokens)} tokens, more than {a}.vocab_size {vocab}"
            )
        hidden = whole(need(f"{a}.embedding_length"), f"{a}.embedding_length", source)
        heads = whole(need(f"{a}.attention.head_count"), f"{a}.attention.head_count", source, high=MAX_HEADS)
        kv_key = f"{a}.attention.head_count_kv"
        kv_heads = whole(self.field(kv_key, heads), kv_key, source, high=MAX_HEADS)
        if heads % kv_heads:
            raise ModelLoadError(
                f"{source}: {a}.attention.head_count {heads} does not split into {kv_key} {kv_heads} "
                "(the KV heads must divide the attention heads)"
            )
        # Phi-3's rope.dimension_count is the rotated part of a head (Phi-4-mini: three quarters)
        head_keys = (f"{a}.attention.key_length",) + (() if a == "phi3" else (f"{a}.rope.dimension_count",))
        head_dim_key = next((k for k in head_keys if self.field(k) is not None), None)
        if head_dim_key is not None:
            head_dim = whole(self.field(head_dim_key), head_dim_key, source)
        elif hidden % heads:
            raise ModelLoadError(
                f"{source}: {a}.embedding_length {hidden} does not split into {a}.attention.head_count {heads} "
                f"and there is no {a}.attention.key_length to say the head size"
            )
        else:
            head_dim = hidden // heads
        if head_dim % 2:
            raise ModelLoadError(f"{source}: the head size must be even (rotary embeddings turn pairs), got {head_dim}")
        rotary_dim = None
        if a == "phi3" and self.field(f"{a}.rope.dimension_count") is not None:
            key = f"{a}.rope.dimension_count"
            rotary_dim = whole(self.field(key), key, source, high=head_dim)
            if rotary_dim % 2:
                raise ModelLoadError(f"{source}: {key} must be even (rotary embeddings turn pairs), got {rotary_dim}")
            rotary_dim = None if rotary_dim == head_dim else rotary_dim
        kind = self.field(f"{a}.rope.scaling.type", "none")
        scaling = RopeScaling()
        if "rope_freqs.weight" in self._rope_factors:
            scaling = self._frequency_factors(rotary_dim or head_dim)
        elif self._rope_factors:
            scaling = self._longrope(rotary_dim or head_dim)
        elif kind == "linear":
            factor_key = f"{a}.rope.scaling.factor"
            scaling = RopeScaling("linear", factor=real(need(factor_key), factor_key, source))
        elif kind == "yarn":
            scaling = self._yarn()
        elif kind != "none":
            raise ModelLoadError(
                f"{source}: rope scaling {shown(kind)} is not supported (supported: none, linear, yarn)"
            )
        layers = whole(need(f"{a}.block_count"), f"{a}.block_count", source, high=MAX_LAYERS)
        window_key = f"{a}.attention.sliding_window"
        window = self.field(window_key)
        windowed = None
        if a in GEMMA_GLOBAL_EVERY:
            every = GEMMA_GLOBAL_EVERY[a]
            windowed = tuple((i + 1) % every != 0 for i in range(layers))
        attn_scale = None
        if a in GEMMA_27B_LAYERS:
            attn_scale = (hidden / heads if layers == GEMMA_27B_LAYERS[a] else head_dim) ** -0.5

        def cap(key: str) -> float | None:
            value = self.field(f"{a}.{key}")
            return None if value is None else real(value, f"{a}.{key}", source)

        return ModelConfig(
            model_type=ARCHITECTURES[a],
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=whole(need(f"{a}.feed_forward_length"), f"{a}.feed_forward_length", source),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            max_position=whole(
                self.field(f"{a}.context_length", 2048), f"{a}.context_length", source, high=MAX_POSITIONS
            ),
            rms_eps=real(
                self.field(f"{a}.attention.layer_norm_rms_epsilon", 1e-6),
                f"{a}.attention.layer_norm_rms_epsilon",
                source,
                0.0,
                1.0,
            ),
            rope_theta=real(self.field(f"{a}.rope.freq_base", 10000.0), f"{a}.rope.freq_base", source),
            rope_scaling=scaling,
            tie_embeddings="lm_head.weight" not in self._tensors,
            attention_bias=ARCHITECTURES[a] == "llama" and "model.layers.0.self_attn.q_proj.bias" in self._tensors,
            bos_token_id=token_id(
                self.field("tokenizer.ggml.bos_token_id"), "tokenizer.ggml.bos_token_id", source, vocab
            ),
            eos_token_ids=self._end_of_generation(source, vocab),
            sliding_window=whole(window, window_key, source, high=MAX_POSITIONS) if window else None,
            activation="gelu_tanh" if a.startswith("gemma") else "silu",
            attn_scale=attn_scale,
            attn_softcap=cap("attn_logit_softcapping"),
            final_softcap=cap("final_logit_softcapping"),
            windowed_layers=windowed,
            local_rope_theta=10000.0 if a == "gemma3" else None,
            rotary_dim=rotary_dim,
        )

    def _end_of_generation(self, source: str, vocab: int) -> tuple[int, ...]:
        """The tokens that end an answer, as llama.cpp collects them: the file's EOS, end-of-turn and
        end-of-message ids, and the tokens that chat templates use to end a turn, found by their text
        (files often name only the base model's EOS: Gemma's ``<end_of_turn>`` or Llama 3's
        ``<|eot_id|>`` would otherwise run on into the next turn)."""
        ids: list[int] = []
        for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
            name = f"tokenizer.ggml.{key}"
            ids += token_ids(self.field(name), name, source, vocab)
        tokens = self.field("tokenizer.ggml.tokens")
        if isinstance(tokens, list):
            ids += [i for i, t in enumerate(tokens) if t in TURN_ENDS and i < vocab]
        return tuple(dict.fromkeys(ids))

    def _yarn(self) -> RopeScaling:
        """YaRN as llama.cpp's metadata gives it; the file's ``attn_factor`` multiplies YaRN's own scale
        of the rotation, as llama.cpp's rotation does."""
        a, source = self.arch, str(self.path)

        def key(name: str) -> str:
            return f"{a}.rope.scaling.{name}"

        def required(name: str) -> Any:
            value = self.field(key(name))
            if value is None:
                raise ModelLoadError(f"{source}: rope scaling 'yarn' needs {key(name)}, which is missing")
            return value

        factor = real(required("factor"), key("factor"), source)
        original = whole(
            required("original_context_length"), key("original_context_length"), source, high=MAX_POSITIONS
        )
        return RopeScaling(
            "yarn",
            factor=factor,
            original_max_position=original,
            attention_factor=real(self.field(key("attn_factor"), 1.0), key("attn_factor"), source)
            * yarn_attention_factor(factor),
            beta_fast=real(self.field(key("yarn_beta_fast"), 32.0), key("yarn_beta_fast"), source),
            beta_slow=real(self.field(key("yarn_beta_slow"), 1.0), key("yarn_beta_slow"), source),
        )

    def _factors(self, name: str, dim: int, required: str) -> tuple[float, ...]:
        """An f32 tensor of one positive factor per rotary pair."""
        source = str(self.path)
        t = self._rope_factors.get(name)
        if t is None or list(t.dims) != [dim // 2] or t.type != 0:  # F32
            raise ModelLoadError(f"{source}: {name} must be an f32 vector of {dim // 2} factors{required}")
        values = self.header.tensor_bytes(t, dim // 2 * 4, 1).view(np.float32).reshape(-1)
        return tuple(real(float(v), name.removesuffix(".weight"), source, 0.0) for v in values)

    def _frequency_factors(self, dim: int) -> RopeScaling:
        """Llama 3.1's rescaled rotary frequencies, which llama.cpp's converter stores precomputed as
        ``rope_freqs``: each pair's rate divided by its factor at every position. That is longrope's
        arithmetic with one set of factors for short and long contexts alike."""
        factors = self._factors("rope_freqs.weight", dim, "")
        return RopeScaling("longrope", short_factor=factors, long_factor=factors, original_max_position=MAX_POSITIONS)

    def _longrope(self, dim: int) -> RopeScaling:
        """Phi-3's longrope factors, stored as two f32 tensors of one factor per rotary pair."""
        a, source = self.arch, str(self.path)
        factors = {
            which: self._factors(f"rope_factors_{which}.weight", dim, " (both long and short present)")
            for which in ("long", "short")
        }
        original_key = f"{a}.rope.scaling.original_context_length"
        original = whole(self.field(original_key, 4096), original_key, source, high=MAX_POSITIONS)
        context = whole(self.field(f"{a}.context_length", original), f"{a}.context_length", source, high=MAX_POSITIONS)
        factor = context / original
        attention_key = f"{a}.rope.scaling.attn_factor"
        attention = self.field(attention_key)
        if attention is None:
            attention = longrope_attention_factor(factor, original)
        return RopeScaling(
            "longrope",
            factor=factor,
            original_max_position=original,
            short_factor=factors["short"],
            long_factor=factors["long"],
            attention_factor=real(attention, attention_key, source),
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

    def q4_1_weights(self, name: str) -> QMatrix | None:
        """The matrix ``name`` as native int4 weights taken straight from its Q4_1 blocks (q/k rows in
        Hugging Face order), or None when the file stores it in another type."""
        from gguf import GGMLQuantizationType
        from torchburn_native.transformer import from_q4_1

        t = self._tensors[name]
        if t.type != GGMLQuantizationType.Q4_1 or len(t.dims) != 2:
            return None
        _, raw = self._raw(name)  # [n, bytes of a row's blocks]
        blocks = self._hf_rows(name, torch.from_numpy(raw.copy())).contiguous()
        k, n = t.dims
        return from_q4_1(blocks, n, k)

    def type_name(self, name: str) -> str:
        """The GGUF type of tensor ``name`` (its number when the type is unknown)."""
        from gguf import GGMLQuantizationType

        t = self._tensors[name].type
        try:
            return GGMLQuantizationType(t).name
        except ValueError:
            return str(t)

    def computable_as_stored(self, name: str) -> bool:
        """Whether matrix ``name`` is of a type the kernels compute in as stored."""
        from torchburn_native.ggml import TYPES

        return self.type_name(name) in TYPES

    def stored(self, name: str, rows: tuple[int, int] | None = None) -> GgmlMatrix:
        """The matrix ``name`` in its stored type, read in place from the mapped file (Llama q/k rows
        read in Hugging Face order): no copy, no dequantization. ``rows``: only rows ``lo .. hi`` (one
        projection of a fused matrix)."""
        import warnings

        from torchburn_native.ggml import TYPES, lend

        t = self._tensors[name]
        kind, raw = self._raw(name)
        if len(t.dims) != 2 or kind.name not in TYPES:
            raise ModelLoadError(
                f"{self.path}: tensor {t.name} is {kind.name} of {len(t.dims)} dimensions; computed in as "
                f"stored are matrices of {', '.join(TYPES)} (pass another quant to convert)"
            )
        k, n = (int(d) for d in t.dims)
        if rows is not None:
            lo, hi = rows
            if not 0 <= lo < hi <= n or self._permuted(name):
                raise ModelLoadError(f"{self.path}: rows {lo}..{hi} of tensor {t.name} ({n} rows) cannot be lent")
            raw, n = raw[lo:hi], hi - lo
        order = None
        if self._permuted(name):
            heads = self.config.num_heads if "q_proj" in name else self.config.num_kv_heads
            order = _hf_row_order(n, heads)
        with warnings.catch_warnings():
            # the map is read-only and so is every use of the tensor: the kernels only read it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            data = torch.from_numpy(raw).reshape(-1)
        # a view of the file's read-only map: its pages go back once a regrouped copy holds them
        return lend(kind.name, data, n, k, order, file_mapped=True)

    def _raw(self, name: str) -> tuple[Any, np.ndarray]:
        """The tensor's GGUF type and its bytes, [rows, bytes per row] (a row: the fastest dimension)."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        t = self._tensors[name]
        try:
            kind = GGMLQuantizationType(t.type)
            block, block_bytes = GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise ModelLoadError(f"{self.path}: tensor {t.name} has unknown GGUF type {t.type}") from None
        # the header checked that rows are whole blocks and that the bytes lie inside the file
        return kind, self.header.tensor_bytes(t, t.dims[0] // block * block_bytes, math.prod(t.dims[1:]))

    def _permuted(self, name: str) -> bool:
        """Whether llama.cpp stores ``name``'s rows reordered (Llama's q and k, per head)."""
        return self.arch == "llama" and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight"))

    def _hf_rows(self, name: str, w: torch.Tensor) -> torch.Tensor:
        """``w``'s rows in Hugging Face order: llama.cpp reorders those of Llama q and k per head."""
        if self._permuted(name):
            return _unpermute_rows(w, self.config.num_heads if "q_proj" in name else self.config.num_kv_heads)
        return w

    def chat_template(self, name: str | None = None) -> str | None:
        """The file's chat template, or with ``name`` one of its named ones (``tool_use``: the template
        for requests with tools, as Hermes 2 Pro and Command-R ship one)."""
        key = "tokenizer.chat_template" + (f".{name}" if name else "")
        template = self.field(key)
        return None if template is None else text(template, key, str(self.path))


def _hf_row_order(rows: int, heads: int) -> list[int]:
    """For each Hugging Face row, the stored row it is (see :func:`_unpermute_rows`)."""
    return _unpermute_rows(torch.arange(rows), heads).tolist()


def _unpermute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head row order: it stores each head's rows as (half, pair) interleaved."""
    rows = w.shape[0]
    half = rows // heads // 2
    # stored [heads, half, 2, ...] -> original [heads, 2, half, ...]
    return w.reshape(heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
