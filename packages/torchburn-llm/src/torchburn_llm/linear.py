"""The model's matrix products: fp32 through torch, or bf16 / int8 / int4 weights through the native
engine's kernels (bf16 against f32 activations; int8 / int4 with activations quantized per block of
32 and integer dot products)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

QUANTS = ("fp32", "bf16", "int8", "int4")
# formats a Linear accepts: the user-facing ones, plus int8 in blocks of 32 (the output projection's)
FORMATS = (*QUANTS, "int8-blocks")


def kept_address(t: torch.Tensor | None, keep: list[torch.Tensor]) -> int:
    """The address of ``t`` as contiguous f32 (0 for None), for native code that holds it; the tensor
    behind the address joins ``keep``, which must outlive that code's use of it."""
    if t is None:
        return 0
    t = t.detach().float().contiguous()
    keep.append(t)
    return int(t.data_ptr())


class Linear:
    """``y = x @ W.T + b`` for ``x`` [..., K], ``W`` [N, K]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, quant: str = "fp32") -> None:
        if quant not in FORMATS:
            raise ValueError(f"quant={quant!r} is not one of {', '.join(FORMATS)}")
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.quant = quant
        self.weight: torch.Tensor | None = None
        self.packed: Any = None
        if quant == "fp32":
            self.weight = weight
        else:
            from torchburn_native import _native
            from torchburn_native.engine import ensure_threads

            # the kernels run on PyTorch's OpenMP team (or a pool of the same size): two spinning
            # pools on the same cores would slow both
            ensure_threads()
            w = weight.float().contiguous()
            self.packed = _native.QMatrix.quantize(w.data_ptr(), self.out_features, self.in_features, quant)

    @classmethod
    def from_packed(cls, packed: Any, bias: torch.Tensor | None) -> Linear:
        """A projection over weights already quantized natively (a ``_native.QMatrix``)."""
        lin = cls.__new__(cls)
        lin.out_features, lin.in_features = packed.shape
        lin.bias, lin.quant, lin.weight, lin.packed = bias, packed.kind, None, packed
        return lin

    @property
    def nbytes(self) -> int:
        if self.packed is not None:
            return int(self.packed.nbytes)
        assert self.weight is not None
        return self.weight.numel() * self.weight.element_size()

    def native_projection(self, keep: list[torch.Tensor]) -> tuple[Any, int]:
        """This projection as the native decoder takes it; tensors it refers to by address join ``keep``."""

        bias = kept_address(self.bias, keep)
        if self.packed is not None:
            return self.packed, bias
        assert self.weight is not None
        return (kept_address(self.weight, keep), self.out_features, self.in_features), bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            assert self.weight is not None
            return F.linear(x, self.weight, self.bias)
        return project_many([self], x)[0]


def project_many(linears: list[Linear], x: torch.Tensor) -> list[torch.Tensor]:
    """``[lin(x) for lin in linears]``; quantized projections of one input (q, k and v; gate and up) go
    to the native engine in one call that reads the tokens once for all of them."""
    packed = [lin.packed for lin in linears]
    if any(p is None for p in packed):
        return [lin(x) for lin in linears]
    from torchburn_native import _native

    x = x.float().contiguous()
    rows = x.numel() // linears[0].in_features
    outs = [torch.empty(*x.shape[:-1], lin.out_features) for lin in linears]
    _native.matmul_many(packed, x.data_ptr(), rows, [o.data_ptr() for o in outs])
    return [o if lin.bias is None else o + lin.bias for lin, o in zip(linears, outs, strict=True)]
