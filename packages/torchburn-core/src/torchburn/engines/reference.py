"""The ``reference`` engine: runs a region's ATen graph with PyTorch's own ops.

It is the oracle of the conformance suite (every other engine must agree with it and with eager) and
lets core be tested without native code. Its stored program is the region graph in JSON form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import graph_codec
from .._version import __version__
from ..hookspecs import hookimpl
from ..ops import OpRegistry
from .base import Engine, Program, Region


def _functional_aten(op: Any) -> bool:
    return isinstance(op, torch._ops.OpOverload) and op.namespace in ("aten", "prims") and not op._schema.is_mutable


class ReferenceProgram:
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.graph_module = gm
        self._forward: Callable[..., Sequence[Any]] = gm.forward

    def __call__(self, *args: Any) -> Sequence[Any]:
        return self._forward(*args)


class ReferenceEngine(Engine):
    name = "reference"
    device = "cpu"
    version = __version__
    priority = -100  # correct but slow: never preferred over a real engine
    ops = OpRegistry("reference")
    ops.add_rule("every functional aten/prims op", _functional_aten)

    def compile(self, region: Region) -> Program:
        return ReferenceProgram(region.graph_module)

    def serialize(self, program: Program) -> bytes | None:
        assert isinstance(program, ReferenceProgram)
        try:
            return graph_codec.dumps(program.graph_module)
        except graph_codec.GraphCodecError:
            return None  # kept in memory only

    def load(self, region: Region, payload: bytes) -> Program:
        return ReferenceProgram(graph_codec.loads(payload, region.graph_module))


@hookimpl
def register_engines(register: Callable[[Engine], None]) -> None:
    register(ReferenceEngine())
