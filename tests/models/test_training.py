"""Training compiled with the native engine, strict (forward and backward graphs both on the engine):
optimizer steps of a ResNet (batch norm in training mode, max pooling's backward) and of a
transformer block, and a two-process DistributedDataParallel run, each against the same training in
eager. Parameters after the steps are compared, so every gradient and every running statistic counts.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

import torchburn
from helpers import assert_engine_ran, strict_compile

ENGINE = "native"
# a few steps of SGD through ~20 layers: summation order differences of the kernels compound
TRAINED = {"rtol": 2e-4, "atol": 2e-4}


def _train(
    model: nn.Module,
    run: Callable[..., torch.Tensor],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    make_optimizer: Callable[..., torch.optim.Optimizer],
) -> tuple[list[float], list[torch.Tensor]]:
    """Losses of each step, and the first step's gradients (before the two runs' rounding differs)."""
    optimizer = make_optimizer(model.parameters())
    losses, first_grads = [], []
    for x, y in batches:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(run(x), y)
        loss.backward()
        if not first_grads:
            first_grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, first_grads


def _compare_training(
    model: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    make_optimizer: Callable[..., torch.optim.Optimizer],
) -> None:
    eager = model.train()
    compiled = copy.deepcopy(eager)
    fast = strict_compile(ENGINE)(compiled)
    expected_losses, expected_grads = _train(eager, eager, batches, make_optimizer)
    losses, grads = _train(compiled, fast, batches, make_optimizer)
    names = [name for name, _ in compiled.named_parameters()]
    for name, got, want in zip(names, grads, expected_grads, strict=True):
        # relative to the gradient's own scale: entries near zero carry the others' rounding
        bound = 1e-3 * float(want.abs().max()) + 1e-6
        assert float((got - want).abs().max()) <= bound, f"gradient of {name} differs from eager's"
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected_losses), **TRAINED)
    for name, p_fast, p_eager in zip(names, compiled.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p_fast, p_eager, **TRAINED, msg=lambda m, name=name: f"parameter {name}: {m}")
    for (name, b_fast), b_eager in zip(compiled.named_buffers(), eager.buffers(), strict=True):
        torch.testing.assert_close(b_fast, b_eager, **TRAINED, msg=lambda m, name=name: f"buffer {name}: {m}")
    assert_engine_ran(ENGINE)
    ops = torchburn.coverage()[ENGINE]
    # the backward graph ran on the engine too: convolution's or a matmul's gradient is there
    assert any("backward" in op or op == "aten.mm.default" for op in ops), sorted(ops)


def _batches(n: int, shape: tuple[int, ...], classes: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(shape, generator=g), torch.randint(0, classes, (shape[0],), generator=g)) for _ in range(n)]


def test_resnet_optimizer_steps_match_eager() -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    # a freshly initialized ResNet with batch norm over small batches is chaotic: at lr 0.01 two eager
    # runs a part in a million apart at the start differ by 1e-3 after three steps; at 0.001 by 1e-4
    batches = _batches(3, (8, 3, 64, 64), 10)
    _compare_training(model, batches, lambda params: torch.optim.SGD(params, lr=0.001, momentum=0.9))
    ops = torchburn.coverage()[ENGINE]
    # max pooling's gradient is a scatter-add; each convolution's two gradients are convolutions too
    assert "aten.scatter_add.default" in ops, sorted(ops)
    forward_convolutions = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert ops["aten.convolution.default"]["engine"] >= 2 * forward_convolutions


class _Block(nn.Module):
    """A pre-norm transformer block with a classification head, as in a small ViT or BERT."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.head = nn.Linear(32, 5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.embed(tokens)).mean(1))


def test_transformer_block_optimizer_steps_match_eager() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randint(0, 50, (4, 12), generator=g), torch.randint(0, 5, (4,), generator=g)) for _ in range(3)]
    _compare_training(_Block(), batches, lambda params: torch.optim.AdamW(params, lr=1e-3))


_DDP_WORKER = """
import os, sys, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))
# the compiled module inside DDP: Dynamo does not trace DDP's own forward (it runs its inner module
# with Dynamo disabled), so torch.compile(DDP(model)) would leave the model in eager
strict = {"engine": "native", "fallback": "error"}
fast = DistributedDataParallel(torch.compile(model, backend="torchburn", options=strict))
optimizer = torch.optim.SGD(fast.parameters(), lr=0.1, momentum=0.9)
g = torch.Generator().manual_seed(3)
for _ in range(4):
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
    shard = slice(rank * 8 // world, (rank + 1) * 8 // world)  # each rank its half of the batch
    optimizer.zero_grad()
    nn.functional.cross_entropy(fast(x[shard]), y[shard]).backward()
    optimizer.step()
import torchburn
ops = torchburn.coverage()["native"]
assert sum(r["engine"] for r in ops.values()) > 0 and all(r["fallback"] == 0 for r in ops.values()), ops
if rank == 0:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _eager_full_batch_training() -> dict[str, torch.Tensor]:
    """What the two ranks compute together: averaged gradients of two half batches = the full batch's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.state_dict()


def test_two_process_ddp_matches_eager(tmp_path: Path) -> None:
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.fail("this torch build has no gloo backend for CPU DistributedDataParallel")
    port, out = _free_port(), tmp_path / "rank0.safetensors"
    env = {**os.environ, "TORCHBURN_NUM_THREADS": "1"}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _DDP_WORKER, str(rank), "2", str(port), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    results = [w.communicate(timeout=600) for w in workers]
    for rank, (w, (stdout, stderr)) in enumerate(zip(workers, results, strict=True)):
        assert w.returncode == 0, f"rank {rank} failed:\n{stdout}\n{stderr}"
    from safetensors.torch import load_file

    trained = load_file(out)
    expected = _eager_full_batch_training()
    assert trained.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
