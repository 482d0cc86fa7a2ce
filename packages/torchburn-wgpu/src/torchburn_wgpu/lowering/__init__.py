"""What each supported ATen op becomes on the GPU: the registry core partitions by, and the lowerings,
one module per family (``elementwise``, ``views``, ``linalg``, ``reduction``, ``indexing``, ``pooling``).

A lowering gets the planner, the FX node, its arguments (tensors as planner values, the rest as given)
and the node's output as a meta tensor; it returns planner values (or lazy expressions) for the outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from torchburn.ops import OpRegistry

from ..values import INTEGER_DTYPES

aten = torch.ops.aten

OPS = OpRegistry("wgpu")
LOWERINGS: dict[Any, Callable[..., Any]] = {}

# a torch.fx.Node: typed loosely, since its args are a wide union no lowering benefits from
FxNode = Any
LoweringFn = TypeVar("LoweringFn", bound=Callable[..., Any])

F32 = frozenset({torch.float32})
# float16 is stored as f16 and computed in f32 (adapters with shader-f16): the generated elementwise
# kernels and the matmul handle it; float64 (shader-f64) runs in matmul and plain arithmetic
HALF = frozenset({torch.float16})
F32_HALF = F32 | HALF
FLOATS = frozenset({torch.float32, torch.float64, torch.float16})
BOOL = frozenset({torch.bool})
INTS = INTEGER_DTYPES
NUMERIC = F32 | INTS
ANY = F32 | INTS | BOOL
ALL = ANY | FLOATS


def lower(
    ops: Any | Iterable[Any],
    *,
    family: str,
    dtypes: frozenset[torch.dtype] = F32,
    check: Any = None,
    reads: Iterable[str] = (),
) -> Callable[[LoweringFn], LoweringFn]:
    """Registers ``fn(p, node, args, out)`` as the lowering of ``ops`` and enters them in the engine's
    op table. The table declines a node that sets an argument ``fn`` (or ``check``) never reads;
    ``reads`` names those honoured another way (through the output's shape, say)."""
    overloads = [ops] if isinstance(ops, torch._ops.OpOverload) else list(ops)

    def register(fn: LoweringFn) -> LoweringFn:
        OPS.add(overloads, family=family, dtypes=dtypes, check=check, lowering=fn, convention="list", reads=reads)
        for op in overloads:
            LOWERINGS[op] = fn
        return fn

    return register


def shape_of(meta: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in meta.shape)


def keep_whole() -> frozenset[Any]:
    """Ops the engine runs directly, so core must not decompose them."""
    return frozenset(
        {
            aten.gelu.default,
            aten.silu.default,
            aten.hardtanh.default,
            aten.hardswish.default,
            aten.hardsigmoid.default,
            aten.native_layer_norm.default,
            aten._native_batch_norm_legit_no_training.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default,
        }
    )


# the family modules register their ops on import
from . import attention, elementwise, indexing, linalg, pooling, reduction, views  # noqa: E402

__all__ = [
    "LOWERINGS",
    "OPS",
    "attention",
    "elementwise",
    "indexing",
    "keep_whole",
    "linalg",
    "pooling",
    "reduction",
    "views",
]
