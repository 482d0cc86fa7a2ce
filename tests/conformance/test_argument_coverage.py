"""Every argument of every op an engine claims is either honoured or declined.

An engine's op table knows, from each lowering's source, which of the op's arguments it reads (see
``torchburn.arguments``); a node that sets any other argument to a non-default value is declined, so
it runs eagerly instead of silently computing something else. These tests check the table of each
engine, then show the rule at work in a real compile.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchburn
from torchburn.arguments import has_default, schema_arguments
from torchburn.engines.base import NodeSpec
from torchburn.ops import OpRegistry, OpSupport
from torchburn.partition import node_spec

ENGINES = [
    e.name
    for e in torchburn.list_engines()
    if e.available and any(entry.lowering is not None for entry in torchburn.get_engine(e.name).ops.entries())
]


def test_the_engines_with_lowerings_are_checked() -> None:
    assert {"native", "wgpu"} <= set(ENGINES)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_claimed_argument_is_read_or_declined(engine: str) -> None:
    never_runs = []
    for entry in torchburn.get_engine(engine).ops.entries():
        read = entry.arguments_read
        assert read is not None, f"{entry.op}: the source of its lowering cannot be read, so its arguments go unchecked"
        for argument in schema_arguments(entry.op):
            if argument.name not in read and not has_default(argument):
                never_runs.append(f"{entry.op}: {argument.name}")
    # a required argument the lowering never reads would make the engine decline every such node:
    # either the lowering is wrong, or it honours the argument another way and must say so (reads=)
    assert not never_runs, "\n".join(never_runs)


def _node(fn: Any, *inputs: torch.Tensor, op: Any = None) -> NodeSpec:
    """The NodeSpec of the compute node of ``fn``'s ATen graph (the one calling ``op``, if given)."""
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn, tracing_mode="fake")(*inputs)
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and (op is None or n.target is op)]
    return node_spec(node)


def test_an_unread_argument_is_declined_when_set() -> None:
    aten = torch.ops.aten

    def add_ignoring_alpha(p: Any, node: Any, x: Any, y: Any) -> Any:  # never looks at alpha
        return (p, node, x, y)

    registry = OpRegistry("test")
    registry.add(aten.add.Tensor, family="elementwise", lowering=add_ignoring_alpha)
    x = torch.randn(3)
    assert registry.supports(_node(lambda a, b: torch.add(a, b), x, x)) is True
    assert registry.supports(_node(lambda a, b: torch.add(a, b, alpha=1), x, x)) is True  # the default
    assert registry.supports(_node(lambda a, b: torch.add(a, b, alpha=2), x, x)) == "argument alpha=2 not supported"

    def add(p: Any, node: Any, x: Any, y: Any, *, alpha: Any = 1) -> Any:
        return (p, node, x, y, alpha)

    honouring = OpRegistry("test")
    honouring.add(aten.add.Tensor, family="elementwise", lowering=add)
    assert honouring.supports(_node(lambda a, b: torch.add(a, b, alpha=2), x, x)) is True


def test_tensor_options_other_than_cpu_memory_are_declined() -> None:
    aten = torch.ops.aten

    def zeros(p: Any, node: Any, size: Any, **kwargs: Any) -> Any:
        return (p, node, size, kwargs)

    registry = OpRegistry("test")
    registry.add(aten.zeros.default, family="constant", lowering=zeros)
    spec = _node(lambda x: x + torch.zeros(3, device="cpu", dtype=torch.float64), torch.randn(3), op=aten.zeros.default)
    zero_node = spec.node
    assert registry.supports(spec) is True
    zero_node.kwargs = {**zero_node.kwargs, "pin_memory": True}
    assert "pin_memory=True" in str(registry.supports(node_spec(zero_node)))
    zero_node.kwargs = {**zero_node.kwargs, "pin_memory": False, "device": torch.device("cuda")}
    assert "device=cuda" in str(registry.supports(node_spec(zero_node)))


SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


@pytest.mark.parametrize("engine", [e for e in ENGINES if torchburn.get_engine(e).ops.entry(SDPA) is not None])
def test_a_compile_declines_what_the_lowering_does_not_read(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Strip ``scale`` from what the engine's attention lowering reads: a strict compile that sets it
    must then be refused, naming the argument, instead of running with the default scale."""
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    registry = torchburn.get_engine(engine).ops
    entry = registry.entry(op)
    assert entry is not None and entry.arguments_read is not None and "scale" in entry.arguments_read

    class WithoutScale(OpSupport):
        @property
        def arguments_read(self) -> frozenset[str] | None:  # type: ignore[override]
            read = super().arguments_read
            return None if read is None else read - {"scale"}

    stripped = WithoutScale(**{f: getattr(entry, f) for f in entry.__dataclass_fields__})
    monkeypatch.setitem(registry._entries, op, stripped)
    q = torch.randn(1, 2, 4, 8)

    def attend(q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, scale=0.37)

    with torch.no_grad(), pytest.raises(torchburn.FallbackError, match=r"scale=0\.37"):
        torch.compile(attend, backend="torchburn", options={"engine": engine, "fallback": "error"})(q)
