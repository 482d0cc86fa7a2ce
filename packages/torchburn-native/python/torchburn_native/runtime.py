"""The native engine's runtime facts that planning depends on, gathered once into a PlanContext: how many
threads the kernels use and which library computes matrix products."""

from __future__ import annotations

from torchburn.planning import PlanContext

from . import _native


def plan_context() -> PlanContext:
    """The engine's threads (started on first use) and GEMM library (``mkl`` or ``gemm-crate``)."""
    from .engine import ensure_threads

    return PlanContext(threads=ensure_threads(), blas=str(_native.gemm_backend()))
