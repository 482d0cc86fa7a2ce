"""Running a stored forward/backward pair without AOTAutograd (the warm-start cache's autograd path).

AOTAutograd wraps the forward and backward it compiles in a ``torch.autograd.Function`` and, around
it, runtime wrappers for everything a graph can do to its inputs and outputs. The graphs the
warm-start cache keeps need only this part of it (see :mod:`torchburn.cache.lowered`): the forward
returns ``[updated inputs..., outputs..., saved for backward...]``; the updates are copied into their
inputs, the saved values kept for the backward, and the backward gets them plus one gradient per
differentiable output, laid out as the stored backward graph was traced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from .cache.lowered import Layout

CompilePhase = Callable[[torch.fx.GraphModule, str], Callable[..., Any]]


class Replay:
    """The compiled forward of a stored pair; the backward compiles when it first runs."""

    def __init__(
        self,
        forward: torch.fx.GraphModule,
        backward: torch.fx.GraphModule,
        layout: Layout,
        compile_phase: CompilePhase,
    ) -> None:
        self.layout = layout
        self.forward_program = compile_phase(forward, "forward")
        self._backward_graph: torch.fx.GraphModule | None = backward
        self._backward_program: Callable[..., Any] | None = None
        self._compile_phase = compile_phase
        tangents = [n.meta["val"] for n in backward.graph.nodes if n.op == "placeholder"][layout.saved :]
        # (shape, stride, dtype) the backward was traced with, per differentiable output
        self.tangent_layouts = [(tuple(t.shape), tuple(t.stride()), t.dtype) for t in tangents]

    def backward_program(self) -> Callable[..., Any]:
        if self._backward_program is None:
            assert self._backward_graph is not None
            self._backward_program = self._compile_phase(self._backward_graph, "backward")
            self._backward_graph = None
        return self._backward_program

    # both run outside Dynamo's frame hook: a training step compiled whole calls the backward under it
    @torch._dynamo.disable  # type: ignore[untyped-decorator]
    def run_backward(self, *args: Any) -> Any:
        return self.backward_program()(*args)

    @torch._dynamo.disable  # type: ignore[untyped-decorator]
    def __call__(self, *args: Any) -> list[Any]:
        results = _ReplayFunction.apply(self, *args)
        layout = self.layout
        outputs = list(results[: layout.outputs])
        with torch.no_grad():
            for index, value in zip(layout.mutated_inputs, results[layout.outputs :], strict=True):
                args[index].copy_(value)
        return outputs


def _as_traced(grad: torch.Tensor, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The gradient with the strides the backward graph was traced for (a compiled graph assumes them)."""
    if grad.dtype == dtype and tuple(grad.shape) == shape and _same_layout(grad, stride):
        return grad
    out = torch.empty_strided(shape, stride, dtype=dtype, device=grad.device)
    out.copy_(grad)
    return out


def _same_layout(t: torch.Tensor, stride: tuple[int, ...]) -> bool:
    return all(size <= 1 or s == want for size, s, want in zip(t.shape, t.stride(), stride, strict=True))


class _ReplayFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, replay: Replay, *args: Any) -> tuple[Any, ...]:  # type: ignore[override]
        layout = replay.layout
        results = replay.forward_program(*args)
        updates = results[: len(layout.mutated_inputs)]
        start = len(layout.mutated_inputs)
        outputs = list(results[start : start + layout.outputs])
        saved = results[start + layout.outputs :]
        for i in layout.unsafe_views:
            outputs[i] = torch.ops.aten._unsafe_view(outputs[i], outputs[i].shape)
        ctx.replay = replay
        ctx.save_for_backward(*saved)
        fixed = [
            o for o, d in zip(outputs, layout.differentiable, strict=True) if not d and isinstance(o, torch.Tensor)
        ]
        ctx.mark_non_differentiable(*fixed, *updates)
        return (*outputs, *updates)

    @staticmethod
    @once_differentiable  # type: ignore[untyped-decorator]
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        replay: Replay = ctx.replay
        layout = replay.layout
        wanted = [g for g, d in zip(grads[: layout.outputs], layout.differentiable, strict=True) if d]
        tangents = [_as_traced(g, *spec) for g, spec in zip(wanted, replay.tangent_layouts, strict=True)]
        return (None, *replay.run_backward(*ctx.saved_tensors, *tangents))
