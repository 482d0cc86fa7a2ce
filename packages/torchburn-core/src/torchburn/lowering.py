"""Lowering a Dynamo graph to ATen: AOTAutograd with the core-ATen decomposition table.

The table is the one ``torch.export`` uses, minus the ops the engine asks to keep whole (so an engine
with a fused attention kernel sees ``_scaled_dot_product_flash_attention_for_cpu`` instead of its
decomposition), plus any decompositions the engine adds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import core_aten_decompositions
from torch._functorch.aot_autograd import aot_module_simplified

from .engines.base import Engine


@functools.cache
def _core_table() -> dict[Any, Callable[..., Any]]:
    return dict(core_aten_decompositions())


def decomposition_table(engine: Engine) -> dict[Any, Callable[..., Any]]:
    keep = engine.keep_whole()
    table = {op: fn for op, fn in _core_table().items() if op not in keep}
    table.update(engine.extra_decompositions())
    return table


def lower(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    engine: Engine,
    compile_graph: Callable[[torch.fx.GraphModule, list[Any], str], Callable[..., Any]],
) -> Callable[..., Any]:
    """Run AOTAutograd; ``compile_graph(aten_gm, inputs, phase)`` compiles the forward and backward graphs."""
    return aot_module_simplified(
        gm,
        example_inputs,
        fw_compiler=functools.partial(_compile_phase, compile_graph, "forward"),
        bw_compiler=functools.partial(_compile_phase, compile_graph, "backward"),
        inference_compiler=functools.partial(_compile_phase, compile_graph, "inference"),
        decompositions=decomposition_table(engine),
    )


def _compile_phase(
    compile_graph: Callable[[torch.fx.GraphModule, list[Any], str], Callable[..., Any]],
    phase: str,
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
) -> Callable[..., Any]:
    return compile_graph(gm, example_inputs, phase)
