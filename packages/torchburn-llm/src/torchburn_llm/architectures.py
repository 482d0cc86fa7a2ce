"""Architectures as data: which tensors a checkpoint of each family holds, and the few switches its
forward pass reads. Registered through the ``register_models`` hook like any plugin's.

Every family here is the Llama decoder (RMSNorm, rotary attention with grouped KV heads, SwiGLU MLP);
they differ only in switches: Qwen2 always has q/k/v biases, Qwen3 normalises q and k per head before
the rotation, Mistral may limit attention to a sliding window (read from its config).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from torchburn.hookspecs import hookimpl
from torchburn.plugins import plugin_host

from .config import ModelConfig
from .errors import ModelLoadError

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Architecture:
    name: str
    model_types: tuple[str, ...]  # config.json's ``model_type`` values this spec reads
    qkv_bias: bool | None = None  # True: always; None: config.attention_bias decides
    qk_norm: bool = False  # RMSNorm over each head of q and k before the rotation (Qwen3)
    # names a checkpoint may carry that the forward pass does not need (old rotary caches)
    ignorable: tuple[str, ...] = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)

    def has_qkv_bias(self, cfg: ModelConfig) -> bool:
        return cfg.attention_bias if self.qkv_bias is None else self.qkv_bias

    def tensors(self, cfg: ModelConfig) -> dict[str, Shape]:
        """Every tensor the checkpoint must hold, with its shape."""
        h, d, kv, inter = cfg.hidden_size, cfg.head_dim, cfg.num_kv_heads, cfg.intermediate_size
        q_out, kv_out = cfg.num_heads * d, kv * d
        want: dict[str, Shape] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
        if not cfg.tie_embeddings:
            want["lm_head.weight"] = (cfg.vocab_size, h)
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            want[p + "input_layernorm.weight"] = (h,)
            want[p + "post_attention_layernorm.weight"] = (h,)
            for name, rows in (("q", q_out), ("k", kv_out), ("v", kv_out)):
                want[p + f"self_attn.{name}_proj.weight"] = (rows, h)
                if self.has_qkv_bias(cfg):
                    want[p + f"self_attn.{name}_proj.bias"] = (rows,)
            want[p + "self_attn.o_proj.weight"] = (h, q_out)
            if cfg.attention_bias and self.qkv_bias is None:
                want[p + "self_attn.o_proj.bias"] = (h,)
            if self.qk_norm:
                want[p + "self_attn.q_norm.weight"] = (d,)
                want[p + "self_attn.k_norm.weight"] = (d,)
            for name, shape in (("gate", (inter, h)), ("up", (inter, h)), ("down", (h, inter))):
                want[p + f"mlp.{name}_proj.weight"] = shape
                if cfg.mlp_bias:
                    want[p + f"mlp.{name}_proj.bias"] = (shape[0],)
        return want

    def check(self, cfg: ModelConfig, found: dict[str, Shape], source: str) -> None:
        """Raise, naming them, if tensors are missing, unexpected or of the wrong shape."""
        want = self.tensors(cfg)
        if cfg.tie_embeddings and "lm_head.weight" in found:
            want["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)  # some exports keep the tied copy
        ignore = [re.compile(p) for p in self.ignorable]
        missing = sorted(set(want) - set(found))
        unexpected = sorted(n for n in set(found) - set(want) if not any(p.fullmatch(n) for p in ignore))
        wrong = sorted(f"{n} {found[n]} (expected {want[n]})" for n in set(want) & set(found) if found[n] != want[n])
        problems = []
        for what, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
            if names:
                shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
                problems.append(f"{len(names)} {what}: {shown}")
        if problems:
            raise ModelLoadError(f"{source} does not match the {self.name} architecture: " + "; ".join(problems))


LLAMA = Architecture("llama", ("llama",))
MISTRAL = Architecture("mistral", ("mistral",))
QWEN2 = Architecture("qwen2", ("qwen2",), qkv_bias=True)
QWEN3 = Architecture("qwen3", ("qwen3",), qk_norm=True)


@hookimpl
def register_models(register: Callable[[Architecture], None]) -> None:
    for arch in (LLAMA, MISTRAL, QWEN2, QWEN3):
        register(arch)


@functools.cache
def _registered() -> dict[str, Architecture]:
    by_type: dict[str, Architecture] = {}
    plugin_host().manager.hook.register_models(register=lambda a: by_type.update(dict.fromkeys(a.model_types, a)))
    return by_type


def architecture_for(model_type: str) -> Architecture:
    """The registered architecture reading ``model_type``; a clear error naming the known ones if none."""
    known = _registered()
    if model_type not in known:
        # a checkout without the entry point installed still knows the built-in families
        known = {**{t: a for a in (LLAMA, MISTRAL, QWEN2, QWEN3) for t in a.model_types}, **known}
    if model_type not in known:
        raise ModelLoadError(f"model_type {model_type!r} is not supported; supported: {', '.join(sorted(known))}")
    return known[model_type]
