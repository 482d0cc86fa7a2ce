"""Helpers shared by the tests (importable as ``helpers``: tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torchburn


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run a fresh interpreter (a new process: nothing in memory carries over) and fail loudly on error."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"subprocess failed:\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
    return proc


def engine_counts(engine: str) -> tuple[int, int]:
    """(nodes run by the engine, nodes fallen back) summed over ops."""
    ops = torchburn.coverage().get(engine, {})
    return sum(r["engine"] for r in ops.values()), sum(r["fallback"] for r in ops.values())
