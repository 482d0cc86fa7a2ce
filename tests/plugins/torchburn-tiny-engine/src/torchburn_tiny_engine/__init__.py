"""A third-party engine in one file, on TorchBurn's planning layer: add, mul, relu and (kept whole) gelu
on contiguous float32.

Its lowering table says what it runs; the shared graph walk turns a region into a plan (a list of
steps over numbered slots) once per input signature; running a plan calls this engine's own kernels
and counts each call, so tests can prove that its code, not PyTorch's fallback, produced the values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import torchburn
from torchburn import Engine, Region
from torchburn.planning import Family, GraphWalk, LoweringTable, PlannedRegion

aten = torch.ops.aten
KERNEL_CALLS: dict[str, int] = {}
TABLE = LoweringTable("tiny")
F32 = [torch.float32]


def _gelu(x: torch.Tensor) -> torch.Tensor:
    # exact GELU written out, so it is not PyTorch's gelu kernel that runs
    return x * 0.5 * (1.0 + torch.special.erf(x / math.sqrt(2.0)))


@dataclass
class Plan:
    """Steps ``(kernel name, kernel, argument slots or constants, result slot)`` over numbered slots."""

    steps: list[tuple[str, Callable[..., torch.Tensor], tuple[Any, ...], int]] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def run(self, args: Sequence[Any]) -> tuple[torch.Tensor, ...]:
        slots = {i: a for i, a in enumerate(args)}
        for name, kernel, operands, result in self.steps:
            KERNEL_CALLS[name] = KERNEL_CALLS.get(name, 0) + 1
            slots[result] = kernel(*[slots[o] if isinstance(o, Slot) else o for o in operands])
        return tuple(slots[o] for o in self.outputs)


class Slot(int):
    """A plan slot (input ``i`` is slot ``i``)."""


class Planner(GraphWalk):
    table = TABLE

    def __init__(self, gm: torch.fx.GraphModule, args: Sequence[Any]) -> None:
        super().__init__(gm, args)
        self.plan = Plan()
        self.next_slot = len(args)

    def bind_input(self, position: int, tensor_index: int, tensor: torch.Tensor) -> tuple[Any, torch.Tensor]:
        return Slot(position), torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")

    def step(self, op: Any, kernel: Callable[..., torch.Tensor], *operands: Any) -> Slot:
        result = Slot(self.next_slot)
        self.next_slot += 1
        self.plan.steps.append((str(op), kernel, operands, result))
        return result


@TABLE.lower(aten.add.Tensor, family=Family.ELEMENTWISE, dtypes=F32, contiguous_only=True)
def add(p: Planner, node: Any, a: Slot, b: Any, *, alpha: float = 1) -> Slot:
    return p.step(node.target, lambda x, y: torch.add(x, y, alpha=alpha), a, b)


@TABLE.lower(aten.mul.Tensor, family=Family.ELEMENTWISE, dtypes=F32, contiguous_only=True)
def mul(p: Planner, node: Any, a: Slot, b: Any) -> Slot:
    return p.step(node.target, torch.mul, a, b)


@TABLE.lower(aten.relu.default, family=Family.ACTIVATION, dtypes=F32, contiguous_only=True)
def relu(p: Planner, node: Any, x: Slot) -> Slot:
    return p.step(node.target, torch.relu, x)


@TABLE.lower(aten.gelu.default, family=Family.ACTIVATION, dtypes=F32, contiguous_only=True)
def gelu(p: Planner, node: Any, x: Slot, *, approximate: str = "none") -> Slot:
    if approximate != "none":
        raise NotImplementedError("only exact (erf) GELU")  # never reached: unread values are declined
    return p.step(node.target, _gelu, x)


class TinyRegion(PlannedRegion[Plan]):
    def make_plan(self, args: Sequence[Any]) -> Plan:
        planner = Planner(self.graph_module, args)
        planner.plan.outputs = [int(v) for v in planner.walk()]
        return planner.plan

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        return self.plan_for(args).run(args)


class TinyEngine(Engine):
    name = "tiny"
    aliases = ("tiny-engine",)
    device = "cpu"
    version = "0.0.1"
    partial_opset = True
    ops = TABLE.ops

    def keep_whole(self) -> frozenset[Any]:
        return frozenset({aten.gelu.default})

    def compile(self, region: Region) -> TinyRegion:
        return TinyRegion(region.graph_module)


@torchburn.hookimpl
def register_engines(register: Callable[[Engine], None]) -> None:
    register(TinyEngine())
