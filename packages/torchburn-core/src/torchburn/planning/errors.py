"""The error a planner raises for a node it accepted but cannot plan at these concrete sizes."""

from __future__ import annotations


class PlanError(Exception):
    """A node the engine accepted turned out not to be plannable at these sizes (a gap or a bug); the
    region then falls back to eager (see :mod:`torchburn.region_guard`)."""
