"""The LLM runtime reaches the native engine only through its public modules, ``torchburn_native.transformer``
and ``torchburn_native.ggml``, whose calls check every tensor they are handed before its address crosses
into native code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torchburn_native.transformer import Decoder, Dims, Layer, Projection, QuantKind, from_q4_1, matmul_many, quantize

import torchburn_llm

PUBLIC = ("torchburn_native.transformer", "torchburn_native.ggml")


def _llm_sources() -> list[Path]:
    return sorted(Path(torchburn_llm.__file__).parent.rglob("*.py"))


def test_the_llm_runtime_imports_only_the_public_native_api() -> None:
    sources = _llm_sources()
    assert sources, "torchburn_llm's sources were not found"
    wrong = []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchburn_native"):
                if node.module not in PUBLIC:
                    wrong.append(f"{path.name}:{node.lineno}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                wrong += [
                    f"{path.name}:{node.lineno}: import {a.name}"
                    for a in node.names
                    if a.name.startswith("torchburn_native") and a.name not in PUBLIC
                ]
        wrong += [
            f"{path.name}: mentions {m.group(0)}" for m in re.finditer(r"torchburn_native\._\w+|\b_native\b", text)
        ]
    assert not wrong, f"the LLM runtime must use {' and '.join(PUBLIC)} only:\n" + "\n".join(wrong)


@pytest.mark.parametrize("kind", ["int8", "int4", "bf16"])
def test_matmul_many_matches_the_products_of_its_matrices(kind: QuantKind) -> None:
    torch.manual_seed(0)
    weights = [torch.randn(48, 64), torch.randn(16, 64)]
    x = torch.randn(3, 5, 64)
    outs = matmul_many([quantize(w, kind) for w in weights], x)
    for w, out in zip(weights, outs, strict=True):
        assert out.shape == (3, 5, w.shape[0])
        want = F.linear(x, w)
        # activations are quantized too (int8 per block of 32); int4 has 16 levels per block of weights
        tol = {"int8": 0.03, "bf16": 0.03, "int4": 0.25}[kind] * want.abs().max().item()
        assert (out - want).abs().max().item() < tol


def test_quantized_matrices_reject_what_is_not_a_matrix_of_their_kind() -> None:
    with pytest.raises(ValueError, match="matrix"):
        quantize(torch.randn(64), "int8")
    with pytest.raises(ValueError, match="Q4_1 blocks of a 2x64 matrix are 80 uint8 values"):
        from_q4_1(torch.zeros(79, dtype=torch.uint8), 2, 64)
    with pytest.raises(ValueError, match="inputs"):
        matmul_many([quantize(torch.randn(8, 64), "int8")], torch.randn(2, 32))


def _tiny_decoder() -> tuple[Decoder, int, int]:
    torch.manual_seed(0)
    hidden, heads, kv_heads, head_dim, vocab, inter = 64, 2, 1, 32, 40, 96

    def proj(n: int, k: int) -> Projection:
        return Projection(torch.randn(n, k) * 0.1)

    layer = Layer(
        attn_norm=torch.ones(hidden),
        mlp_norm=torch.ones(hidden),
        q=proj(heads * head_dim, hidden),
        k=proj(kv_heads * head_dim, hidden),
        v=proj(kv_heads * head_dim, hidden),
        o=proj(hidden, heads * head_dim),
        gate=proj(inter, hidden),
        up=proj(inter, hidden),
        down=proj(hidden, inter),
    )
    dims = Dims(hidden, heads, kv_heads, head_dim, vocab, eps=1e-5)
    return Decoder(dims, torch.randn(vocab, hidden), torch.ones(hidden), proj(vocab, hidden), [layer]), head_dim, vocab


def test_decoder_steps_check_the_buffers_they_are_given() -> None:
    decoder, head_dim, vocab = _tiny_decoder()
    keys, values = torch.zeros(1, 1, 8, head_dim), torch.zeros(1, 1, 8, head_dim)
    cos, sin = torch.ones(1, head_dim), torch.zeros(1, head_dim)
    logits = torch.empty(1, vocab)
    step = decoder.step
    step(3, 0, keys, values, cos, sin, logits)
    assert torch.isfinite(logits).all() and keys[0, 0, 0].abs().sum() > 0
    with pytest.raises(ValueError, match="KV cache's keys"):
        step(3, 1, torch.zeros(1, 2, 8, head_dim), values, cos, sin, logits)
    with pytest.raises(ValueError, match="KV cache's values"):
        step(3, 1, keys, torch.zeros(1, 1, 8, head_dim, dtype=torch.float64), cos, sin, logits)
    with pytest.raises(ValueError, match="rotary cos"):
        step(3, 1, keys, values, torch.ones(2, head_dim), sin, logits)
    with pytest.raises(ValueError, match="logits"):
        step(3, 1, keys, values, cos, sin, torch.empty(vocab - 1))
    with pytest.raises(IndexError, match="out of bounds"):
        step(3, 8, keys, values, cos, sin, logits)
    with pytest.raises(ValueError, match="logits"):
        decoder.prefill([1, 2], 1, keys, values, torch.ones(2, head_dim), torch.zeros(2, head_dim), logits, True)


def test_decoders_check_the_tensors_they_are_built_from() -> None:
    dims = Dims(hidden=64, heads=2, kv_heads=1, head_dim=32, vocab=40, eps=1e-5)
    with pytest.raises(ValueError, match="the embedding has 64 values, expected 2560"):
        Decoder(dims, torch.randn(1, 64), torch.ones(64), Projection(torch.randn(40, 64)), [])
