"""A checkpoint's ``config.json``, read into the numbers the runtime needs (and checked)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checks import MAX_HEADS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, flag, real, shown, text, token_id, token_ids, whole
from .errors import ModelLoadError
from .files import read_json_object


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are rescaled for long contexts: ``none``, ``linear`` or ``llama3``."""

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


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
        # older exports: top-level rope_theta + rope_scaling; newer: one rope_parameters object
        rope_key = "rope_parameters" if raw.get("rope_parameters") else "rope_scaling"
        rope = raw.get(rope_key)
        if rope is not None and not isinstance(rope, dict):
            raise ModelLoadError(f"{source}: {rope_key} must be an object, got {shown(rope)}")
        theta = raw.get("rope_theta")
        if theta is None and rope is not None:
            theta = rope.get("rope_theta")
        window: Any = raw.get("sliding_window")
        if not flag(raw.get("use_sliding_window"), "use_sliding_window", source, default=True):
            window = None  # Qwen2 carries a window it does not use by default
        return ModelConfig(
            model_type=text(need("model_type"), "model_type", source),
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=whole(need("intermediate_size"), "intermediate_size", source),
            num_layers=whole(need("num_hidden_layers"), "num_hidden_layers", source, high=MAX_LAYERS),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            max_position=whole(
                optional("max_position_embeddings", 2048), "max_position_embeddings", source, high=MAX_POSITIONS
            ),
            rms_eps=real(optional("rms_norm_eps", 1e-6), "rms_norm_eps", source, 0.0, 1.0),
            rope_theta=real(10000.0 if theta is None else theta, "rope_theta", source),
            rope_scaling=_rope_scaling(rope, rope_key, source),
            tie_embeddings=flag(raw.get("tie_word_embeddings"), "tie_word_embeddings", source),
            attention_bias=flag(raw.get("attention_bias"), "attention_bias", source),
            mlp_bias=flag(raw.get("mlp_bias"), "mlp_bias", source),
            # 0, like null, means no window
            sliding_window=whole(window, "sliding_window", source, high=MAX_POSITIONS) if window else None,
            bos_token_id=token_id(raw.get("bos_token_id"), "bos_token_id", source, vocab),
            eos_token_ids=token_ids(raw.get("eos_token_id"), "eos_token_id", source, vocab),
        )


def _rope_scaling(raw: dict[str, Any] | None, key: str, source: str) -> RopeScaling:
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
    raise ModelLoadError(f"{source}: rope scaling {shown(kind)} is not supported (supported: default, linear, llama3)")
