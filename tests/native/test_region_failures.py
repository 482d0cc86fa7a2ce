"""The native engine failing while it plans a region, at compile time or at the first call of a new
size, falls back to eager (counted, warned) instead of crashing the user's program."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torchburn
from helpers import engine_counts


def model(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ x.T + 1).sum(-1)


def test_native_planning_failure_is_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default engine, failing while it plans a region (at compile time for static shapes)."""
    from torchburn_native import planner

    def broken(self: Any) -> Any:
        raise ValueError("sdpa shapes do not agree")

    monkeypatch.setattr(planner.Planner, "run", broken)
    x = torch.randn(5, 3)
    fast = torch.compile(model, backend="torchburn", options={"engine": "native"})
    with pytest.warns(torchburn.TorchBurnFallbackWarning, match="'native' failed while compiling.*do not agree"):
        torch.testing.assert_close(fast(x), model(x))
    assert engine_counts("native")[0] == 0


def test_native_first_run_failure_with_new_sizes_is_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamic shapes plan at the first call of each size: a failure there falls back too."""
    from torchburn_native import planner

    real_run = planner.Planner.run

    def fails_on_seven_rows(self: Any) -> Any:
        if any(isinstance(a, torch.Tensor) and a.shape[0] == 7 for a in self.args):
            raise ValueError("no plan for 7 rows")
        return real_run(self)

    monkeypatch.setattr(planner.Planner, "run", fails_on_seven_rows)
    fast = torch.compile(model, backend="torchburn", options={"engine": "native"}, dynamic=True)
    for rows in (5, 6):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(fast(x), model(x))
    assert engine_counts("native")[1] == 0
    x = torch.randn(7, 3)
    with pytest.warns(torchburn.TorchBurnFallbackWarning, match="failed while running.*no plan for 7 rows"):
        torch.testing.assert_close(fast(x), model(x))
    assert engine_counts("native")[0] == 0
