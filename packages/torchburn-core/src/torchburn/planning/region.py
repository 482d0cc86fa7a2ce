"""The base of every engine's compiled region: the region's ATen graph and one plan per input signature.

A graph compiled with symbolic sizes runs for every new size without a Dynamo recompile: the engine
plans it again for the concrete layouts (shapes, strides, dtypes, int arguments) of that call, and
keeps the plan. Plans hold memory (buffers, packed weights, GPU allocations), so a region keeps only
``plans_kept`` of them, dropping the least recently used; a dropped signature is planned again if it
comes back.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, TypeVar

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

PlanT = TypeVar("PlanT")
Signature = tuple[Any, ...]

RECENT_KEPT = 64


def signature(args: Sequence[Any]) -> Signature:
    """What a plan depends on: every tensor's shape, strides and dtype; every other argument's value."""
    return tuple([(tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args])


class PlannedRegion(Generic[PlanT]):
    """A region's graph and its plans, least recently used first. Subclasses implement ``make_plan``."""

    plans_kept: ClassVar[int] = 32
    # the regions each engine compiled most recently, for inspection and tests (per subclass)
    _recent: ClassVar[dict[type, collections.deque[Any]]] = {}

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.graph_module = gm
        self._plans: collections.OrderedDict[Signature, PlanT] = collections.OrderedDict()
        self._plan_lock = threading.Lock()
        recent = PlannedRegion._recent.setdefault(type(self), collections.deque(maxlen=RECENT_KEPT))
        recent.append(self)

    @classmethod
    def recent_regions(cls) -> list[Any]:
        """The regions of this class compiled most recently in this process, newest last."""
        found: list[Any] = []
        for kind, regions in PlannedRegion._recent.items():
            if issubclass(kind, cls):
                found += regions
        return found

    @property
    def plans(self) -> dict[Signature, PlanT]:
        """The plans kept now, by signature, least recently used first (a copy)."""
        with self._plan_lock:
            return dict(self._plans)

    def make_plan(self, args: Sequence[Any]) -> PlanT:
        """Plan the region for the layouts of ``args``."""
        raise NotImplementedError

    def plan_for(self, args: Sequence[Any], key: Signature | None = None) -> PlanT:
        """The plan for ``args``' signature, made on first sight."""
        key = signature(args) if key is None else key
        found = self._plans.get(key)
        if found is not None:
            # no lock on a hit, so that one thread's planning does not hold up the others' calls; an
            # OrderedDict's operations are atomic under the GIL, and the key may just have been dropped
            with contextlib.suppress(KeyError):
                self._plans.move_to_end(key)
            return found
        with self._plan_lock:
            found = self._plans.get(key)
            if found is None:
                # planning runs real meta kernels: step outside Dynamo's fake mode if compiling
                with unset_fake_temporarily():
                    found = self.make_plan(args)
                self._plans[key] = found
                while len(self._plans) > self.plans_kept:
                    self._plans.popitem(last=False)
        return found
