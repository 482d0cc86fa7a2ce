"""The decoder forward pass shared by every registered family, over a preallocated KV cache.

One sequence at a time. ``forward(ids)`` runs the new tokens [T] through every layer at the positions
after those already cached (prefill: T = the prompt; decode: T = 1) and returns their logits [T, vocab];
``decode_batch`` runs one new token of each of several sequences, each over its own cache.
A decode step is one call into the native engine's decoder, which runs every layer on the same weights
and KV cache (``native_decode=False`` keeps it in tensor code); so is the prefill of a quantized model
(``native_prefill``). The tensor code below is the reference both are tested against, and fp32's
prefill, where PyTorch's BLAS is as fast as any.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F

from .architectures import Architecture
from .config import ModelConfig
from .errors import ContextLengthError
from .linear import STORED, Linear, project_many
from .rope import RotaryTable, local_inverse_frequencies, rotate

if TYPE_CHECKING:
    from torchburn_native.ggml import GgmlMatrix
    from torchburn_native.transformer import Decoder, QMatrix


class KVCache:
    """Keys and values of every layer for up to ``capacity`` positions, allocated once."""

    def __init__(self, cfg: ModelConfig, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"KV cache capacity must be at least 1, got {capacity}")
        shape = (cfg.num_layers, cfg.num_kv_heads, capacity, cfg.head_dim)  # [L, KVH, S, D]
        self.keys = torch.zeros(shape)
        self.values = torch.zeros(shape)
        self.capacity = capacity
        self.length = 0  # positions filled

    def check_room(self, new: int) -> None:
        if self.length + new > self.capacity:
            raise ContextLengthError(
                f"{self.length} cached + {new} new tokens exceed the KV cache's {self.capacity} positions"
            )

    def reset(self, length: int = 0) -> None:
        """Forget positions from ``length`` on (0: everything)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} positions to {length}")
        self.length = length


