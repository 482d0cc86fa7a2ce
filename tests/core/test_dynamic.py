"""Dynamic shapes: new sizes run correctly without a Dynamo recompile per size."""

from __future__ import annotations

from typing import Any

import torch

from helpers import engine_counts
from torchburn.backend import torchburn_backend


class _Counting:
    """A backend that counts how often Dynamo compiles, then hands over to torchburn."""

    def __init__(self) -> None:
        self.compiles = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.compiles += 1
        return torchburn_backend(gm, example_inputs, options={"engine": "reference", "fallback": "error"})


def _fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x @ w, dim=-1) * x.shape[0] + x.sum(0, keepdim=True) @ w


def test_dynamic_true_compiles_once_for_many_sizes() -> None:
    backend = _Counting()
    fast = torch.compile(_fn, backend=backend, dynamic=True)
    w = torch.randn(7, 3)
    for n in (2, 3, 5, 8, 13, 21):
        x = torch.randn(n, 7)
        torch.testing.assert_close(fast(x, w), _fn(x, w))
    assert backend.compiles == 1
    assert engine_counts("reference")[0] > 0


def test_automatic_dynamic_stops_recompiling_after_second_size() -> None:
    backend = _Counting()
    fast = torch.compile(_fn, backend=backend)
    w = torch.randn(7, 3)
    for n in (4, 6, 9, 10, 17):
        x = torch.randn(n, 7)
        torch.testing.assert_close(fast(x, w), _fn(x, w))
    assert backend.compiles == 2  # static first, then one dynamic graph for every later size


def test_mark_dynamic() -> None:
    backend = _Counting()
    fast = torch.compile(_fn, backend=backend)
    w = torch.randn(7, 3)
    for n in (3, 11, 12):
        x = torch.randn(n, 7)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(fast(x, w), _fn(x, w))
    assert backend.compiles == 1
