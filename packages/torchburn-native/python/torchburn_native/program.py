"""The callable core hands back for a region: plans per input signature, then one Rust call per run."""

from __future__ import annotations

import collections
import json
import mmap
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchburn.cpp_helpers import assert_size_stride, empty_strided_cpu
from torchburn.planning import PlanContext, PlannedRegion, signature

from . import _native
from .planner import DerivedInput, PlannedProgram, Planner
from .runtime import plan_context

__all__ = ["PLANS_KEPT", "CompiledRegion", "recent_regions", "signature"]


# later calls' path for the last plan's argument layouts: outputs, or None when the arguments differ
FastPath = Callable[..., "tuple[torch.Tensor, ...] | None"]


# a region keeps the derived copies of this many plans (input sizes) before dropping the least recently
# used: with packed copies per size, ever new sizes would otherwise grow memory without bound
DERIVED_PLANS_KEPT = 4

# a region keeps the plans of this many input signatures, dropping the least recently used beyond that
# (a dropped signature is planned again if it comes back, about a millisecond for a Linear). Unbounded,
# inputs of ever new sizes (dynamic shapes) grew the process without end: each plan's small long-lived
# allocations pin the C heap between the freed buffers of the calls around it. 300 ascending batch sizes
# through a Linear 1024 -> 1024, five passes, grew it by 442 MB and climbing with every plan kept, and by
# 62-98 MB, level after the first pass, with 32 kept
PLANS_KEPT = 32


def recent_regions() -> list[CompiledRegion]:
    """The regions compiled most recently in this process (newest last), for inspection and tests."""
    return CompiledRegion.recent_regions()


class CompiledRegion(PlannedRegion[tuple[_native.Program, PlannedProgram]]):
    """A region's graph plus one Rust program per input signature (one for static shapes)."""

    plans_kept = PLANS_KEPT

    def __init__(self, gm: torch.fx.GraphModule, context: PlanContext | None = None) -> None:
        super().__init__(gm)
        self.context = context if context is not None else plan_context()
        self._lock = self._plan_lock
        # the last plan of an all-tensor signature, checked per call by size/stride/dtype alone
        self._fast: FastPath | None = None
        # the copies of GEMM operands the plans read, by what they copy (shared by every plan that reads
        # the same copy), least recently used first; see _derived_copies
        self._derived: collections.OrderedDict[DerivedInput, _DerivedEntry] = collections.OrderedDict()
        self._derived_lock = threading.Lock()
        self._profiling = False

    def describe(self) -> list[dict[str, Any]]:
        """Per planned signature: the instruction kinds in order, the arena size, and the bytes the
        intermediates would take without the memory plan's reuse."""
        rows = []
        with self._lock:
            plans = list(self._plans.values())
        for _, planned in plans:
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

    def set_profiling(self, on: bool = True) -> None:
        """Time every instruction of this region's programs from now on, clearing earlier times (or,
        with ``on=False``, stop). Off, a run pays one flag check for it."""
        with self._lock:
            self._profiling = on
            for program, _ in self._plans.values():
                program.set_profiling(on)

    def profile(self) -> list[list[dict[str, Any]]]:
        """Per planned signature, per instruction in plan order: its kind, how many runs were timed,
        and their mean and total wall-clock time in microseconds (a kernel's time on all its threads)."""
        tables = []
        with self._lock:
            plans = list(self._plans.values())
        for program, planned in plans:
            kinds = [i["kind"] for i in json.loads(planned.plan_json)["instrs"]]
            tables.append(
                [
                    {"kind": kind, "runs": runs, "mean_us": ns / runs / 1e3 if runs else 0.0, "total_us": ns / 1e3}
                    for kind, (ns, runs) in zip(kinds, program.profile(), strict=True)
                ]
            )
        return tables

    def make_plan(self, args: Sequence[Any]) -> tuple[_native.Program, PlannedProgram]:
        planned = Planner(self.graph_module, args, self.context).run()
        program = _native.Program(planned.plan_json, planned.in_bytes, planned.out_bytes)
        if self._profiling:
            program.set_profiling(True)
        return program, planned

    def prepare(self, args: Sequence[Any]) -> tuple[_native.Program, PlannedProgram]:
        """The Rust program and plan for ``args``' layouts, planned on first sight."""
        return self.plan_for(args)

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        fast = self._fast
        if fast is not None:
            outs = fast(*args)
            if outs is not None:
                return outs
        program, planned = self.prepare(args)
        self._fast = self._fast_path(program, planned, args)
        return self._run(program, planned, args)

    def _fast_path(self, program: _native.Program, planned: PlannedProgram, args: Sequence[Any]) -> FastPath | None:
        """The per-call path for later calls with these arguments' layouts: all in Rust when the plan
        reads no derived copies, else a Python check in front of :meth:`_run`."""
        if not all(isinstance(a, torch.Tensor) for a in args):
            return None  # symbolic sizes arrive as ints: the general path keys on their values
        specs = [(tuple(a.shape), tuple(a.stride()), a.dtype) for a in args]
        if not planned.derived:
            outs = [(s.shape, s.strides, s.dtype) for s in planned.out_specs]
            extra = [c.data_ptr() for c in planned.constants]
            return _native.FastCall(
                program, specs, outs, extra, planned.constants, assert_size_stride, empty_strided_cpu
            )

        def checked(*call_args: Any) -> tuple[torch.Tensor, ...] | None:
            if len(call_args) != len(specs):
                return None
            try:
                for a, (size, stride, dtype) in zip(call_args, specs, strict=True):
                    if a.dtype is not dtype:
                        return None
                    assert_size_stride(a, size, stride)
            except (AssertionError, AttributeError, TypeError):
                return None
            return self._run(program, planned, call_args)

        return checked

    def _run(self, program: _native.Program, planned: PlannedProgram, args: Sequence[Any]) -> tuple[torch.Tensor, ...]:
        outs = tuple([empty_strided_cpu(s.shape, s.strides, s.dtype) for s in planned.out_specs])
        ins = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]
        if planned.constants:
            ins += [c.data_ptr() for c in planned.constants]
        copies: list[torch.Tensor] = []  # held until the run ends, even if another thread refreshes them
        if planned.derived:
            sources = [a for a in args if isinstance(a, torch.Tensor)] + list(planned.constants)
            copies = self._derived_copies(planned, sources)
            ins += [c.data_ptr() for c in copies]
        program.run(ins, [o.data_ptr() for o in outs])
        return outs

    def _derived_copies(self, planned: PlannedProgram, sources: list[torch.Tensor]) -> list[torch.Tensor]:
        """The copies the plan reads (row-major, paneled or MKL-packed GEMM operands), remade only when
        their source changed: another tensor, new storage (``.data =``), or an in-place update (its
        version counter moved).

        Plans for other input sizes share a copy where it does not depend on the size (a row-major
        weight); a packed copy depends on the rows of A, so inputs of ever new sizes would each add
        one. The cache keeps ``DERIVED_PLANS_KEPT`` plans' worth and drops the least recently used
        beyond that (remade if needed again), so memory stays bounded under varying shapes."""
        copies = []
        with self._derived_lock:
            cache = self._derived
            for spec in planned.derived:
                src = sources[spec.source]
                version = _version(src)
                entry = cache.get(spec)
                if (
                    entry is None
                    or version is None
                    or entry.source() is not src
                    or entry.data_ptr != src.data_ptr()
                    or entry.version != version
                ):
                    entry = _DerivedEntry(weakref.ref(src), src.data_ptr(), version, _make_copy(src, spec))
                    cache[spec] = entry
                cache.move_to_end(spec)
                copies.append(entry.copy)
            while len(cache) > DERIVED_PLANS_KEPT * len(planned.derived):
                cache.popitem(last=False)
        return copies

    def derived_copies(self) -> list[tuple[DerivedInput, torch.Tensor]]:
        """The copies of GEMM operands this region holds now (what each copies, and the copy), least
        recently used first."""
        with self._derived_lock:
            return [(spec, entry.copy) for spec, entry in self._derived.items()]


