"""The one vocabulary of op families, shared by every engine's lowering table, ``torchburn ops`` and the
docs: the same op is in the same family whichever engine runs it, and the files that lower, validate
and run a family carry its name in every engine (``lowering/norm.py``, ``instructions/norm.rs``,
``kernels/norm.rs``; ``shaders/norm.wgsl``)."""

from __future__ import annotations

from enum import Enum


class Family(str, Enum):
    ELEMENTWISE = "elementwise"  # arithmetic and math functions, fused into one sweep
    ACTIVATION = "activation"  # GELU, SiLU, hardswish and friends
    COMPARISON = "comparison"  # eq, lt, isnan, ... (bool results)
    CONVERSION = "conversion"  # dtype casts
    CONSTANT = "constant"  # full, zeros, arange and the *_like factories
    VIEW = "view"  # reshape, permute, slice, expand: no data moves
    COPY = "copy"  # clone, cat, stack, pad: data moves, values do not change
    INDEX = "index"  # gather, scatter, index, embedding
    REDUCE = "reduce"  # sum, mean, amax, argmax, var
    SOFTMAX = "softmax"
    SCAN = "scan"  # order-dependent passes along one dim: cumsum, cummax, logcumsumexp, sort, topk
    NORM = "norm"  # layer, group, batch and RMS norms
    MATMUL = "matmul"  # mm, bmm, addmm, baddbmm
    CONV = "conv"  # convolution
    POOL = "pool"  # max, average and adaptive pooling
    ATTENTION = "attention"  # fused scaled-dot-product attention

    def __str__(self) -> str:
        return self.value
