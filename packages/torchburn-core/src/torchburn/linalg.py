"""Small dense factorisations and solves (LU with partial pivoting, Cholesky, triangular substitution) as
unrolled elementwise and reduction steps, for engines without LAPACK-style kernels.

Each algorithm runs a fixed number of steps (the matrix order ``n``, known when tracing), and each step
updates the whole matrix through masks built from ``arange`` grids rather than slices, so the trace is
``n`` copies of a few fused elementwise sweeps, reductions and gathers. That suits the small matrices
these ops meet in models (covariances, small systems, batches of 3x3); past :data:`MAX_ORDER` the op
stays whole and falls back. Results follow LAPACK's conventions: ``getrf``'s pivot is the first largest
magnitude in the column, a zero pivot leaves its column unscaled and sets ``info``; pivots are 1-based
int32; ``potrf``'s ``info`` is the order of the first minor that is not positive definite; ``geqrf``'s
reflectors take ``beta = -sign(alpha) ||x||``, which fixes QR's signs.
Eigen- and singular-value decompositions (whose vectors are defined only up to sign) are not here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

# the largest matrix order unrolled here
MAX_ORDER = 32


def _grid(n: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column numbers of an n x n matrix, [n, 1] and [n]."""
    i = torch.arange(n, device=like.device)
    return i.unsqueeze(1), i


def _batch_shape(*shapes: torch.Size) -> torch.Size:
    """The broadcast of batch shapes (PyTorch's function, typed)."""
    shape: torch.Size = torch.broadcast_shapes(*shapes)  # type: ignore[no-untyped-call]
    return shape


def _small(a: torch.Tensor) -> bool:
    return a.dim() >= 2 and max(a.shape[-2:]) <= MAX_ORDER and a.is_floating_point()


def _small_square(a: torch.Tensor) -> bool:
    return _small(a) and a.shape[-1] == a.shape[-2]


