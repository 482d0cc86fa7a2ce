"""Op registries: the table an engine keeps of which ATen ops it runs, for which dtypes, ranks and layouts.

An engine fills one ``OpRegistry`` at import (each entry next to its kernel); the partitioner asks it
node by node and ``torchburn ops`` prints it. Ops are keyed by ``OpOverload`` objects, never by strings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .engines.base import NodeSpec

Check = Callable[["NodeSpec"], "bool | str"]

FLOATING = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
INTEGRAL = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})
ALL_DTYPES = FLOATING | INTEGRAL | {torch.bool}


@dataclass(frozen=True)
class OpSupport:
    """What an engine supports of one op. ``dtypes=None`` means any dtype."""

    op: Any  # torch._ops.OpOverload
    family: str
    dtypes: frozenset[torch.dtype] | None = None
    max_rank: int | None = None
    contiguous_only: bool = False
    check: Check | None = None  # extra condition on args (e.g. only dim=-1)

    def accepts(self, node: NodeSpec) -> bool | str:
        specs = [s for s in (*node.inputs, *node.outputs) if s is not None]
        if self.dtypes is not None:
            bad = sorted({str(s.dtype) for s in specs if s.dtype not in self.dtypes})
            if bad:
                return f"dtype {', '.join(bad)} not supported (supported: {_dtype_list(self.dtypes)})"
        if self.max_rank is not None and any(s.rank > self.max_rank for s in specs):
            return f"rank above {self.max_rank} not supported"
        if self.contiguous_only and not all(s.is_contiguous for s in node.tensor_inputs):
            return "non-contiguous input not supported"
        if self.check is not None:
            return self.check(node)
        return True


def _dtype_list(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


@dataclass(frozen=True)
class OpFamilyRule:
    """Support for every op a predicate accepts (used by engines that run ATen wholesale)."""

    description: str
    predicate: Callable[[Any], bool]


class OpRegistry:
    """The ops one engine runs. ``supports(node)`` returns True or the reason it does not."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self._entries: dict[Any, OpSupport] = {}
        self._rules: list[OpFamilyRule] = []

    def add(
        self,
        ops: Any | Iterable[Any],
        *,
        family: str,
        dtypes: Iterable[torch.dtype] | None = None,
        max_rank: int | None = None,
        contiguous_only: bool = False,
        check: Check | None = None,
    ) -> None:
        overloads = [ops] if isinstance(ops, torch._ops.OpOverload) else list(ops)
        for op in overloads:
            if not isinstance(op, torch._ops.OpOverload):
                raise TypeError(f"register OpOverload objects such as torch.ops.aten.add.Tensor; got {op!r}")
            if op in self._entries:
                raise ValueError(f"{op} is registered twice for engine {self.engine!r}")
            frozen = frozenset(dtypes) if dtypes is not None else None
            self._entries[op] = OpSupport(op, family, frozen, max_rank, contiguous_only, check)

    def add_rule(self, description: str, predicate: Callable[[Any], bool]) -> None:
        self._rules.append(OpFamilyRule(description, predicate))

    def supports(self, node: NodeSpec) -> bool | str:
        entry = self._entries.get(node.target)
        if entry is not None:
            return entry.accepts(node)
        if any(rule.predicate(node.target) for rule in self._rules):
            return True
        return "op not implemented"

    def __contains__(self, op: object) -> bool:
        return op in self._entries or any(rule.predicate(op) for rule in self._rules)

    def __len__(self) -> int:
        return len(self._entries)

    def rows(self) -> list[dict[str, str]]:
        """One row per registered op (and one per rule), for coverage tables."""
        rows = [
            {
                "op": str(e.op),
                "family": e.family,
                "dtypes": _dtype_list(e.dtypes) if e.dtypes is not None else "any",
                "max_rank": str(e.max_rank) if e.max_rank is not None else "any",
                "layout": "contiguous" if e.contiguous_only else "strided",
            }
            for e in sorted(self._entries.values(), key=lambda e: (e.family, str(e.op)))
        ]
        rows += [
            {"op": r.description, "family": "rule", "dtypes": "any", "max_rank": "any", "layout": "strided"}
            for r in self._rules
        ]
        return rows
