"""The warm-start cache: the ATen graphs a Dynamo graph lowered to, kept on disk.

A process compiling a graph that another process already lowered (same model code, inputs, engine,
options, torch and TorchBurn) skips Dynamo-graph-to-ATen tracing, the decomposition table and, under
autograd, AOTAutograd's metadata pass, joint trace and partitioner: it decodes the stored graphs with
fake values and hands them to the engine as if they were fresh. That is what inductor's AOTAutograd
cache does for inductor; this one stores no Python objects, only graphs as data.

An entry holds either one inference graph, or a forward and a backward graph with the layout of the
forward's results (which inputs it updates, how many outputs, which are differentiable). Graphs are
stored only where replaying them needs nothing of AOTAutograd's runtime but what
:mod:`torchburn.aot_replay` does: no outputs aliasing inputs or each other, no effect tokens or RNG
state, input updates only as data copies into inputs that do not require grad. Anything else lowers
afresh every time, as before.

Entries live in the authenticated disk store of :mod:`torchburn.cache` (keyed BLAKE3 over the entry
with the user's secret), so a graph another user wrote or anyone edited is never decoded. Decoding
still checks every field.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .. import graph_codec
from .dynamo_key import Unkeyable, dynamo_graph_key

if TYPE_CHECKING:
    from ..engines.base import Engine
    from ..options import CompileOptions
    from .key import GraphKey

log = logging.getLogger("torchburn.cache")

ENTRY_FORMAT = "torchburn-lowered-1"
_KINDS = ("inference", "autograd")


def _admitted(target: Any) -> bool:
    """Ops a stored graph may call, beyond decode_graph's own rule (ATen/prims overloads and getitem):
    none that reads a file, even from an authenticated entry."""
    return "from_file" not in str(target)


@dataclass
class Layout:
    """How the forward's results split: ``[updated inputs..., outputs..., saved for backward...]``."""

    inputs: int
    mutated_inputs: list[int]  # inputs the forward's first results are copied into
    outputs: int
    differentiable: list[bool]  # per output
    unsafe_views: list[int]  # outputs turned into non-views, as AOTAutograd does
    saved: int

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @staticmethod
    def from_json(data: Any, inputs: int) -> Layout:
        if not isinstance(data, dict) or set(data) != set(Layout.__dataclass_fields__):
            raise graph_codec.GraphCodecError("stored layout is malformed")
        layout = Layout(**data)
        ints = [layout.inputs, layout.outputs, layout.saved, *layout.mutated_inputs, *layout.unsafe_views]
        if not all(type(v) is int and v >= 0 for v in ints) or layout.inputs != inputs:
            raise graph_codec.GraphCodecError("stored layout has bad counts")
        if not all(v < inputs for v in layout.mutated_inputs) or not all(
            v < layout.outputs for v in layout.unsafe_views
        ):
            raise graph_codec.GraphCodecError("stored layout names results that do not exist")
        if len(layout.differentiable) != layout.outputs or not all(type(d) is bool for d in layout.differentiable):
            raise graph_codec.GraphCodecError("stored layout has bad differentiability flags")
        return layout


@dataclass
class Lowered:
    """Decoded graphs of one entry, ready for the engine."""

    kind: str
    graphs: dict[str, torch.fx.GraphModule]
    layout: Layout | None = None


class NotReplayable(Exception):
    """AOTAutograd's result needs its own runtime wrappers; the message says which part."""


