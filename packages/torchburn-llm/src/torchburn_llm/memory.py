"""Whether the machine has room for what a load is about to allocate: a clear error before the
allocation, rather than the kernel's out-of-memory killer ending the user's program halfway."""

from __future__ import annotations

from pathlib import Path

from .errors import ModelLoadError

MEMINFO = Path("/proc/meminfo")


def available_bytes() -> int | None:
    """Memory the system can give a process now without swapping (Linux's ``MemAvailable``); None
    where the system does not say."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_room(need: int, what: str, remedy: str) -> None:
    """Raise a ModelLoadError naming ``what`` and ``remedy`` when ``need`` bytes exceed the memory
    available."""
    free = available_bytes()
    if free is not None and need > free:
        raise ModelLoadError(
            f"{what} needs {need / 1e9:.1f} GB, more than the {free / 1e9:.1f} GB of memory available; {remedy}"
        )
