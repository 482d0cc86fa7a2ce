"""What planning may depend on besides the graph and its inputs, handed to it by ``Engine.compile``, so
that lowerings read the engine's runtime facts from one object instead of importing runtime state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PlanContext:
    """``threads``: worker threads the kernels use; ``blas``: the library computing matrix products
    (e.g. ``mkl``), if any; ``limits``: device limits (bindings, buffer sizes); ``features``: optional
    device features present (``shader-f16``, ``subgroups``...)."""

    threads: int = 1
    blas: str | None = None
    limits: Mapping[str, int] = field(default_factory=dict)
    features: frozenset[str] = frozenset()

    def limit(self, name: str, default: int) -> int:
        return int(self.limits.get(name, default))

    def has(self, feature: str) -> bool:
        return feature in self.features
