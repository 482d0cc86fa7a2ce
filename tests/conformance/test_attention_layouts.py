"""Attention in every layout models hand it over, on every engine, strict, against eager.

Attention reaches engines as ``aten._scaled_dot_product_flash_attention_for_cpu``, whose k and v may
have fewer heads than q (grouped-query attention: ``enable_gqa=True`` passes them so); its operands are
often views (q, k and v sliced from one fused projection, heads moved by a transpose, k/v broadcast over
heads by ``expand``), its mask broadcasts from any rank, and ``scale`` and ``is_causal`` change every
score. An engine that claims the op must get each of these right or decline the node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchburn
from helpers import engine_counts

ENGINES = [e.name for e in torchburn.list_engines() if e.available and not torchburn.get_engine(e.name).partial_opset]

Inputs = tuple[torch.Tensor, ...]
Layout = Callable[[torch.Generator], tuple[Callable[..., torch.Tensor], Inputs]]


def _r(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def contiguous(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
    return F.scaled_dot_product_attention, (_r(g, 2, 4, 9, 16), _r(g, 2, 4, 11, 16), _r(g, 2, 4, 11, 16))


def grouped(heads: int, kv_heads: int, **kwargs: Any) -> Layout:
    def build(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
        def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)

        return f, (_r(g, 2, heads, 7, 16), _r(g, 2, kv_heads, 13, 16), _r(g, 2, kv_heads, 13, 24))

    return build


def grouped_with_mask(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
    keep = torch.rand(7, 13, generator=g) > 0.3
    keep[:, 0] = True  # every query sees a key (eager's math path gives NaN otherwise)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)

    return f, (_r(g, 2, 6, 7, 16), _r(g, 2, 3, 13, 16), _r(g, 2, 3, 13, 16))


def fused_projection(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
    """q, k and v as strided slices of one [b, t, 3, h, d] projection, output back to [b, t, h·d]."""

    def f(qkv: torch.Tensor) -> torch.Tensor:
        b, t = qkv.shape[:2]
        q, k, v = qkv.view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4).unbind(0)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, 32)

    return f, (_r(g, 2, 10, 96),)


def heads_transposed(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
    """[b, t, h, d] tensors viewed as [b, h, t, d] (rows strided by h·d)."""

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

    return f, (_r(g, 2, 9, 4, 16), _r(g, 2, 12, 4, 16), _r(g, 2, 12, 4, 16))


def kv_expanded(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
    """One k/v head broadcast over the query heads by expand (head stride 0)."""

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k.expand(2, 4, 12, 16), v.expand(2, 4, 12, 16))

    return f, (_r(g, 2, 4, 9, 16), _r(g, 2, 1, 12, 16), _r(g, 2, 1, 12, 16))


def grouped_repeated_by_hand(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
    """What older transformers did: repeat_interleave k/v to the query heads, then plain attention."""

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k = k[:, :, None].expand(2, 2, 2, 12, 16).reshape(2, 4, 12, 16)
        v = v[:, :, None].expand(2, 2, 2, 12, 16).reshape(2, 4, 12, 16)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return f, (_r(g, 2, 4, 12, 16), _r(g, 2, 2, 12, 16), _r(g, 2, 2, 12, 16))


def masked(shape: tuple[int, ...], kind: str) -> Layout:
    def build(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
        if kind == "bool":
            mask = torch.rand(*shape, generator=g) > 0.3
            mask[..., 0] = True
        else:
            mask = _r(g, *shape)

        def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        return f, (_r(g, 2, 3, 5, 8), _r(g, 2, 3, 6, 8), _r(g, 2, 3, 6, 8))

    return build


def causal(tq: int, tk: int) -> Layout:
    def build(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
        def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        return f, (_r(g, 1, 2, tq, 8), _r(g, 1, 2, tk, 8), _r(g, 1, 2, tk, 8))

    return build


def scaled(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, scale=0.37)

    return f, (_r(g, 2, 2, 6, 8), _r(g, 2, 2, 6, 8), _r(g, 2, 2, 6, 8))


def value_width(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
    return F.scaled_dot_product_attention, (_r(g, 1, 3, 4, 8), _r(g, 1, 3, 5, 8), _r(g, 1, 3, 5, 20))


def one_query(g: torch.Generator) -> tuple[Callable[..., torch.Tensor], Inputs]:
    """A decode step: one query row over many keys, grouped."""

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    return f, (_r(g, 1, 8, 1, 16), _r(g, 1, 2, 40, 16), _r(g, 1, 2, 40, 16))


LAYOUTS: dict[str, Layout] = {
    "contiguous": contiguous,
    "gqa-4q-2kv": grouped(4, 2),
    "gqa-8q-2kv-causal": grouped(8, 2, is_causal=True),
    "mqa-6q-1kv": grouped(6, 1),
    "gqa-scale": grouped(4, 2, scale=0.2),
    "gqa-bool-mask": grouped_with_mask,
    "gqa-one-query": one_query,
    "gqa-repeated-by-hand": grouped_repeated_by_hand,
    "fused-qkv-projection": fused_projection,
    "heads-transposed": heads_transposed,
    "kv-expanded-over-heads": kv_expanded,
    "mask-bool-2d": masked((5, 6), "bool"),
    "mask-float-4d": masked((2, 3, 5, 6), "float"),
    "mask-float-head-broadcast": masked((2, 1, 5, 6), "float"),
    "mask-float-key-row": masked((1, 6), "float"),
    "causal-fewer-queries": causal(3, 7),
    "causal-more-queries": causal(7, 3),
    "scale": scaled,
    "value-width": value_width,
}


def _check(engine: str, fn: Callable[..., torch.Tensor], inputs: Inputs) -> None:
    torchburn.reset_coverage()
    torch._dynamo.reset()
    with torch.no_grad():
        want = fn(*inputs)
        got = torch.compile(fn, backend="torchburn", options={"engine": engine, "fallback": "error"})(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
    ran, fell = engine_counts(engine)
    assert ran > 0 and fell == 0


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("engine", ENGINES)
def test_attention_layout_matches_eager(engine: str, layout: str) -> None:
    fn, inputs = LAYOUTS[layout](torch.Generator().manual_seed(7))
    _check(engine, fn, inputs)


@pytest.mark.parametrize("layout", ["gqa-4q-2kv", "gqa-8q-2kv-causal", "gqa-bool-mask", "mqa-6q-1kv"])
def test_wgpu_fused_kernel_groups_heads(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small problems take the GPU engine's two-product plan; force its fused kernel too."""
    if "wgpu" not in ENGINES:
        pytest.fail("the wgpu engine is unavailable (CI installs mesa-vulkan-drivers for it)", pytrace=False)
    from torchburn_wgpu.lowering import attention

    monkeypatch.setattr(attention, "SCORES_IN_MEMORY", 0)
    fn, inputs = LAYOUTS[layout](torch.Generator().manual_seed(7))
    _check("wgpu", fn, inputs)


@pytest.mark.parametrize("engine", ENGINES)
def test_transformers_llama_with_grouped_query_attention(engine: str) -> None:
    """The model that crashed the compile (native) and came out wrong (wgpu): 2 layers, 4 heads over
    2 key/value heads, 48 tokens, as transformers builds it (sdpa with enable_gqa)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = transformers.LlamaModel(config).eval()
    ids = torch.randint(0, 100, (1, 48), generator=torch.Generator().manual_seed(1))

    def run(ids: torch.Tensor) -> torch.Tensor:
        return model(ids).last_hidden_state  # type: ignore[no-any-return]

    _check(engine, run, (ids,))
