"""PyTorch's C++ helpers for checking and allocating strided CPU tensors, the ones inductor's
generated code calls: about a third of the cost of their Python forms, which stand in where a torch
build lacks them. Engines use them on the per-call path of a compiled region."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _python_empty_strided(size: Any, stride: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype)


def _python_assert_size_stride(t: torch.Tensor, size: Any, stride: Any) -> None:
    if tuple(t.shape) != tuple(size) or t.stride() != tuple(stride):
        raise AssertionError(f"expected size {size} and stride {stride}, got {tuple(t.shape)}, {t.stride()}")


def _guards_helper(name: str, fallback: Callable[..., Any]) -> Callable[..., Any]:
    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    helper = getattr(guards, name, None)
    return helper if callable(helper) else fallback


# empty_strided_cpu(size, stride, dtype): an uninitialized CPU tensor laid out so
empty_strided_cpu: Callable[[Any, Any, torch.dtype], torch.Tensor] = _guards_helper(
    "_empty_strided_cpu", _python_empty_strided
)
# assert_size_stride(t, size, stride): raises AssertionError unless t has exactly that size and stride
assert_size_stride: Callable[[torch.Tensor, Any, Any], None] = _guards_helper(
    "assert_size_stride", _python_assert_size_stride
)
