"""The key of a Dynamo graph, for the warm-start cache: what Dynamo handed the backend, canonically.

Two processes that trace the same model with the same inputs hand the backend graphs that print the
same here, so the second can take the ATen graphs the first lowered to. A graph whose every part cannot
be named exactly (a call target that does not resolve back to itself by its qualified name, an argument
of an unknown type, symbolic sizes, a submodule call) has no key: it is always lowered afresh.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .._version import __version__
from .key import GraphKey, _tensor_digest, hash_parts

if TYPE_CHECKING:
    from ..engines.base import Engine
    from ..options import CompileOptions

KEY_FORMAT = "torchburn-lowered-key-1"


class Unkeyable(Exception):
    """This graph has no warm-start key; the message says why."""


def _qualified_name(target: Any) -> str:
    """``module.qualname`` of a call target, checked to resolve back to the very same object."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{target}"
    module_name, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not isinstance(module_name, str) or not isinstance(qualname, str):
        raise Unkeyable(f"call target {target!r} has no importable name")
    module = sys.modules.get(module_name)
    if module is None and module_name in ("_operator", "builtins", "math"):
        module = importlib.import_module(module_name)
    # by qualified name, or by plain name in its module: torch.conv2d and kin are static methods of a C
    # class that is not importable by its own name, F.max_pool2d is a wrapper made in a function
    for path in (qualname, getattr(target, "__name__", "")):
        if not isinstance(path, str) or "<" in path:
            continue
        found: Any = module
        for part in path.split("."):
            found = getattr(found, part, None)
        if found is target:
            return f"{module_name}.{path}"
    raise Unkeyable(f"call target {module_name}.{qualname} does not resolve back to itself")


def _argument(value: Any, index: dict[torch.fx.Node, int]) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"n": index[value]}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"f": repr(value)}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_argument(v, index) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"d": {k: _argument(v, index) for k, v in sorted(value.items())}}
    if isinstance(value, slice):
        return {"slice": [_argument(v, index) for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return {type(value).__name__: str(value)}
    raise Unkeyable(f"argument of type {type(value).__name__} has no canonical form")


def _placeholder(value: Any, storages: list[StorageWeakRef]) -> list[Any]:
    """A Dynamo input: a plain tensor of static sizes; which earlier input shares its storage (so that
    inputs aliasing each other never meet a graph lowered for inputs that did not)."""
    if not isinstance(value, torch.Tensor) or is_traceable_wrapper_subclass(value):
        raise Unkeyable(f"input {type(value).__name__} is not a plain tensor")
    sizes = [*value.shape, *value.stride(), value.storage_offset()]
    if not all(type(s) is int for s in sizes):
        raise Unkeyable("the graph has symbolic sizes")
    storage = StorageWeakRef(value.untyped_storage())  # type: ignore[no-untyped-call]
    shared = next((i for i, s in enumerate(storages) if s == storage), None)
    storages.append(storage)
    return [
        str(value.dtype),
        str(value.device),
        list(value.shape),
        list(value.stride()),
        value.storage_offset(),
        value.requires_grad,
        shared,
    ]


def graph_text(gm: torch.fx.GraphModule) -> str:
    """The graph node by node: op, target, arguments and, for inputs, their tensor description."""
    index: dict[torch.fx.Node, int] = {}
    storages: list[StorageWeakRef] = []
    rows: list[Any] = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        row: list[Any] = [node.op]
        if node.op == "placeholder":
            row.append(_placeholder(node.meta.get("example_value"), storages))
        elif node.op == "call_function":
            row.append(_qualified_name(node.target))
        elif node.op == "call_method":
            row.append(str(node.target))
        elif node.op == "get_attr":
            value = getattr(gm, str(node.target), None)
            if not isinstance(value, torch.Tensor) or is_traceable_wrapper_subclass(value):
                raise Unkeyable(f"constant {node.target} is not a plain tensor")
            row.append([str(node.target), str(value.dtype), list(value.shape), _tensor_digest(value)])
        elif node.op != "output":
            raise Unkeyable(f"{node.op} nodes are not keyed")
        row.append(_argument(tuple(node.args), index))
        row.append(_argument(dict(node.kwargs), index))
        rows.append(row)
    return json.dumps(rows, separators=(",", ":"))


@functools.cache
def _code_stamp(package_dirs: tuple[str, ...]) -> str:
    """Name, size and modification time of every Python file of these packages: the lowering changes
    with the code of core's decompositions and the engine's, which a version number does not track
    between releases. Read once per process, not once per compiled graph."""
    rows = []
    for folder in package_dirs:
        root = Path(folder)
        for path in sorted(root.rglob("*.py")):
            stat = path.stat()
            rows.append(f"{path.relative_to(root.parent)}:{stat.st_size}:{stat.st_mtime_ns}")
    return hash_parts([("files", "\n".join(rows))]).digest


def dynamo_graph_key(gm: torch.fx.GraphModule, engine: Engine, options: CompileOptions) -> GraphKey:
    """The warm-start key of a Dynamo graph, or :class:`Unkeyable`."""
    import torchburn

    engine_module = sys.modules.get(type(engine).__module__.split(".")[0])
    packages = [torchburn] + ([engine_module] if engine_module is not None else [])
    parts: list[tuple[str, str]] = [
        ("format", KEY_FORMAT),
        ("torchburn", __version__),
        ("torch", torch.__version__),
        ("code", _code_stamp(tuple(str(Path(m.__file__).parent) for m in packages if m.__file__))),
        ("engine", f"{engine.name} {engine.version}"),
        ("engine_parts", json.dumps(engine.cache_key_parts(), sort_keys=True)),
        ("options", json.dumps(options.key_items())),
        ("grad_enabled", str(torch.is_grad_enabled())),
        ("deterministic", str(torch.are_deterministic_algorithms_enabled())),
        ("graph", graph_text(gm)),
    ]
    return hash_parts(parts)
