"""A checkpoint's ``config.json``, read into the numbers the runtime needs (and checked)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ModelLoadError


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
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot read {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{path} holds {type(raw).__name__}, not a JSON object")
        return ModelConfig.from_dict(raw, source=str(path))

    @staticmethod
    def from_dict(raw: dict[str, Any], source: str = "config") -> ModelConfig:
        def need(key: str) -> Any:
            if key not in raw or raw[key] is None:
                raise ModelLoadError(f"{source}: required key {key!r} is missing")
            return raw[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        head_dim = int(raw.get("head_dim") or hidden // heads)
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise ModelLoadError(f"{source}: {heads} attention heads do not split into {kv_heads} KV heads")
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        # older exports: top-level rope_theta + rope_scaling; newer: one rope_parameters object
        rope = raw.get("rope_parameters") or raw.get("rope_scaling")
        theta = raw.get("rope_theta") or (rope.get("rope_theta") if isinstance(rope, dict) else None)
        window = raw.get("sliding_window")
        if raw.get("use_sliding_window") is False:  # Qwen2 carries a window it does not use by default
            window = None
        return ModelConfig(
            model_type=str(need("model_type")),
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            max_position=int(raw.get("max_position_embeddings") or 2048),
            rms_eps=float(raw.get("rms_norm_eps") or 1e-6),
            rope_theta=float(theta or 10000.0),
            rope_scaling=_rope_scaling(rope, source),
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            sliding_window=int(window) if window else None,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
        )


def _rope_scaling(raw: Any, source: str) -> RopeScaling:
    if not raw:
        return RopeScaling()
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{source}: rope_scaling must be an object, got {raw!r}")
    kind = str(raw.get("rope_type") or raw.get("type") or "default")
    if kind == "default":
        return RopeScaling()
    if kind == "linear":
        return RopeScaling("linear", factor=float(raw["factor"]))
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            factor=float(raw["factor"]),
            low_freq_factor=float(raw.get("low_freq_factor", 1.0)),
            high_freq_factor=float(raw.get("high_freq_factor", 4.0)),
            original_max_position=int(raw.get("original_max_position_embeddings", 8192)),
        )
    raise ModelLoadError(f"{source}: rope scaling {kind!r} is not supported (supported: default, linear, llama3)")
