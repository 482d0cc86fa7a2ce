"""A JSON form of ATen FX graphs: the canonical text hashed by the cache key, the payload the
reference engine stores on disk, and the lowered graphs of the warm-start cache (with each node's
dtype, shape, strides and offset, so they decode with fake values and skip tracing).

A stored graph is untrusted data. Decoding never evaluates code or unpickles. ``loads`` resolves a name
only to an op the region being loaded already contains (so a payload cannot bring in
``aten.from_file``, an RNG, device or in-place op the region did not have), and the decoded graph must
then be the region's own graph, node for node. ``decode_graph`` resolves names to ATen and prims ops
the caller's policy admits; its callers only hand it entries authenticated by the user's cache key.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor

FORMAT = 1
_NAMESPACES = ("aten", "prims")


class GraphCodecError(ValueError):
    """The graph holds something this codec cannot represent, or a payload is not a valid graph."""


def target_name(target: Any) -> str:
    """Stable name of a call target: ``aten.add.Tensor``, ``operator.getitem``, or module.qualname."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # e.g. "aten.add.Tensor"
    if target is operator.getitem:
        return "operator.getitem"
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"


def graph_targets(gm: torch.fx.GraphModule) -> frozenset[Any]:
    """The call targets of a graph: the only ops a payload loaded for it may name."""
    return frozenset(n.target for n in gm.graph.nodes if n.op == "call_function")


def resolve_target(name: str, allowed: frozenset[Any] | Callable[[Any], bool]) -> Any:
    """The op ``name`` names, if it is one of ``allowed`` (a set of ops or a predicate over them)."""
    admits = allowed if callable(allowed) else allowed.__contains__
    if not isinstance(name, str):
        raise GraphCodecError(f"target {name!r} is not an op name")
    if name == "operator.getitem":
        if not admits(operator.getitem):
            raise GraphCodecError("operator.getitem is not in the region this graph is loaded for")
        return operator.getitem
    parts = name.split(".")
    if len(parts) != 3 or parts[0] not in _NAMESPACES:
        raise GraphCodecError(f"target {name!r} is not an ATen op this codec may load")
    try:
        target = getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError) as exc:
        raise GraphCodecError(f"unknown op {name!r} in this torch build") from exc
    if not isinstance(target, torch._ops.OpOverload):
        raise GraphCodecError(f"{name!r} is not an op overload")
    if not admits(target):
        raise GraphCodecError(f"op {name} is not in the region this graph is loaded for")
    return target


def _encode_arg(value: Any, index: dict[torch.fx.Node, int], strict: bool) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"n": index[value]}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"f": repr(value)}
    if isinstance(value, list):
        return {"l": [_encode_arg(v, index, strict) for v in value]}
    if isinstance(value, tuple):
        return {"t": [_encode_arg(v, index, strict) for v in value]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if strict:
        raise GraphCodecError(f"cannot encode argument of type {type(value).__name__}: {value!r}")
    return {"repr": f"{type(value).__qualname__}:{value!r}"}


def _decode_arg(value: Any, nodes: list[torch.fx.Node]) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise GraphCodecError(f"malformed argument {value!r}")
    ((kind, payload),) = value.items()
    if kind == "n":
        if not isinstance(payload, int) or isinstance(payload, bool) or not 0 <= payload < len(nodes):
            raise GraphCodecError(f"argument names node {payload!r}, which is not an earlier node")
        return nodes[payload]
    if kind == "f":
        return float(payload)
    if kind == "l":
        return [_decode_arg(v, nodes) for v in payload]
    if kind == "t":
        return tuple(_decode_arg(v, nodes) for v in payload)
    if kind in ("dtype", "layout", "memory_format"):
        obj = getattr(torch, payload, None)
        expected = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}[kind]
        if not isinstance(obj, expected):
            raise GraphCodecError(f"unknown {kind} {payload!r}")
        return obj
    if kind == "device":
        # only the devices a region can hold; the graph comparison then requires the region's own
        if payload not in ("cpu", "meta"):
            raise GraphCodecError(f"device {payload!r} is not one a stored graph may name (cpu, meta)")
        return torch.device(payload)
    raise GraphCodecError(f"unknown argument kind {kind!r}")


def _spec_text(value: Any) -> Any:
    """Dtype/shape/stride of a node's value for the key; symbolic sizes print as their expression."""
    if isinstance(value, torch.Tensor):
        return [str(value.dtype), [str(s) for s in value.shape], [str(s) for s in value.stride()]]
    if isinstance(value, (tuple, list)):
        return [_spec_text(v) for v in value]
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ["sym", str(value)]
    return type(value).__name__


_NODE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,200}$")
_MAX_ELEMENTS = 1 << 40  # a stored spec describing more is not one a real graph had