@dataclass(frozen=True)
class _DerivedEntry:
    source: weakref.ref[torch.Tensor]
    data_ptr: int
    version: int | None
    copy: torch.Tensor


def _version(t: torch.Tensor) -> int | None:
    """The tensor's in-place version counter; None for inference tensors, which have none (never cached)."""
    try:
        return int(t._version)
    except RuntimeError:
        return None


def _make_copy(src: torch.Tensor, spec: DerivedInput) -> torch.Tensor:
    """The copy ``spec`` describes of the view of ``src`` it names."""
    with torch.no_grad():
        view = torch.as_strided(src, spec.shape, spec.strides, src.storage_offset() + spec.offset)
        if spec.packed_rows:
            k, n = spec.shape
            # a mapping of its own: MKL asks for a buffer some 7.5 MB larger than the packed matrix it
            # writes, and untouched pages of a fresh mapping take no memory; dropped, the whole goes
            # back to the OS. From the C heap, dropped packed buffers stayed resident (100 input sizes
            # through one Linear 1024 -> 1024: +359 MB, against +2 MB for row-major copies)
            mapping = mmap.mmap(-1, spec.numel * 4)
            packed = torch.frombuffer(mapping, dtype=torch.float32, count=spec.numel)
            rs, cs = spec.strides
            _native.pack_gemm_b(spec.packed_rows, n, k, view.data_ptr(), rs, cs, packed.data_ptr(), spec.packed_bytes)
            return packed
        if not spec.panel:
            return view.contiguous()
        rows, cols = spec.shape
        panels = -(-cols // spec.panel)
        padded = torch.nn.functional.pad(view, (0, panels * spec.panel - cols))  # [rows, panels·P]
        return padded.view(rows, panels, spec.panel).transpose(0, 1).contiguous()  # [panels, rows, P]
