"""Scans and sorts on the native engine (``lowering/scan.py``, ``kernels/scan.rs``) against eager, strict:
every dim, float and integer dtypes, NaN, ties and empty dims."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from helpers import assert_engine_ran, strict_compile

compile_ = strict_compile("native")


def _input(dtype: torch.dtype, shape: tuple[int, ...] = (3, 5, 4)) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g).round(decimals=1).to(dtype)  # rounded: ties happen
        x.view(-1)[::7] = float("nan")
        return x
    return torch.randint(-5, 5, shape, generator=g, dtype=dtype)


def _check(fn: Callable[..., Any], *inputs: torch.Tensor) -> None:
    with torch.no_grad():
        expected = fn(*inputs)
        actual = compile_(fn)(*inputs)
    torch.testing.assert_close(actual, expected, equal_nan=True, rtol=1e-5, atol=1e-5)
    assert_engine_ran("native")


SCANS = {
    "cumsum": lambda d: lambda x: torch.cumsum(x, d),
    "cumprod": lambda d: lambda x: torch.cumprod(x, d),
    "cummax": lambda d: lambda x: torch.cummax(x, d),
    "cummin": lambda d: lambda x: torch.cummin(x, d),
}


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("name", sorted(SCANS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
def test_scans_match_eager(name: str, dim: int, dtype: torch.dtype) -> None:
    _check(SCANS[name](dim), _input(dtype))


@pytest.mark.parametrize("dim", [0, 2])
def test_logcumsumexp_including_infinities(dim: int) -> None:
    x = _input(torch.float32)
    x[0, 0, 0] = float("-inf")
    x[1, 1, 1] = float("inf")
    _check(lambda t: torch.logcumsumexp(t, dim), x)


def test_half_scans_compute_in_float32() -> None:
    _check(lambda t: torch.cumsum(t, 1), _input(torch.float16))
    _check(lambda t: torch.cumsum(t, 1), _input(torch.bfloat16))


def test_cumsum_of_bools_counts() -> None:
    _check(lambda t: torch.cumsum(t > 0, 2), _input(torch.float32))


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_sort_is_stable_and_orders_nan_like_eager(dim: int, descending: bool, dtype: torch.dtype) -> None:
    _check(lambda t: torch.sort(t, dim=dim, descending=descending, stable=True), _input(dtype))
    _check(lambda t: torch.argsort(t, dim=dim, descending=descending, stable=True), _input(dtype))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize(("k", "dim"), [(1, -1), (3, 1), (4, -1), (0, 0)])
def test_topk(k: int, dim: int, largest: bool) -> None:
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(5))  # distinct values: one order
    _check(lambda t: torch.topk(t, k, dim=dim, largest=largest), x)


def test_flip_and_rot90() -> None:
    x = _input(torch.float32)
    _check(lambda t: torch.flip(t, [0, 2]), x)
    _check(lambda t: torch.rot90(t, 1, [1, 2]), x)
    _check(lambda t: torch.flip(t.transpose(0, 2), [1]) * 2, x)


def test_var_mean_and_round_decimals() -> None:
    x = torch.randn(6, 7, generator=torch.Generator().manual_seed(9))
    _check(lambda t: torch.var_mean(t, 1, correction=0), x)
    _check(lambda t: torch.std_mean(t, [0, 1]), x)
    _check(lambda t: torch.round(t * 100, decimals=-1), x)
    _check(lambda t: torch.round(t, decimals=2), x)