def _spec_data(value: Any) -> Any:
    """A node's static value as data: a tensor's dtype/shape/stride/offset, a tuple of them, or None."""
    if isinstance(value, torch.Tensor):
        sizes = [*value.shape, *value.stride(), value.storage_offset()]
        if not all(type(s) is int for s in sizes):
            raise GraphCodecError("the graph has symbolic sizes")
        return {
            "dtype": str(value.dtype).removeprefix("torch."),
            "device": str(value.device),
            "shape": list(value.shape),
            "stride": list(value.stride()),
            "offset": value.storage_offset(),
        }
    if isinstance(value, (tuple, list)):
        return {"t": [_spec_data(v) for v in value]}
    if value is None:
        return None
    raise GraphCodecError(f"cannot store a node value of type {type(value).__name__}")


# small tensor constants a trace makes (torch.tensor([...]) in a forward) travel inside a stored graph
MAX_CONSTANT_BYTES = 1 << 16
_CONSTANT_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        *(torch.float32, torch.float64, torch.float16, torch.bfloat16),
        *(torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool),
    )
}


def _constant_data(value: Any) -> dict[str, Any]:
    """A small plain tensor constant as data (dtype, shape, little-endian bytes in hex)."""
    if type(value) is not torch.Tensor and type(value) is not torch.nn.Parameter:
        raise GraphCodecError(f"constant of type {type(value).__name__} is not a plain tensor")
    dtype = str(value.dtype).removeprefix("torch.")
    data = value.detach().cpu().contiguous()
    size = data.numel() * data.element_size()
    if dtype not in _CONSTANT_DTYPES or size > MAX_CONSTANT_BYTES:
        raise GraphCodecError(f"constant {dtype}{list(value.shape)} is not a small tensor of a stored dtype")
    raw = data.reshape(-1).view(torch.uint8).tolist() if size else []
    return {"dtype": dtype, "shape": list(value.shape), "hex": bytes(raw).hex()}


def _constant(data: Any) -> torch.Tensor:
    if not isinstance(data, dict) or set(data) != {"dtype", "shape", "hex"}:
        raise GraphCodecError("malformed stored constant")
    dtype = _CONSTANT_DTYPES.get(str(data["dtype"]))
    shape = _dims(data["shape"], "constant shape")
    if dtype is None or not isinstance(data["hex"], str) or len(data["hex"]) > 2 * MAX_CONSTANT_BYTES:
        raise GraphCodecError("stored constant has a bad dtype or size")
    raw = bytes.fromhex(data["hex"])
    numel = math.prod(shape)
    if len(raw) != numel * torch.empty((), dtype=dtype).element_size():
        raise GraphCodecError("stored constant's bytes do not match its shape")
    flat = torch.tensor(list(raw), dtype=torch.uint8).view(dtype) if raw else torch.empty(0, dtype=dtype)
    return flat.reshape(shape).clone()


