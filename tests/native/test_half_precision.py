"""bfloat16 and float16 through the ops that compute in float32 and store back (attention, convolution,
max pooling), as PyTorch's CPU kernels accumulate: each result is the float32 computation on the same
rounded inputs, rounded once, so it may differ from it by one rounding of the output at most."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

Compile = Callable[..., Callable[..., Any]]
Ran = Callable[..., None]
HALVES = [torch.bfloat16, torch.float16]


def _rounded_once(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
    """``fn`` in float32 on ``inputs`` (already rounded to their dtype), rounded to that dtype."""
    return fn(*(x.float() for x in inputs)).to(inputs[0].dtype)


def _assert_one_rounding_apart(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    spacing = torch.finfo(expected.dtype).eps * expected.float().abs().clamp_min(1e-3)
    assert ((actual.float() - expected.float()).abs() <= spacing).all()


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_attention(compile_engine: Compile, assert_engine_ran: Ran, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 16, generator=g).to(dtype) for _ in range(3))

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with torch.no_grad():
        actual = compile_engine(attend)(q, k, v)
    _assert_one_rounding_apart(actual, _rounded_once(attend, q, k, v))
    assert_engine_ran(1)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_convolution_and_max_pooling(compile_engine: Compile, assert_engine_ran: Ran, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 12, 12, generator=g).to(dtype)
    w, b = torch.randn(8, 3, 3, 3, generator=g).to(dtype), torch.randn(8, generator=g).to(dtype)

    def conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, b, padding=1)

    with torch.no_grad():
        actual = compile_engine(conv)(x, w, b)
        _assert_one_rounding_apart(actual, _rounded_once(conv, x, w, b))
        pooled = compile_engine(lambda x: F.max_pool2d(x, 2))(x)
    assert torch.equal(pooled, F.max_pool2d(x.float(), 2).to(dtype))  # a maximum rounds to itself
    assert_engine_ran(2)
