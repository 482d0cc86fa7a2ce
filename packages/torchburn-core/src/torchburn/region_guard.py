"""An engine's failure costs speed, never the user's program.

An engine that accepted every node of a region may still raise while planning, compiling or running
it (an unforeseen shape, a driver error, a bug). Under ``fallback="warn"`` or ``"silent"`` such a
region runs in PyTorch eager from then on, counted as fallen back in ``torchburn.coverage()`` (and
warned under ``"warn"``, naming the engine, the ops and the error); under ``"error"`` the failure is a
``FallbackError`` carrying the engine's message.

A failure at run time is told apart from a bad input by running the region eagerly: if eager raises
too, the input is at fault and the user gets eager's error, as without TorchBurn.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from typing import Any

from . import telemetry
from .cache import program_for
from .engines.base import Engine, Program, Region
from .graph_codec import target_name
from .options import CompileOptions


def region_ops(region: Region) -> list[str]:
    """The op of every compute node of the region, in graph order (one entry per node)."""
    return [
        target_name(n.target)
        for n in region.graph_module.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem
    ]


def _failure(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _raise_fallback_error(engine: Engine, ops: list[str], phase: str, error: BaseException) -> None:
    from ._fallback_error import FallbackError

    reason = f"engine raised while {phase} its region: {_failure(error)}"
    raise FallbackError(engine.name, dict.fromkeys(ops, reason), failure=_failure(error)) from error


def _fall_back(engine: Engine, region: Region, options: CompileOptions, phase: str, error: BaseException) -> None:
    """Count the region's nodes as fallen back and warn, or raise under ``fallback="error"``."""
    ops = region_ops(region)
    if options.fallback == "error":
        _raise_fallback_error(engine, ops, phase, error)
    for op in ops:
        telemetry.demote(engine.name, op)
    if options.fallback == "warn":
        telemetry.warn_engine_failure(engine.name, sorted(set(ops)), phase, error)


def compile_region(engine: Engine, region: Region, options: CompileOptions) -> Program:
    """The engine's program for ``region`` behind a guard, or the region's eager graph where the engine
    raised while compiling it."""
    try:
        program = program_for(engine, region, options)
    except Exception as exc:
        from ._fallback_error import FallbackError

        if isinstance(exc, FallbackError):
            raise
        _fall_back(engine, region, options, "compiling", exc)
        return region.graph_module.forward  # type: ignore[no-any-return]
    return GuardedProgram(engine, region, options, program)


class GuardedProgram:
    """Calls the engine's program; on the first failure that eager does not share, the region runs
    eagerly for good (or, under ``fallback="error"``, the call raises ``FallbackError``)."""

    __slots__ = ("_engine", "_lock", "_options", "_program", "_region", "engine_program")

    def __init__(self, engine: Engine, region: Region, options: CompileOptions, program: Program) -> None:
        self.engine_program = program  # the engine's own program, for inspection
        self._program = program
        self._engine = engine
        self._region = region
        self._options = options
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Sequence[Any]:
        try:
            return self._program(*args)
        except Exception as exc:
            return self._recover(exc, args)

    @property
    def fell_back(self) -> bool:
        return self._program is not self.engine_program

    def _recover(self, error: Exception, args: tuple[Any, ...]) -> Sequence[Any]:
        if self.fell_back:
            raise error  # eager itself raised: the input is at fault
        eager = self._region.graph_module
        result = eager(*args)  # raises eager's own error when the input is at fault
        with self._lock:
            if self.fell_back:
                return result  # another thread already switched
            if self._options.fallback == "error":
                _raise_fallback_error(self._engine, region_ops(self._region), "running", error)
            _fall_back(self._engine, self._region, self._options, "running", error)
            self._program = eager
        return result  # type: ignore[no-any-return]
