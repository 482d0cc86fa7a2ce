"""The model's matrix products: fp32 through torch, bf16 / int8 / int4 weights through the native
engine's kernels (bf16 against f32 activations; int8 / int4 with activations quantized per block of
32 and integer dot products), or a GGUF file's weights in their stored types (``stored``), read in
place from the mapped file."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from torchburn_native.ggml import GgmlMatrix
    from torchburn_native.transformer import Projection, QMatrix, QuantKind

QUANTS = ("fp32", "bf16", "int8", "int4")
# a GGUF file's own tensor types, computed in as stored
STORED = "stored"
# formats a Linear accepts: the user-facing ones, plus int8 in blocks of 32 (the output projection's)
FORMATS = (*QUANTS, "int8-blocks")


class Linear:
    """``y = x @ W.T + b`` for ``x`` [..., K], ``W`` [N, K]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, quant: str = "fp32") -> None:
        if quant not in FORMATS:
            raise ValueError(f"quant={quant!r} is not one of {', '.join(FORMATS)}")
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.quant = quant
        self.weight: torch.Tensor | None = None
        self.packed: QMatrix | None = None
        self.stored: GgmlMatrix | None = None
        if quant == "fp32":
            self.weight = weight
        else:
            from torchburn_native.transformer import quantize

            self.packed = quantize(weight, cast("QuantKind", quant))

    @classmethod
    def from_packed(cls, packed: QMatrix, bias: torch.Tensor | None) -> Linear:
        """A projection over weights already quantized natively (a ``torchburn_native.transformer.QMatrix``)."""
        lin = cls.__new__(cls)
        lin.out_features, lin.in_features = packed.shape
        lin.bias, lin.quant, lin.weight, lin.packed, lin.stored = bias, packed.kind, None, packed, None
        return lin

    @classmethod
    def from_stored(cls, matrix: GgmlMatrix, bias: torch.Tensor | None) -> Linear:
        """A projection over a GGUF tensor in its stored type (a ``torchburn_native.ggml.GgmlMatrix``)."""
        lin = cls.__new__(cls)
        lin.out_features, lin.in_features = matrix.shape
        lin.bias, lin.quant, lin.weight, lin.packed, lin.stored = bias, matrix.kind, None, None, matrix
        return lin

    @property
    def nbytes(self) -> int:
        if self.stored is not None:
            return int(self.stored.nbytes)
        if self.packed is not None:
            return int(self.packed.nbytes)
        assert self.weight is not None
        return self.weight.numel() * self.weight.element_size()

    def projection(self) -> Projection:
        """This projection as the native decoder takes it."""
        from torchburn_native.transformer import Projection

        weight = next(w for w in (self.stored, self.packed, self.weight) if w is not None)
        return Projection(weight, self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.stored is not None:
            from torchburn_native.ggml import matmul

            out = matmul(self.stored, x)
            return out if self.bias is None else out + self.bias
        if self.packed is None:
            assert self.weight is not None
            return F.linear(x, self.weight, self.bias)
        return project_many([self], x)[0]


def project_many(linears: list[Linear], x: torch.Tensor) -> list[torch.Tensor]:
    """``[lin(x) for lin in linears]``; quantized projections of one input (q, k and v; gate and up) go
    to the native engine in one call that reads the tokens once for all of them."""
    packed = [lin.packed for lin in linears if lin.packed is not None]
    if len(packed) != len(linears):
        return [lin(x) for lin in linears]
    from torchburn_native.transformer import matmul_many

    outs = matmul_many(packed, x)
    return [o if lin.bias is None else o + lin.bias for lin, o in zip(linears, outs, strict=True)]