@dataclass
class Recorder:
    """Collects the graphs of one cold compile, then writes them as one entry."""

    key: GraphKey
    inputs: int
    graphs: dict[str, Any] = field(default_factory=dict)
    layout: Layout | None = None
    failure: str | None = None

    def _encode(self, phase: str, gm: torch.fx.GraphModule) -> None:
        # AOTAutograd shows graphs under its fake mode: the constants' real bytes are read outside it
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        try:
            with unset_fake_temporarily():
                self.graphs[phase] = graph_codec.encode_graph(gm, with_values=True)
        except Exception as exc:  # recording is best effort: the compile itself must go on
            self.failure = f"{phase} graph: {type(exc).__name__}: {exc}"

    def inference(self, gm: torch.fx.GraphModule, meta: Any = None) -> None:
        """The inference graph: from the direct trace (no ``meta``) or AOTAutograd's inference path."""
        try:
            if meta is not None:
                _check_common(meta, self.inputs, gm)
                if meta.mutated_inp_runtime_indices or getattr(meta, "num_unsafe_view_outputs", 0):
                    raise NotReplayable("inputs updated outside the graph or outputs made non-views")
        except NotReplayable as exc:
            self.failure = str(exc)
            return
        self._encode("inference", gm)

    def forward(self, gm: torch.fx.GraphModule, meta: Any) -> None:
        try:
            self.layout = _forward_layout(gm, meta, self.inputs)
        except NotReplayable as exc:
            self.failure = str(exc)
            return
        self._encode("forward", gm)

    def backward(self, gm: torch.fx.GraphModule) -> None:
        layout = self.layout
        if layout is None:
            return
        placeholders = sum(n.op == "placeholder" for n in gm.graph.nodes)
        outputs = len(gm.graph.output_node().args[0])  # type: ignore[arg-type]
        if placeholders != layout.saved + sum(layout.differentiable) or outputs != layout.inputs:
            self.failure = "backward graph does not take the saved values and one gradient per output"
            return
        self._encode("backward", gm)

    def payload(self) -> bytes | None:
        """The entry's bytes, or None when the compile took a path that cannot be replayed."""
        if self.failure is not None:
            log.info("lowered graphs of %s not stored: %s", self.key.digest[:16], self.failure)
            return None
        if set(self.graphs) == {"inference"}:
            kind = "inference"
        elif set(self.graphs) == {"forward", "backward"} and self.layout is not None:
            kind = "autograd"
        else:
            return None
        entry = {
            "format": ENTRY_FORMAT,
            "kind": kind,
            "inputs": self.inputs,
            "graphs": self.graphs,
            "layout": self.layout.as_json() if kind == "autograd" and self.layout is not None else None,
        }
        return json.dumps(entry, separators=(",", ":")).encode()


def _check_common(meta: Any, inputs: int, gm: torch.fx.GraphModule) -> None:
    from torch._functorch._aot_autograd.schemas import MutationType, OutputType

    if getattr(meta, "tokens", None) or getattr(meta, "num_graphsafe_rng_states", 0):
        raise NotReplayable("effect tokens or RNG state")
    if getattr(meta, "is_rng_op_functionalized", False) or meta.num_intermediate_bases:
        raise NotReplayable("functionalized RNG or outputs aliasing intermediates")
    if any(o.output_type != OutputType.non_alias for o in meta.output_info):
        raise NotReplayable("an output aliases an input or another output")
    if len(meta.input_info) != inputs or sum(n.op == "placeholder" for n in gm.graph.nodes) != inputs:
        raise NotReplayable("AOTAutograd merged or added inputs")
    for i in meta.mutated_inp_runtime_indices:
        info = meta.input_info[i]
        if info.mutation_type != MutationType.MUTATED_OUT_GRAPH or info.mutates_metadata or info.requires_grad:
            raise NotReplayable(f"input {i} is updated in a way other than a data copy")
        if getattr(info, "mutates_storage_metadata", False) or getattr(info, "mutations_hidden_from_autograd", False):
            raise NotReplayable(f"input {i} has its storage replaced")


