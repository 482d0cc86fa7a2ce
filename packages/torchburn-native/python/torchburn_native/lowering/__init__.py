"""ATen op → program lowering, one module per op family. Importing this package registers them all in
the engine's lowering table (``planner.TABLE``, a :class:`torchburn.planning.LoweringTable`), whose
registry is what ``supports`` and the coverage table read, so what the engine claims and what it can
plan cannot drift apart.
"""

from __future__ import annotations

from torchburn.planning import Family

from ..planner import TABLE

OPS = TABLE.ops
lower = TABLE.lower

__all__ = ["OPS", "TABLE", "Family", "lower"]


def _load_all() -> None:
    from . import attention, conv, elementwise, index, matmul, norm, pool, reduce, scan, softmax, views  # noqa: F401


_load_all()
