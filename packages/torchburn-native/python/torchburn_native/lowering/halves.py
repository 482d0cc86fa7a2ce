"""Half types (float16, bfloat16) compute in f32 and are narrowed back at the end, as PyTorch's CPU
kernels do.
"""

from __future__ import annotations

import torch

from ..planner import Planner
from ..values import Tensorish, Value


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def narrow(p: Planner, v: Value, dtype: torch.dtype) -> Tensorish:
    """Back to the node's dtype: a lazy conversion that fuses into whatever reads it."""
    if v.dtype == dtype:
        return v
    return p.converted(v, dtype)
