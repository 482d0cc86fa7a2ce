"""Architectures as data: which tensors a checkpoint of each family holds, and the few switches its
forward pass reads. Registered through the ``register_models`` hook like any plugin's.

Every family here is the Llama decoder (RMSNorm, rotary attention with grouped KV heads, a gated MLP);
they differ only in switches: Qwen2 always has q/k/v biases, Qwen3 normalises q and k per head before
the rotation, Mistral may limit attention to a sliding window (read from its config). Gemma scales
the embedding by √hidden, stores its norms as offsets from one and gates with tanh-GELU; Gemma 2 and 3
add norms after attention and after the MLP (and their configs bring logit caps, windowed layers
and a second rotary base). Phi-3 stores q/k/v as one matrix and gate/up as another, which the
loader splits into rows of the usual names.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

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
    norm_offset: bool = False  # norm weights w are stored for a scale of 1 + w (Gemma)
    scaled_embedding: bool = False  # the embedding's rows are multiplied by √hidden (Gemma)
    # norms after attention and after the MLP too; the one before the MLP is pre_feedforward_layernorm
    sandwich_norms: bool = False
    fused: bool = False  # q/k/v in one qkv_proj, gate/up in one gate_up_proj (Phi-3)
    # names a checkpoint may carry that the forward pass does not need (old rotary caches)
    ignorable: tuple[str, ...] = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)

    def has_qkv_bias(self, cfg: ModelConfig) -> bool:
        return cfg.attention_bias if self.qkv_bias is None else self.qkv_bias

    @property
    def mlp_norm(self) -> str:
        """The name (after ``model.layers.N.``) of the norm before the MLP."""
        return "pre_feedforward_layernorm.weight" if self.sandwich_norms else "post_attention_layernorm.weight"

    def fused_parts(self, cfg: ModelConfig) -> dict[str, list[tuple[str, int, int]]]:
        """For each stored matrix that holds several projections (name after ``model.layers.N.``), the
        projections it holds: (name, first row, end row)."""
        if not self.fused:
            return {}
        q_out, kv_out, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
        return {
            "self_attn.qkv_proj.weight": [
                ("self_attn.q_proj.weight", 0, q_out),
                ("self_attn.k_proj.weight", q_out, q_out + kv_out),
                ("self_attn.v_proj.weight", q_out + kv_out, q_out + 2 * kv_out),
            ],
            "mlp.gate_up_proj.weight": [("mlp.gate_proj.weight", 0, inter), ("mlp.up_proj.weight", inter, 2 * inter)],
        }

    def split_fused(self, cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``tensors`` with each fused matrix replaced by the projections it holds (row ranges: views)."""
        out = dict(tensors)
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            for fused, parts in self.fused_parts(cfg).items():
                w = out.pop(p + fused, None)
                if w is not None:
                    out.update({p + name: w[lo:hi] for name, lo, hi in parts})
        return out

    def shift_norms(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Norm weights as the scale itself: ``1 + w`` where the checkpoint stores offsets (Gemma's
        folders; llama.cpp's converter stores the sum already)."""
        if not self.norm_offset:
            return tensors
        return {n: w + 1.0 if n.endswith("norm.weight") else w for n, w in tensors.items()}

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
            if self.sandwich_norms:
                want[p + "pre_feedforward_layernorm.weight"] = (h,)
                want[p + "post_feedforward_layernorm.weight"] = (h,)
            if self.fused:
                want[p + "self_attn.qkv_proj.weight"] = (q_out + 2 * kv_out, h)
                want[p + "mlp.gate_up_proj.weight"] = (2 * inter, h)
                want[p + "mlp.down_proj.weight"] = (h, inter)
                want[p + "self_attn.o_proj.weight"] = (h, q_out)
                continue
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
GEMMA = Architecture("gemma", ("gemma",), norm_offset=True, scaled_embedding=True)
GEMMA2 = Architecture("gemma2", ("gemma2",), norm_offset=True, scaled_embedding=True, sandwich_norms=True)
GEMMA3 = Architecture(
    "gemma3", ("gemma3_text",), qk_norm=True, norm_offset=True, scaled_embedding=True, sandwich_norms=True
)
PHI3 = Architecture("phi3", ("phi3",), qkv_bias=False, fused=True)
BUILT_IN = (LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA, GEMMA2, GEMMA3, PHI3)


@hookimpl
def register_models(register: Callable[[Architecture], None]) -> None:
    for arch in BUILT_IN:
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
        known = {**{t: a for a in BUILT_IN for t in a.model_types}, **known}
    if model_type not in known:
        raise ModelLoadError(f"model_type {model_type!r} is not supported; supported: {', '.join(sorted(known))}")
    return known[model_type]
