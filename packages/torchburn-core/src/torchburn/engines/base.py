"""The engine interface: what core asks of an engine and what it hands it.

Core lowers a graph to ATen, asks :meth:`Engine.supports` node by node, cuts the supported nodes into
regions, and calls :meth:`Engine.compile` once per region. The returned program is called with the
region's inputs (tensors, and Python ints for symbolic sizes) and returns a tuple of its outputs.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from .. import ops as _ops

if TYPE_CHECKING:
    from ..cache.key import GraphKey
    from ..options import CompileOptions

Program = Callable[..., Sequence[Any]]


@dataclass(frozen=True)
class TensorSpec:
    """Dtype, shape and layout of one tensor in a graph; sizes may be symbolic (``torch.SymInt``)."""

    dtype: torch.dtype
    shape: tuple[Any, ...]
    stride: tuple[Any, ...]
    storage_offset: Any = 0

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in reversed(list(zip(self.shape, self.stride, strict=True))):
            if size != 1 and stride != expected:
                return False
            expected = expected * size
        return True

    @property
    def is_dynamic(self) -> bool:
        return any(not isinstance(s, int) for s in (*self.shape, *self.stride))

    @staticmethod
    def of(value: Any) -> TensorSpec | None:
        """Spec of a (fake) tensor; None for anything else."""
        if not isinstance(value, torch.Tensor):
            return None
        return TensorSpec(value.dtype, tuple(value.shape), tuple(value.stride()), value.storage_offset())


@dataclass(frozen=True)
class NodeSpec:
    """One ATen node as an engine sees it when deciding support."""

    node: torch.fx.Node
    target: Any  # torch._ops.OpOverload for every node offered to an engine
    inputs: tuple[TensorSpec | None, ...]  # one per positional arg: None where the arg is not a tensor
    outputs: tuple[TensorSpec | None, ...]

    @property
    def args(self) -> tuple[Any, ...]:
        return self.node.args

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.node.kwargs)

    @property
    def tensor_inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(s for s in self.inputs if s is not None)


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str | None = None  # why not, when not available
    device_name: str | None = None  # what it would run on (e.g. the GPU adapter), when known
    # runs on a software stand-in for its device (a CPU Vulkan driver, say): correct, but never picked
    # for TORCHBURN_DEVICE=auto over a real engine
    emulated: bool = False


@dataclass
class Region:
    """A connected set of supported nodes, compiled into one program.

    ``graph_module`` holds only ATen ``OpOverload`` calls and ``getitem``; its output is always a tuple.
    ``inputs`` has one entry per placeholder: a TensorSpec, or None for a symbolic/Python int.
    """

    graph_module: torch.fx.GraphModule
    inputs: tuple[TensorSpec | None, ...]
    outputs: tuple[TensorSpec | None, ...]
    options: CompileOptions | None = None
    key: GraphKey | None = None  # set by core before compile


class Engine(abc.ABC):
    """Base class of every engine. Subclasses set the class attributes and implement ``compile``.

    ``partial_opset`` marks an engine that implements a subset of ATen on purpose (a demo or a
    specialised accelerator): the conformance suite then checks its values but lets other ops fall back.
    """

    name: str
    aliases: tuple[str, ...] = ()
    device: str = "cpu"  # "cpu" or "gpu"
    version: str = "0"
    priority: int = 0  # higher wins when TorchBurn picks a default among available engines
    partial_opset: bool = False
    ops: _ops.OpRegistry

    def availability(self) -> Availability:
        return Availability(True)

    def keep_whole(self) -> frozenset[Any]:
        """ATen ops the engine implements directly, so core must not decompose them (e.g. sdpa, gelu)."""
        return frozenset()

    def extra_decompositions(self) -> dict[Any, Callable[..., Any]]:
        """Decompositions to apply on top of core ATen's (op -> Python function of ATen ops)."""
        return {}

    def supports(self, node: NodeSpec) -> bool | str:
        """True if the engine runs this node; otherwise a short reason (shown in warnings and errors)."""
        return self.ops.supports(node)

    @abc.abstractmethod
    def compile(self, region: Region) -> Program:
        """Build a program for a region; called once per distinct region (results are cached)."""

    def cache_key_parts(self) -> dict[str, str]:
        """Extra facts that change compiled programs (ISA, driver, ...); they enter every cache key."""
        return {}

    def serialize(self, program: Program) -> bytes | None:
        """Bytes from which ``load`` rebuilds the program in another process; None: not storable."""
        return None

    def load(self, region: Region, payload: bytes) -> Program:
        """Rebuild a program from ``serialize``'s bytes; raise ``ValueError`` if they are not valid."""
        raise ValueError(f"engine {self.name!r} does not load stored programs")
