"""A checkpoint's ``config.json``, read into the numbers the runtime needs (and checked)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checks import MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, flag, real, shown, text, token_id, token_ids, whole
from .errors import ModelLoadError
from .files import read_json_object

# the MLP activations the runtime computes, by the names configs give them
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
# families whose configs name the activation ``hidden_activation`` and default it to tanh-GELU
GEMMA_TYPES = ("gemma", "gemma2", "gemma3_text")


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are rescaled for long contexts: ``none``, ``linear``, ``llama3``,
    ``longrope`` (Phi-3: per-frequency factors, ``short_factor`` up to ``original_max_position`` and
    ``long_factor`` beyond, the rotation scaled by ``attention_factor``) or ``yarn`` (Qwen2.5's long
    contexts, DeepSeek: rates blended between kept and divided by ``factor``, the rotation scaled by
    ``attention_factor``)."""

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0
    # YaRN: rates turning more than beta_fast times over the original context keep theirs, fewer than
    # beta_slow times are divided by the factor, those between blend linearly (by pair index)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position: int
    rms_eps: float
    rope_theta: float
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None  # attend to at most this many previous positions (Mistral)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    activation: str = "silu"  # the gated MLP's: "silu" or "gelu_tanh"
    attn_scale: float | None = None  # scores are q·k times this; None: 1/sqrt(head_dim)
    attn_softcap: float | None = None  # scores become cap·tanh(s/cap) (Gemma 2)
    final_softcap: float | None = None  # so do the logits
    # which layers the sliding window limits (None: every layer); the others attend to everything
    windowed_layers: tuple[bool, ...] | None = None
    # Gemma 3: the windowed layers rotate at their own base, unscaled
    local_rope_theta: float | None = None
    rotary_dim: int | None = None  # only the first this many elements of a head rotate (None: all)

    @property
    def rotary_width(self) -> int:
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    def windowed(self, layer: int) -> bool:
        """Whether the sliding window limits ``layer``'s attention."""
        return self.sliding_window is not None and (self.windowed_layers is None or self.windowed_layers[layer])

    @staticmethod
    def from_file(path: Path) -> ModelConfig:
        """``config.json`` at ``path`` (which must lie inside its folder, symlinks resolved)."""
        return ModelConfig.from_dict(read_json_object(path, path.parent), source=str(path))

    @staticmethod
    def from_dict(raw: dict[str, Any], source: str = "config") -> ModelConfig:
        """Every number checked (type and range) and every relation between them (heads split into KV
        heads, the hidden size into heads, EOS ids inside the vocabulary) before anything is sized by it."""

        def need(key: str) -> Any:
            if raw.get(key) is None:
                raise ModelLoadError(f"{source}: required key {key!r} is missing")
            return raw[key]

        def optional(key: str, default: Any) -> Any:
            return default if raw.get(key) is None else raw[key]

        vocab = whole(need("vocab_size"), "vocab_size", source, high=MAX_VOCAB)
        hidden = whole(need("hidden_size"), "hidden_size", source)
        heads = whole(need("num_attention_heads"), "num_attention_heads", source, high=MAX_HEADS)
        kv_heads = whole(optional("num_key_value_heads", heads), "num_key_value_heads", source, high=MAX_HEADS)
        if heads % kv_heads:
            raise ModelLoadError(
                f"{source}: num_attention_heads {heads} do not split into num_key_value_heads {kv_heads} "
                "(the KV heads must divide the attention heads)"
            )
        if raw.get("head_dim") is None and hidden % heads:
            raise ModelLoadError(
                f"{source}: hidden_size {hidden} does not split into num_attention_heads {heads} "
                "and there is no head_dim to say the head size"
            )
        head_dim = whole(optional("head_dim", hidden // heads), "head_dim", source)
        if head_dim % 2:
            raise ModelLoadError(f"{source}: head_dim must be even (rotary embeddings turn pairs), got {head_dim}")
        model_type = text(need("model_type"), "model_type", source)
        layers = whole(need("num_hidden_layers"), "num_hidden_layers", source, high=MAX_LAYERS)
        # older exports: top-level rope_theta + rope_scaling; newer: one rope_parameters object, or one
        # per kind of layer (Gemma 3)
        rope_key = "rope_parameters" if raw.get("rope_parameters") else "rope_scaling"
        rope = raw.get(rope_key)
        if rope is not None and not isinstance(rope, dict):
            raise ModelLoadError(f"{source}: {rope_key} must be an object, got {shown(rope)}")
        local_rope: Any = None
        if rope is not None and "full_attention" in rope:
            local_rope = rope.get("sliding_attention")
            rope, rope_key = rope["full_attention"], f"{rope_key}.full_attention"
            if not isinstance(rope, dict) or not (local_rope is None or isinstance(local_rope, dict)):
                raise ModelLoadError(f"{source}: {rope_key} and its sliding_attention must be objects")
        theta = raw.get("rope_theta")
        if theta is None and rope is not None:
            theta = rope.get("rope_theta")
        local_theta = raw.get("rope_local_base_freq")
        if local_theta is None and local_rope is not None:
            if (local_rope.get("rope_type") or "default") != "default":
                raise ModelLoadError(f"{source}: rope scaling of the sliding-window layers is not supported")
            local_theta = local_rope.get("rope_theta")
        if local_theta is None and model_type == "gemma3_text":
            local_theta = 10000.0
        window: Any = raw.get("sliding_window")
        if not flag(raw.get("use_sliding_window"), "use_sliding_window", source, default=True):
            window = None  # Qwen2 carries a window it does not use by default
        partial = raw.get("partial_rotary_factor")
        if partial is None and rope is not None:
            partial = rope.get("partial_rotary_factor")
        rotary_dim = None
        if partial is not None and real(partial, "partial_rotary_factor", source, 0.0, 1.0) < 1.0:
            rotary_dim = int(head_dim * partial)
            if rotary_dim < 2 or rotary_dim % 2:
                raise ModelLoadError(
                    f"{source}: partial_rotary_factor {partial} of head_dim {head_dim} rotates {rotary_dim} "
                    "elements; rotary embeddings need an even count of at least 2"
                )
        max_position = whole(
            optional("max_position_embeddings", 2048), "max_position_embeddings", source, high=MAX_POSITIONS
        )
        scalar = raw.get("query_pre_attn_scalar")
        return ModelConfig(
            model_type=model_type,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=whole(need("intermediate_size"), "intermediate_size", source),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            max_position=max_position,
            rms_eps=real(optional("rms_norm_eps", 1e-6), "rms_norm_eps", source, 0.0, 1.0),
            rope_theta=real(10000.0 if theta is None else theta, "rope_theta", source),
            rope_scaling=_rope_scaling(rope, rope_key, source, raw, max_position, rotary_dim or head_dim),
            tie_embeddings=flag(raw.get("tie_word_embeddings"), "tie_word_embeddings", source),
            attention_bias=flag(raw.get("attention_bias"), "attention_bias", source),
            mlp_bias=flag(raw.get("mlp_bias"), "mlp_bias", source),
            # 0, like null, means no window
            sliding_window=whole(window, "sliding_window", source, high=MAX_POSITIONS) if window else None,
            bos_token_id=token_id(raw.get("bos_token_id"), "bos_token_id", source, vocab),
            eos_token_ids=token_ids(raw.get("eos_token_id"), "eos_token_id", source, vocab),
            activation=_activation(raw, model_type, source),
            attn_scale=None if scalar is None else real(scalar, "query_pre_attn_scalar", source) ** -0.5,
            attn_softcap=_cap(raw.get("attn_logit_softcapping"), "attn_logit_softcapping", source),
            final_softcap=_cap(raw.get("final_logit_softcapping"), "final_logit_softcapping", source),
            windowed_layers=_windowed_layers(raw, model_type, layers, source),
            local_rope_theta=None if local_theta is None else real(local_theta, "rope_local_base_freq", source),
            rotary_dim=rotary_dim,
        )


def longrope_attention_factor(factor: float, original: int) -> float:
    """Longrope's default scale of the rotation for a context ``factor`` times the original length."""
    return math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0


def _activation(raw: dict[str, Any], model_type: str, source: str) -> str:
    """The gated MLP's activation. Gemma configs name it ``hidden_activation`` (their ``hidden_act``,
    where present, is an older field ``transformers`` ignores for them)."""
    key = "hidden_activation" if model_type in GEMMA_TYPES else "hidden_act"
    name = raw.get(key) or ("gelu_pytorch_tanh" if model_type in GEMMA_TYPES else "silu")
    if name not in ACTIVATIONS:
        raise ModelLoadError(
            f"{source}: {key} {shown(name)} is not supported (supported: {', '.join(sorted(ACTIVATIONS))})"
        )
    return ACTIVATIONS[name]


def _cap(value: Any, key: str, source: str) -> float | None:
    return None if value is None else real(value, key, source)


def _windowed_layers(raw: dict[str, Any], model_type: str, layers: int, source: str) -> tuple[bool, ...] | None:
    """Which layers the sliding window limits: ``layer_types`` where the config lists them, else the
    family's fixed pattern (Gemma 2: every other layer from the first; Gemma 3: all but every
    ``sliding_window_pattern``-th); None: every layer."""
    kinds = raw.get("layer_types")
    if kinds is not None:
        allowed = ("sliding_attention", "full_attention")
        if not isinstance(kinds, list) or len(kinds) != layers or any(k not in allowed for k in kinds):
            raise ModelLoadError(f"{source}: layer_types must list {layers} entries, each one of {', '.join(allowed)}")
        return tuple(k == "sliding_attention" for k in kinds)
    if model_type == "gemma2":
        return tuple(i % 2 == 0 for i in range(layers))
    if model_type == "gemma3_text":
        pattern = whole(raw.get("sliding_window_pattern", 6), "sliding_window_pattern", source)
        return tuple((i + 1) % pattern != 0 for i in range(layers))
    return None


def _rope_scaling(
    raw: dict[str, Any] | None, key: str, source: str, config: dict[str, Any], max_position: int, dim: int
) -> RopeScaling:
    if not raw:
        return RopeScaling()
    kind = raw.get("rope_type") or raw.get("type") or "default"
    if kind == "default":
        return RopeScaling()

    def need(name: str) -> Any:
        if raw.get(name) is None:
            raise ModelLoadError(f"{source}: {key} of type {shown(kind)} needs {name!r}, which is missing")
        return raw[name]

    if kind == "linear":
        return RopeScaling("linear", factor=real(need("factor"), f"{key}.factor", source))
    if kind == "llama3":
        low = real(raw.get("low_freq_factor", 1.0), f"{key}.low_freq_factor", source)
        high = real(raw.get("high_freq_factor", 4.0), f"{key}.high_freq_factor", source)
        if high <= low:  # the blend between them divides by their difference
            raise ModelLoadError(f"{source}: {key}.high_freq_factor ({high:g}) must be above low_freq_factor ({low:g})")
        original = raw.get("original_max_position_embeddings", 8192)
        return RopeScaling(
            "llama3",
            factor=real(need("factor"), f"{key}.factor", source),
            low_freq_factor=low,
            high_freq_factor=high,
            original_max_position=whole(
                original, f"{key}.original_max_position_embeddings", source, high=MAX_POSITIONS
            ),
        )
    if kind in ("longrope", "su"):
        original = whole(
            raw.get("original_max_position_embeddings")
            or config.get("original_max_position_embeddings")
            or max_position,
            "original_max_position_embeddings",
            source,
            high=MAX_POSITIONS,
        )
        factors = {}
        for name in ("short_factor", "long_factor"):
            values = need(name)
            if not isinstance(values, list) or len(values) != dim // 2:
                raise ModelLoadError(f"{source}: {key}.{name} must list {dim // 2} numbers (one per rotary pair)")
            factors[name] = tuple(real(v, f"{key}.{name}", source) for v in values)
        factor = raw.get("factor")
        factor = max_position / original if factor is None else real(factor, f"{key}.factor", source)
        attention = raw.get("attention_factor")
        if attention is None:
            attention = longrope_attention_factor(factor, original)
        return RopeScaling(
            "longrope",
            factor=factor,
            original_max_position=original,
            short_factor=factors["short_factor"],
            long_factor=factors["long_factor"],
            attention_factor=real(attention, f"{key}.attention_factor", source),
        )
    if kind == "yarn":
        original = whole(
            raw.get("original_max_position_embeddings") or max_position,
            f"{key}.original_max_position_embeddings",
            source,
            high=MAX_POSITIONS,
        )
        factor = raw.get("factor")
        factor = max_position / original if factor is None else real(factor, f"{key}.factor", source)
        attention = raw.get("attention_factor")
        if attention is None:
            mscale, mscale_all = raw.get("mscale"), raw.get("mscale_all_dim")
            if mscale and mscale_all:
                top = real(mscale, f"{key}.mscale", source)
                bottom = real(mscale_all, f"{key}.mscale_all_dim", source)
                attention = yarn_attention_factor(factor, top) / yarn_attention_factor(factor, bottom)
            else:
                attention = yarn_attention_factor(factor)
        truncate = raw.get("truncate", True)
        if not isinstance(truncate, bool):
            raise ModelLoadError(f"{source}: {key}.truncate must be true or false, got {shown(truncate)}")
        fast = real(raw.get("beta_fast") or 32.0, f"{key}.beta_fast", source)
        slow = real(raw.get("beta_slow") or 1.0, f"{key}.beta_slow", source)
        return RopeScaling(
            "yarn",
            factor=factor,
            original_max_position=original,
            attention_factor=real(attention, f"{key}.attention_factor", source),
            beta_fast=fast,
            beta_slow=slow,
            truncate=truncate,
        )
    raise ModelLoadError(
        f"{source}: rope scaling {shown(kind)} is not supported (supported: default, linear, llama3, longrope, yarn)"
    )


def yarn_attention_factor(factor: float, mscale: float = 1.0) -> float:
    """YaRN's scale of the rotation (the paper's ``0.1 · mscale · ln(factor) + 1``; 1 without scaling)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
