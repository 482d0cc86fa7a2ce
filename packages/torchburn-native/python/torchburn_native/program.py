"""The callable core hands back for a region: plans per input signature, then one Rust call per run."""

from __future__ import annotations

import collections
import json
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


_RECENT: collections.deque[CompiledRegion] = collections.deque(maxlen=64)


def recent_regions() -> list[CompiledRegion]:
    """The regions compiled most recently in this process (newest last), for inspection and tests."""
    return list(_RECENT)


class CompiledRegion:
    """A region's graph plus one Rust program per input signature (one for static shapes)."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.graph_module = gm
        self._plans: dict[tuple[Any, ...], tuple[_native.Program, PlannedProgram]] = {}
        self._lock = threading.Lock()
        _RECENT.append(self)

    def describe(self) -> list[dict[str, Any]]:
        """Per planned signature: the instruction kinds in order, the arena size, and the bytes the
        intermediates would take without the memory plan's reuse."""
        rows = []
        for _, planned in list(self._plans.values()):
            plan = json.loads(planned.plan_json)
            rows.append(
                {
                    "instructions": [i["kind"] for i in plan["instrs"]],
                    "activations": [i.get("act") for i in plan["instrs"] if i["kind"] == "matmul"],
                    "arena_bytes": plan["arena_bytes"],
                    "intermediate_bytes": planned.intermediate_bytes,
                }
            )
        return rows

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
        ins = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]
        if planned.constants:
            ins += [c.data_ptr() for c in planned.constants]
        program.run(ins, [o.data_ptr() for o in outs])
        return outs
