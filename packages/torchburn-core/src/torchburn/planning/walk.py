"""The one walk over a region graph that every engine's planner makes, at concrete input layouts.

Inputs are bound to the engine's values, each node's output is described by a meta tensor (taken from
the trace when the inputs are laid out as traced, else computed by the op's meta kernel), and each node
is handed to its lowering as ``fn(planner, node, *args, **kwargs)`` with its arguments already mapped
to values. A lazy result (an elementwise expression not yet in memory) read by more than one node, or
leaving the region, is materialized once instead of being recomputed by every reader.

An engine's planner subclasses :class:`GraphWalk` and supplies how inputs and constants become its
values and how a lazy value is written to memory.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from .context import PlanContext
from .errors import PlanError
from .table import LoweringTable


def static_tensors(value: Any) -> bool:
    """Whether ``value`` (a node's traced ``val``) is a tensor, or a non-empty tuple or list of them,
    with static sizes and strides."""
    if isinstance(value, (tuple, list)):
        return bool(value) and all(static_tensors(v) for v in value)
    return (
        isinstance(value, torch.Tensor)
        and all(isinstance(s, int) for s in value.shape)
        and all(isinstance(s, int) for s in value.stride())
    )


def same_layout(traced: Any, bound: Any) -> bool:
    """Whether a traced placeholder value describes ``bound`` (its meta tensor, or a Python scalar)."""
    if not isinstance(bound, torch.Tensor):
        return type(traced) is type(bound) and isinstance(bound, (int, float, bool)) and traced == bound
    return (
        static_tensors(traced)
        and traced.dtype == bound.dtype
        and tuple(traced.shape) == tuple(bound.shape)
        and traced.stride() == bound.stride()
    )


def on_meta(result: Any) -> Any:
    """Results of ops that create tensors (``full``, ``scalar_tensor``) on the device their arguments
    name, as meta tensors like every other value's."""
    if isinstance(result, torch.Tensor) and result.device.type != "meta":
        return torch.empty_strided(result.shape, result.stride(), dtype=result.dtype, device="meta")
    if isinstance(result, (tuple, list)):
        return type(result)(on_meta(r) for r in result)
    return result


class GraphWalk:
    """Binds a region's inputs, then lowers its nodes in order; see the module docs."""

    table: LoweringTable  # the engine's lowerings: set by each engine's planner class

    def __init__(self, gm: torch.fx.GraphModule, args: Sequence[Any], context: PlanContext | None = None) -> None:
        self.gm = gm
        self.args = list(args)
        self.context = context if context is not None else PlanContext()  # the engine's runtime facts
        self.env: dict[torch.fx.Node, Any] = {}
        self.meta_env: dict[torch.fx.Node, Any] = {}
        self.current: torch.fx.Node | None = None
        self.traced_values_hold = False
        self.output_users: set[torch.fx.Node] = set()

    # ---- what an engine supplies --------------------------------------------------------------
    def bind_input(self, position: int, tensor_index: int, tensor: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """The engine's value for input tensor number ``tensor_index`` (placeholder ``position``), and
        the meta tensor that describes it as the engine holds it."""
        raise NotImplementedError

    def bind_constant(self, node: torch.fx.Node, tensor: torch.Tensor) -> Any:
        """The engine's value for a tensor the graph holds (``get_attr``)."""
        raise PlanError(f"graph constant {node.target} is not supported by this engine")

    def is_lazy(self, value: Any) -> bool:
        """Whether ``value`` is an expression not yet in memory."""
        return False

    def materialize(self, value: Any) -> Any:
        """``value`` written to memory."""
        return value

    # ---- the walk -------------------------------------------------------------------------------
    def walk(self) -> list[Any]:
        """Lower every node; returns the engine's values of the region's outputs, in order."""
        graph = self.gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        tensor_index = 0
        for position, (node, arg) in enumerate(zip(placeholders, self.args, strict=True)):
            if isinstance(arg, torch.Tensor):
                self.env[node], self.meta_env[node] = self.bind_input(position, tensor_index, arg)
                tensor_index += 1
            else:
                self.env[node] = self.meta_env[node] = arg
        # the trace's values describe this call only if its inputs are laid out as the traced ones
        self.traced_values_hold = all(same_layout(n.meta.get("val"), self.meta_env[n]) for n in placeholders)
        for node in graph.nodes:
            if node.op == "get_attr":
                tensor = self._attribute(node)
                self.env[node] = self.bind_constant(node, tensor)
                self.meta_env[node] = torch.empty_strided(
                    tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta"
                )
        output_node = graph.output_node()
        self.output_users = set(output_node.all_input_nodes)
        for node in graph.nodes:
            if node.op in ("placeholder", "output", "get_attr"):
                continue
            if node.op != "call_function":
                raise PlanError(f"unexpected {node.op} node {node.name}")
            self.current = node
            self.meta_env[node] = self._meta(node)
            self.env[node] = self._lower(node)
        results = output_node.args[0]
        values = []
        for r in list(results) if isinstance(results, (tuple, list)) else [results]:
            if not isinstance(r, torch.fx.Node):
                raise PlanError("region outputs must be tensors")
            values.append(self.env[r])
        return values

    def out_meta(self, index: int | None = None) -> Any:
        """The meta tensor (or tuple of them) of the node being lowered, or its ``index``-th output."""
        assert self.current is not None
        meta = self.meta_env[self.current]
        return meta if index is None else meta[index]

    def _attribute(self, node: torch.fx.Node) -> torch.Tensor:
        obj: Any = self.gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, torch.Tensor):
            raise PlanError(f"graph constant {node.target} is not a tensor")
        return obj.detach()

    def _meta(self, node: torch.fx.Node) -> Any:
        if node.target is operator.getitem:
            seq, idx = node.args
            return self.meta_env[seq][idx]  # type: ignore[index]
        traced = node.meta.get("val")
        if self.traced_values_hold and static_tensors(traced):
            return traced  # the lowering trace already inferred it; a meta kernel would do it again
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: self.meta_env[n])
        if "device" in kwargs:
            kwargs = {**kwargs, "device": torch.device("meta")}  # factories and copies: shape only
        try:
            return on_meta(node.target(*args, **kwargs))  # type: ignore[operator]
        except (NotImplementedError, RuntimeError) as exc:
            raise PlanError(f"{node.target}: its output shape depends on values ({exc})") from exc

    def _lower(self, node: torch.fx.Node) -> Any:
        if node.target is operator.getitem:
            seq, idx = node.args
            return self.env[seq][idx]  # type: ignore[index]
        fn = self.table.get(node.target)
        if fn is None:
            raise PlanError(f"no lowering for {node.target}")
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: self.env[n])
        result = fn(self, node, *args, **kwargs)
        # a lazy value with several readers (or that leaves the region) is computed once, not per reader
        if self.is_lazy(result) and (len(node.users) > 1 or node in self.output_users):
            result = self.materialize(result)
        return result
