"""An engine that raises while compiling or running a region costs speed, never the user's program:
the region runs eagerly (counted, warned) or, under ``fallback="error"``, the call raises
``FallbackError`` with the engine's message."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torchburn
from helpers import engine_counts
from torchburn.engines.reference import ReferenceEngine, ReferenceProgram


def model(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ x.T + 1).sum(-1)


class EngineBug(RuntimeError):
    pass


def _compile(mode: str) -> Any:
    return torch.compile(model, backend="torchburn", options={"engine": "reference", "fallback": mode})


@pytest.fixture
def failing_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    def compile(self: ReferenceEngine, region: Any) -> Any:
        raise EngineBug("planner met a shape it did not expect")

    monkeypatch.setattr(ReferenceEngine, "compile", compile)


@pytest.fixture
def failing_run(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def run(self: ReferenceProgram, *args: Any) -> Any:
        calls.append(1)
        raise EngineBug("kernel launch failed")

    monkeypatch.setattr(ReferenceProgram, "__call__", run)
    return calls


@pytest.mark.parametrize("mode", ["warn", "silent"])
def test_compile_failure_falls_back_to_eager(failing_compile: None, mode: str) -> None:
    x = torch.randn(5, 3)
    if mode == "warn":
        with pytest.warns(torchburn.TorchBurnFallbackWarning, match=r"'reference' failed while compiling.*EngineBug"):
            out = _compile(mode)(x)
    else:
        out = _compile(mode)(x)
    torch.testing.assert_close(out, model(x))
    ran, fell = engine_counts("reference")
    assert ran == 0 and fell >= 3  # mm, add, tanh, sum: all counted as fallen back
    assert torchburn.coverage()["reference"]["aten.tanh.default"] == {"engine": 0, "fallback": 1}


def test_compile_failure_under_error_carries_the_engine_message(failing_compile: None) -> None:
    with pytest.raises(torchburn.FallbackError, match="planner met a shape it did not expect") as info:
        _compile("error")(torch.randn(5, 3))
    assert info.value.engine == "reference" and "aten.tanh.default" in info.value.ops
    assert "EngineBug" in str(info.value.failure)


def test_run_failure_falls_back_once_and_for_good(failing_run: list[int]) -> None:
    x = torch.randn(5, 3)
    fast = _compile("warn")
    with pytest.warns(torchburn.TorchBurnFallbackWarning, match=r"failed while running.*kernel launch failed"):
        torch.testing.assert_close(fast(x), model(x))
    torch.testing.assert_close(fast(x + 1), model(x + 1))
    assert len(failing_run) == 1  # the engine is not asked again
    ran, fell = engine_counts("reference")
    assert ran == 0 and fell >= 3


def test_run_failure_under_error_raises(failing_run: list[int]) -> None:
    with pytest.raises(torchburn.FallbackError, match="kernel launch failed"):
        _compile("error")(torch.randn(5, 3))


def test_bad_input_gives_eagers_own_error(failing_run: list[int]) -> None:
    """Where eager fails as well, the input is at fault: the user sees PyTorch's error, not ours."""
    table = torch.randn(4, 3)

    def lookup(i: torch.Tensor) -> torch.Tensor:
        return table[i] * 2

    fast = torch.compile(lookup, backend="torchburn", options={"engine": "reference", "fallback": "error"})
    with pytest.raises(IndexError, match="out of bounds"):
        fast(torch.tensor([0, 9]))
    assert engine_counts("reference")[1] == 0  # not counted as the engine's failure


def test_a_graph_that_cannot_be_traced_to_aten_runs_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while tracing to ATen (say, a decomposition PyTorch cannot trace) falls back for the
    whole graph: eager values and a warning, or a FallbackError naming the failure in strict mode."""
    import torchburn.warm_start

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("aot_autograd expected to have an entirely functional graph")

    monkeypatch.setattr(torchburn.warm_start, "to_aten", broken)
    x = torch.randn(4, 4)
    with pytest.warns(UserWarning, match="tracing a graph to ATen failed .*AssertionError"):
        got = _compile("warn")(x)
    torch.testing.assert_close(got, model(x))
    torch._dynamo.reset()
    with pytest.raises(torchburn.FallbackError, match="tracing to ATen failed: AssertionError"):
        _compile("error")(x)
