"""Matrix products (mm, bmm, addmm, baddbmm, and _grouped_mm for mixtures of experts): the GEMM-backed ops.

Operands go to the kernel as strided views, so ``x @ w.t()`` reads ``w`` in place. A bias is folded
into the GEMM (it seeds the output, which the GEMM accumulates into) and a following activation is
applied as an epilogue (see ``elementwise._fuse_epilogue``).
"""

from __future__ import annotations

from typing import Any

import torch

from torchburn.planning import Family

from ..planner import Planner, broadcast_strides
from ..values import Tensorish, Value
from . import lower
from .conv import conv_epilogue

aten = torch.ops.aten


MATMUL_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16}


def _gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    # half types are widened to f32 for the product (as PyTorch's CPU kernels accumulate in f32)
    return torch.float64 if dtype == torch.float64 else torch.float32


def _operand3(v: Value) -> dict[str, Any]:
    if v.rank == 2:
        return v.operand((1, *v.shape), (0, *v.strides))
    return v.operand()


def _as_gemm_input(p: Planner, x: Tensorish, dtype: torch.dtype) -> Value:
    v = p.value(x)
    if v.dtype != dtype:
        v = p.contiguous(v, dtype)
    return v


# below this many elements repacking a column-major operand each call costs less than keeping a copy
ROW_MAJOR_COPY_MIN = 1 << 14


# kernels/gemm.rs's PARALLEL_MIN_FLOPS: smaller products run on one thread
PARALLEL_MIN_FLOPS = 96 * 96 * 96


# from here an f32 product whose B is a region input reads B packed by MKL once per version of B and
# runs on MKL's own threads, its bias, residual and activation in passes over blocks of C's rows
# (kernels/gemm_packed.rs). Bench rows on 2 threads, this threshold against 2^28: Linear+ReLU
# 128x512 -> 1024 (2^26) 1.02-1.04x -> 1.09-1.11x eager; packing everything took mm 256³ (2^24) from
# 1.01-1.02x to 0.94x, and the MLP at batch 32 (2^23, 2^24) did not move
PACKED_B_MIN_FLOPS = 1 << 26


