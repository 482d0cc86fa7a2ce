"""Which arguments of an op a lowering reads, so that an engine never silently ignores one.

An engine claims an ATen op by registering a lowering for it. If the lowering never looks at one of
the op's arguments (``enable_gqa``, ``alpha``, ``approximate``, a mask), a node that sets it would run
with the argument's default instead: a wrong result, not an error. So the registry declines a node
that passes a non-default value for an argument its lowering does not read; the engine's conformance
test then shows every claimed argument honoured.

What a lowering reads is found in its source, for the two calling conventions TorchBurn's engines use:

- ``fn(p, node, *args, **kwargs)``: the op's arguments bound to the function's parameters (by position
  for positional arguments, by name for keyword-only ones); a parameter counts when the body reads it.
- ``fn(p, node, args, out)``: the body reads ``args[i]`` / ``args[i:j]`` / ``len(args) > i`` for the
  positional arguments and names keyword arguments as string literals (``node.kwargs.get("scale")``).

Helpers the lowering calls are followed when they are handed ``args`` whole. Anything the analysis
cannot see is declared with ``reads=`` where the lowering is registered.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

import torch

_NO_DEFAULT = object()


def schema_arguments(op: Any) -> list[Any]:
    """The op's schema arguments (``torch._C.Argument``), in order."""
    return list(op._schema.arguments)


def default_of(argument: Any) -> Any:
    """The schema default of an argument, or a sentinel when it has none."""
    return argument.default_value if argument.has_default_value() else _NO_DEFAULT


def has_default(argument: Any) -> bool:
    return argument.has_default_value()  # type: ignore[no-any-return]


@functools.cache
def _tree(fn: Callable[..., Any]) -> ast.FunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    try:
        module = ast.parse(source)
    except SyntaxError:  # a lambda's source is the middle of a statement
        return None
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node  # type: ignore[return-value]
    return None


def _names_loaded(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _strings(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _position(index: int, count: int) -> int:
    return index + count if index < 0 else index


def _constant_int(node: ast.expr | None, default: int) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    return default


def _indices_read(tree: ast.AST, name: str, count: int) -> set[int]:
    """Positions of the list ``name`` the body reads: ``name[i]``, ``name[i:j]``, ``len(name) > i``;
    every position when the list is iterated, unpacked or handed on whole."""
    read: set[int] = set()
    parent_of: dict[ast.AST, ast.AST] = {}
    for outer in ast.walk(tree):
        for child in ast.iter_child_nodes(outer):
            parent_of[child] = outer
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)):
            continue
        parent = parent_of.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node:
            index = parent.slice
            if isinstance(index, ast.Constant) and isinstance(index.value, int):
                read.add(_position(index.value, count))
            elif isinstance(index, ast.Slice):
                lo = _position(_constant_int(index.lower, 0), count)
                hi = _position(_constant_int(index.upper, count), count)
                read.update(range(lo, min(hi, count)))
            else:
                read.update(range(count))  # a computed index: could be any
            continue
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "len":
            continue  # len(args) alone reads no value
        read.update(range(count))  # iterated, unpacked or passed on: every position
    return read


