"""Tracing to ATen: inference graphs take the direct trace, everything needing AOTAutograd still gets it,
and either way PyTorch's mutation and aliasing semantics hold."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo

import torchburn.aten_graph as aten_graph
from helpers import assert_engine_ran, strict_compile

compile_ = strict_compile("native")


@pytest.fixture
def aot_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the graphs handed to AOTAutograd."""
    calls: list[int] = []
    real = aten_graph.aot_module_simplified

    def spy(*args: Any, **kwargs: Any) -> Callable[..., Any]:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(aten_graph, "aot_module_simplified", spy)
    torch._dynamo.reset()
    return calls


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(inplace=True), torch.nn.Linear(32, 4)]
    return torch.nn.Sequential(*layers).eval()


def test_inference_is_lowered_without_aotautograd(aot_calls: list[int]) -> None:
    model, x = _mlp(), torch.randn(8, 16)
    with torch.no_grad():
        expected = model(x)
        got = compile_(model)(x)
    torch.testing.assert_close(got, expected)
    assert_engine_ran("native", 3)
    assert aot_calls == []


def test_training_still_goes_through_aotautograd(aot_calls: list[int]) -> None:
    model, x = _mlp(), torch.randn(8, 16)
    compile_(model)(x).sum().backward()
    expected_grad = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad()
    model(x).sum().backward()
    for got, want in zip(expected_grad, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(got, want)
    assert aot_calls == [1]


def test_a_mutated_input_is_written_back(aot_calls: list[int]) -> None:
    def scale_in_place(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return x + 1.0

    x = torch.randn(5, 7)
    want_x = x * 2.0
    with torch.no_grad():
        out = compile_(scale_in_place)(x)
    torch.testing.assert_close(x, want_x)  # the caller's tensor changed, as in eager
    torch.testing.assert_close(out, want_x + 1.0)
    assert aot_calls == [1]


def test_an_output_viewing_an_input_shares_its_memory(aot_calls: list[int]) -> None:
    def transpose_and_sum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.t(), (x * x).sum(dim=0)

    x = torch.randn(6, 3)
    with torch.no_grad():
        view, total = compile_(transpose_and_sum)(x)
    torch.testing.assert_close(total, (x * x).sum(dim=0))
    assert view.data_ptr() == x.data_ptr() and view.shape == (3, 6)
    assert aot_calls == [1]


def test_outputs_viewing_each_other_go_through_aotautograd(aot_calls: list[int]) -> None:
    def relu_and_flat(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = (x - 0.5).relu()
        return y, y.view(-1)

    x = torch.randn(4, 5)
    with torch.no_grad():
        y, flat = compile_(relu_and_flat)(x)
    torch.testing.assert_close(y, (x - 0.5).relu())
    torch.testing.assert_close(flat, (x - 0.5).relu().view(-1))
    assert aot_calls == [1]


def test_a_view_of_an_intermediate_needs_no_wrapper(aot_calls: list[int]) -> None:
    def flat_gelu(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x * 3.0).reshape(-1)

    x = torch.randn(4, 5)
    with torch.no_grad():
        got = compile_(flat_gelu)(x)
    torch.testing.assert_close(got, torch.nn.functional.gelu(x * 3.0).reshape(-1))
    assert aot_calls == []


def test_grad_switched_on_inside_the_graph_goes_through_aotautograd(aot_calls: list[int]) -> None:
    """Called under ``no_grad``, a function that enables grad itself (a training step) still gets a
    backward: the graph is not an inference graph although grad is off when it is compiled."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def step(x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            loss = model(x).square().mean()
        return loss

    x = torch.randn(8, 16)
    with torch.no_grad():
        loss = compile_(step)(x)
    assert aot_calls and loss.requires_grad
    loss.backward()
    actual = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad()
    step(x).backward()
    for a, p in zip(actual, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad)
    assert_engine_ran("native")
