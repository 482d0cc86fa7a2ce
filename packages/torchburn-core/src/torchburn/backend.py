"""The ``torch.compile`` backend: ``torch.compile(model, backend="torchburn", options={...})``.

Dynamo finds :func:`torchburn_backend` through the ``torch_dynamo_backends`` entry point, so it works
without ``import torchburn``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.fx._lazy_graph_module import _LazyGraphModule

from ._fallback_error import FallbackError
from .aten_graph import functorch_levels_restored
from .engines.discovery import resolve_engine
from .errors import OptionsError, TorchBurnError
from .options import parse_options
from .partition import partition_and_compile, whole_graph_program
from .warm_start import compile_dynamo_graph


def torchburn_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    options: Mapping[str, Any] | None = None,
    **unexpected: Any,
) -> Callable[..., Any]:
    """Dynamo backend entry: lower to ATen, partition for the engine, compile regions."""
    if unexpected:
        raise OptionsError(
            f"torch.compile passed {', '.join(sorted(unexpected))} to the torchburn backend; "
            'only options={...} is accepted (keys: "engine", "fallback", "cache", "verbose")'
        )
    opts = parse_options(options)
    engine = resolve_engine(opts.engine)

    def compile_graph(aten_gm: torch.fx.GraphModule, inputs: list[Any], phase: str) -> Callable[..., Any]:
        compiled = partition_and_compile(aten_gm, engine, opts)
        program = whole_graph_program(compiled)
        if program is not None:
            return program
        if isinstance(compiled, _LazyGraphModule):
            # generate the code now: a lazy module's forward would re-enter nn.Module.__call__ on every call
            compiled.real_recompile()
        return compiled.forward

    try:
        with functorch_levels_restored():
            return compile_dynamo_graph(gm, example_inputs, engine, opts, compile_graph)
    except TorchBurnError:
        raise  # a strict fallback or a bad option: the user's to see, as raised
    except _DYNAMO_HANDLES:
        raise  # Dynamo turns these into a graph break or an eager frame itself
    except Exception as error:
        return _graph_runs_eagerly(gm, engine.name, opts.fallback, error)


# data-dependent values met while tracing, and Dynamo's own signals: Dynamo handles them
_DYNAMO_HANDLES: tuple[type[BaseException], ...] = (
    torch._dynamo.exc.TorchDynamoException,
    torch._subclasses.fake_tensor.DataDependentOutputException,
    torch._subclasses.fake_tensor.DynamicOutputShapeException,
    torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode,
)


def _graph_runs_eagerly(gm: torch.fx.GraphModule, engine: str, fallback: str, error: Exception) -> Callable[..., Any]:
    """Tracing to ATen failed (a decomposition PyTorch could not trace, say): the whole graph runs in
    eager, with a warning, or under ``fallback="error"`` the failure is raised as a FallbackError."""
    failure = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    if fallback == "error":
        raise FallbackError(engine, {"graph": f"tracing to ATen failed: {failure}"}, failure=failure) from error
    if fallback != "silent":
        warnings.warn(f"torchburn: tracing a graph to ATen failed ({failure}); it runs in PyTorch eager", stacklevel=2)
    return gm.forward
