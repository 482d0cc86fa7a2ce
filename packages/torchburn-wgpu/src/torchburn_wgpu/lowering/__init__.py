"""What each supported ATen op becomes on the GPU: the engine's lowering table (``planner.TABLE``, a
:class:`torchburn.planning.LoweringTable`) filled by one module per family (``elementwise``, ``views``,
``index``, ``reduce``, ``softmax``, ``norm``, ``matmul``, ``conv``, ``pool``, ``attention``).

A lowering is ``fn(p, node, *args, **kwargs)``: the planner, the FX node and the op's arguments (tensors
as planner values, the rest as given); ``p.out_meta()`` is the node's output as a meta tensor. It
returns planner values (or lazy expressions) for the outputs.
"""

from __future__ import annotations

from typing import Any

import torch

from ..planner import TABLE
from ..values import INTEGER_DTYPES

aten = torch.ops.aten

OPS = TABLE.ops
lower = TABLE.lower

# a torch.fx.Node: typed loosely, since its args are a wide union no lowering benefits from
FxNode = Any

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
from . import attention, conv, elementwise, index, matmul, norm, pool, reduce, scan, softmax, views  # noqa: E402

__all__ = [
    "OPS",
    "TABLE",
    "attention",
    "conv",
    "elementwise",
    "index",
    "keep_whole",
    "matmul",
    "norm",
    "pool",
    "reduce",
    "scan",
    "softmax",
    "views",
]
