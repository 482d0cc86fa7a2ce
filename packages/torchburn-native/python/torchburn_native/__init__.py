"""torchburn-native: TorchBurn's default CPU engine (``native``, alias ``native_cpu``).

Importing this package is not needed to use it: TorchBurn finds the engine through its entry point.
The functions here are for inspection and tests. LLM runtimes run decoder-only transformers on the
engine's kernels through :mod:`torchburn_native.transformer`.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from . import _native


def isa() -> str:
    """The instruction-set level the kernels run at: ``avx512``, ``avx2``, ``baseline`` or ``neon``.

    The CPU's best level unless ``TORCHBURN_ISA`` names a lower one (see :func:`isa_status`)."""
    return str(_native.isa())


def isa_status() -> dict[str, Any]:
    """How the level was chosen: ``level``, ``detected`` (the CPU's best), ``supported`` (every level
    this CPU runs, lowest first, each a valid ``TORCHBURN_ISA``), ``requested`` and ``ignored`` (why a
    request was not followed, else None)."""
    status: dict[str, Any] = _native.isa_status()
    return status


def num_threads() -> int:
    """Worker threads the kernels use (``TORCHBURN_NUM_THREADS``, else ``torch.get_num_threads()``)."""
    from .engine import ensure_threads

    return ensure_threads()


def thread_pool() -> str:
    """Which threads run parallel kernels: ``openmp`` (PyTorch's own OpenMP team) or ``own``."""
    from .engine import ensure_threads

    ensure_threads()
    return str(_native.thread_pool())


def gemm_backend() -> str:
    """Which library computes GEMM block products: ``mkl`` (PyTorch's own) or ``gemm-crate``."""
    from .engine import ensure_threads

    ensure_threads()
    return str(_native.gemm_backend())


def debug_last_call() -> dict[str, list[int]]:
    """Data pointers the last program run on this thread read (``inputs``) and wrote (``outputs``)."""
    result: dict[str, Any] = _native.debug_last_call()
    return result


def debug_stats() -> dict[str, int]:
    """Process-wide counters: ``runs`` is the number of program runs (one per compiled-region call)."""
    result: dict[str, Any] = _native.debug_stats()
    return result


def ops_table() -> list[dict[str, str]]:
    """The engine's op registry as rows (op, family, dtypes, ...): what ``torchburn ops`` prints."""
    from .lowering import OPS

    return OPS.rows()


__all__ = [
    "debug_last_call",
    "debug_stats",
    "gemm_backend",
    "isa",
    "isa_status",
    "num_threads",
    "ops_table",
    "thread_pool",
]