@dataclass
class _Layer:
    ln_attn: torch.Tensor
    ln_mlp: torch.Tensor
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    gate: Linear
    up: Linear
    down: Linear
    post_attn_norm: torch.Tensor | None  # [H] Gemma 2/3: the attention's output normed before the residual
    post_mlp_norm: torch.Tensor | None  # and the MLP's
    windowed: bool  # the sliding window limits this layer
    local_rope: bool  # it rotates with the windowed layers' own table (Gemma 3)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class Transformer:
    """fp32 weights held as torch tensors; the forward pass is plain tensor code (the reference path)."""

    def __init__(
        self,
        arch: Architecture,
        cfg: ModelConfig,
        tensors: Mapping[str, torch.Tensor],
        quant: str = "fp32",
        packed: dict[str, QMatrix | GgmlMatrix] | None = None,
    ) -> None:
        """``packed``: matrices already in a native format, by name, in place of their entries in
        ``tensors``: a GGUF file's Q4_1 blocks under int4, or every matrix of a GGUF file in its stored
        type (``GgmlMatrix``, the embedding included) under ``stored``."""
        packed = packed or {}
        self.arch, self.cfg, self.quant = arch, cfg, quant
        embed = packed.get("model.embed_tokens.weight")
        # [V, H]: f32, or a GGUF matrix whose rows are dequantized as tokens look them up
        self.embed: torch.Tensor | GgmlMatrix = (
            tensors["model.embed_tokens.weight"] if embed is None else cast("GgmlMatrix", embed)
        )
        self.norm = tensors["model.norm.weight"]
        # weights a GGUF file holds in a type not computed in as stored are dequantized: fp32
        plain = "fp32" if quant == STORED else quant
        head_name = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
        if head_name not in packed:
            # the output projection (often the tied embedding) is int8 in blocks of 32 under int8 and
            # int4: its rows span a wide range, it decides every token, and GGUF files store it that way
            head_quant = plain if plain in ("fp32", "bf16") else "int8-blocks"
            head = tensors[head_name]
            self.lm_head = Linear(head, None, head_quant)
        else:
            self.lm_head = Linear.from_stored(cast("GgmlMatrix", packed[head_name]), None)
        self.rotary = RotaryTable.of(cfg)
        self.inv_freq = self.rotary.inv_freq
        local = local_inverse_frequencies(cfg)
        self.local_rotary = None if local is None else RotaryTable(local)
        # Gemma: √hidden, rounded to f32 as transformers rounds it to the weights' dtype
        self.embed_scale = float(torch.tensor(cfg.hidden_size**0.5)) if arch.scaled_embedding else 1.0
        self.native_decode = True
        self.native_steps = 0  # decode steps run by the native decoder
        self.native_batched_steps = 0  # calls of decode_batch run by the native decoder (one step each of B sequences)
        # quantized prompts run natively too; fp32 ones stay in tensor code, on PyTorch's BLAS
        self.native_prefill = quant != "fp32"
        self.native_prefills = 0  # prompts run by the native decoder
        self.native_batched_prefills = 0  # calls of prefill_batch that ran several prompts in one native call
        self._decoder: Decoder | None = None

        def linear(name: str) -> Linear:
            bias = tensors.get(name + ".bias")
            weight = packed.get(name + ".weight")
            if weight is None:
                return Linear(tensors[name + ".weight"], bias, plain)
            if quant == STORED:
                return Linear.from_stored(cast("GgmlMatrix", weight), bias)
            return Linear.from_packed(cast("QMatrix", weight), bias)

        self.layers = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            windowed = cfg.windowed(i)
            self.layers.append(
                _Layer(
                    tensors[p + "input_layernorm.weight"],
                    tensors[p + arch.mlp_norm],
                    linear(a + "q_proj"),
                    linear(a + "k_proj"),
                    linear(a + "v_proj"),
                    linear(a + "o_proj"),
                    tensors.get(a + "q_norm.weight"),
                    tensors.get(a + "k_norm.weight"),
                    linear(m + "gate_proj"),
                    linear(m + "up_proj"),
                    linear(m + "down_proj"),
                    tensors[p + "post_attention_layernorm.weight"] if arch.sandwich_norms else None,
                    tensors[p + "post_feedforward_layernorm.weight"] if arch.sandwich_norms else None,
                    windowed,
                    windowed and self.local_rotary is not None,
                )
            )

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights one token's forward pass reads (the embedding row aside)."""
        per_layer = sum(
            lin.nbytes
            for layer in self.layers
            for lin in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down)
        )
        return per_layer + self.lm_head.nbytes

    def new_cache(self, capacity: int | None = None) -> KVCache:
        return KVCache(self.cfg, capacity or self.cfg.max_position)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache: KVCache, last_only: bool = False) -> torch.Tensor:
        """Logits [T, V] of the new tokens ``ids`` [T] ([1, V], the last one's, with ``last_only``: all
        generation needs, and the output projection is a fifth of a small model's prefill); their keys
        and values join ``cache``."""
        t = int(ids.shape[0])
        cache.check_room(t)
        if t == 0:
            return torch.empty(0, self.cfg.vocab_size)
        if int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.cfg.vocab_size}), got {ids.min()}..{ids.max()}")
        if t == 1 and self.native_decode:
            return self._decode_step(int(ids[0]), cache)
        if t > 1 and self.native_prefill:
            return self._native_prefill(ids, cache, last_only)
        x = self._residual(ids, cache)  # [T, H]
        if last_only:
            x = x[-1:]
        logits = self.lm_head(rms_norm(x, self.norm, self.cfg.rms_eps))  # [T, V]
        cap = self.cfg.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    @torch.no_grad()
    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The final normed hidden states [T, H] of the tokens ``ids`` [T] from position 0, in a cache of
        their own (what an embedding pools)."""
        t = int(ids.shape[0])
        if t == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size:
            raise ValueError(f"token ids must be a non-empty run in [0, {self.cfg.vocab_size})")
        if t > self.cfg.max_position:
            raise ContextLengthError(f"{t} tokens exceed the model's context of {self.cfg.max_position}")
        return rms_norm(self._residual(ids, self.new_cache(t)), self.norm, self.cfg.rms_eps)

    def _residual(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """The residual stream [T, H] after every layer, in tensor code; the keys and values join ``cache``."""
        start, t = cache.length, int(ids.shape[0])
        eps = self.cfg.rms_eps
        positions = torch.arange(start, start + t)
        rotary = self._rotary_rows(start, t)  # (cos, sin) [T, R] of the main and the local table
        masks = (self._mask(positions, start + t, False), self._mask(positions, start + t, True))  # [T, S] each
        x = self._embed_rows(ids) * self.embed_scale  # [T, H]
        for li, layer in enumerate(self.layers):
            cos, sin = rotary[layer.local_rope]
            a = self._attention(li, layer, rms_norm(x, layer.ln_attn, eps), cos, sin, masks[layer.windowed], cache)
            x = x + (a if layer.post_attn_norm is None else rms_norm(a, layer.post_attn_norm, eps))
            m = self._mlp(layer, rms_norm(x, layer.ln_mlp, eps))
            x = x + (m if layer.post_mlp_norm is None else rms_norm(m, layer.post_mlp_norm, eps))
        cache.length = start + t
        return x

    @torch.no_grad()
    def decode_batch(self, tokens: Sequence[int], caches: Sequence[KVCache]) -> torch.Tensor:
        """Logits [B, V] of one new token for each of B independent sequences: ``tokens[b]`` at the next
        position of ``caches[b]`` (its ``length``), whose keys and values join that cache. Each row is what
        ``forward`` gives that token alone; natively it is one call that reads the weights once for all
        the sequences (a server's continuous batching: sequences join and leave between calls)."""
        b = len(tokens)
        if b != len(caches):
            raise ValueError(f"decode_batch got {b} tokens for {len(caches)} KV caches: it needs one per sequence")
        if b == 0:
            return torch.empty(0, self.cfg.vocab_size)
        if len({id(c) for c in caches}) != b:
            raise ValueError("decode_batch needs a KV cache per sequence; the same cache appears twice")
        vocab = self.cfg.vocab_size
        ids = [operator.index(t) for t in tokens]  # ints (or integer scalars), not floats
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"token ids must lie in [0, {vocab}), got {min(ids)}..{max(ids)}")
        for cache in caches:
            cache.check_room(1)
        if not self.native_decode:
            return torch.cat(
                [self.forward(torch.tensor([t]), c, last_only=True) for t, c in zip(ids, caches, strict=True)]
            )
        positions = [c.length for c in caches]
        # each sequence's rotary rows at its own position: [B, R] per table
        cos, sin = self.rotary.rows_at(positions)
        local_cos, local_sin = (None, None) if self.local_rotary is None else self.local_rotary.rows_at(positions)
        logits = torch.empty(b, vocab)
        self.native_decoder().step_batch(
            ids,
            positions,
            [c.keys for c in caches],
            [c.values for c in caches],
            cos,
            sin,
            logits,
            local_cos,
            local_sin,
        )
        for c in caches:
            c.length += 1
        self.native_batched_steps += 1
        return logits

    @torch.no_grad()
    def prefill_batch(self, prompts: Sequence[Sequence[int]], caches: Sequence[KVCache]) -> torch.Tensor:
        """Last logits [P, V] of P prompts, each run at the next positions of its own cache (whose keys
        and values it joins): row ``i`` is what ``forward(prompts[i], caches[i], last_only=True)``
        gives. Natively, the prompts long enough for the prompt kernels run together in one call that
        reads the weights once for all of them (a server admitting several requests at once), each
        getting its lone run's logits bit for bit; the others run one by one."""
        from torchburn_native.transformer import PROMPT_KERNEL_MIN_TOKENS

        p = len(prompts)
        if p != len(caches):
            raise ValueError(f"prefill_batch got {p} prompts for {len(caches)} KV caches: it needs one per prompt")
        if len({id(c) for c in caches}) != p:
            raise ValueError("prefill_batch needs a KV cache per prompt; the same cache appears twice")
        ids = [[operator.index(t) for t in prompt] for prompt in prompts]
        vocab = self.cfg.vocab_size
        for i, (prompt, cache) in enumerate(zip(ids, caches, strict=True)):
            if not prompt:
                raise ValueError(f"prompt {i} has no tokens")
            if min(prompt) < 0 or max(prompt) >= vocab:
                raise ValueError(f"prompt {i}: token ids must lie in [0, {vocab}), got {min(prompt)}..{max(prompt)}")
            cache.check_room(len(prompt))
        logits = torch.empty(p, vocab)
        together = [
            i for i, prompt in enumerate(ids) if self.native_prefill and len(prompt) >= PROMPT_KERNEL_MIN_TOKENS
        ]
        if len(together) < 2:
            together = []
        for i in sorted(set(range(p)) - set(together)):
            logits[i] = self.forward(torch.tensor(ids[i]), caches[i], last_only=True)[-1]
        if together:
            # every prompt's rotary rows at its own positions, one prompt after the other: [ΣT, R] per table
            mains, locals_ = zip(*(self._rotary_rows(caches[i].length, len(ids[i])) for i in together), strict=True)
            cos, sin = torch.cat([c for c, _ in mains]), torch.cat([s for _, s in mains])
            local_cos, local_sin = torch.cat([c for c, _ in locals_]), torch.cat([s for _, s in locals_])
            out = torch.empty(len(together), vocab)
            self.native_decoder().prefill_batch(
                [ids[i] for i in together],
                [caches[i].length for i in together],
                [caches[i].keys for i in together],
                [caches[i].values for i in together],
                cos,
                sin,
                out,
                local_cos,
                local_sin,
            )
            for row, i in zip(out, together, strict=True):
                logits[i] = row
                caches[i].length += len(ids[i])
            self.native_batched_prefills += 1
        return logits

    def _rotary_rows(self, start: int, t: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """cos and sin rows [T, R] of positions ``start .. start + t``: the main table's, then the
        windowed layers' own (the main one again where they have none)."""
        main = self.rotary.rows(start, t)
        return [main, main if self.local_rotary is None else self.local_rotary.rows(start, t)]

    def _decode_step(self, token: int, cache: KVCache) -> torch.Tensor:
        """Logits [1, V] of one token at the next position, in one native call."""
        pos = cache.length
        (cos, sin), (local_cos, local_sin) = self._rotary_rows(pos, 1)  # [1, R] each
        logits = torch.empty(1, self.cfg.vocab_size)
        self.native_decoder().step(token, pos, cache.keys, cache.values, cos, sin, logits, local_cos, local_sin)
        cache.length = pos + 1
        self.native_steps += 1
        return logits

    def _native_prefill(self, ids: torch.Tensor, cache: KVCache, last_only: bool) -> torch.Tensor:
        """Logits of the prompt ``ids`` [T] (the last token's with ``last_only``) in one native call."""
        start, t = cache.length, int(ids.shape[0])
        (cos, sin), (local_cos, local_sin) = self._rotary_rows(start, t)  # [T, R] each
        logits = torch.empty(1 if last_only else t, self.cfg.vocab_size)
        self.native_decoder().prefill(
            ids.tolist(), start, cache.keys, cache.values, cos, sin, logits, not last_only, local_cos, local_sin
        )
        cache.length = start + t
        self.native_prefills += 1
        return logits

    def native_decoder(self) -> Decoder:
        """The native engine's decoder over this model's weights, built on first use."""
        if self._decoder is None:
            from torchburn_native.transformer import Decoder, Dims, Layer

            cfg = self.cfg
            dims = Dims(
                hidden=cfg.hidden_size,
                heads=cfg.num_heads,
                kv_heads=cfg.num_kv_heads,
                head_dim=cfg.head_dim,
                vocab=cfg.vocab_size,
                eps=float(cfg.rms_eps),
                window=cfg.sliding_window,
                rotary_dim=cfg.rotary_dim,
                attn_scale=cfg.attn_scale,
                attn_softcap=cfg.attn_softcap,
                final_softcap=cfg.final_softcap,
                embed_scale=self.embed_scale,
                activation="gelu_tanh" if cfg.activation == "gelu_tanh" else "silu",
            )
            layers = [
                Layer(
                    attn_norm=w.ln_attn,
                    mlp_norm=w.ln_mlp,
                    q=w.q.projection(),
                    k=w.k.projection(),
                    v=w.v.projection(),
                    o=w.o.projection(),
                    gate=w.gate.projection(),
                    up=w.up.projection(),
                    down=w.down.projection(),
                    q_norm=w.q_norm,
                    k_norm=w.k_norm,
                    post_attn_norm=w.post_attn_norm,
                    post_mlp_norm=w.post_mlp_norm,
                    windowed=w.windowed,
                    local_rope=w.local_rope,
                )
                for w in self.layers
            ]
            self._decoder = Decoder(dims, self.embed, self.norm, self.lm_head.projection(), layers)
        return self._decoder

    def _embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The embeddings [T, H] of the tokens ``ids`` [T]."""
        if isinstance(self.embed, torch.Tensor):
            return self.embed[ids]
        from torchburn_native.ggml import dequantize

        return torch.cat([dequantize(self.embed, slice(i, i + 1)) for i in ids.tolist()])

    def _mask(self, positions: torch.Tensor, length: int, windowed: bool) -> torch.Tensor:
        """Additive mask [T, S]: a query sees keys at or before its position (``windowed``: within the
        sliding window, where the model has one)."""
        keys = torch.arange(length)[None, :]
        allowed = keys <= positions[:, None]
        if windowed and self.cfg.sliding_window is not None:
            allowed &= keys > positions[:, None] - self.cfg.sliding_window
        return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))

    def _attention(
        self,
        li: int,
        w: _Layer,
        x: torch.Tensor,  # [T, H]
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache,
    ) -> torch.Tensor:
        cfg = self.cfg
        t, d, kvh = x.shape[0], cfg.head_dim, cfg.num_kv_heads
        group = cfg.num_heads // kvh
        q, k, v = project_many([w.q, w.k, w.v], x)
        q = q.view(t, cfg.num_heads, d).transpose(0, 1)  # [Hq, T, D]
        k = k.view(t, kvh, d).transpose(0, 1)  # [KVH, T, D]
        v = v.view(t, kvh, d).transpose(0, 1)
        if w.q_norm is not None and w.k_norm is not None:
            q, k = rms_norm(q, w.q_norm, cfg.rms_eps), rms_norm(k, w.k_norm, cfg.rms_eps)
        r = cfg.rotary_width  # the rest of each head passes unrotated
        q = torch.cat((rotate(q[..., :r], cos, sin), q[..., r:]), dim=-1)
        k = torch.cat((rotate(k[..., :r], cos, sin), k[..., r:]), dim=-1)
        start = cache.length
        cache.keys[li, :, start : start + t] = k
        cache.values[li, :, start : start + t] = v
        keys = cache.keys[li, :, : start + t]  # [KVH, S, D]
        values = cache.values[li, :, : start + t]
        q = q.reshape(kvh, group * t, d)  # queries of one KV head side by side: [KVH, G·T, D]
        scale = d**-0.5 if cfg.attn_scale is None else cfg.attn_scale
        scores = (q @ keys.transpose(1, 2)) * scale  # [KVH, G·T, S]
        if cfg.attn_softcap is not None:
            scores = torch.tanh(scores / cfg.attn_softcap) * cfg.attn_softcap
        scores = scores.view(kvh, group, t, -1) + mask  # [KVH, G, T, S]
        out = torch.softmax(scores, dim=-1) @ values[:, None]  # [KVH, G, T, D]
        out = out.reshape(cfg.num_heads, t, d).transpose(0, 1).reshape(t, cfg.num_heads * d)  # [T, Hq·D]
        return w.o(out)

    def _mlp(self, w: _Layer, x: torch.Tensor) -> torch.Tensor:
        gate, up = project_many([w.gate, w.up], x)
        act = F.gelu(gate, approximate="tanh") if self.cfg.activation == "gelu_tanh" else F.silu(gate)
        return w.down(act * up)
