"""An engine's lowering table: for each ATen op it runs, the function that plans it into the engine's
program, and what the partitioner may offer it (dtypes, checks), kept in one place so that what an
engine claims and what it can plan never drift apart.

Every lowering has one signature, ``fn(p, node, *args, **kwargs)``: the engine's planner, the FX node,
then the op's arguments as the ATen schema orders them (tensors as the planner's values). The table
reads each lowering's source to learn which arguments it honours (see :mod:`torchburn.arguments`) and
declines nodes that set any other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch

from ..ops import Check, OpRegistry
from .families import Family

Lowering = Callable[..., Any]
F = TypeVar("F", bound=Lowering)


def _overloads(ops: tuple[Any, ...]) -> list[Any]:
    """OpOverloads from arguments that may each be an overload, or a list, set or dict of them."""
    found: list[Any] = []
    for item in ops:
        if isinstance(item, torch._ops.OpOverload):
            found.append(item)
        elif isinstance(item, (Mapping, Iterable)):
            found.extend(item)
        else:
            raise TypeError(f"lower() takes OpOverload objects such as torch.ops.aten.add.Tensor, got {item!r}")
    return found


class LoweringTable:
    """The ops one engine lowers. ``table.ops`` is the registry the partitioner asks."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.ops = OpRegistry(engine)
        self._lowerings: dict[Any, Lowering] = {}

    def lower(
        self,
        *ops: Any,
        family: Family,
        dtypes: Iterable[torch.dtype] | None = None,
        check: Check | None = None,
        reads: Iterable[str] = (),
        max_rank: int | None = None,
        contiguous_only: bool = False,
    ) -> Callable[[F], F]:
        """Register the decorated ``fn(p, node, *args, **kwargs)`` as the lowering of ``ops``.

        ``dtypes`` and ``check`` say which nodes the engine accepts; ``reads`` names arguments the
        lowering honours without reading them by name (through the output's shape, say), each to be
        explained by a comment where it is registered."""
        overloads = _overloads(ops)
        family = Family(family)

        def register(fn: F) -> F:
            self.ops.add(
                overloads,
                family=family.value,
                dtypes=dtypes,
                max_rank=max_rank,
                contiguous_only=contiguous_only,
                check=check,
                lowering=fn,
                reads=reads,
            )
            for op in overloads:
                self._lowerings[op] = fn
            return fn

        return register

    def get(self, op: Any) -> Lowering | None:
        return self._lowerings.get(op)

    def __contains__(self, op: object) -> bool:
        return op in self._lowerings

    def __len__(self) -> int:
        return len(self._lowerings)
