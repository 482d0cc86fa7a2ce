"""What the engine borrows from the process it runs in: the choice to borrow it, and where it is mapped."""

from __future__ import annotations

import os


def torch_or_own(variable: str) -> str:
    """An environment switch between borrowing PyTorch's runtime (``torch``, the default) and the
    engine's own (``own``); anything else is an error naming the variable and the choices."""
    raw = os.environ.get(variable, "torch").strip().lower() or "torch"
    if raw not in ("torch", "own"):
        raise ValueError(f"{variable} must be one of torch, own, got {raw!r}")
    return raw


def mapped_libraries(name: str) -> list[str]:
    """Paths of the shared libraries mapped into this process whose file name contains ``name``."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            fields = [line.split() for line in f]
    except OSError:
        return []
    return sorted({f[-1] for f in fields if len(f) >= 6 and name in os.path.basename(f[-1])})
