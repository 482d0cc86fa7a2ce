"""Op registries: the table an engine keeps of which ATen ops it runs, for which dtypes, ranks and layouts.

An engine fills one ``OpRegistry`` at import (each entry next to its kernel); the partitioner asks it
node by node and ``torchburn ops`` prints it. Ops are keyed by ``OpOverload`` objects, never by strings.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from . import arguments

if TYPE_CHECKING:
    from .engines.base import NodeSpec

Check = Callable[["NodeSpec"], "bool | str"]

FLOATING = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
INTEGRAL = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})
ALL_DTYPES = FLOATING | INTEGRAL | {torch.bool}


@dataclass(frozen=True)
class OpSupport:
    """What an engine supports of one op. ``dtypes=None`` means any dtype.

    With ``lowering`` given, the arguments the lowering (or ``check``) reads are found in their source
    (see :mod:`torchburn.arguments`), plus those named in ``reads`` (honoured another way, such as
    through the output's shape); a node that sets any other argument to a non-default value is
    declined, so an argument is never silently ignored."""

    op: Any  # torch._ops.OpOverload
    family: str
    dtypes: frozenset[torch.dtype] | None = None
    max_rank: int | None = None
    contiguous_only: bool = False
    check: Check | None = None  # extra condition on args (e.g. only dim=-1)
    lowering: Callable[..., Any] | None = None
    convention: str = "bound"  # how the lowering takes arguments (see torchburn.arguments)
    reads: frozenset[str] = frozenset()

    @functools.cached_property
    def arguments_read(self) -> frozenset[str] | None:
        """The op's arguments this engine honours; None when not known (every one is then assumed)."""
        if self.lowering is None:
            return None
        found = arguments.arguments_read(self.lowering, self.op, self.convention)
        if found is None:
            return None
        if self.check is not None:
            found |= arguments.check_reads(self.check, self.op)
        return found | self.reads | arguments.TENSOR_OPTIONS

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
        read = self.arguments_read
        if read is not None:
            unread = arguments.unread_values(tuple(node.args), node.kwargs, self.op, read)
            unread += arguments.tensor_option_problems(node.kwargs)
            if unread:
                return f"argument {', '.join(unread)} not supported"
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
        lowering: Callable[..., Any] | None = None,
        convention: str = "bound",
        reads: Iterable[str] = (),
    ) -> None:
        """Register ``ops``. Engines pass their ``lowering`` (and its calling ``convention``) so that the
        registry declines arguments it does not read; ``reads`` names arguments honoured another way."""
        overloads = [ops] if isinstance(ops, torch._ops.OpOverload) else list(ops)
        named = {a.name for op in overloads if isinstance(op, torch._ops.OpOverload) for a in op._schema.arguments}
        unknown = sorted(set(reads) - named)
        if unknown:
            raise ValueError(f"no op of {overloads} has an argument {', '.join(unknown)}")
        for op in overloads:
            if not isinstance(op, torch._ops.OpOverload):
                raise TypeError(f"register OpOverload objects such as torch.ops.aten.add.Tensor; got {op!r}")
            if op in self._entries:
                raise ValueError(f"{op} is registered twice for engine {self.engine!r}")
            frozen = frozenset(dtypes) if dtypes is not None else None
            family = str(getattr(family, "value", family))  # a planning.Family, or its name
            names = {a.name for a in op._schema.arguments}
            self._entries[op] = OpSupport(
                op, family, frozen, max_rank, contiguous_only, check, lowering, convention, frozenset(reads) & names
            )

    def add_rule(self, description: str, predicate: Callable[[Any], bool]) -> None:
        self._rules.append(OpFamilyRule(description, predicate))

    def supports(self, node: NodeSpec) -> bool | str:
        entry = self._entries.get(node.target)
        if entry is not None:
            return entry.accepts(node)
        if any(rule.predicate(node.target) for rule in self._rules):
            return True
        return "op not implemented"

    def entry(self, op: Any) -> OpSupport | None:
        """What the engine registered for ``op`` (None for ops only a rule covers, or none)."""
        return self._entries.get(op)

    def entries(self) -> list[OpSupport]:
        return list(self._entries.values())

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
