"""Decoder-only transformer steps and quantized matrices: the native engine's API for LLM runtimes.

A runtime describes its model once as a :class:`Decoder` (sizes, f32 tensors, and projections whose
weights are f32 tensors or :class:`QMatrix` quantized by :func:`quantize` or read by
:func:`from_q4_1`), then runs it one token (:meth:`Decoder.step`) or one prompt
(:meth:`Decoder.prefill`) per foreign call, appending to a KV cache the runtime owns, or one token of
each of several sequences, each with its own cache (:meth:`Decoder.step_batch`). The layer is the
one most open-weight decoders share: RMSNorm before attention and before the MLP; q/k/v projections
with optional biases and an optional per-head q/k RMSNorm; rotary embeddings from cos/sin rows the
caller computes (so rope scaling stays the caller's); grouped-query attention over the cache,
optionally within a sliding window; the output projection; a SiLU-gated MLP; a final norm and the
output projection to the logits. An architecture maps onto it as data, on the runtime's side, and the
switches of :class:`Dims` and :class:`Layer` cover the families that differ from it: a tanh-GELU
gate, another attention scale, logit caps, norms after attention and the MLP, windowed and global
layers with a rotary table each, partial rotation, a scaled embedding.

Tensors cross as data pointers, without copies. A decoder holds the tensors it was built from (as
contiguous f32 CPU tensors, converted once where they are not) for as long as it lives; every call
checks the dtype, device, layout and size of the buffers it is given, so nothing here reads or
writes outside a tensor. Weights must not be changed in place while a decoder built on them lives.

Every constructor here starts the engine's worker threads first (:func:`ensure_threads`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ._native import PROMPT_KERNEL_MIN_TOKENS, GgmlMatrix, QMatrix
from ._native import Decoder as _NativeDecoder
from ._native import matmul_many as _matmul_many

QuantKind = Literal["int8", "int8-blocks", "int4", "bf16"]
Activation = Literal["silu", "gelu_tanh"]
"""The gated MLP's activation: ``down(act(gate) * up)``; ``gelu_tanh`` is ``gelu(approximate="tanh")``."""

"""How a :class:`QMatrix` stores its rows: int8 with a scale per row, int8 in blocks of 32 with a
scale each, int4 in blocks of 32 with a scale and an offset each, or bf16."""

# one GGUF Q4_1 block: an f16 scale, an f16 minimum and 32 4-bit values
_Q4_1_BLOCK = 32
_Q4_1_BLOCK_BYTES = 20


def ensure_threads() -> int:
    """Start the kernels' worker threads, once per process, and return how many there are.

    They run on PyTorch's own OpenMP team where the process has one (``TORCHBURN_NUM_THREADS``
    threads, else ``torch.get_num_threads()``): two spinning pools on the same cores would slow both.
    """
    from .engine import ensure_threads as start

    return start()


def _cpu_tensor(t: torch.Tensor, what: str) -> None:
    if t.device.type != "cpu":
        raise ValueError(f"{what} must be a CPU tensor, got one on {t.device}")


def _no_negatives(*named: tuple[str, Sequence[int]]) -> None:
    """Refuses a negative token id, position or start (the native side takes them unsigned)."""
    for what, numbers in named:
        bad = next((v for v in numbers if v < 0), None)
        if bad is not None:
            raise IndexError(f"a {what} must not be negative, got {bad}")


def quantize(weight: torch.Tensor, kind: QuantKind) -> QMatrix:
    """``weight`` [n, k] (any float dtype, k a multiple of 32) quantized as ``kind``."""
    _cpu_tensor(weight, "the weight")
    if weight.dim() != 2:
        raise ValueError(f"quantize takes a matrix [n, k], got shape {tuple(weight.shape)}")
    ensure_threads()
    w = weight.detach().float().contiguous()
    n, k = w.shape
    return QMatrix.quantize(w.data_ptr(), n, k, kind)


