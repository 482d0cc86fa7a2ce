"""Cutting an ATen graph into engine regions and eager fallbacks.

Every compute node (an ATen op producing tensors) is offered to the engine as a ``NodeSpec``; supported
nodes are grouped by torch's ``CapabilityBasedPartitioner`` into connected, cycle-free regions; each
region becomes one engine program called from the top-level graph. Shape arithmetic on symbolic sizes
stays in the top-level graph (it is Python ints, not tensor work) and is neither offered nor counted.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from . import telemetry
from .engines.base import Engine, NodeSpec, Program, Region, TensorSpec
from .graph_codec import target_name
from .options import CompileOptions
from .region_guard import compile_region

log = logging.getLogger("torchburn.partition")

REGION_PREFIX = "torchburn_region_"


@dataclass(frozen=True)
class Decision:
    node: torch.fx.Node
    op: str
    supported: bool
    reason: str = ""


def _is_tensorish(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value)


def _specs(values: Any) -> tuple[TensorSpec | None, ...]:
    if isinstance(values, (tuple, list)):
        return tuple(TensorSpec.of(v) for v in values)
    return (TensorSpec.of(values),)


def node_spec(node: torch.fx.Node) -> NodeSpec:
    inputs = tuple(TensorSpec.of(a.meta.get("val")) if isinstance(a, torch.fx.Node) else None for a in node.args)
    return NodeSpec(node, node.target, inputs, _specs(node.meta.get("val")))


def decide(gm: torch.fx.GraphModule, engine: Engine) -> dict[torch.fx.Node, Decision]:
    """Ask the engine about every compute node; getitem follows its producer."""
    decisions: dict[torch.fx.Node, Decision] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            producer = decisions.get(node.args[0])  # type: ignore[arg-type]
            if producer is not None:
                decisions[node] = Decision(node, "getitem", producer.supported, producer.reason)
            continue
        if not _is_tensorish(node.meta.get("val")):
            continue  # symbolic-size arithmetic: stays in Python
        op = target_name(node.target)
        if not isinstance(node.target, torch._ops.OpOverload):
            decisions[node] = Decision(node, op, False, "not an ATen op")
            continue
        try:
            verdict = engine.supports(node_spec(node))
        except Exception as exc:  # an engine bug must cost speed, not correctness
            verdict = f"support check raised {type(exc).__name__}: {exc}"
        decisions[node] = Decision(node, op, verdict is True, "" if verdict is True else str(verdict))
    return decisions


class _Support(OperatorSupportBase):
    def __init__(self, decisions: dict[torch.fx.Node, Decision]) -> None:
        self.decisions = decisions

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        decision = self.decisions.get(node)
        return decision is not None and decision.supported


def _region_of(sub: torch.fx.GraphModule, options: CompileOptions) -> tuple[Region, bool]:
    """Region from a fused submodule; its output is made a tuple. Returns (region, single_output)."""
    output = sub.graph.output_node()
    result: Any = output.args[0]
    single = not isinstance(result, (tuple, list))
    if single:
        result = (result,)
        output.args = (result,)
        sub.recompile()
    inputs = tuple(TensorSpec.of(n.meta.get("val")) for n in sub.graph.nodes if n.op == "placeholder")
    outputs = tuple(TensorSpec.of(n.meta.get("val")) for n in result)
    return Region(sub, inputs, outputs, options), single


def _caller(
    program: Program, single: bool, n_outputs: int, index: int, outputs: tuple[TensorSpec | None, ...] = ()
) -> Callable[..., Any]:
    """The graph's call of a region's program. ``outputs`` (the traced specs): where given, each output
    comes back with the strides it was traced with (:func:`_as_traced`)."""
    layouts = _traced_layouts(outputs)
    if single:

        def run_one(*args: Any) -> Any:
            result = program(*args)[0]
            return _as_traced(result, layouts[0]) if layouts else result

        run = run_one
    else:

        def run_many(*args: Any) -> Any:
            results = program(*args)
            if not layouts:
                return results
            return tuple(_as_traced(r, layout) for r, layout in zip(results, layouts, strict=True))

        run = run_many
    run.__name__ = run.__qualname__ = f"{REGION_PREFIX}{index}"
    # for whole_graph_program
    run.torchburn_program = program  # type: ignore[attr-defined]
    run.torchburn_outputs = None if single else n_outputs  # type: ignore[attr-defined]
    return run


Layout = tuple[tuple[int, ...], tuple[int, ...]] | None  # a traced output's (shape, strides), None: any


def _traced_layouts(outputs: tuple[TensorSpec | None, ...]) -> list[Layout]:
    """Each output's static traced shape and strides; empty where every output is contiguous or not
    static (nothing to check then)."""
    layouts: list[Layout] = []
    for spec in outputs:
        static = spec is not None and all(isinstance(x, int) for x in (*spec.shape, *spec.stride))
        layouts.append((tuple(spec.shape), tuple(spec.stride)) if static and spec is not None else None)
    if all(spec is None or spec.is_contiguous for spec in outputs):
        return []
    return layouts


def _as_traced(value: Any, layout: Layout) -> Any:
    """``value`` with the strides its node was traced with. A program returns dense tensors, but the
    nodes after a region were traced on its outputs' own layouts: an op that PyTorch runs lays out
    its result like its input (CPU attention returns [B, H, T, D] as [B, T, H, D] when its query came
    transposed), and a later view of that result holds only for the traced layout."""
    if layout is None or not isinstance(value, torch.Tensor) or value.stride() == layout[1]:
        return value
    shape, stride = layout
    out = torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)
    out.copy_(value)
    return out


def whole_graph_program(fused: torch.fx.GraphModule) -> Program | None:
    """The engine program when ``fused`` is nothing but one region taking the graph's inputs in order
    and returning its outputs in order: then the graph's own forward is a layer of calls to skip."""
    nodes = list(fused.graph.nodes)
    if any(n.op not in ("placeholder", "call_function", "output") for n in nodes):
        return None
    placeholders = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op == "call_function"]
    if not calls:
        return None
    region = calls[0]
    program: Program | None = getattr(region.target, "torchburn_program", None)
    if program is None or list(region.args) != placeholders or region.kwargs:
        return None
    results = list(fused.graph.output_node().args[0])  # type: ignore[arg-type]
    if region.target.torchburn_outputs is None:  # type: ignore[union-attr]  # a single-output region
        return program if calls == [region] and results == [region] else None
    getitems = calls[1:]
    in_order = all(n.target is operator.getitem and n.args == (region, i) for i, n in enumerate(getitems))
    whole = len(getitems) == region.target.torchburn_outputs and results == getitems  # type: ignore[union-attr]
    return program if in_order and whole else None


