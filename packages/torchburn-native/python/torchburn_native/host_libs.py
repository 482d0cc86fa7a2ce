"""What the engine borrows from the process it runs in: the choice to borrow it, and where it is mapped."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator


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


def loaded_libraries(name: str) -> Iterator[ctypes.CDLL]:
    """Handles on the mapped libraries named like ``name``, opened with ``RTLD_NOLOAD``: only what the
    process already holds (the very copy PyTorch uses), never a fresh load."""
    for path in mapped_libraries(name):
        try:
            yield ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue


def symbol_address(lib: ctypes.CDLL, symbol: str) -> int:
    """The address of ``symbol`` in ``lib``, or 0 where it has none."""
    fn = getattr(lib, symbol, None)
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0) if fn is not None else 0
