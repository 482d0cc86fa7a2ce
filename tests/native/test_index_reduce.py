"""scatter_reduce and index_reduce on the native engine against eager, strict: every reduction, with
and without the tensor's own values, duplicate targets and NaN."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_engine_ran, strict_compile

compile_ = strict_compile("native")
REDUCTIONS = ["sum", "prod", "mean", "amax", "amin"]


def _data(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(4, 6, generator=g, dtype=dtype)
    src = torch.randn(4, 6, generator=g, dtype=dtype)
    src[1, 2] = float("nan")
    index = torch.randint(0, 3, (4, 6), generator=g)  # many duplicates; columns 3..5 never targeted
    return x, index, src


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scatter_reduce(reduce: str, include_self: bool, dtype: torch.dtype) -> None:
    x, index, src = _data(dtype)

    def fn(a: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.scatter_reduce(a * 1, 1, i, s, reduce, include_self=include_self)

    with torch.no_grad():
        torch.testing.assert_close(compile_(fn)(x, index, src), fn(x, index, src), equal_nan=True)
    assert_engine_ran("native")


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(reduce: str, include_self: bool) -> None:
    x, _, src = _data(torch.float32)
    index = torch.tensor([0, 2, 0, 1, 2, 2])

    def fn(a: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (a + 0).index_reduce(1, i, s, reduce, include_self=include_self)

    with torch.no_grad():
        torch.testing.assert_close(compile_(fn)(x, index, src), fn(x, index, src), equal_nan=True)
    assert_engine_ran("native")