def _whole_graph_region(
    gm: torch.fx.GraphModule, decisions: dict[torch.fx.Node, Decision], engine: Engine, options: CompileOptions
) -> torch.fx.GraphModule | None:
    """Where the engine takes every node and the graph returns distinct computed tensors, the graph is
    one region: compiled as it stands, without the partitioner's search for connected groups (a tenth
    of a second on a ResNet-18). Returns the graph calling it, as ``partition_and_compile`` does."""
    nodes = list(gm.graph.nodes)
    if any(n.op not in ("placeholder", "call_function", "output") for n in nodes):
        return None
    if any(n.op == "call_function" and not (n in decisions and decisions[n].supported) for n in nodes):
        return None
    result: Any = gm.graph.output_node().args[0]
    if not isinstance(result, (tuple, list)) or not result:
        return None  # a single output: the region would have to rewrite the caller's graph into a tuple
    results = list(result)
    computed = all(isinstance(r, torch.fx.Node) and r.op == "call_function" for r in results)
    if not computed or len(set(results)) != len(results):
        return None
    placeholders = [n for n in nodes if n.op == "placeholder"]
    outer = torch.fx.Graph()
    inputs = []
    for node in placeholders:
        inputs.append(outer.placeholder(node.name))
        inputs[-1].meta = dict(node.meta)
    region, _ = _region_of(gm, options)  # the graph itself, unchanged: its output already is a tuple
    program = compile_region(engine, region, options)
    call = outer.call_function(_caller(program, False, len(region.outputs), 0), tuple(inputs))
    outs = [outer.call_function(operator.getitem, (call, i)) for i in range(len(results))]
    outer.output(tuple(outs) if isinstance(result, tuple) else outs)
    return torch.fx.GraphModule(torch.nn.Module(), outer)


def partition_and_compile(gm: torch.fx.GraphModule, engine: Engine, options: CompileOptions) -> torch.fx.GraphModule:
    """Replace supported regions of ``gm`` with engine programs; record coverage; honour ``fallback``."""
    decisions = decide(gm, engine)
    refused = {d.op: d.reason for d in decisions.values() if not d.supported and d.op != "getitem"}
    if refused and options.fallback == "error":
        from ._fallback_error import FallbackError

        raise FallbackError(engine.name, refused)
    for d in decisions.values():
        if d.op != "getitem":
            telemetry.record(engine.name, d.op, d.supported)
    if options.fallback == "warn":
        for op, reason in refused.items():
            telemetry.warn_fallback_once(engine.name, op, reason)

    whole = _whole_graph_region(gm, decisions, engine, options)
    if whole is not None:
        if options.verbose:
            log.info("engine %s: the whole graph is one region\n%s", engine.name, whole.code)
        return whole
    partitioner = CapabilityBasedPartitioner(gm, _Support(decisions), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    fused = partitioner.fuse_partitions(partitions, prefix=REGION_PREFIX)
    index = 0
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not str(node.target).startswith(REGION_PREFIX):
            continue
        sub = fused.get_submodule(node.target)
        assert isinstance(sub, torch.fx.GraphModule)
        region, single = _region_of(sub, options)
        program = compile_region(engine, region, options)
        with fused.graph.inserting_before(node):
            caller = _caller(program, single, len(region.outputs), index, region.outputs)
            call = fused.graph.call_function(caller, tuple(node.args), dict(node.kwargs))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        fused.graph.erase_node(node)
        fused.delete_submodule(node.target)
        index += 1
    fused.graph.lint()
    fused.recompile()
    if options.verbose:
        log.info(
            "engine %s: %d region(s), %d eager op(s) %s\n%s",
            engine.name,
            index,
            len(refused),
            sorted(refused),
            fused.code,
        )
    return fused
