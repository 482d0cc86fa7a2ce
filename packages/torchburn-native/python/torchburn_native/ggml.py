"""Matrices in GGUF's tensor types, computed in as stored (the native engine's API for LLM runtimes).

A :class:`GgmlMatrix` reads its weights in place from a uint8 tensor the caller lends (typically a view
of a memory-mapped ``.gguf`` file): nothing is dequantized or copied up front. Its products quantize
each activation row the way llama.cpp pairs it with the weight type (int8 per block of 32 for
``Q8_0``/``Q4_0``/``Q4_1``/``Q5_0``/``Q5_1``/``IQ4_NL``, int8 per block of 256 for the K-quants and
``IQ4_XS``, f32 for the float types) and dequantize the weights in registers (``Q2_K`` and ``Q3_K``
through the portable block decoder on every CPU: correct and read as stored, but without vector kernels
yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import torch

from ._native import GgmlMatrix

GgmlType = Literal[
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
    "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS",
]  # fmt: skip
TYPES: tuple[str, ...] = get_args(GgmlType)

__all__ = ["TYPES", "GgmlMatrix", "GgmlType", "dequantize", "lend", "matmul", "row_bytes"]


def row_bytes(kind: str, k: int) -> int:
    """Bytes of a row of ``k`` elements of ``kind`` (``k`` whole blocks)."""
    elements, nbytes = GgmlMatrix.block_size(kind)
    if k % elements:
        raise ValueError(f"{kind} rows are whole blocks of {elements} elements; a row of {k} is not")
    return k // elements * nbytes


def lend(
    kind: str,
    data: torch.Tensor,
    n: int,
    k: int,
    order: Sequence[int] | None = None,
    *,
    file_mapped: bool = False,
) -> GgmlMatrix:
    """The matrix [n, k] of type ``kind`` whose rows are the bytes of ``data`` (a contiguous uint8 CPU
    tensor, held by the matrix and read in place: it must not change while the matrix lives); with
    ``order`` (a permutation of ``range(n)``), row r is stored row ``order[r]``.

    Where the CPU's kernels take the type regrouped (``GgmlMatrix.regrouped``), the matrix copies the
    bytes into that layout instead. ``file_mapped=True`` says ``data`` is a view of a read-only file
    mapping (``mmap``): its pages are then handed back once copied, so that the model holds its weights
    once. Never pass it for memory of one's own: the pages handed back would read as zeros."""
    from .transformer import ensure_threads

    if data.dtype != torch.uint8 or data.device.type != "cpu" or not data.is_contiguous():
        raise ValueError(
            f"GGUF weights are lent as a contiguous uint8 CPU tensor, got {data.dtype} on {data.device}"
            + ("" if data.is_contiguous() else ", not contiguous")
        )
    ensure_threads()
    rows = None if order is None else [int(r) for r in order]
    return GgmlMatrix.lend(kind, data.data_ptr(), data.numel(), n, k, data, rows, file_mapped)


def dequantize(m: GgmlMatrix, rows: slice | None = None) -> torch.Tensor:
    """Rows ``rows`` (all by default) of ``m`` as f32: [rows, k]."""
    n, k = m.shape
    start, stop, step = (rows or slice(None)).indices(n)
    if step != 1:
        raise ValueError("dequantize takes a contiguous range of rows")
    count = max(0, stop - start)
    out = torch.empty(count, k, dtype=torch.float32)
    if count:
        m.dequantize_into(start, count, out.data_ptr())
    return out


def matmul(m: GgmlMatrix, x: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` in f32 for ``x`` [..., k]."""
    n, k = m.shape
    if x.device.type != "cpu" or x.dim() == 0 or x.shape[-1] != k:
        raise ValueError(f"matmul with a {n}x{k} matrix takes CPU inputs [..., {k}], got {tuple(x.shape)}")
    x = x.float().contiguous()
    tokens = x.numel() // k
    out = torch.empty(*x.shape[:-1], n, dtype=torch.float32)
    if tokens:
        m.matmul_into(x.data_ptr(), tokens, out.data_ptr())
    return out
