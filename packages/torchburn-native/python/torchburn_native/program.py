"""The callable core hands back for a region: plans per input signature, then one Rust call per run."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import _native
from .planner import PlannedProgram, Planner


def signature(args: Sequence[Any]) -> tuple[Any, ...]:
    """What a plan depends on: every tensor's shape, strides and dtype; every int's value."""
    return tuple([(a.shape, a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args])


class CompiledRegion:
    """A region's graph plus one Rust program per input signature (one for static shapes)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.graph_module = gm
        self._plans: dict[tuple[Any, ...], tuple[_native.Program, PlannedProgram]] = {}
        self._lock = threading.Lock()

    def prepare(self, args: Sequence[Any]) -> tuple[_native.Program, PlannedProgram]:
        key = signature(args)
        found = self._plans.get(key)
        if found is None:
            with self._lock:
                found = self._plans.get(key)
                if found is None:
                    # planning runs real meta kernels: step outside Dynamo's fake mode if compiling
                    with unset_fake_temporarily():
                        planned = Planner(self.graph_module, args).run()
                    program = _native.Program(planned.plan_json, planned.in_bytes, planned.out_bytes)
                    found = self._plans[key] = (program, planned)
        return found

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        program, planned = self.prepare(args)
        outs = tuple([torch.empty_strided(s.shape, s.strides, dtype=s.dtype) for s in planned.out_specs])
        program.run([a.data_ptr() for a in args if isinstance(a, torch.Tensor)], [o.data_ptr() for o in outs])
        return outs
