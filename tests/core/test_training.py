"""A training step through the backend: forward, loss.backward(), optimizer step — same as eager."""

from __future__ import annotations

import copy

import torch

import torchburn


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 5))


def _step(model: torch.nn.Module, run: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(run(x), y)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))  # type: ignore[union-attr]
        opt.step()
    return grads


def test_training_step_matches_eager_gradients() -> None:
    eager = _model()
    compiled_model = copy.deepcopy(eager)
    fast = torch.compile(compiled_model, backend="torchburn", options={"engine": "reference", "fallback": "error"})
    x, y = torch.randn(16, 20), torch.randint(0, 5, (16,))
    for g_fast, g_eager in zip(_step(compiled_model, fast, x, y), _step(eager, eager, x, y), strict=True):
        torch.testing.assert_close(g_fast, g_eager, rtol=1e-5, atol=1e-6)
    for p_fast, p_eager in zip(compiled_model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p_fast, p_eager, rtol=1e-5, atol=1e-6)
    ops = torchburn.coverage()["reference"]
    # the backward graph went through the engine too: the forward uses addmm, only weight/input grads use mm
    assert ops["aten.mm.default"]["engine"] >= 2
    assert all(row["fallback"] == 0 for row in ops.values())


def test_a_whole_training_step_compiled_with_its_backward_matches_eager() -> None:
    """``torch.compile(step)`` where ``step`` calls ``loss.backward()``: the backward graph is compiled
    while Dynamo's frame hook is on, which must not trace TorchBurn's own code as user code."""
    import warnings

    model = _model()
    x, y = torch.randn(16, 20), torch.randint(0, 5, (16,))

    def step(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for p in model.parameters():
            p.grad = None
        loss = torch.nn.functional.cross_entropy(model(inputs), y)
        loss.backward()
        return loss.detach(), model[0].weight.grad  # type: ignore[return-value]

    expected = step(x)
    fast = torch.compile(step, backend="torchburn", options={"engine": "native", "fallback": "error"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            got = fast(x)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    traced_ourselves = [w for w in caught if "torchburn" in str(w.message) and "Dynamo" in str(w.message)]
    assert not traced_ourselves, traced_ourselves[0].message
    ops = torchburn.coverage()["native"]
    assert ops["aten.mm.default"]["engine"] >= 2 and all(row["fallback"] == 0 for row in ops.values())
