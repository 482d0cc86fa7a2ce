"""Shapes and values at the edges, each once a wrong answer or an error on the wgpu engine: 0-d
reductions and indices, outputs that are expanded views, buffers under one vec4, truth of negative
numbers, integer clamps and NaN tests of integers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F


def _check(gpu_compile: Callable[..., Any], assert_gpu_ran: Callable[..., None], fn: Any, *inputs: Any) -> None:
    with torch.no_grad():
        expected = fn(*inputs)
        actual = gpu_compile(fn)(*inputs)
    torch.testing.assert_close(actual, expected, equal_nan=True)
    assert_gpu_ran()


@pytest.mark.parametrize("op", [torch.any, torch.all])
def test_truth_of_negative_numbers_and_nan(op: Any, gpu_compile: Any, assert_gpu_ran: Any) -> None:
    x = torch.tensor([[-8.5, 0.0, float("nan")], [0.0, 0.0, -1.0]])
    _check(gpu_compile, assert_gpu_ran, lambda t: op(t, 1), x)
    _check(gpu_compile, assert_gpu_ran, lambda t: op(t - 1), torch.tensor(-8.5))


def test_reductions_over_dim_0_of_a_0d_tensor(gpu_compile: Any, assert_gpu_ran: Any) -> None:
    _check(gpu_compile, assert_gpu_ran, lambda t: (t.sum(0), t.amax(-1), torch.any(t, 0)), torch.tensor(-2.5))


def test_index_select_with_0d_input_or_index(gpu_compile: Any, assert_gpu_ran: Any) -> None:
    _check(
        gpu_compile, assert_gpu_ran, lambda t, i: torch.index_select(t, 0, i) * 2, torch.tensor(3.0), torch.tensor([0])
    )
    x = torch.randn(4, 3)
    _check(gpu_compile, assert_gpu_ran, lambda t, i: torch.index_select(t, 0, i) + 1, x, torch.tensor(2))


def test_an_expanded_output_comes_back_with_its_values(gpu_compile: Any, assert_gpu_ran: Any) -> None:
    _check(gpu_compile, assert_gpu_ran, lambda t: (t * 2).expand(3, 4, 5), torch.randn(4, 1))


@pytest.mark.parametrize("features", [1, 3])
def test_buffers_smaller_than_one_vector(features: int, gpu_compile: Any, assert_gpu_ran: Any) -> None:
    w, b = torch.randn(features, 8), torch.randn(features)
    _check(gpu_compile, assert_gpu_ran, lambda x: F.linear(x, w, b), torch.randn(1, 8))


def test_integer_clamps_and_nan_tests(gpu_compile: Any, assert_gpu_ran: Any) -> None:
    i = torch.arange(-6, 6).reshape(3, 4)
    _check(gpu_compile, assert_gpu_ran, lambda t: torch.clamp(t, -2, 3) * 2, i)
    _check(gpu_compile, assert_gpu_ran, lambda t, lo: torch.clamp(t, min=lo), i, torch.tensor([0, -1, 2, 9]))
    _check(gpu_compile, assert_gpu_ran, lambda t: torch.isnan(t + 1), i)
    _check(gpu_compile, assert_gpu_ran, lambda t: torch.round(t, decimals=1), torch.randn(5, 5))
