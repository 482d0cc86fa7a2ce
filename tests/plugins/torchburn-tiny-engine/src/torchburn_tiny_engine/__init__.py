"""A third-party engine in one file: add, mul, relu and (kept whole) gelu on contiguous float32.

It interprets a region with its own kernel table and counts every kernel it runs, so tests can prove
that its code, not PyTorch's fallback, produced the values.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

import torchburn
from torchburn import Engine, OpRegistry, Region

aten = torch.ops.aten
KERNEL_CALLS: dict[str, int] = {}


def _gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    # exact GELU written out, so it is not PyTorch's gelu kernel that runs
    return x * 0.5 * (1.0 + torch.special.erf(x / math.sqrt(2.0)))


KERNELS: dict[Any, Callable[..., torch.Tensor]] = {
    aten.add.Tensor: lambda a, b, alpha=1: torch.add(a, b, alpha=alpha),
    aten.mul.Tensor: torch.mul,
    aten.relu.default: torch.relu,
    aten.gelu.default: _gelu,
}


class TinyProgram:
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.nodes = list(gm.graph.nodes)

    def __call__(self, *args: Any) -> Sequence[Any]:
        env: dict[torch.fx.Node, Any] = {}
        inputs = iter(args)
        for node in self.nodes:
            if node.op == "placeholder":
                env[node] = next(inputs)
            elif node.op == "output":
                return tuple(env[n] for n in node.args[0])
            elif node.target is operator.getitem:
                env[node] = env[node.args[0]][node.args[1]]
            else:
                fn = KERNELS[node.target]
                a = [env[x] if isinstance(x, torch.fx.Node) else x for x in node.args]
                KERNEL_CALLS[str(node.target)] = KERNEL_CALLS.get(str(node.target), 0) + 1
                env[node] = fn(*a, **node.kwargs)
        raise AssertionError("region graph has no output")


class TinyEngine(Engine):
    name = "tiny"
    aliases = ("tiny-engine",)
    device = "cpu"
    version = "0.0.1"
    partial_opset = True
    ops = OpRegistry("tiny")
    ops.add(
        [aten.add.Tensor, aten.mul.Tensor, aten.relu.default],
        family="elementwise",
        dtypes=[torch.float32],
        contiguous_only=True,
    )
    ops.add(
        aten.gelu.default,
        family="activation",
        dtypes=[torch.float32],
        contiguous_only=True,
        check=lambda node: node.kwargs.get("approximate", "none") == "none" or "only exact (erf) GELU",
    )

    def keep_whole(self) -> frozenset[Any]:
        return frozenset({aten.gelu.default})

    def compile(self, region: Region) -> TinyProgram:
        return TinyProgram(region.graph_module)


@torchburn.hookimpl
def register_engines(register: Callable[[Engine], None]) -> None:
    register(TinyEngine())