def _weight_layout(p: Planner, v: Value, rows: int) -> tuple[Value, int]:
    """A column-major 2-D region input (``x @ w.t()``, as Linear does) read from a cached copy, and the
    copy's panel width (0: plain row-major). The ``gemm`` crate would otherwise gather it element by
    element into its packed layout on every call. MKL reads it transposed, but packs a contiguous
    row-major block some 10% faster (128x512 @ 512x512 on one thread: 430 -> 380 µs); when the GEMM
    splits its columns between threads, the copy is laid out in one such block per thread.
    """
    if not (
        v.buffer.kind == "in"
        and v.rank == 2
        and v.strides[0] == 1
        and v.strides[1] == v.shape[0]
        and v.shape[1] > 1
        and v.numel >= ROW_MAJOR_COPY_MIN
    ):
        return v, 0
    k, n = v.shape
    threads = p.context.threads
    # as kernels/gemm.rs splits: columns when they outnumber the rows and the product is worth threads
    splits_columns = threads > 1 and n > rows and rows * n * k >= PARALLEL_MIN_FLOPS
    if p.context.blas == "mkl" and v.dtype in (torch.float32, torch.float64) and splits_columns:
        panel = -(-n // threads)
        panel = -(-panel // 16) * 16
        if panel < n:
            return p.row_major_copy(v, panel), panel
    return p.row_major_copy(v), 0


def fuse_residual(p: Planner, x: Value, r: Value) -> bool:
    """Folds ``x + r`` into the matmul or convolution that just produced ``x``: a matmul's output
    blocks start from ``r`` (plus any bias) and the product accumulates onto them; a convolution adds
    ``r`` in its epilogue. Either way the sum costs no pass over memory of its own. ``x`` must be the
    whole output of that product, read nowhere else; ``r`` a dense tensor of the same shape and
    dtype that exists before the product runs. True if folded."""
    producer = p.producer.get(id(x.buffer))
    if producer is None or r.buffer is x.buffer or r.shape != x.shape or r.dtype != x.dtype:
        return False
    made = p.producer.get(id(r.buffer))
    if made is not None and made >= producer:
        return False  # computed after the product
    instr = p.instrs[producer]
    if instr["kind"] == "conv2d":
        found = conv_epilogue(p, x)
        if found is None or not r.is_contiguous or found[0]["residual"] is not None or found[0]["relu"]:
            return False
        found[0]["residual"] = r.operand()
        r.buffer.touch(producer)
        return True
    if instr["kind"] != "matmul" or instr.get("residual") is not None or instr.get("act") is not None:
        return False
    out = instr["out"]
    whole = Value(x.buffer, x.dtype, tuple(out["shape"]), tuple(out["strides"]), out["offset"])
    if (
        out["buf"] is not x.buffer
        or whole.offset != 0
        or x.offset != 0
        or not (whole.is_contiguous and x.is_contiguous and r.is_contiguous)
        or x.numel != whole.numel
    ):
        return False
    # r laid out as the matmul's output: both are dense, element for element
    instr["residual"] = r.operand(whole.shape, whole.strides)
    r.buffer.touch(producer)
    return True


def _packed_b(p: Planner, b: Value, rows: int, alpha: float) -> dict[str, Any] | None:
    """The operand of a copy of ``b`` packed by MKL once per version of ``b``, where the product
    (``rows`` rows of A, one batch) can read one: f32, alpha 1, ``b`` a 2-D region input as it lies,
    in a layout CBLAS reads, and the product at least ``PACKED_B_MIN_FLOPS``; else None
    (``kernels/gemm_packed.rs``)."""
    from .. import _native

    if (
        alpha != 1.0
        or b.dtype != torch.float32
        or b.rank != 2
        or b.buffer.kind != "in"
        or b.buffer.index >= len(p.in_bytes) - len(p.derived)  # a derived copy is no region input
    ):
        return None
    k, n = b.shape
    if rows * n * k < PACKED_B_MIN_FLOPS:
        return None
    nbytes = _native.packed_b_bytes(rows, n, k, *b.strides)  # 0 for a layout CBLAS cannot read
    return p.packed_copy(b, rows, nbytes) if nbytes else None


def matmul(
    p: Planner,
    a: Tensorish,
    b: Tensorish,
    bias: Tensorish | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
) -> Tensorish:
    meta = p.out_meta()
    out_dtype: torch.dtype = meta.dtype
    dtype = _gemm_dtype(out_dtype)
    av = _as_gemm_input(p, a, dtype)
    bv = _as_gemm_input(p, b, dtype)
    rows = av.shape[-2]
    packed = _packed_b(p, bv, rows, alpha) if av.rank == 2 else None
    b_panel = 0
    if packed is None:
        bv, b_panel = _weight_layout(p, bv, rows)
    out = p.new_value(tuple(meta.shape), dtype)
    instr: dict[str, Any] = {
        "kind": "matmul",
        "a": _operand3(av),
        "b": _operand3(bv),
        "out": _operand3(out),
        "bias": None,
        "residual": None,
        "alpha": float(alpha),
        "beta": float(beta),
        "act": None,
        "b_panel": b_panel,
        "b_packed": packed,
    }
    reads = [av, bv]
    if bias is not None and beta != 0:
        biasv = _as_gemm_input(p, bias, dtype)
        strides = broadcast_strides(biasv, out.shape)
        instr["bias"] = (
            biasv.operand(out.shape, strides) if out.rank == 3 else biasv.operand((1, *out.shape), (0, *strides))
        )
        reads.append(biasv)
    p.emit(instr, reads, [out])
    if out_dtype != dtype:
        return p.converted(out, out_dtype)
    return out


@lower(aten.mm.default, aten.bmm.default, family=Family.MATMUL, dtypes=MATMUL_DTYPES)
def mm(p: Planner, node: Any, a: Tensorish, b: Tensorish) -> Tensorish:
    return matmul(p, a, b)


@lower(aten.addmm.default, aten.baddbmm.default, family=Family.MATMUL, dtypes=MATMUL_DTYPES)
def addmm(
    p: Planner, node: Any, bias: Tensorish, a: Tensorish, b: Tensorish, beta: float = 1, alpha: float = 1
) -> Tensorish:
    return matmul(p, a, b, bias, alpha, beta)


def _grouped_rows(node: Any) -> bool | str:
    """``_grouped_mm``'s mixture-of-experts form only: rows [S, K] in groups by offsets, one [K, N]
    matrix of [G, K, N] per group, floats."""
    a, b = (x.meta["val"] for x in node.args[:2])
    offs = node.args[2] if len(node.args) > 2 else node.kwargs.get("offs")
    if offs is None or a.dim() != 2 or b.dim() != 3:
        return "grouped_mm: only [S, K] rows grouped by offsets over [G, K, N] matrices"
    if a.dtype not in MATMUL_DTYPES or b.dtype != a.dtype or offs.meta["val"].dtype not in (torch.int32, torch.int64):
        return "grouped_mm: float operands of one dtype and integer offsets"
    return True


@lower(aten._grouped_mm.default, family=Family.MATMUL, check=_grouped_rows)
def grouped_mm(p: Planner, node: Any, a: Tensorish, b: Tensorish, offs: Tensorish) -> Tensorish:
    """Each group of rows of ``a`` (rows ``offs[g-1]:offs[g]``) by its matrix ``b[g]``: a mixture of
    experts over its tokens sorted by expert. Rows past the last offset come out zero."""
    meta = p.out_meta()
    out_dtype: torch.dtype = meta.dtype
    dtype = _gemm_dtype(out_dtype)
    av = _as_gemm_input(p, a, dtype)  # [S, K]
    bv = _as_gemm_input(p, b, dtype)  # [G, K, N]
    ov = p.value(offs)  # [G]
    out = p.new_value(tuple(meta.shape), dtype)  # [S, N]
    p.emit(
        {"kind": "grouped_mm", "a": av.operand(), "b": bv.operand(), "offs": ov.operand(), "out": out.operand()},
        [av, bv, ov],
        [out],
    )
    if out_dtype != dtype:
        return p.converted(out, out_dtype)
    return out
