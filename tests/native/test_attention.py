"""Fused attention (``kernels/attention.rs``) at sizes the small conformance case does not reach: several
key blocks, query blocks that leave padding, value widths other than the query width, every mask kind.
With MKL present both products run there; the Rust unit tests cover the engine's own micro-kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

Compile = Callable[..., Callable[..., Any]]
Ran = Callable[..., None]

# (batch, heads, queries, keys, query/key width, value width)
SHAPES = [(1, 2, 200, 300, 40, 24), (2, 3, 37, 129, 64, 64), (1, 1, 1, 257, 16, 80)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", ["none", "causal", "bool", "additive"])
def test_attention_matches_eager(
    compile_engine: Compile, assert_engine_ran: Ran, shape: tuple[int, ...], mask: str
) -> None:
    b, h, tq, tk, d, dv = shape
    g = torch.Generator().manual_seed(tq * tk + d)
    q, k = torch.randn(b, h, tq, d, generator=g), torch.randn(b, h, tk, d, generator=g)
    v = torch.randn(b, h, tk, dv, generator=g)
    kwargs: dict[str, Any] = {}
    if mask == "causal":
        kwargs["is_causal"] = True
    elif mask == "bool":
        keep = torch.rand(tq, tk, generator=g) > 0.3
        keep[:, 0] = True  # every query sees a key: a fully masked row is NaN in eager's math path
        kwargs["attn_mask"] = keep
    elif mask == "additive":
        kwargs["attn_mask"] = torch.randn(b, 1, tq, tk, generator=g)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    fast = compile_engine(attend)
    with torch.no_grad():
        torch.testing.assert_close(fast(q, k, v), attend(q, k, v), rtol=1e-4, atol=1e-5)
    assert_engine_ran()
