"""The conformance cases: every engine must reproduce PyTorch eager on each of these.

A case builds a callable and its inputs from a seeded generator. Cases are small so the suite stays
fast on a 2-core machine; the model-level cases (MLP, CNN block, transformer layer) use real modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Builder = Callable[[torch.Generator], tuple[Callable[..., Any], tuple[Any, ...]]]


@dataclass(frozen=True)
class Case:
    name: str
    build: Builder
    rtol: float = 1e-4
    atol: float = 1e-5


def _r(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=dtype)


def _i(g: torch.Generator, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=g)


def _module(m: nn.Module) -> nn.Module:
    return m.eval()


CASES: list[Case] = []


def case(name: str, rtol: float = 1e-4, atol: float = 1e-5) -> Callable[[Builder], Builder]:
    def add(build: Builder) -> Builder:
        CASES.append(Case(name, build, rtol, atol))
        return build

    return add


# --- elementwise with broadcasting -------------------------------------------------------------
@case("add_broadcast")
def _(g: torch.Generator):  # type: ignore[no-untyped-def]
    return (lambda a, b: a + b * 2.0), (_r(g, 4, 1, 5), _r(g, 3, 5))


@case("arith_broadcast")
def _(g):  # type: ignore[no-untyped-def]
    return (lambda a, b: (a * b - a) / (b.abs() + 1.0) - 3.0), (_r(g, 2, 3, 4), _r(g, 4))


@case("where_clamp_pow")
def _(g):  # type: ignore[no-untyped-def]
    return (lambda a, b: torch.where(a > 0, a.clamp(-0.5, 0.5), b.pow(2)) + a.pow(3)), (_r(g, 6, 7), _r(g, 1, 7))


@case("unary_family")
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor) -> torch.Tensor:
        p = a.abs() + 0.1
        return (
            a.exp()
            + p.log()
            + a.tanh()
            + a.sigmoid()
            + p.sqrt()
            + p.rsqrt()
            + a.sin()
            + a.cos()
            + torch.erf(a)
            - a.neg()
        )

    return f, (_r(g, 33, 17),)


@case("activations")
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            F.relu(a),
            F.gelu(a),
            F.gelu(a, approximate="tanh"),
            F.silu(a),
            F.hardswish(a),
            F.leaky_relu(a, 0.1),
            F.elu(a),
            F.softplus(a),
            F.hardsigmoid(a),
        )

    return f, (_r(g, 8, 129),)


@case("comparisons_and_masks")
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = ((a > b) & (a < 1.0)) | ~(b == 0)
        return mask, a * mask + a.masked_fill(a < 0, -1.0)

    return f, (_r(g, 5, 9), _r(g, 5, 9))


@case("integer_arith")
def _(g):  # type: ignore[no-untyped-def]
    return (lambda a, b: (a * b + torch.div(a, 3, rounding_mode="floor")) % 5 - b), (_i(g, 100, 4, 6), _i(g, 100, 6))


@case("nan_inf_propagation")
def _(g):  # type: ignore[no-untyped-def]
    a = _r(g, 4, 4)
    a[0, 0], a[1, 1], a[2, 2] = float("nan"), float("inf"), float("-inf")
    return (lambda t: (t * 2 + 1, t.amax(-1), torch.relu(t))), (a,)


# --- reductions ----------------------------------------------------------------------------------
@case("reductions")
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            a.sum(1),
            a.mean(-1, keepdim=True),
            a.amax(0),
            a.amin((0, 2)),
            a.argmax(-1),
            a.var(1, correction=1),
            a.prod(-1),
            (a > 0).all(-1),
            (a > 2).any(),
            a.sum(),
            torch.var_mean(a, 1),
            a.max(1),
            a.min(-1, keepdim=True),
        )

    return f, (_r(g, 3, 5, 7),)


@case("integer_reductions")
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            a.sum(1),
            a.amax(0),
            a.amin((0, 2)),
            a.argmax(-1),
            a.argmin(1),
            (a % 3 + 1).prod(-1),
            (a > 4).sum(-1),
            b.argmax(0),  # int32, as tokenizers' attention masks come
            b.sum(),
        )

    return f, (_i(g, 9, 3, 5, 7) - 4, _i(g, 50000, 6, 4).to(torch.int32))


# --- scans -------------------------------------------------------------------------------------------
@case("scans", atol=1e-4)
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor, long: torch.Tensor, i: torch.Tensor) -> tuple[Any, ...]:
        return (
            torch.cumsum(a, 1),
            torch.cumprod(a * 0.5 + 1, -1),
            torch.cummax(a, 0),
            torch.cummin(a, 2),
            torch.logcumsumexp(a, 1),
            # lines long enough to be scanned in parallel chunks
            torch.cumsum(long, -1),
            torch.cummax(long, -1),
            torch.cummin(long, -1),
            torch.logcumsumexp(long, 1),
            torch.cumsum(i, 1),
            torch.cummax(i, 0),
            torch.cumsum(i > 0, -1),
            torch.cumsum(i, 0, dtype=torch.float32),
        )

    a = _r(g, 3, 5, 4).round(decimals=1)  # rounded: ties, which move cummax's index to the later one
    a.view(-1)[::9] = float("nan")
    long = _r(g, 2, 1000).round(decimals=1)
    long[1, 500] = float("nan")
    return f, (a, long, _i(g, 9, 4, 6) - 4)


@case("sorts")
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor, ties: torch.Tensor, i: torch.Tensor) -> tuple[Any, ...]:
        return (
            # distinct values: without stable=True the order of equal ones is eager's own choice
            torch.sort(a, -1),
            torch.sort(a, 0, descending=True),
            torch.topk(a, 3, -1),
            torch.topk(a, 2, 0, largest=False),
            # ties and NaNs: a stable order keeps them by position
            torch.sort(ties, dim=1, stable=True),
            torch.argsort(ties, dim=-1, descending=True, stable=True),
            torch.sort(i, dim=-1, stable=True),
        )

    ties = _r(g, 4, 37).round(decimals=1)
    ties.view(-1)[::11] = float("nan")
    return f, (_r(g, 4, 37), ties, _i(g, 5, 3, 40))


# --- matmul family -------------------------------------------------------------------------------
@case("matmul_family")
def _(g):  # type: ignore[no-untyped-def]
    def f(
        a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, w: torch.Tensor, bias: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return a @ b, torch.bmm(c, c.transpose(1, 2)), c @ b, F.linear(c, w, bias), F.linear(a, w)

    return f, (_r(g, 9, 16), _r(g, 16, 5), _r(g, 3, 4, 16), _r(g, 7, 16), _r(g, 7))


@case("grouped_mm_experts")
def _(g):  # type: ignore[no-untyped-def]
    # a mixture of experts' product as transformers computes it: token rows sorted by expert, a histogram
    # of the experts summed into int32 offsets (floats to int32), each expert's rows by its own matrix
    def f(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        experts = w.shape[0]
        counts = torch.histc(ids.float(), bins=experts, min=0, max=experts - 1)
        offs = counts.cumsum(0, dtype=torch.int32)
        return torch._grouped_mm(x[ids.argsort(stable=True)], w, offs), offs, (x.abs() * 3).cumsum(0, dtype=torch.int32)

    ids = torch.tensor([3, 0, 1, 3, 0, 3, 1, 0, 3, 3, 1])  # expert 2 gets no token
    return f, (_r(g, 11, 8), _r(g, 4, 8, 12), ids)


@case("matmul_f64")
def _(g):  # type: ignore[no-untyped-def]
    return (lambda a, b: torch.relu(a @ b)), (_r(g, 8, 12, dtype=torch.float64), _r(g, 12, 3, dtype=torch.float64))


@case("non_contiguous_inputs")
def _(g):  # type: ignore[no-untyped-def]
    a = _r(g, 12, 8).t()  # (8, 12) transposed view
    b = _r(g, 4, 12, 2)[:, :, 0]  # (4, 12) strided slice
    return (lambda x, y: (x @ y.t()) * 2 + x.sum(1, keepdim=True)), (a, b)


# --- softmax and norms ---------------------------------------------------------------------------
@case("softmax")
def _(g):  # type: ignore[no-untyped-def]
    return (lambda a: (a.softmax(-1), a.log_softmax(1), a.softmax(0))), (_r(g, 6, 10, 4) * 5,)


@case("softmax_nan_inf")
def _(g):  # type: ignore[no-untyped-def]
    # rows with a NaN, a +inf, a -inf, all -inf, and plain; short rows and rows of 3000 (held in
    # registers on the GPU, looped over otherwise)
    short, long = _r(g, 5, 7), _r(g, 5, 3000)
    for a in (short, long):
        a[0, 3] = float("nan")
        a[1, 2] = float("inf")
        a[2, 1] = float("-inf")
        a[3, :] = float("-inf")
    return (lambda a, b: (a.softmax(-1), a.log_softmax(-1), b.softmax(-1), b.log_softmax(-1))), (short, long)


@case("norms")
def _(g):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    ln, gn, bn, rms = nn.LayerNorm(12), nn.GroupNorm(2, 4), _module(nn.BatchNorm2d(4)), nn.RMSNorm(12)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        for m in (ln, gn, bn, rms):
            m.weight.uniform_(0.5, 1.5)

    def f(a: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return ln(a), rms(a), gn(img), bn(img)

    return f, (_r(g, 5, 12), _r(g, 2, 4, 3, 3))


# --- views and data movement ---------------------------------------------------------------------
@case("views")
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            a.view(6, 20) * 1,
            a.permute(2, 0, 1).reshape(-1, 6) + 0,
            a.transpose(0, 1).contiguous(),
            a[:, 1:4:2, ::3] * 2,
            a.unsqueeze(1).expand(6, 3, 4, 5) + 1,
            a.flatten(1) - 1,
            a.narrow(2, 1, 3) * 1,
        )

    return f, (_r(g, 2, 3, 4, 5).view(6, 4, 5),)


@case("as_strided")
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pooled = a.mean((2, 3), keepdim=True)  # [2, 8, 1, 1]
        return (
            # re-striding size-1 dims, as a channels-last adaptive pool does in ConvNeXt and Swin
            pooled.as_strided((2, 8, 1, 1), (8, 1, 8, 8)) * 2,
            # overlapping windows with a storage offset
            (b + 1).flatten().as_strided((4, 4), (2, 1), 1).sum(1),
            # of a transposed intermediate: its storage order is not its index order
            (b.t() * 2).as_strided((3, 4), (1, 3)) + 0,
        )

    return f, (_r(g, 2, 8, 3, 3), _r(g, 3, 4))


@case("flip_repeat")
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flipped = a.flip(0, 2), a.flip(-1) * 2
        return *flipped, a.repeat(2, 1, 3), a[0].repeat(2, 1, 1), torch.as_strided_copy(a, (3, 4), (1, 5))

    return f, (_r(g, 3, 4, 5),)


@case("cat_stack_pad")
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.cat([a, b], 0), torch.stack([a, a * 2], -1), F.pad(a, (1, 2, 0, 1), value=0.5)

    return f, (_r(g, 3, 4), _r(g, 5, 4))


# --- indexing ------------------------------------------------------------------------------------
@case("searchsorted")
def _(g):  # type: ignore[no-untyped-def]
    boundaries = torch.tensor([-1.0, 0.0, 0.0, 0.5, 2.0])  # a repeated boundary: left and right differ

    def f(x: torch.Tensor, rows: torch.Tensor, shuffled: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.bucketize(x, boundaries),
            torch.bucketize(x, boundaries, right=True, out_int32=True),
            torch.searchsorted(boundaries, x, side="right"),
            torch.searchsorted(rows, x[:3, :4]),  # one sorted row per row of values
            torch.searchsorted(shuffled, x[:3, :4], sorter=torch.argsort(shuffled, -1)),
        )

    x = _r(g, 4, 6).round(decimals=0)  # values equal to boundaries
    x[0, 0] = float("nan")  # after every boundary, as eager places it
    return f, (x, torch.sort(_r(g, 3, 7), -1).values, _r(g, 3, 7))


@case("nonzero_static")
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask = a > 0.3
        return (
            torch.nonzero_static(mask, size=4),  # fewer places than nonzeros: the first ones
            torch.nonzero_static(a * mask, size=40, fill_value=7),  # more: padded
            torch.nonzero_static(mask[0, 0], size=3),
        )

    return f, (_r(g, 2, 3, 4),)


@case("scatter_combine")
def _(g):  # type: ignore[no-untyped-def]
    idx = _i(g, 4, 6, 3)  # repeated positions: each reduction must see every value
    rows = torch.tensor([1, 3, 1, 0, 3])

    def f(a: torch.Tensor, src: torch.Tensor, ints: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            a.scatter_add(0, idx, src),
            a.scatter_reduce(0, idx, src, "sum"),
            a.scatter_reduce(0, idx, src, "prod"),
            a.scatter_reduce(0, idx, src, "amax"),
            a.scatter_reduce(0, idx, src, "amin"),
            ints.scatter_add(0, idx, ints[:1].expand(6, 3).contiguous()),
            torch.index_put(a, (rows,), src[:5], accumulate=True),
            a.index_add(0, rows, src[:5] * 0.5),
        )

    return f, (_r(g, 4, 3), _r(g, 6, 3), _i(g, 9, 4, 3))


@case("index_put")
def _(g):  # type: ignore[no-untyped-def]
    rows = torch.tensor([3, 0, -1])  # distinct positions: with repeats the value that stays is unspecified
    cols = torch.tensor([1, 4, 2])

    def f(a: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = a.clone()
        b[rows] = v[0]  # whole rows, the value broadcast
        c = a.clone()
        c[rows, cols] = v[:, 0]  # single elements
        d = a.clone()
        d[:, cols] = v[0, :3] * 2  # a later dim, the values broadcast over rows
        e = torch.index_put(a, (rows,), torch.tensor(-1.0))  # a 0-d value
        return b, c, d, e

    return f, (_r(g, 5, 6), _r(g, 3, 6))


@case("indexing")
def _(g):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    emb = nn.Embedding(20, 6)
    idx, tok = _i(g, 7, 5), _i(g, 20, 2, 3)
    gidx = _i(g, 4, 7, 4)

    def f(a: torch.Tensor, i: torch.Tensor, t: torch.Tensor, gi: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            a.index_select(0, i),
            a[i],
            torch.gather(a, 1, gi),
            emb(t),
            torch.zeros(7, 4).scatter(1, gi, a),
            a.masked_fill(a > 0.5, 0.0),
        )

    return f, (_r(g, 7, 4), idx, tok, gidx)


# --- convolution and pooling ---------------------------------------------------------------------
@case("conv")
def _(g):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    c1 = nn.Conv1d(3, 4, 3, padding=1)
    c2 = nn.Conv2d(4, 8, 3, stride=2, padding=1)
    dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
    ct = nn.ConvTranspose2d(8, 2, 2, stride=2)

    def f(seq: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = c2(img)
        return c1(seq), y, dw(y), ct(y)

    return f, (_r(g, 2, 3, 11), _r(g, 2, 4, 9, 9))


@case("pooling")
def _(g):  # type: ignore[no-untyped-def]
    def f(img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.max_pool2d(img, 2), F.max_pool2d(img, 3, 2, 1), F.avg_pool2d(img, 2), F.adaptive_avg_pool2d(img, 1)

    return f, (_r(g, 2, 3, 8, 8),)


@case("upsampling")
def _(g):  # type: ignore[no-untyped-def]
    def f(img: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            F.interpolate(img, scale_factor=2, mode="bilinear"),
            F.interpolate(img, scale_factor=1.7, mode="bilinear", align_corners=True),
            F.interpolate(img, size=(5, 13), mode="bilinear"),  # down in one axis, up in the other
            F.interpolate(img, scale_factor=(0.5, 3), mode="bilinear", recompute_scale_factor=True),
            F.interpolate(img, scale_factor=2, mode="nearest"),
            F.interpolate(img, size=(4, 11), mode="nearest"),
            F.interpolate(img, scale_factor=1.5, mode="nearest-exact"),
        )

    return f, (_r(g, 2, 3, 7, 6),)


# --- special functions ---------------------------------------------------------------------------
_POLYNOMIALS = [
    torch.special.chebyshev_polynomial_t,
    torch.special.chebyshev_polynomial_u,
    torch.special.chebyshev_polynomial_v,
    torch.special.chebyshev_polynomial_w,
    torch.special.shifted_chebyshev_polynomial_t,
    torch.special.shifted_chebyshev_polynomial_u,
    torch.special.shifted_chebyshev_polynomial_v,
    torch.special.shifted_chebyshev_polynomial_w,
    torch.special.hermite_polynomial_h,
    torch.special.hermite_polynomial_he,
    torch.special.laguerre_polynomial_l,
    torch.special.legendre_polynomial_p,
]


@case("orthogonal_polynomials", atol=1e-4)
def _(g):  # type: ignore[no-untyped-def]
    # every x against every degree: both ends and the middle of [-1, 1] (and of [0, 1], the shifted
    # kinds' interval), points outside it, degrees past the closed forms' switch, truncated, negative, NaN
    x = torch.cat([torch.tensor([-1.0, 0.0, 1.0, 0.5, -1.5, 1.75]), torch.rand(10, generator=g) * 2.4 - 1.2])
    n = torch.tensor([-1.0, 0.0, 1.0, 2.0, 3.7, 5.0, 7.0, 9.0, 12.0, float("nan")])

    def f(x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, ...]:
        xs, ns = x[:, None], n[None, :]  # [16, 10]
        return (*(p(xs, ns) for p in _POLYNOMIALS), torch.special.legendre_polynomial_p(x, 4))  # a scalar degree too

    return f, (x, n)


_BESSEL = [
    torch.special.i0,
    torch.special.i0e,
    torch.special.i1,
    torch.special.i1e,
    torch.special.modified_bessel_i0,
    torch.special.modified_bessel_i1,
    torch.special.modified_bessel_k0,
    torch.special.modified_bessel_k1,
    torch.special.scaled_modified_bessel_k0,
    torch.special.scaled_modified_bessel_k1,
    torch.special.bessel_j0,
    torch.special.bessel_j1,
    torch.special.bessel_y0,
    torch.special.bessel_y1,
    torch.special.spherical_bessel_j0,
    torch.special.airy_ai,
]


@case("bessel_functions", atol=1e-4)
def _(g):  # type: ignore[no-untyped-def]
    # both signs, both sides of every series switch (2, 5, 8, 25), zero, tiny and the infinities
    specials = torch.tensor([0.0, -0.0, 1e-20, 2.0, 5.0, 8.0, 25.0, float("inf"), -float("inf"), float("nan")])
    x = torch.cat([specials, torch.rand(40, generator=g) * 60 - 30])
    return (lambda x: tuple(f(x) for f in _BESSEL)), (x,)


@case("order_statistics")
def _(g):  # type: ignore[no-untyped-def]
    x = _r(g, 5, 9)
    x[1, 3] = float("nan")  # median: NaN and its index; nanmedian: the numbers' median
    x[2, :] = float("nan")  # nanmedian of a line of NaN
    x[3, 4:] = x[3, 0]  # ties keep their first position

    def f(x: torch.Tensor) -> tuple[Any, ...]:
        return (
            torch.median(x[3:]),
            torch.median(x, 1),
            torch.median(x, 0, keepdim=True),
            torch.nanmedian(x),
            torch.nanmedian(x[[0, 1, 3, 4]], 1),
            torch.nanmedian(x, 1).values,  # for a line of NaN the index is the selection algorithm's
            torch.kthvalue(x[[0, 4]], 3, 1),
            torch.kthvalue(x, 3, 1).values,  # among ties and NaN PyTorch's index is its quickselect's
            torch.kthvalue(x[3:], 2, 0, keepdim=True),
            torch.mode(x[3:], 1),  # row 3's ties: the value repeated most, its last position
            torch.mode(x[[0, 3, 4]].round(), 0, keepdim=True),  # equally frequent values: the smallest
        )

    return f, (x,)


@case("composites")
def _(g):  # type: ignore[no-untyped-def]
    x, other = _r(g, 2, 3, 7, 10), _r(g, 6, 4)
    mask = torch.rand(1, 3, 1, 10, generator=g) < 0.5  # broadcast over the batch and the rows
    index = torch.tensor([0, -1, 5, 17, 5])  # negative from the end; a repeated one accumulates
    with_nan = torch.tensor([-2.0, 0.0, -0.0, 3.0, float("nan")])

    def f(x: torch.Tensor, other: torch.Tensor) -> tuple[Any, ...]:
        pooled = F.adaptive_max_pool2d(x, (3, 4), return_indices=True)  # windows overlap: no tiling
        return (
            *pooled,
            F.adaptive_max_pool1d(x[0], 4),
            x.masked_scatter(mask, other.flatten().repeat(20)),
            other.put(index, torch.arange(5.0), accumulate=True),
            other.put(index[:3], torch.arange(3.0)),
            torch.addbmm(other[:, :3], x[0, :, :6, :4], x[1, :, :4, :3], beta=0.5, alpha=2.0),
            *(torch.cdist(other, other[:3] + 1, p=p) for p in (0.0, 1.0, 2.0, 3.0, float("inf"))),
            F.pdist(other),
            F.pdist(other, p=1),
            torch.histc(x, bins=7),
            torch.histc(other, bins=5, min=-1, max=1),
            torch.angle(with_nan + 0 * other[0, 0]),
        )

    return f, (x, other)


@case("convolution_3d", atol=1e-4)
def _(g):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    plain = nn.Conv3d(4, 6, (3, 2, 3), stride=(2, 1, 2), padding=(1, 0, 1), dilation=(2, 1, 1), groups=2)
    transposed = nn.ConvTranspose3d(6, 2, (3, 3, 2), stride=(3, 2, 1), padding=(1, 1, 0), output_padding=(2, 1, 0))
    model = _module(nn.Sequential(plain, nn.ReLU(), transposed))
    return model, (_r(g, 2, 4, 9, 6, 7),)


@case("separable_resampling_and_pooling", atol=1e-4)
def _(g):  # type: ignore[no-untyped-def]
    def f(img: torch.Tensor, vol: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            F.interpolate(img, size=(5, 9), mode="bilinear", antialias=True),  # down: the filter widens
            F.interpolate(img, scale_factor=(1.5, 0.4), mode="bilinear", antialias=True),
            F.interpolate(img, size=(4, 20), mode="bicubic", antialias=True, align_corners=True),
            F.interpolate(img, scale_factor=0.3, mode="bicubic", antialias=True, recompute_scale_factor=False),
            F.avg_pool3d(vol, 3, stride=2, padding=1),
            F.avg_pool3d(vol, (2, 3, 2), stride=(1, 2, 3), padding=(1, 1, 0), count_include_pad=False),
            F.avg_pool3d(vol, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
            F.avg_pool3d(vol, 2, divisor_override=3),
            F.adaptive_avg_pool3d(vol, (3, 4, 2)),
            F.adaptive_avg_pool3d(vol, 1),
        )

    return f, (_r(g, 2, 3, 11, 17), _r(g, 2, 3, 7, 9, 6))


@case("scatter_reductions")
def _(g):  # type: ignore[no-untyped-def]
    index = torch.tensor([[0, 2, 2, 4], [1, 1, 3, 0], [4, 4, 4, 4]])  # repeats; row 2 misses most targets

    def f(x: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            *(
                x.scatter_reduce(1, index, src, reduce, include_self=include_self)
                for reduce in ("sum", "prod", "mean", "amax", "amin")
                for include_self in (True, False)
            ),
            x.max(),
            x.min(),
            x.scatter(1, index, src, reduce="add"),
            x.scatter(1, index[:, :2], src, reduce="multiply"),  # src larger than the index: its corner
            x.scatter(1, index, 1.5, reduce="multiply"),
        )

    return f, (_r(g, 3, 6), _r(g, 3, 4))


@case("positional_writes")
def _(g):  # type: ignore[no-untyped-def]
    index = torch.tensor([3, 0, 3, 1])

    def f(x: torch.Tensor, cube: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.diagonal_scatter(x, src[0, :5]),
            torch.diagonal_scatter(x, src[1, :4], offset=2),
            torch.diagonal_scatter(x, src[2, :4], offset=-1),
            torch.diagonal_scatter(cube, src[:3, :3], 1, 2, 0),  # dims out of order, a batch dim between
            torch.as_strided_scatter(x, src[:2, :3], (2, 3), (7, 2), 1),
            x.index_reduce(0, index, src[:4], "mean"),
            x.index_reduce(1, torch.tensor([1, 1, 5]), src[:5, :3], "amax", include_self=False),
            x[0, 0].index_reduce(0, torch.tensor([0]), src[0, 0], "prod"),
        )

    return f, (_r(g, 5, 6), _r(g, 4, 3, 5), _r(g, 5, 6))


@case("bags_and_bilinear")
def _(g):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    bilinear = nn.Bilinear(6, 4, 5)
    indices = torch.tensor([3, 0, 7, 7, 2, 9, 1, 0])
    offsets = torch.tensor([0, 3, 3, 6])  # bag 1 is empty

    def f(table: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            bilinear(x1, x2),
            F.embedding_bag(indices, table, offsets, mode="sum", per_sample_weights=weights),
            F.embedding_bag(indices, table, offsets, mode="mean", padding_idx=7),
            F.embedding_bag(indices, table, offsets, mode="max"),
            F.embedding_bag(indices, table, torch.tensor([0, 2, 8]), mode="mean", include_last_offset=True),
            F.embedding_bag(indices.reshape(2, 4), table, mode="max"),  # fixed-size bags
        )

    return f, (_r(g, 10, 5), _r(g, 3, 6), _r(g, 3, 4), _r(g, 8))


@case("small_linear_algebra", atol=1e-4)
def _(g):  # type: ignore[no-untyped-def]
    def f(a: torch.Tensor, b: torch.Tensor, wide: torch.Tensor) -> tuple[Any, ...]:
        spd = a @ a.mT + torch.eye(5)  # [3, 5, 5], positive definite
        singular = a[0].clone()
        singular[4] = singular[1] * 2  # det 0: a zero pivot appears
        low = torch.linalg.cholesky(spd)
        factors, pivots = torch.linalg.lu_factor(a)
        return (
            torch.linalg.solve(a, b),
            torch.linalg.solve(a, b[0, :, 0]),  # one right-hand side as a vector, batch broadcast
            torch.linalg.solve(a, b.mT, left=False),
            torch.linalg.inv(a),
            torch.linalg.det(a),
            torch.linalg.det(singular),
            *torch.linalg.slogdet(a),
            low,
            torch.linalg.cholesky(spd, upper=True),
            torch.cholesky_solve(b, low),
            torch.cholesky_inverse(low),
            torch.linalg.lu_solve(factors, pivots, b),
            torch.linalg.lu_solve(factors, pivots, b, adjoint=True),
            torch.linalg.lu_solve(factors, pivots, b.mT, left=False),
            *torch.linalg.lu(wide),  # rectangular: P [4, 4], L [4, 4], U [4, 6]
            *torch.linalg.lu(wide.mT),
            torch.linalg.solve_triangular(low, b, upper=False),
            torch.linalg.solve_triangular(low.mT, b.mT, upper=True, left=False, unitriangular=True),
            torch.triangular_solve(b, low, upper=False, transpose=True).solution,
            *torch.linalg.qr(wide),
            *torch.linalg.qr(wide.mT, mode="complete"),
            torch.linalg.qr(a, mode="r").R,
            torch.ormqr(*torch.geqrf(wide.mT), wide[:2], left=False, transpose=True),
        )

    return f, (_r(g, 3, 5, 5) + 3 * torch.eye(5), _r(g, 3, 5, 2), _r(g, 4, 6))


@case("gamma_and_error_functions", rtol=2e-4, atol=1e-4)
def _(g):  # type: ignore[no-untyped-def]
    # both sides of the poles and of each approximation's switch points, the tails, and the specials
    specials = torch.tensor([0.0, -0.0, 1.0, 2.0, -1.0, -2.5, 0.5, 1e-6, 30.0, float("inf"), -float("inf")])
    x = torch.cat([specials, torch.rand(45, generator=g) * 24 - 12])
    p = torch.cat([torch.tensor([0.0, 1.0, 1e-30, 0.5, 0.02425, 0.97575]), torch.rand(20, generator=g)])
    unit = p * 2 - 1

    def f(x: torch.Tensor, p: torch.Tensor, unit: torch.Tensor) -> tuple[torch.Tensor, ...]:
        positive = x.abs() + 0.1
        return (
            torch.lgamma(x),
            torch.digamma(x),
            torch.polygamma(1, x),
            torch.polygamma(3, positive),
            torch.mvlgamma(positive + 2, 3),
            torch.special.zeta(positive + 1, positive),
            torch.special.zeta(3.0, positive),
            torch.erfinv(unit),
            torch.special.ndtri(p),
            torch.special.erfcx(x),
            torch.special.log_ndtr(x),
        )

    return f, (x, p, unit)


# --- attention -----------------------------------------------------------------------------------
@case("attention", atol=1e-5)
def _(g):  # type: ignore[no-untyped-def]
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            F.scaled_dot_product_attention(q, k, v),
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        )

    return f, (_r(g, 2, 4, 16, 8), _r(g, 2, 4, 16, 8), _r(g, 2, 4, 16, 8), _r(g, 16, 16))


# --- modules -------------------------------------------------------------------------------------
@case("mlp")
def _(g):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return _module(nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 256))), (_r(g, 32, 512),)


class _CNNBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.max_pool2d(y, 2)
        y = F.relu(y + self.bn2(self.conv2(y)))  # residual
        return self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))


@case("cnn_block")
def _(g):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return _module(_CNNBlock()), (_r(g, 2, 3, 16, 16),)


@case("transformer_layer", atol=1e-4)
def _(g):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
    return _module(layer), (_r(g, 2, 10, 64),)
