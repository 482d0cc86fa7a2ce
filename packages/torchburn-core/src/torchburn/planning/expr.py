"""The compute-type rule of elementwise expressions, shared by every engine.

An elementwise chain is fused into one sweep that loads each operand, computes in one type and stores
the result. Which type: PyTorch's own rule, as its CPU kernels apply it. Half types (float16,
bfloat16) compute in float32 and are rounded when stored; float64 computes in float64; integers in the
engine's integer type; bool as bool where the engine has one. An engine maps these four compute types
to its own (the native engine computes integers and bools in i64, WGSL in i32 and bool).
"""

from __future__ import annotations

from typing import Literal

import torch

ComputeType = Literal["f64", "f32", "int", "bool"]

_HALF = frozenset({torch.float16, torch.bfloat16})


def compute_type(dtype: torch.dtype) -> ComputeType:
    """The type an expression producing or reading ``dtype`` computes in."""
    if dtype == torch.float64:
        return "f64"
    if dtype == torch.float32 or dtype in _HALF:
        return "f32"
    if dtype == torch.bool:
        return "bool"
    if dtype.is_floating_point or dtype.is_complex:
        raise ValueError(f"no elementwise compute type for {dtype}")
    return "int"


def promoted_compute_type(*dtypes: torch.dtype) -> ComputeType:
    """The compute type of an expression over operands of ``dtypes``: PyTorch's type promotion, then
    :func:`compute_type`."""
    result = dtypes[0]
    for dtype in dtypes[1:]:
        result = torch.promote_types(result, dtype)
    return compute_type(result)