def from_q4_1(blocks: torch.Tensor, n: int, k: int) -> QMatrix:
    """int4 weights [n, k] kept as they are from GGUF Q4_1 blocks: ``blocks`` holds the ``n · k / 32``
    blocks of 20 bytes, row after row, as uint8."""
    _cpu_tensor(blocks, "Q4_1 blocks")
    ensure_threads()
    if k > 0 and k % _Q4_1_BLOCK == 0:
        need = n * (k // _Q4_1_BLOCK) * _Q4_1_BLOCK_BYTES
        if blocks.dtype != torch.uint8 or blocks.numel() != need:
            raise ValueError(
                f"Q4_1 blocks of a {n}x{k} matrix are {need} uint8 values, got {blocks.numel()} {blocks.dtype}"
            )
    blocks = blocks.contiguous()  # held until the call returns: it reads through the address
    # n or k out of range: the native side says which
    return QMatrix.from_q4_1(blocks.data_ptr(), n, k)


def matmul_many(mats: Sequence[QMatrix], x: torch.Tensor) -> list[torch.Tensor]:
    """``[x @ W.T for W in mats]`` in f32 for ``x`` [..., k] and matrices of that one width: the tokens
    are read once for all of them (q, k and v of a prompt; gate and up)."""
    if not mats:
        return []
    _cpu_tensor(x, "the input")
    k = mats[0].shape[1]
    if x.dim() == 0 or x.shape[-1] != k:
        raise ValueError(f"matmul_many needs inputs [..., {k}], got shape {tuple(x.shape)}")
    x = x.float().contiguous()
    rows = x.numel() // k
    outs = [torch.empty(*x.shape[:-1], m.shape[0], dtype=torch.float32) for m in mats]
    _matmul_many(list(mats), x.data_ptr(), rows, [o.data_ptr() for o in outs])
    return outs


@dataclass(frozen=True)
class Dims:
    """The sizes of a stack."""

    hidden: int
    heads: int
    kv_heads: int  # fewer than ``heads``: grouped-query attention
    head_dim: int
    vocab: int
    eps: float  # RMSNorm's
    window: int | None = None  # keys older than this many positions are not attended to (windowed layers)
    rotary_dim: int | None = None  # the first this many elements of each head are rotated (all: None)
    attn_scale: float | None = None  # scores are q·k times this (None: 1/sqrt(head_dim))
    attn_softcap: float | None = None  # scores become cap·tanh(s/cap) before the softmax
    final_softcap: float | None = None  # and the logits too
    embed_scale: float = 1.0  # embedding rows are multiplied by this
    activation: Activation = "silu"

    @property
    def rotary_width(self) -> int:
        return self.head_dim if self.rotary_dim is None else self.rotary_dim


@dataclass(frozen=True)
class Projection:
    """``y = x @ weight.T + bias``: ``weight`` [n, k] quantized, in a GGUF type as stored, or an f32
    tensor; ``bias`` [n]."""

    weight: QMatrix | GgmlMatrix | torch.Tensor
    bias: torch.Tensor | None = None


@dataclass(frozen=True)
class Layer:
    """One pre-norm layer: norm weights [hidden] (q/k norms [head_dim]) and its projections."""

    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    q: Projection
    k: Projection
    v: Projection
    o: Projection
    gate: Projection
    up: Projection
    down: Projection
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None  # [hidden]: the attention's output normalized before the residual
    post_mlp_norm: torch.Tensor | None = None  # and the MLP's
    windowed: bool = True  # whether ``Dims.window`` applies to this layer
    local_rope: bool = False  # whether it reads the second rotary table (``local_cos`` / ``local_sin``)


class Decoder:
    """A decoder-only transformer stack over the given weights: a decode step or a prompt's prefill,
    from the token ids to the logits, in one call each.

    Each call reads and writes the caller's KV cache, ``keys`` and ``values`` f32
    [layers, kv_heads, capacity, head_dim], at the positions it runs; ``cos`` and ``sin`` hold those
    positions' rotary rows, f32 [T, rotary width], and ``local_cos`` / ``local_sin`` those of the layers
    marked ``local_rope`` where they differ."""

    def __init__(
        self,
        dims: Dims,
        embed: torch.Tensor | GgmlMatrix,
        norm: torch.Tensor,
        head: Projection,
        layers: Sequence[Layer],
    ) -> None:
        """``embed`` [vocab, hidden] (f32, or a GGUF matrix whose rows are dequantized per token) and
        ``norm`` [hidden]; ``head`` projects to the vocabulary."""
        ensure_threads()
        self.dims = dims
        self._tensors: list[torch.Tensor] = []  # what the native decoder holds the addresses of
        d = dims
        native_layers = [
            (
                self._address(layer.attn_norm, d.hidden, "an attention norm"),
                self._address(layer.mlp_norm, d.hidden, "an MLP norm"),
                self._address(layer.q_norm, d.head_dim, "a q norm"),
                self._address(layer.k_norm, d.head_dim, "a k norm"),
                self._projection(layer.q),
                self._projection(layer.k),
                self._projection(layer.v),
                self._projection(layer.o),
                self._projection(layer.gate),
                self._projection(layer.up),
                self._projection(layer.down),
                self._address(layer.post_attn_norm, d.hidden, "a post-attention norm"),
                self._address(layer.post_mlp_norm, d.hidden, "a post-MLP norm"),
                layer.windowed,
                int(layer.local_rope),
            )
            for layer in layers
        ]
        scale = d.head_dim**-0.5 if d.attn_scale is None else d.attn_scale
        self._native = _NativeDecoder(
            (d.hidden, d.heads, d.kv_heads, d.head_dim, d.vocab, float(d.eps), d.window),
            (d.rotary_width, float(scale), d.attn_softcap, d.final_softcap, float(d.embed_scale), d.activation),
            embed if isinstance(embed, GgmlMatrix) else self._address(embed, d.vocab * d.hidden, "the embedding"),
            self._address(norm, d.hidden, "the final norm"),
            self._projection(head),
            native_layers,
        )
        self._layers = len(native_layers)

    @property
    def num_layers(self) -> int:
        return self._layers

    def step(
        self,
        token: int,
        pos: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        logits: torch.Tensor,
        local_cos: torch.Tensor | None = None,
        local_sin: torch.Tensor | None = None,
    ) -> None:
        """Run ``token`` at position ``pos`` (the cache holds ``0..pos``): its keys and values go to the
        cache, its logits (f32 [vocab], any shape of that size) to ``logits``."""
        io = self._buffers(keys, values, (cos, sin, local_cos, local_sin), logits, 1, 1)
        self._native.step(token, pos, *io[:6], *io[6:])

    def step_batch(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
        logits: torch.Tensor,
        local_cos: torch.Tensor | None = None,
        local_sin: torch.Tensor | None = None,
    ) -> None:
        """Run one token of each of B sequences in one call: ``tokens[b]`` at position ``positions[b]``
        of sequence ``b``, whose KV cache ``keys[b]`` / ``values[b]`` (as :meth:`step` takes one) holds
        ``0..positions[b]``. Each sequence's keys and values go to its own cache and its logits to row
        ``b`` of ``logits`` (f32 [B, vocab]); ``cos`` and ``sin`` (and ``local_cos`` / ``local_sin``)
        hold row ``b``'s rotary rows, f32 [B, rotary width]. The weights are read once for all the
        sequences, and each gets the logits :meth:`step` would give it. Every sequence needs a cache of
        its own."""
        b = len(tokens)
        self._check_batch("step_batch", ("tokens", tokens), ("positions", positions), keys, values, "sequence")
        _no_negatives(("token id", tokens), ("position", positions))
        io = self._batch_buffers(keys, values, (cos, sin, local_cos, local_sin), logits, b, b)
        # token ids, positions and distinct caches: the native side checks them, naming the sequence
        self._native.step_batch([int(t) for t in tokens], [int(p) for p in positions], *io)

    def prefill(
        self,
        tokens: Sequence[int],
        start: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        logits: torch.Tensor,
        all_logits: bool = False,
        local_cos: torch.Tensor | None = None,
        local_sin: torch.Tensor | None = None,
    ) -> None:
        """Run the prompt ``tokens`` at positions ``start .. start + T`` (the cache holds ``0..start``):
        their keys and values go to the cache, the last token's logits (f32 [vocab]) or, with
        ``all_logits``, every token's (f32 [T, vocab]) to ``logits``."""
        t = len(tokens)
        io = self._buffers(keys, values, (cos, sin, local_cos, local_sin), logits, t, t if all_logits else 1)
        self._native.prefill(list(tokens), start, *io[:6], all_logits, *io[6:])

    def prefill_batch(
        self,
        prompts: Sequence[Sequence[int]],
        starts: Sequence[int],
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
        logits: torch.Tensor,
        local_cos: torch.Tensor | None = None,
        local_sin: torch.Tensor | None = None,
    ) -> None:
        """Run the prompts of P sequences in one pass: ``prompts[i]`` at positions ``starts[i] ..`` of
        sequence ``i``, whose KV cache ``keys[i]`` / ``values[i]`` holds ``0..starts[i]``. ``cos`` and
        ``sin`` (and ``local_cos`` / ``local_sin``) hold every prompt's rotary rows, one prompt after
        the other, f32 [ΣT, rotary width]; row ``i`` of ``logits`` (f32 [P, vocab]) gets prompt ``i``'s
        last logits. The weights are read once for all the prompts; one of at least 8 tokens gets
        what :meth:`prefill` gives it alone, bit for bit. Every prompt needs a cache of its own."""
        self._check_batch("prefill_batch", ("prompts", prompts), ("starts", starts), keys, values, "prompt")
        ids = [[int(t) for t in prompt] for prompt in prompts]
        _no_negatives(("token id", [t for prompt in ids for t in prompt]), ("start", starts))
        rows = sum(len(prompt) for prompt in ids)
        io = self._batch_buffers(keys, values, (cos, sin, local_cos, local_sin), logits, rows, len(prompts))
        # token ids, room in each cache and distinct caches: the native side checks them, naming the prompt
        self._native.prefill_batch(ids, [int(s) for s in starts], *io)

    def _address(self, t: torch.Tensor | None, numel: int, what: str) -> int:
        """The address of ``t`` as contiguous f32 (0 for None), the tensor behind it kept alive."""
        if t is None:
            return 0
        _cpu_tensor(t, what)
        if t.numel() != numel:
            raise ValueError(f"{what} has {t.numel()} values, expected {numel}")
        t = t.detach().float().contiguous()
        self._tensors.append(t)
        return int(t.data_ptr())

    def _projection(self, p: Projection) -> tuple[QMatrix | GgmlMatrix | tuple[int, int, int], int]:
        w = p.weight
        if isinstance(w, QMatrix | GgmlMatrix):
            n, k = w.shape
            weight: QMatrix | GgmlMatrix | tuple[int, int, int] = w
        else:
            if w.dim() != 2:
                raise ValueError(f"a projection's weight is a matrix [n, k], got shape {tuple(w.shape)}")
            n, k = w.shape
            weight = (self._address(w, n * k, "a projection's weight"), n, k)
        return weight, self._address(p.bias, n, "a projection's bias")

    def _buffers(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
        logits: torch.Tensor,
        rows: int,
        logit_rows: int,
    ) -> tuple[int, int, int, int, int, int, int, int]:
        """``(keys, values, capacity, cos, sin, logits, local_cos, local_sin)`` as the native calls take
        them (0 for a second table not given), each buffer checked to be a contiguous f32 CPU tensor of
        the size the call reads or writes."""
        capacity = self._cache(keys, values)
        cos, sin, local_cos, local_sin = self._tables(tables, rows)
        out = self._logits(logits, logit_rows)
        return (keys.data_ptr(), values.data_ptr(), capacity, cos, sin, out, local_cos, local_sin)

    @staticmethod
    def _check_batch(
        call: str,
        items: tuple[str, Sequence[object]],
        places: tuple[str, Sequence[object]],
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        each: str,
    ) -> None:
        """A batched call's per-sequence lists: at least one ``items``, and as many ``places``, key
        caches and value caches."""
        (name, first), (place_name, place) = items, places
        n = len(first)
        if n == 0:
            raise ValueError(f"{call} needs at least one {each}")
        if not len(place) == len(keys) == len(values) == n:
            raise ValueError(
                f"{call} got {n} {name}, {len(place)} {place_name}, {len(keys)} key caches and "
                f"{len(values)} value caches: it needs one of each per {each}"
            )

    def _batch_buffers(
        self,
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
        logits: torch.Tensor,
        rows: int,
        logit_rows: int,
    ) -> tuple[list[int], list[int], list[int], int, int, int, int, int]:
        """``(keys, values, capacities, cos, sin, logits, local_cos, local_sin)`` of a batched call as
        the native side takes them, each buffer checked as :meth:`_buffers` checks one sequence's."""
        capacities = [self._cache(k, v) for k, v in zip(keys, values, strict=True)]
        cos, sin, local_cos, local_sin = self._tables(tables, rows)
        out = self._logits(logits, logit_rows)
        key_at, value_at = [k.data_ptr() for k in keys], [v.data_ptr() for v in values]
        return (key_at, value_at, capacities, cos, sin, out, local_cos, local_sin)

    def _cache(self, keys: torch.Tensor, values: torch.Tensor) -> int:
        """The capacity of the KV cache ``keys`` / ``values``, checked to be contiguous f32 CPU tensors
        [layers, kv_heads, capacity, head_dim]."""
        d = self.dims
        f32 = torch.float32
        shape = keys.shape
        capacity = shape[2] if len(shape) == 4 else -1
        cache = (self._layers, d.kv_heads, capacity, d.head_dim)
        for t, what in ((keys, "keys"), (values, "values")):
            if t.shape != cache or t.dtype is not f32 or not t.is_cpu or not t.is_contiguous():
                raise ValueError(
                    f"the KV cache's {what} must be contiguous f32 CPU tensors [layers, kv_heads, capacity, "
                    f"head_dim] = {cache}, got {t.dtype} {tuple(t.shape)} on {t.device}"
                )
        return int(capacity)

    def _tables(
        self,
        tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
        rows: int,
    ) -> tuple[int, int, int, int]:
        """The addresses of the rotary rows ``(cos, sin, local_cos, local_sin)``, each checked to be a
        contiguous f32 CPU tensor of ``rows`` rows of the rotary width (0 for a second table not given)."""
        f32 = torch.float32
        cos, sin, local_cos, local_sin = tables
        if (local_cos is None) != (local_sin is None):
            raise ValueError("the second rotary table needs both local_cos and local_sin")
        width = self.dims.rotary_width
        given = [
            (t, what) for t, what in zip(tables, ("cos", "sin", "local cos", "local sin"), strict=True) if t is not None
        ]
        for t, what in given:
            if t.numel() != rows * width or t.dtype is not f32 or not t.is_cpu or not t.is_contiguous():
                raise ValueError(
                    f"the rotary {what} rows must be a contiguous f32 CPU tensor of {rows}x{width} "
                    f"values, got {t.dtype} {tuple(t.shape)} on {t.device}"
                )
        local = (0, 0) if local_cos is None or local_sin is None else (local_cos.data_ptr(), local_sin.data_ptr())
        return (cos.data_ptr(), sin.data_ptr(), *local)

    def _logits(self, logits: torch.Tensor, rows: int) -> int:
        """The address of ``logits``, checked to be a contiguous f32 CPU tensor of ``rows`` x vocab."""
        vocab = self.dims.vocab
        if (
            logits.numel() != rows * vocab
            or logits.dtype is not torch.float32
            or not logits.is_cpu
            or not logits.is_contiguous()
        ):
            raise ValueError(
                f"logits must be a contiguous f32 CPU tensor of {rows}x{vocab} values, "
                f"got {logits.dtype} {tuple(logits.shape)} on {logits.device}"
            )
        return int(logits.data_ptr())


__all__ = [
    "PROMPT_KERNEL_MIN_TOKENS",
    "Activation",
    "Decoder",
    "Dims",
    "Layer",
    "Projection",
    "QMatrix",
    "QuantKind",
    "ensure_threads",
    "from_q4_1",
    "matmul_many",
    "quantize",
]