def _dims(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(type(v) is int and 0 <= v < _MAX_ELEMENTS for v in value):
        raise GraphCodecError(f"stored {what} {str(value)[:80]} is not a list of sizes")
    return value


def _fake_value(spec: Any, fake_mode: Any) -> Any:
    """The fake tensor (or tuple of them) a stored spec describes, made in ``fake_mode``."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise GraphCodecError(f"malformed node value {str(spec)[:80]}")
    if set(spec) == {"t"} and isinstance(spec["t"], list):
        return tuple(_fake_value(v, fake_mode) for v in spec["t"])
    dtype = getattr(torch, str(spec.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise GraphCodecError(f"unknown dtype {spec.get('dtype')!r} in a stored node value")
    shape, stride = _dims(spec.get("shape"), "shape"), _dims(spec.get("stride"), "stride")
    offset = spec.get("offset")
    if len(shape) != len(stride) or type(offset) is not int or not 0 <= offset < _MAX_ELEMENTS:
        raise GraphCodecError(f"stored node value {str(spec)[:80]} has mismatched sizes")
    device = spec.get("device")
    if device not in ("cpu", "meta"):
        raise GraphCodecError(f"device {device!r} is not one a stored graph may name (cpu, meta)")
    extent = offset + (1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0)
    # a meta tensor wrapped directly: twenty times cheaper than making it under the fake mode
    storage = torch.empty(extent, dtype=dtype, device="meta")
    meta = storage.as_strided(shape, stride, offset)
    return FakeTensor(fake_mode, meta, torch.device(device))


def encode_graph(
    gm: torch.fx.GraphModule, *, strict: bool = True, with_meta: bool = False, with_values: bool = False
) -> dict[str, Any]:
    """The graph as JSON-able data. ``with_meta`` adds each node's dtype/shape/stride as text (for
    keys); ``with_values`` adds them as data ``decode_graph`` turns back into fake values (static
    graphs only)."""
    index: dict[torch.fx.Node, int] = {}
    nodes = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        entry: dict[str, Any] = {"op": node.op, "name": node.name}
        if node.op == "call_function":
            if strict and not isinstance(node.target, torch._ops.OpOverload) and node.target is not operator.getitem:
                raise GraphCodecError(f"cannot encode call to {target_name(node.target)}")
            entry["target"] = target_name(node.target)
        elif node.op == "get_attr":
            entry["target"] = node.target
            if with_values:
                entry["constant"] = _constant_data(getattr(gm, str(node.target), None))
        elif node.op not in ("placeholder", "output"):
            raise GraphCodecError(f"cannot encode {node.op} node {node.name}")
        if node.args:
            entry["args"] = _encode_arg(tuple(node.args), index, strict)
        if node.kwargs:
            entry["kwargs"] = {k: _encode_arg(v, index, strict) for k, v in node.kwargs.items()}
        if with_meta and "val" in node.meta:
            entry["val"] = _spec_text(node.meta["val"])
        if with_values and node.op != "output":
            entry["value"] = _spec_data(node.meta.get("val"))
        nodes.append(entry)
    return {"format": FORMAT, "nodes": nodes}


def dumps(gm: torch.fx.GraphModule) -> bytes:
    """Serialize a graph with no constants (get_attr) to bytes; raises GraphCodecError otherwise."""
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            raise GraphCodecError("graphs with tensor constants are not serialized")
    return json.dumps(encode_graph(gm), sort_keys=True, separators=(",", ":")).encode()


def _structure(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    """The graph as encoded, without node names (which do not change what it computes)."""
    nodes = encode_graph(gm)["nodes"]
    for entry in nodes:
        entry.pop("name", None)
    return list(nodes)


def _outputs(gm: torch.fx.GraphModule) -> int:
    result = gm.graph.output_node().args[0]
    return len(result) if isinstance(result, (tuple, list)) else 1


def _first_difference(decoded: torch.fx.GraphModule, region: torch.fx.GraphModule) -> str:
    inputs = [sum(n.op == "placeholder" for n in g.graph.nodes) for g in (decoded, region)]
    if inputs[0] != inputs[1]:
        return f"{inputs[0]} inputs where the region has {inputs[1]}"
    outputs = [_outputs(g) for g in (decoded, region)]
    if outputs[0] != outputs[1]:
        return f"{outputs[0]} outputs where the region has {outputs[1]}"
    for i, (a, b) in enumerate(zip(_structure(decoded), _structure(region), strict=False)):
        if a != b:
            return f"node {i} is {a.get('target', a['op'])} where the region has {b.get('target', b['op'])}"
    return f"{len(decoded.graph.nodes)} nodes where the region has {len(region.graph.nodes)}"


def loads(payload: bytes, region: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rebuild the GraphModule ``dumps`` stored for ``region``, checking every field: names resolve only
    to the region's own ops, and the result must be the region's graph (same inputs, outputs, ops and
    arguments, node for node)."""
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise GraphCodecError(f"payload is not JSON: {str(exc)[:200]}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("nodes"), list):
        raise GraphCodecError("payload is not a torchburn graph of this format")
    decoded = _build(data, graph_targets(region), None)
    got = _structure(decoded)
    if got != _structure(region):
        raise GraphCodecError(f"stored graph is not the region's: {_first_difference(decoded, region)}")
    return decoded


def _build(
    data: dict[str, Any], allowed: frozenset[Any] | Callable[[Any], bool], fake_mode: Any
) -> torch.fx.GraphModule:
    """The GraphModule of decoded JSON; with a fake mode, each node's stored value becomes its ``val``
    and stored constants are allowed (``loads`` admits none)."""
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    built: list[torch.fx.Node] = []
    try:
        for entry in data["nodes"]:
            op = entry["op"]
            args = _decode_arg(entry.get("args", {"t": []}), built)
            kwargs = {str(k): _decode_arg(v, built) for k, v in entry.get("kwargs", {}).items()}
            if op == "placeholder":
                node = graph.placeholder(str(entry["name"]))
            elif op == "call_function":
                target = resolve_target(entry["target"], allowed)
                # the stored name where it is one (a warm graph then keys its regions as the cold one did)
                name = entry.get("name") if fake_mode is not None and _NODE_NAME.match(str(entry.get("name"))) else None
                node = graph.create_node("call_function", target, args, kwargs, name=name)
            elif op == "output":
                node = graph.output(args[0])
            elif op == "get_attr" and fake_mode is not None:
                target = str(entry["target"])
                if not _NODE_NAME.match(target) or hasattr(root, target):
                    raise GraphCodecError(f"stored constant name {target[:80]!r} is not a fresh attribute name")
                root.register_buffer(target, _constant(entry.get("constant")))
                node = graph.get_attr(target)
            else:
                raise GraphCodecError(f"unexpected node kind {op!r}")
            if fake_mode is not None and op != "output":
                node.meta["val"] = _fake_value(entry["value"], fake_mode)
            built.append(node)
        graph.lint()
        return torch.fx.GraphModule(root, graph)
    except (KeyError, IndexError, TypeError, AttributeError, RecursionError, RuntimeError, ValueError) as exc:
        if isinstance(exc, GraphCodecError):
            raise
        raise GraphCodecError(f"malformed graph payload: {str(exc)[:200]}") from exc


def decode_graph(data: Any, allowed: Callable[[Any], bool], fake_mode: Any) -> torch.fx.GraphModule:
    """Rebuild a graph ``encode_graph(..., with_values=True)`` made, with fake values made in
    ``fake_mode``; call targets must be ATen/prims ops (or getitem) that ``allowed`` admits."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("nodes"), list):
        raise GraphCodecError("payload is not a torchburn graph of this format")
    return _build(data, allowed, fake_mode)