# ---- LU ------------------------------------------------------------------------------------------------
def _lu(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed LU of ``a`` [.., m, n] with partial pivoting: (LU [.., m, n], pivots [.., min(m, n)] 1-based
    int32, perm [.., m] the row order of ``a`` that LU factors, info [..] int32)."""
    m, n = a.shape[-2:]
    rows = torch.arange(m, device=a.device)  # [m]
    cols = torch.arange(n, device=a.device)  # [n]
    batch = a.shape[:-2]
    perm = rows.expand(*batch, m)
    info = torch.zeros(batch, dtype=torch.int32, device=a.device)
    pivots = [torch.zeros((*batch, 0), dtype=torch.int64, device=a.device)]
    for k in range(min(m, n)):
        column = a[..., :, k]  # [.., m]
        magnitude = torch.where(rows >= k, column.abs(), torch.full_like(column, -1.0))
        p = magnitude.argmax(-1, keepdim=True)  # [.., 1]: the first largest
        pivots.append(p + 1)
        order = torch.where(rows == k, p, torch.where(rows == p, k, rows))  # [.., m]: rows k and p swapped
        a = a.gather(-2, order.unsqueeze(-1).expand(*batch, m, n))
        perm = perm.gather(-1, order)
        pivot = a[..., k, k].unsqueeze(-1)  # [.., 1]
        zero = pivot == 0
        info = torch.where((info == 0) & zero.squeeze(-1), k + 1, info)
        column = a[..., :, k]
        # a zero pivot leaves its (all-zero) column unscaled, as getrf does
        factor = torch.where((rows > k) & ~zero, column / pivot, column)
        factor = torch.where(rows > k, factor, torch.zeros_like(factor))  # [.., m]
        update = factor.unsqueeze(-1) * a[..., k, :].unsqueeze(-2)  # [.., m, n]
        a = torch.where(cols > k, a - update, a)
        a = torch.where((cols == k) & (rows > k).unsqueeze(1), factor.unsqueeze(-1), a)
    return a, torch.cat(pivots, -1).to(torch.int32), perm, info


def _unpack(lu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit lower L [.., m, k] and upper U [.., k, n] (k = min(m, n)) of packed ``lu`` [.., m, n]."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    rows, cols = torch.arange(m, device=lu.device).unsqueeze(1), torch.arange(n, device=lu.device)
    lower = torch.where(cols < rows, lu, (rows == cols).to(lu.dtype))[..., :, :k]
    upper = torch.where(cols >= rows, lu, torch.zeros_like(lu))[..., :k, :]
    return lower, upper


def _swaps_to_perm(pivots: torch.Tensor) -> torch.Tensor:
    """The row order [.., n] that the 1-based row swaps ``pivots`` [.., n] make of 0..n-1."""
    n = pivots.shape[-1]
    index = torch.arange(n, device=pivots.device)
    perm = index.expand(*pivots.shape)
    for k in range(n):
        p = pivots[..., k : k + 1].to(torch.int64) - 1  # [.., 1]
        order = torch.where(index == k, p, torch.where(index == p, k, index))
        perm = perm.gather(-1, order)
    return perm


def _permutation_matrix(perm: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """P with ``A = P (A[perm])``: P[r, c] = 1 where perm[c] = r."""
    n = perm.shape[-1]
    rows = torch.arange(n, device=perm.device).unsqueeze(1)
    return (perm.unsqueeze(-2) == rows).to(dtype)


# ---- triangular substitution -----------------------------------------------------------------------------
def _substitute(t: torch.Tensor, b: torch.Tensor, lower: bool, unit: bool) -> torch.Tensor:
    """X with ``t X = b`` for triangular ``t`` [.., n, n] and ``b`` [.., n, k] (batch dims broadcast)."""
    n = t.shape[-1]
    batch = _batch_shape(t.shape[:-2], b.shape[:-2])
    t = t.expand(*batch, n, n)
    b = b.expand(*batch, *b.shape[-2:])
    rows, _ = _grid(n, t)
    x = torch.zeros_like(b)
    for step in range(n):
        i = step if lower else n - 1 - step
        # unsolved rows of x are still zero, so the whole row of t can take part in the sum
        row = b[..., i, :] - (t[..., i, :].unsqueeze(-1) * x).sum(-2)  # [.., k]
        if not unit:
            row = row / t[..., i, i].unsqueeze(-1)
        x = torch.where(rows == i, row.unsqueeze(-2), x)
    return x


def _as_matrix(b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``b`` as a batch of matrices, and whether it was a batch of vectors (PyTorch's rule)."""
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    return (b.unsqueeze(-1), True) if vector else (b, False)


def _lu_solve_factored(lu: torch.Tensor, perm: torch.Tensor, b: torch.Tensor, adjoint: bool) -> torch.Tensor:
    """X with ``A X = b`` (or ``A^T X = b``) from A's row order ``perm`` and packed ``lu``."""
    n = lu.shape[-1]
    batch = _batch_shape(lu.shape[:-2], b.shape[:-2], perm.shape[:-1])
    lu, b = lu.expand(*batch, n, n), b.expand(*batch, *b.shape[-2:])
    perm = perm.expand(*batch, n)
    if not adjoint:  # A[perm] = L U
        permuted = b.gather(-2, perm.unsqueeze(-1).expand(*b.shape))
        return _substitute(lu, _substitute(lu, permuted, lower=True, unit=True), lower=False, unit=False)
    # A^T = U^T L^T P^T: solve U^T y = b, L^T z = y, then x[perm] = z
    lut = lu.transpose(-2, -1)
    z = _substitute(lut, _substitute(lut, b, lower=True, unit=False), lower=False, unit=True)
    inverse = torch.argsort(perm, -1)
    return z.gather(-2, inverse.unsqueeze(-1).expand(*z.shape))


# ---- the ops ------------------------------------------------------------------------------------------------
def _lu_factor_ex(a: torch.Tensor, pivot: bool = True, check_errors: bool = False) -> Any:
    if not pivot or check_errors or not _small(a):
        return NotImplemented
    lu, pivots, _, info = _lu(a)
    return lu, pivots, info


def _linalg_lu(a: torch.Tensor, pivot: bool = True) -> Any:
    if not pivot or not _small(a):
        return NotImplemented
    lu, _, perm, _ = _lu(a)
    return (_permutation_matrix(perm, a.dtype), *_unpack(lu))


def _lu_unpack(lu: torch.Tensor, pivots: torch.Tensor, unpack_data: bool = True, unpack_pivots: bool = True) -> Any:
    if not unpack_data or not unpack_pivots or not _small(lu):
        return NotImplemented
    m = lu.shape[-2]
    # the swaps act on m rows; pivots name min(m, n) of them
    swaps = torch.cat(
        [
            pivots,
            torch.arange(pivots.shape[-1] + 1, m + 1, device=lu.device)
            .to(pivots.dtype)
            .expand(*pivots.shape[:-1], m - pivots.shape[-1]),
        ],
        -1,
    )
    return (_permutation_matrix(_swaps_to_perm(swaps), lu.dtype), *_unpack(lu))


def _lu_solve(
    lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, *, left: bool = True, adjoint: bool = False
) -> Any:
    if not _small_square(lu) or lu.is_complex():
        return NotImplemented
    perm = _swaps_to_perm(pivots)
    if left:
        return _lu_solve_factored(lu, perm, b, adjoint)
    # X A = B  <=>  A^T X^T = B^T
    return _lu_solve_factored(lu, perm, b.transpose(-2, -1), not adjoint).transpose(-2, -1)


def _determinant(lu: torch.Tensor, pivots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The product of U's diagonal and the permutation's sign (-1 per actual swap)."""
    n = lu.shape[-1]
    diagonal = torch.diagonal(lu, 0, -2, -1)
    swaps = (pivots.to(torch.int64) - 1 != torch.arange(n, device=lu.device)).sum(-1)
    sign = 1 - 2 * (swaps % 2)
    return diagonal, sign.to(lu.dtype)


def _linalg_det(a: torch.Tensor) -> Any:
    if not _small_square(a):
        return NotImplemented
    lu, pivots, _, _ = _lu(a)
    diagonal, sign = _determinant(lu, pivots)
    return diagonal.prod(-1) * sign, lu, pivots


def _linalg_slogdet(a: torch.Tensor) -> Any:
    if not _small_square(a):
        return NotImplemented
    lu, pivots, _, _ = _lu(a)
    diagonal, sign = _determinant(lu, pivots)
    sign = sign * torch.sign(diagonal).prod(-1)
    return sign, diagonal.abs().log().sum(-1), lu, pivots


def _linalg_solve_ex(a: torch.Tensor, b: torch.Tensor, *, left: bool = True, check_errors: bool = False) -> Any:
    if check_errors or not _small_square(a) or b.is_complex():
        return NotImplemented
    lu, pivots, perm, info = _lu(a)
    rhs, vector = _as_matrix(b, a)
    if left:
        x = _lu_solve_factored(lu, perm, rhs, adjoint=False)
    else:  # X A = B  <=>  A^T X^T = B^T
        x = _lu_solve_factored(lu, perm, rhs.transpose(-2, -1), adjoint=True).transpose(-2, -1)
    return (x.squeeze(-1) if vector else x), lu, pivots, info


def _linalg_inv_ex(a: torch.Tensor, *, check_errors: bool = False) -> Any:
    if check_errors or not _small_square(a):
        return NotImplemented
    lu, _, perm, info = _lu(a)
    n = a.shape[-1]
    rows, cols = _grid(n, a)
    eye = (rows == cols).to(a.dtype).expand(*a.shape)
    return _lu_solve_factored(lu, perm, eye, adjoint=False), info


def _linalg_solve_triangular(
    a: torch.Tensor, b: torch.Tensor, *, upper: bool, left: bool = True, unitriangular: bool = False
) -> Any:
    if not _small_square(a) or b.is_complex():
        return NotImplemented
    if left:
        return _substitute(a, b, lower=not upper, unit=unitriangular)
    at = a.transpose(-2, -1)  # X A = B  <=>  A^T X^T = B^T, and A^T is triangular the other way
    return _substitute(at, b.transpose(-2, -1), lower=upper, unit=unitriangular).transpose(-2, -1)


def _triangular_solve(
    b: torch.Tensor, a: torch.Tensor, upper: bool = True, transpose: bool = False, unitriangular: bool = False
) -> Any:
    if not _small_square(a) or b.is_complex():
        return NotImplemented
    t, lower = (a.transpose(-2, -1), upper) if transpose else (a, not upper)
    return _substitute(t, b, lower=lower, unit=unitriangular), a.clone()


# ---- Cholesky --------------------------------------------------------------------------------------------
def _cholesky(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Lower L with ``A = L L^T`` from A's lower triangle, column by column, and potrf's info."""
    n = a.shape[-1]
    rows, cols = _grid(n, a)
    low = torch.zeros_like(a)
    info = torch.zeros(a.shape[:-2], dtype=torch.int32, device=a.device)
    for j in range(n):
        # s[i] = A[i, j] - sum_k L[i, k] L[j, k]; columns >= j of L are still zero
        s = a[..., :, j] - (low * low[..., j : j + 1, :]).sum(-1)  # [.., n]
        head = s[..., j : j + 1]  # [.., 1]
        failed = ~(head > 0)
        info = torch.where((info == 0) & failed.squeeze(-1), j + 1, info)
        root = head.sqrt()
        column = torch.where(rows.squeeze(1) == j, root, s / root)
        column = torch.where(rows.squeeze(1) >= j, column, torch.zeros_like(column))
        low = torch.where(cols == j, column.unsqueeze(-1), low)
    return low, info


def _linalg_cholesky_ex(a: torch.Tensor, *, upper: bool = False, check_errors: bool = False) -> Any:
    if check_errors or not _small_square(a):
        return NotImplemented
    low, info = _cholesky(a)
    return (low.transpose(-2, -1) if upper else low), info


def _cholesky_solve(b: torch.Tensor, factor: torch.Tensor, upper: bool = False) -> Any:
    if not _small_square(factor) or b.is_complex():
        return NotImplemented
    low = factor.transpose(-2, -1) if upper else factor
    y = _substitute(low, b, lower=True, unit=False)
    return _substitute(low.transpose(-2, -1), y, lower=False, unit=False)


def _cholesky_inverse(factor: torch.Tensor, upper: bool = False) -> Any:
    if not _small_square(factor):
        return NotImplemented
    n = factor.shape[-1]
    rows, cols = _grid(n, factor)
    eye = (rows == cols).to(factor.dtype).expand(*factor.shape)
    return _cholesky_solve(eye, factor, upper)


# ---- QR (Householder) ----------------------------------------------------------------------------------
def _geqrf(a: torch.Tensor) -> Any:
    """LAPACK's ``geqrf``: R on and above the diagonal, each reflector's vector below it (its leading 1
    implied) and the reflectors' ``tau``. Reflector k maps column k's part from row k on to
    ``beta e_1`` with ``beta = -sign(alpha) ||x||`` (``larfg``); a column already zero below the
    diagonal gets ``tau = 0``."""
    if not _small(a):
        return NotImplemented
    m, n = a.shape[-2:]
    rows = torch.arange(m, device=a.device)  # [m]
    cols = torch.arange(n, device=a.device)  # [n]
    taus = [torch.zeros((*a.shape[:-2], 0), dtype=a.dtype, device=a.device)]
    for k in range(min(m, n)):
        column = a[..., :, k]  # [.., m]
        alpha = column[..., k : k + 1]  # [.., 1]
        below = torch.where(rows > k, column, torch.zeros_like(column))
        rest = (below * below).sum(-1, keepdim=True).sqrt()  # [.., 1]
        reflect = rest != 0
        beta = -torch.copysign(torch.hypot(alpha, rest), alpha)
        tau = torch.where(reflect, (beta - alpha) / beta, torch.zeros_like(alpha))
        scaled = torch.where(reflect, below / (alpha - beta), below)
        v = torch.where(rows == k, torch.ones_like(column), scaled)  # [.., m], zero above row k
        # H = I - tau v v^T on the columns right of k
        w = (v.unsqueeze(-1) * a).sum(-2)  # [.., n]
        a = torch.where(cols > k, a - tau.unsqueeze(-1) * v.unsqueeze(-1) * w.unsqueeze(-2), a)
        stored = torch.where(rows == k, torch.where(reflect, beta, alpha), scaled)
        a = torch.where((cols == k) & (rows >= k).unsqueeze(1), stored.unsqueeze(-1), a)
        taus.append(tau)
    return a, torch.cat(taus, -1)


def _reflector(packed: torch.Tensor, k: int) -> torch.Tensor:
    """Householder vector k [.., m] of ``geqrf``'s packed output: 0 above row k, 1 at it, stored below."""
    m = packed.shape[-2]
    rows = torch.arange(m, device=packed.device)
    column = packed[..., :, k]
    return torch.where(rows > k, column, (rows == k).to(packed.dtype))


def _apply_reflectors(packed: torch.Tensor, tau: torch.Tensor, c: torch.Tensor, ascending: bool) -> torch.Tensor:
    """``H_i c`` for i = 0..k-1 in the order asked (each H = I - tau v v^T), from the left."""
    count = tau.shape[-1]
    for k in range(count) if ascending else reversed(range(count)):
        v = _reflector(packed, k)  # [.., m]
        t = tau[..., k : k + 1].unsqueeze(-1)  # [.., 1, 1]
        c = c - t * v.unsqueeze(-1) * (v.unsqueeze(-1) * c).sum(-2, keepdim=True)
    return c


def _householder_product(packed: torch.Tensor, tau: torch.Tensor) -> Any:
    """``orgqr``: the first n columns of H_0 H_1 ... H_{k-1}."""
    if not _small(packed) or tau.shape[-1] > packed.shape[-1]:
        return NotImplemented
    m, n = packed.shape[-2:]
    eye = (torch.arange(m, device=packed.device).unsqueeze(1) == torch.arange(n, device=packed.device)).to(packed.dtype)
    return _apply_reflectors(packed, tau, eye.expand(*packed.shape[:-2], m, n), ascending=False)


def _ormqr(packed: torch.Tensor, tau: torch.Tensor, c: torch.Tensor, left: bool = True, transpose: bool = False) -> Any:
    """``Q c``, ``Q^T c``, ``c Q`` or ``c Q^T`` for Q = H_0 ... H_{k-1} given by its reflectors."""
    if not _small(packed) or packed.is_complex():
        return NotImplemented
    if left:
        return _apply_reflectors(packed, tau, c, ascending=transpose)
    # c Q = (Q^T c^T)^T, c Q^T = (Q c^T)^T
    return _apply_reflectors(packed, tau, c.transpose(-2, -1), ascending=not transpose).transpose(-2, -1)


def _linalg_qr(a: torch.Tensor, mode: str = "reduced") -> Any:
    if mode not in ("reduced", "complete", "r") or not _small(a):
        return NotImplemented
    m, n = a.shape[-2:]
    packed, tau = _geqrf(a)
    k = min(m, n)
    columns = m if mode == "complete" else k
    rows = torch.arange(m, device=a.device).unsqueeze(1)
    r = torch.where(torch.arange(n, device=a.device) >= rows, packed, torch.zeros_like(packed))[..., :columns, :]
    if mode == "r":
        return a.new_zeros(0), r  # PyTorch's empty Q
    eye = (rows == torch.arange(columns, device=a.device)).to(a.dtype).expand(*a.shape[:-2], m, columns)
    return _apply_reflectors(packed, tau, eye, ascending=False), r


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.geqrf.default: _geqrf,
    aten.linalg_householder_product.default: _householder_product,
    aten.ormqr.default: _ormqr,
    aten.linalg_qr.default: _linalg_qr,
    aten.linalg_lu_factor_ex.default: _lu_factor_ex,
    aten.linalg_lu.default: _linalg_lu,
    aten.lu_unpack.default: _lu_unpack,
    aten.linalg_lu_solve.default: _lu_solve,
    aten._linalg_det.default: _linalg_det,
    aten._linalg_slogdet.default: _linalg_slogdet,
    aten._linalg_solve_ex.default: _linalg_solve_ex,
    aten.linalg_inv_ex.default: _linalg_inv_ex,
    aten.linalg_solve_triangular.default: _linalg_solve_triangular,
    aten.triangular_solve.default: _triangular_solve,
    aten.linalg_cholesky_ex.default: _linalg_cholesky_ex,
    aten.cholesky_solve.default: _cholesky_solve,
    aten.cholesky_inverse.default: _cholesky_inverse,
}
