"""ATen op → program lowering, one module per family. Importing this package registers them all.

Each lowering is registered with :func:`lower`, which also records what the engine accepts of the op
(dtypes, extra checks) in :data:`OPS`; ``supports`` and the coverage table read that registry, so what
the engine claims and what it can plan cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from torchburn.engines.base import NodeSpec
from torchburn.ops import OpRegistry

from ..planner import LOWERINGS

OPS = OpRegistry("native")

Check = Callable[[NodeSpec], "bool | str"]
F = TypeVar("F", bound=Callable[..., Any])


def lower(
    *ops: Any,
    family: str,
    dtypes: Iterable[torch.dtype] | None = None,
    check: Check | None = None,
    reads: Iterable[str] = (),
) -> Callable[[F], F]:
    """Register ``fn(p, node, *args, **kwargs)`` as the lowering of ``ops``. The registry declines a
    node that sets an argument ``fn`` (or ``check``) never reads; ``reads`` names those honoured
    another way (through the output's shape, say), each with a comment saying how."""

    def register(fn: F) -> F:
        for op in ops:
            OPS.add(op, family=family, dtypes=dtypes, check=check, lowering=fn, convention="bound", reads=reads)
            LOWERINGS[op] = fn
        return fn

    return register


def _load_all() -> None:
    from . import elementwise, indexing, linalg, nn, reduction, shape  # noqa: F401


_load_all()
