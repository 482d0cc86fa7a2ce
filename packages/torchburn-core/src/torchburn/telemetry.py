"""Fallback telemetry: per engine and op, how many graph nodes the engine ran and how many ran eagerly.

Counts are taken when a graph is compiled (a node counts once per compiled graph, not per call).
"""

from __future__ import annotations

import threading
import warnings

from .errors import TorchBurnFallbackWarning

_lock = threading.Lock()
_counts: dict[str, dict[str, dict[str, int]]] = {}
_warned: set[tuple[str, str]] = set()
_failures_warned: set[tuple[str, str, str]] = set()


def record(engine: str, op: str, in_engine: bool) -> None:
    with _lock:
        row = _counts.setdefault(engine, {}).setdefault(op, {"engine": 0, "fallback": 0})
        row["engine" if in_engine else "fallback"] += 1


def demote(engine: str, op: str) -> None:
    """Move one node of ``op`` from the engine's count to the fallback count: its region was given to
    the engine but the engine failed on it, so it runs eagerly after all."""
    with _lock:
        row = _counts.setdefault(engine, {}).setdefault(op, {"engine": 0, "fallback": 0})
        row["engine"] = max(row["engine"] - 1, 0)
        row["fallback"] += 1


def warn_fallback_once(engine: str, op: str, reason: str) -> None:
    """Warn the first time an op falls back for an engine in this process."""
    with _lock:
        if (engine, op) in _warned:
            return
        _warned.add((engine, op))
    warnings.warn(
        f"torchburn: engine {engine!r} does not run {op} ({reason}); it runs in PyTorch eager. "
        'See torchburn.coverage(); options={"fallback": "error"} makes this an error.',
        TorchBurnFallbackWarning,
        stacklevel=3,
    )


def warn_engine_failure(engine: str, ops: list[str], phase: str, error: BaseException) -> None:
    """Warn that ``engine`` raised while ``phase`` (compiling or running) a region of ``ops``, which
    now runs eagerly; once per engine, ops and message."""
    message = f"{type(error).__name__}: {error}"
    with _lock:
        key = (engine, ",".join(ops), message)
        if key in _failures_warned:
            return
        _failures_warned.add(key)
    shown = ", ".join(ops[:6]) + (f" and {len(ops) - 6} more" if len(ops) > 6 else "")
    warnings.warn(
        f"torchburn: engine {engine!r} failed while {phase} a region of {len(ops)} op(s) ({shown}): {message}; "
        'the region runs in PyTorch eager. See torchburn.coverage(); options={"fallback": "error"} makes this '
        "an error.",
        TorchBurnFallbackWarning,
        stacklevel=3,
    )


def coverage() -> dict[str, dict[str, dict[str, int]]]:
    """``{engine: {op: {"engine": nodes run by the engine, "fallback": nodes run eagerly}}}`` (a copy)."""
    with _lock:
        return {e: {op: dict(row) for op, row in ops.items()} for e, ops in _counts.items()}


def format_coverage(report: dict[str, dict[str, dict[str, int]]] | None = None) -> str:
    """The coverage report as an aligned text table."""
    report = coverage() if report is None else report
    lines = [f"{'engine':<12} {'op':<60} {'engine':>7} {'fallback':>8}"]
    for engine, ops in sorted(report.items()):
        for op, row in sorted(ops.items()):
            lines.append(f"{engine:<12} {op:<60} {row['engine']:>7} {row['fallback']:>8}")
    return "\n".join(lines)


def reset_coverage() -> None:
    """Zero the counters and re-arm the warn-once fallback warnings."""
    with _lock:
        _counts.clear()
        _warned.clear()
        _failures_warned.clear()