def _bound_parameters(fn: Callable[..., Any], op: Any) -> set[str] | None:
    """``fn(p, node, *args, **kwargs)``: the schema arguments bound to parameters the body reads."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[2:]
    tree = _tree(fn)
    if tree is None:
        return None
    loaded = _names_loaded(tree)
    arguments = schema_arguments(op)
    read: set[str] = set()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_positional = next((p for p in params if p.kind == p.VAR_POSITIONAL), None)
    var_keyword = next((p for p in params if p.kind == p.VAR_KEYWORD), None)
    by_name = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    positional_schema = [a for a in arguments if not a.kwarg_only]
    for i, argument in enumerate(positional_schema):
        if i < len(positional):
            if positional[i].name in loaded:
                read.add(argument.name)
        elif var_positional is not None:
            extra = _indices_read(tree, var_positional.name, len(positional_schema) - len(positional))
            if i - len(positional) in extra:
                read.add(argument.name)
    for argument in arguments:
        if not argument.kwarg_only:
            continue
        param = by_name.get(argument.name)
        if param is not None and param.name in loaded:
            read.add(argument.name)
        elif param is None and var_keyword is not None and argument.name in _strings(tree):
            read.add(argument.name)
    return read


def _list_convention(fn: Callable[..., Any], op: Any) -> set[str] | None:
    """``fn(p, node, args, out)``: positions of ``args`` read, and keyword names the body spells."""
    tree = _tree(fn)
    if tree is None:
        return None
    arguments = schema_arguments(op)
    positional_schema = [a for a in arguments if not a.kwarg_only]
    params = list(inspect.signature(fn).parameters)
    list_name = params[2] if len(params) > 2 else "args"
    positions = _indices_read(tree, list_name, len(positional_schema))
    positions |= _node_args_read(tree, len(positional_schema))
    strings = _strings(tree)
    read = {a.name for i, a in enumerate(positional_schema) if i in positions}
    # a positional argument may also arrive by keyword (``node.kwargs.get("dim")``)
    read |= {a.name for a in arguments if a.name in strings}
    return read


def _node_args_read(tree: ast.AST, count: int) -> set[int]:
    """Positions read as ``node.args[i]`` (the FX node's own arguments)."""
    read: set[int] = set()
    for sub in ast.walk(tree):
        if (
            isinstance(sub, ast.Subscript)
            and isinstance(sub.value, ast.Attribute)
            and sub.value.attr == "args"
            and isinstance(sub.slice, ast.Constant)
            and isinstance(sub.slice.value, int)
        ):
            read.add(_position(sub.slice.value, count))
    return read


def arguments_read(fn: Callable[..., Any], op: Any, convention: str) -> frozenset[str] | None:
    """Names of ``op``'s arguments that lowering ``fn`` reads (``convention``: "bound" for
    ``fn(p, node, *args, **kwargs)``, "list" for ``fn(p, node, args, out)``); None where the source
    cannot be read (then every argument counts as read, as before this check existed)."""
    if convention == "bound":
        found = _bound_parameters(fn, op)
    elif convention == "list":
        found = _list_convention(fn, op)
    else:
        raise ValueError(f"unknown lowering convention {convention!r} (allowed: bound, list)")
    return None if found is None else frozenset(found)


def check_reads(check: Callable[..., Any], op: Any) -> frozenset[str]:
    """Arguments a support check inspects (``spec.args[i]``, ``args[i]`` after ``args = spec.args``,
    ``spec.kwargs.get("name")``): an argument the check declines when unsupported is handled."""
    tree = _tree(check)
    if tree is None:
        return frozenset()
    positional_schema = [a for a in schema_arguments(op) if not a.kwarg_only]
    count = len(positional_schema)
    positions = _node_args_read(tree, count)
    if "args" in _names_loaded(tree):
        positions |= {i for i in _indices_read(tree, "args", count) if i < count}
    strings = _strings(tree)
    read = {a.name for i, a in enumerate(positional_schema) if i in positions}
    read |= {a.name for a in schema_arguments(op) if a.name in strings}
    return frozenset(read)


# Tensor options: a lowering produces its output as the node's meta says (dtype, and the memory
# format's strides), ``non_blocking`` means nothing without a device copy, and the rest are checked
# here for every op: outputs live in CPU memory, strided and unpinned.
HONOURED_BY_OUTPUT_META = frozenset({"dtype", "memory_format", "non_blocking"})
TENSOR_OPTIONS = HONOURED_BY_OUTPUT_META | {"layout", "device", "pin_memory"}


def tensor_option_problems(node_kwargs: dict[str, Any]) -> list[str]:
    """``name=value`` for each tensor option the engines cannot honour (another device or layout, pinned
    memory)."""
    problems = []
    device = node_kwargs.get("device")
    if device is not None and torch.device(device).type not in ("cpu", "meta"):
        problems.append(f"device={device}")
    layout = node_kwargs.get("layout")
    if layout is not None and layout != torch.strided:
        problems.append(f"layout={layout}")
    if node_kwargs.get("pin_memory"):
        problems.append("pin_memory=True")
    return problems


def unread_values(node_args: tuple[Any, ...], node_kwargs: dict[str, Any], op: Any, read: Iterable[str]) -> list[str]:
    """``name=value`` for every argument the node sets to other than its default and the lowering
    does not read."""
    seen = set(read)
    problems = []
    for i, argument in enumerate(schema_arguments(op)):
        if argument.name in seen:
            continue
        if argument.kwarg_only or i >= len(node_args):
            if argument.name not in node_kwargs:
                continue
            value = node_kwargs[argument.name]
        else:
            value = node_args[i]
        default = default_of(argument)
        if default is _NO_DEFAULT or not _same_value(value, default):
            problems.append(f"{argument.name}={_short(value)}")
    return problems


def _same_value(value: Any, default: Any) -> bool:
    if isinstance(value, torch.fx.Node):
        return False
    if isinstance(default, (list, tuple)) and isinstance(value, (list, tuple)):
        return list(value) == list(default)
    if value is None or default is None:
        return value is default
    if isinstance(value, bool) != isinstance(default, bool):
        return False
    try:
        return bool(value == default)
    except Exception:  # a value that does not compare (a tensor, say) is not the default
        return False


def _short(value: Any) -> str:
    text = value.name if isinstance(value, torch.fx.Node) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