def _forward_layout(gm: torch.fx.GraphModule, meta: Any, inputs: int) -> Layout:
    _check_common(meta, inputs, gm)
    if meta.num_symints_saved_for_bw:
        raise NotReplayable("sizes saved for the backward")
    mutated = list(meta.mutated_inp_runtime_indices)
    if any(not meta.input_info[i].mutates_data for i in mutated):
        raise NotReplayable("an input's metadata is updated")
    results = list(gm.graph.output_node().args[0])  # type: ignore[arg-type]
    outputs = len(meta.output_info)
    saved = len(results) - len(mutated) - outputs
    differentiable = [bool(o.requires_grad) for o in meta.output_info]
    if saved < 0 or (meta.traced_tangents and len(meta.traced_tangents) != sum(differentiable)):
        raise NotReplayable("the forward's results do not split into updates, outputs and saved values")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    updated = {placeholders[i] for i in mutated}
    if any(r in updated for r in results[len(mutated) + outputs :]):
        raise NotReplayable("an input saved for the backward is also updated")
    if not all(isinstance(r, torch.fx.Node) and isinstance(r.meta.get("val"), torch.Tensor) for r in results):
        raise NotReplayable("a result of the forward is not a tensor")
    return Layout(
        inputs=inputs,
        mutated_inputs=mutated,
        outputs=outputs,
        differentiable=differentiable,
        unsafe_views=list(getattr(meta, "unsafe_view_out_indices", [])),
        saved=saved,
    )


def key_of(gm: torch.fx.GraphModule, engine: Engine, options: CompileOptions) -> GraphKey | None:
    """The warm-start key of a Dynamo graph, or None (logged) where it has none."""
    try:
        return dynamo_graph_key(gm, engine, options)
    except Unkeyable as exc:
        log.info("graph has no warm-start key: %s", exc)
        return None
    except Exception as exc:  # the engine's own key parts (a lost GPU, say): its compile reports it
        log.info("no warm-start key: %s: %s", type(exc).__name__, exc)
        return None


def decode(payload: bytes, inputs: list[Any]) -> Lowered:
    """The graphs of a stored entry, checked against the inputs Dynamo passes; GraphCodecError if bad."""
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise graph_codec.GraphCodecError(f"entry is not JSON: {str(exc)[:200]}") from exc
    if not isinstance(data, dict) or data.get("format") != ENTRY_FORMAT or data.get("kind") not in _KINDS:
        raise graph_codec.GraphCodecError("entry is not a lowered-graph entry of this format")
    if data.get("inputs") != len(inputs) or not isinstance(data.get("graphs"), dict):
        raise graph_codec.GraphCodecError("entry is for a different number of inputs")
    fake_mode = _fake_mode(inputs)
    phases = ["inference"] if data["kind"] == "inference" else ["forward", "backward"]
    if set(data["graphs"]) != set(phases):
        raise graph_codec.GraphCodecError(f"entry of kind {data['kind']} must hold graphs {phases}")
    graphs = {phase: graph_codec.decode_graph(data["graphs"][phase], _admitted, fake_mode) for phase in phases}
    first = graphs[phases[0]]
    placeholders = [n for n in first.graph.nodes if n.op == "placeholder"]
    if [_spec(n.meta["val"]) for n in placeholders] != [_spec(x) for x in inputs]:
        raise graph_codec.GraphCodecError("entry's inputs are not the ones Dynamo passes")
    layout = Layout.from_json(data.get("layout"), len(inputs)) if data["kind"] == "autograd" else None
    if layout is not None:
        results = len(first.graph.output_node().args[0])  # type: ignore[arg-type]
        if results != len(layout.mutated_inputs) + layout.outputs + layout.saved:
            raise graph_codec.GraphCodecError("entry's forward graph does not match its layout")
        backward = graphs["backward"]
        taken = sum(n.op == "placeholder" for n in backward.graph.nodes)
        if taken != layout.saved + sum(layout.differentiable):
            raise graph_codec.GraphCodecError("entry's backward graph does not match its layout")
        if len(backward.graph.output_node().args[0]) != layout.inputs:  # type: ignore[arg-type]
            raise graph_codec.GraphCodecError("entry's backward graph does not give one gradient per input")
    return Lowered(data["kind"], graphs, layout)


def _spec(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return None
    return (value.dtype, tuple(value.shape), tuple(value.stride()), value.storage_offset())


def _fake_mode(inputs: list[Any]) -> Any:
    """Dynamo's fake mode (its inputs are fake tensors), or a fresh one."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    for value in inputs:
        if isinstance(value, FakeTensor):
            return value.fake_mode
    return FakeTensorMode()
