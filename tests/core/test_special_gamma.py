"""The gamma-family decompositions agree with PyTorch's own CPU kernels.

Each function of :mod:`torchburn.special_functions.gamma` runs eagerly on real tensors and is compared
with the ATen op it replaces, on dense grids over the interesting ranges and on the edge cases (zeros
of both signs, poles, +-inf, nan, subnormals, the ends of the domain). PyTorch's result is the ground
truth, its infs and nans included.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchburn.special_functions import gamma as sg

INF = math.inf
NAN = math.nan
F32 = torch.float32
F64 = torch.float64

# (rtol, atol) per dtype; float64 runs the same algorithms in double precision
TOL32 = (1e-4, 1e-5)
TOL64 = (1e-10, 1e-12)


def _close(actual: torch.Tensor, expected: torch.Tensor, tol: tuple[float, float]) -> None:
    torch.testing.assert_close(actual, expected, rtol=tol[0], atol=tol[1], equal_nan=True)


def _close_given_cancellation(
    actual: torch.Tensor, expected: torch.Tensor, tol: tuple[float, float], scale: torch.Tensor, scale_rtol: float
) -> None:
    """Like :func:`_close`, but a finite result may also be off by ``scale_rtol * scale``.

    ``scale`` says how ill-conditioned each value is. zeta(s, q) for q < 0 sums terms of both signs as
    large as |q - round(q)|**-s: near its zeros the sum is far smaller than its terms, and PyTorch's own
    result there (float32 included) is as noisy as ``eps`` times that; only an error of that size can be
    asked for.
    """
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    a, e = actual.double(), expected.double()
    scale = torch.where(torch.isfinite(scale), scale, 0.0)
    same_special = (a.isnan() == e.isnan()) & (a.isinf() == e.isinf()) & torch.where(e.isinf(), a == e, True)
    finite = e.isfinite() & a.isfinite()
    allowed = tol[1] + tol[0] * e.abs() + scale_rtol * scale
    ok = same_special & torch.where(finite, (a - e).abs() <= allowed, True)
    if not bool(ok.all()):
        where = (~ok).nonzero()[:5].tolist()
        raise AssertionError(f"{int((~ok).sum())} mismatches, first at {where}: {a[~ok][:5]} vs {e[~ok][:5]}")


def _cancellation_scale(s: torch.Tensor | float, q: torch.Tensor) -> torch.Tensor:
    """The largest term of zeta(s, q) for q < 0 (0 elsewhere), in float64."""
    q = q.double()
    distance = (q - torch.round(q)).abs()
    return torch.where(q < 0, distance ** (-torch.as_tensor(s, dtype=F64)), 0.0)


def _t(values: list[float], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _neighbours(points: list[float], dtype: torch.dtype, spread: int = 3) -> torch.Tensor:
    """The points and their nearest representable neighbours on both sides."""
    base = _t(points, dtype)
    out = [base]
    up, down = base, base
    for _ in range(spread):
        up = torch.nextafter(up, _t([INF], dtype).expand_as(up))
        down = torch.nextafter(down, _t([-INF], dtype).expand_as(down))
        out += [up, down]
    return torch.cat(out)


SPECIALS = [0.0, -0.0, INF, -INF, NAN, 1e-45, -1e-45, 1e-38, -1e-38, 1e-30, -1e-30, 3e38, -3e38]
NEGATIVE_INTEGERS = [-1.0, -2.0, -3.0, -10.0, -100.0, -1e6]
# zeros of digamma, and of lgamma on the negative axis
DIGAMMA_ROOTS = [1.4616321449683622, -0.5040830082644554, -1.5734984731623505, -2.5780961022152215, -3.5833]
LGAMMA_ROOTS = [1.0, 2.0, -2.4570247382208006, -2.7476826467274127, -3.1435808883499800, -3.9552942878282330]


def _gamma_grid(dtype: torch.dtype) -> torch.Tensor:
    return torch.cat(
        [
            torch.linspace(-40.0, 40.0, 40001, dtype=dtype),
            torch.linspace(-3.0, 3.0, 6001, dtype=dtype),
            torch.logspace(-40, 38, 400, dtype=dtype),
            -torch.logspace(-40, 6, 400, dtype=dtype) - 0.25,
            _neighbours([*NEGATIVE_INTEGERS, 0.0, 1.0, 2.0, 10.0, 13.0], dtype),
            _neighbours([*DIGAMMA_ROOTS, *LGAMMA_ROOTS], dtype),
            _t([*SPECIALS, 0.5, -0.5, -1000.5, 1e10, -1e10], dtype),
        ]
    )


# --------------------------------------------------------------------------------------------------
# lgamma, digamma, polygamma
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, tol", [(F32, TOL32), (F64, TOL64)])
def test_lgamma(dtype: torch.dtype, tol: tuple[float, float]) -> None:
    x = _gamma_grid(dtype)
    _close(sg.lgamma(x), torch.lgamma(x), tol)


def test_lgamma_float32_tighter() -> None:
    # next to its zeros (1, 2 and the negative ones) lgamma is a difference of O(1) terms in float32:
    # an absolute error of a few ulp of 1 remains
    x = _gamma_grid(F32)
    _close(sg.lgamma(x), torch.lgamma(x), (1e-5, 1e-6))


@pytest.mark.parametrize("dtype, tol", [(F32, TOL32), (F64, TOL64)])
def test_digamma(dtype: torch.dtype, tol: tuple[float, float]) -> None:
    x = _gamma_grid(dtype)
    _close(sg.digamma(x), torch.digamma(x), tol)


def test_digamma_near_poles_float32() -> None:
    # PyTorch evaluates cot(pi x) in double for float32 input; this must come as close in float32
    x = _neighbours([-1.0, -2.0, -7.0, -30.0, -1000.0], F32, spread=20)
    _close(sg.digamma(x), torch.digamma(x), (1e-5, 1e-6))


def _polygamma_grid(dtype: torch.dtype) -> torch.Tensor:
    # PyTorch's zeta walks from a negative x up to 9 one step at a time: keep |x| moderate
    return torch.cat(
        [
            torch.linspace(-30.0, 30.0, 12001, dtype=dtype),
            torch.logspace(-40, 30, 200, dtype=dtype),
            -torch.logspace(-40, 3, 200, dtype=dtype) - 0.25,
            _neighbours([-1.0, -2.0, -5.0, 0.0, -0.5, -4.5, -10.5, 1.0, 6.5], dtype),
            _t([0.0, -0.0, INF, -INF, NAN, 1e-45, -1e-45, 1e-30, -1e-30, 1e30, -1e6 + 0.5], dtype),
        ]
    )


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 8, 12, 40])
@pytest.mark.parametrize("dtype, tol", [(F32, TOL32), (F64, TOL64)])
def test_polygamma(n: int, dtype: torch.dtype, tol: tuple[float, float]) -> None:
    x = _polygamma_grid(dtype)
    if n == 40 and dtype == F32:
        # 40! overflows float32, so the result is +-inf times zeta; where zeta's terms cancel exactly
        # (negative half-integers) PyTorch's rounding noise gives inf and an exact 0 gives nan
        x = x[~(x < 0)]
    if n < 2:
        _close(sg.polygamma(n, x), torch.polygamma(n, x), tol)
        return
    scale = float(math.factorial(n)) * _cancellation_scale(n + 1.0, x)
    scale_rtol = 1e-6 if dtype == F32 else 1e-14
    _close_given_cancellation(sg.polygamma(n, x), torch.polygamma(n, x), tol, scale, scale_rtol)


def test_polygamma_near_cancellation_is_accurate() -> None:
    # where zeta's leading terms nearly cancel, float32 must not lose more than double does (PyTorch's
    # float32 kernel loses more here, so the float64 kernel is the reference)
    x = torch.linspace(-0.5, -0.5 + 1e-3, 101, dtype=F64)[1:] - 4.0
    for n in (2, 4, 8):
        _close(sg.polygamma(n, x.float()), torch.polygamma(n, x.float().double()).float(), (1e-4, 1e-4))


def test_polygamma_negative_order_is_refused() -> None:
    with pytest.raises(ValueError):
        sg.polygamma(-1, torch.ones(3))


# --------------------------------------------------------------------------------------------------
# Hurwitz zeta
# --------------------------------------------------------------------------------------------------


def _zeta_grid(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.cat(
        [
            torch.linspace(0.5, 40.0, 159, dtype=dtype),
            _t([1.0, 1.0001, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 11.0, 60.0, 1000.0, INF, -INF, NAN, -2.0, 0.0], dtype),
        ]
    )
    q = torch.cat(
        [
            torch.linspace(-20.3, 20.3, 203, dtype=dtype),
            _neighbours([-0.5, -1.5, -3.5, -1.0, 0.0, 1.0], dtype, spread=2),
            _t([1e-30, 1e-45, 1e30, 1e5, INF, -INF, NAN, -1e-6, -3.999, -1000.25], dtype),
        ]
    )
    grid_s, grid_q = torch.meshgrid(s, q, indexing="ij")
    return grid_s, grid_q


@pytest.mark.parametrize("dtype, tol", [(F32, TOL32), (F64, TOL64)])
def test_zeta(dtype: torch.dtype, tol: tuple[float, float]) -> None:
    s, q = _zeta_grid(dtype)
    scale_rtol = 1e-6 if dtype == F32 else 1e-14
    _close_given_cancellation(sg.zeta(s, q), torch.special.zeta(s, q), tol, _cancellation_scale(s, q), scale_rtol)


def test_zeta_broadcasts() -> None:
    s = torch.linspace(1.5, 6.0, 7).reshape(7, 1)
    q = torch.linspace(-4.25, 8.0, 11)
    _close(sg.zeta(s, q), torch.special.zeta(s, q), TOL32)
    _close(sg.zeta(q.abs() + 1.5, torch.tensor(0.75)), torch.special.zeta(q.abs() + 1.5, torch.tensor(0.75)), TOL32)


@pytest.mark.parametrize("dtype", [F32, F64, torch.int64])
def test_zeta_scalar_overloads(dtype: torch.dtype) -> None:
    values = torch.tensor([1, 2, 3, 5, 10], dtype=dtype)
    tol = TOL64 if dtype == F64 else TOL32
    for number in (2, 3.5, 1.0):
        expected = torch.ops.aten.special_zeta.self_scalar(number, values)
        actual = sg.zeta_self_scalar(number, values)
        assert actual.dtype == expected.dtype
        _close(actual, expected, tol)
        expected = torch.ops.aten.special_zeta.other_scalar(values + 1, number)
        actual = sg.zeta_other_scalar(values + 1, number)
        assert actual.dtype == expected.dtype
        _close(actual, expected, tol)


# --------------------------------------------------------------------------------------------------
# erfinv, ndtri, erfcx, log_ndtr
# --------------------------------------------------------------------------------------------------


def _unit_grid(dtype: torch.dtype, low: float) -> torch.Tensor:
    return torch.cat(
        [
            torch.linspace(low - 0.01, 1.01, 20001, dtype=dtype),
            1.0 - torch.logspace(-16 if dtype == F64 else -8, 0, 400, dtype=dtype),
            low + torch.logspace(-40, 0, 400, dtype=dtype),
            _neighbours([low, 0.0, 0.5, 0.7, -0.7, 1.0, 0.13533528323661269189, 1 - 0.13533528323661269189], dtype),
            _t([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, INF, -INF, NAN, 1e-45, 1e-38, 1e-20], dtype),
        ]
    )


@pytest.mark.parametrize("dtype, tol", [(F32, TOL32), (F64, TOL64)])
def test_erfinv(dtype: torch.dtype, tol: tuple[float, float]) -> None:
    y = _unit_grid(dtype, -1.0)
    expected = torch.erfinv(y)
    if dtype == F32:
        _close(sg.erfinv(y), expected, tol)
        return
    # Near +-1 erfinv is steep: the Newton steps compare erf(x) with y, and erf's last bit (1.1e-16)
    # moves x by 1e-16 / erf'(x), a relative error of about 1e-18 / (1 - |y|): 1e-8 at 1 - 1e-10.
    # (PyTorch's kernel is correctly rounded there, so it no longer runs the same two Newton steps.)
    steepness = expected.abs() / (1.0 - y.abs())
    _close_given_cancellation(sg.erfinv(y), expected, tol, steepness, 1e-17)


@pytest.mark.parametrize("dtype, tol", [(F32, (1e-5, 1e-6)), (F64, TOL64)])
def test_ndtri(dtype: torch.dtype, tol: tuple[float, float]) -> None:
    p = torch.cat([_unit_grid(dtype, 0.0), torch.logspace(-300 if dtype == F64 else -45, 0, 1000, dtype=dtype)])
    _close(sg.ndtri(p), torch.special.ndtri(p), tol)


def _real_line(dtype: torch.dtype, low: float, high: float) -> torch.Tensor:
    return torch.cat(
        [
            torch.linspace(low, high, 30001, dtype=dtype),
            torch.logspace(-40, 38, 400, dtype=dtype),
            -torch.logspace(-40, 38, 400, dtype=dtype),
            _neighbours([0.0, -1.0, 50.0, -6.1, -26.7, 5e7, 0.5 * math.sqrt(2.0), -9.4], dtype),
            _t([0.0, -0.0, INF, -INF, NAN, 1e-45, -1e-45, 1e300 if dtype == F64 else 3e38], dtype),
        ]
    )


@pytest.mark.parametrize("dtype, tol", [(F32, (1e-5, 1e-6)), (F64, TOL64)])
def test_erfcx(dtype: torch.dtype, tol: tuple[float, float]) -> None:
    x = _real_line(dtype, -30.0, 80.0)
    _close(sg.erfcx(x), torch.special.erfcx(x), tol)


def test_erfcx_every_table_row() -> None:
    # x = 4 / y - 4 at the centre of each of the table's 100 intervals of y = 4 / (4 + x)
    y = (torch.arange(100, dtype=F64) + 0.5) / 100
    for dtype in (F32, F64):
        x = (4 / y - 4).to(dtype)
        _close(sg.erfcx(x), torch.special.erfcx(x), (1e-6, 0.0) if dtype == F32 else (1e-13, 0.0))
        _close(sg.erfcx(-x), torch.special.erfcx(-x), (1e-5, 0.0) if dtype == F32 else (1e-12, 0.0))


@pytest.mark.parametrize("dtype, tol", [(F32, (1e-5, 1e-6)), (F64, TOL64)])
def test_log_ndtr(dtype: torch.dtype, tol: tuple[float, float]) -> None:
    x = _real_line(dtype, -60.0, 40.0)
    _close(sg.log_ndtr(x), torch.special.log_ndtr(x), tol)


def test_log_ndtr_upper_tail_is_relative() -> None:
    # where log_ndtr(x) ~ -erfc(x / sqrt 2) / 2 is tiny its relative accuracy comes from erfcx, not 1 - erf
    for dtype, rtol in ((F32, 2e-6), (F64, 1e-13)):
        x = torch.linspace(1.0, 13.0 if dtype == F32 else 37.0, 5001, dtype=dtype)
        _close(sg.log_ndtr(x), torch.special.log_ndtr(x), (rtol, 0.0))


# --------------------------------------------------------------------------------------------------
# frexp
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F64, torch.float16, torch.bfloat16])
def test_frexp_is_exact(dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    x = torch.cat(
        [
            torch.randn(2000, dtype=F64).mul(torch.logspace(-30, 30, 2000, dtype=F64)).to(dtype),
            _t([0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.5, 0.75, 2.0, 3.0], dtype),
            _t([info.max, -info.max, info.tiny, -info.tiny, info.smallest_normal / 2, info.eps], dtype),
            _neighbours([info.tiny, 1.0, 2.0, 0.5], dtype),
            _t([0.0], dtype).nextafter(_t([1.0], dtype)),  # smallest subnormal
        ]
    )
    mantissa, exponent = sg.frexp(x)
    expected_mantissa, expected_exponent = torch.frexp(x)
    assert mantissa.dtype == dtype and exponent.dtype == torch.int32
    torch.testing.assert_close(mantissa, expected_mantissa, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(exponent, expected_exponent, rtol=0, atol=0)
    # the sign of zero survives
    assert torch.equal(torch.signbit(mantissa), torch.signbit(expected_mantissa))


def test_frexp_refuses_integers() -> None:
    with pytest.raises(TypeError):
        sg.frexp(torch.arange(3))


# --------------------------------------------------------------------------------------------------
# dtypes, shapes, the table itself, tracing
# --------------------------------------------------------------------------------------------------

UNARY: list[tuple[str, Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] = [
    ("lgamma", sg.lgamma, torch.lgamma),
    ("digamma", sg.digamma, torch.digamma),
    ("trigamma", lambda x: sg.polygamma(1, x), lambda x: torch.polygamma(1, x)),
    ("polygamma3", lambda x: sg.polygamma(3, x), lambda x: torch.polygamma(3, x)),
    ("erfinv", sg.erfinv, torch.erfinv),
    ("ndtri", sg.ndtri, torch.special.ndtri),
    ("erfcx", sg.erfcx, torch.special.erfcx),
    ("log_ndtr", sg.log_ndtr, torch.special.log_ndtr),
]


@pytest.mark.parametrize("name, mine, theirs", UNARY, ids=[u[0] for u in UNARY])
def test_integer_input_promotes(
    name: str, mine: Callable[[torch.Tensor], torch.Tensor], theirs: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    x = torch.arange(-3, 8) if name not in ("erfinv", "ndtri") else torch.tensor([-1, 0, 1])
    actual, expected = mine(x), theirs(x)
    assert actual.dtype == expected.dtype == torch.get_default_dtype()
    _close(actual, expected, TOL32)


@pytest.mark.parametrize("name, mine, theirs", UNARY, ids=[u[0] for u in UNARY])
def test_zero_dim_and_empty(
    name: str, mine: Callable[[torch.Tensor], torch.Tensor], theirs: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    for x in (torch.tensor(0.3), torch.empty(0), torch.empty(2, 0, 3), torch.tensor([[0.25], [0.5]])):
        actual, expected = mine(x), theirs(x)
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        _close(actual, expected, TOL32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name, mine, theirs", UNARY, ids=[u[0] for u in UNARY])
def test_half_precision(
    dtype: torch.dtype,
    name: str,
    mine: Callable[[torch.Tensor], torch.Tensor],
    theirs: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    x = torch.linspace(-0.99, 0.99, 199) if name in ("erfinv", "ndtri") else torch.linspace(-7.9, 7.9, 317)
    if name == "ndtri":
        x = x.abs()
    x = x.to(dtype)
    actual = mine(x)
    # PyTorch computes these in float32 and rounds once, as the decompositions do
    expected = theirs(x.float()).to(dtype)
    assert actual.dtype == dtype
    _close(actual.float(), expected.float(), (1e-2, 1e-3))


def test_table_covers_the_overloads() -> None:
    aten = torch.ops.aten
    assert set(sg.DECOMPOSITIONS) == {
        aten.lgamma.default,
        aten.digamma.default,
        aten.polygamma.default,
        aten.special_zeta.default,
        aten.special_zeta.self_scalar,
        aten.special_zeta.other_scalar,
        aten.erfinv.default,
        aten.special_ndtri.default,
        aten.special_erfcx.default,
        aten.special_log_ndtr.default,
        aten.frexp.Tensor,
    }
    x = torch.linspace(0.05, 0.95, 19)
    calls = [
        (aten.lgamma.default, (x * 9 - 4,)),
        (aten.digamma.default, (x * 9 - 4,)),
        (aten.polygamma.default, (3, x * 9 - 4)),
        (aten.special_zeta.default, (x * 5 + 1, x * 9 - 4)),
        (aten.special_zeta.self_scalar, (3.0, x * 9 - 4)),
        (aten.special_zeta.other_scalar, (x * 5 + 1, 0.5)),
        (aten.erfinv.default, (x * 2 - 1,)),
        (aten.special_ndtri.default, (x,)),
        (aten.special_erfcx.default, (x * 20 - 10,)),
        (aten.special_log_ndtr.default, (x * 20 - 10,)),
    ]
    for op, args in calls:
        _close(sg.DECOMPOSITIONS[op](*args), op(*args), TOL32)
    for actual, expected in zip(sg.DECOMPOSITIONS[aten.frexp.Tensor](x * 1e3), aten.frexp.Tensor(x * 1e3), strict=True):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)


# what the engines are promised to receive: elementwise ops only
ALLOWED_OPS = {
    "_to_copy",
    "abs",
    "add",
    "clamp",
    "copysign",
    "div",
    "eq",
    "erf",
    "exp",
    "expm1",
    "floor",
    "full_like",
    "ge",
    "gt",
    "isinf",
    "isnan",
    "le",
    "log",
    "log1p",
    "logical_and",
    "logical_not",
    "logical_or",
    "lt",
    "maximum",
    "minimum",
    "mul",
    "ne",
    "neg",
    "ones_like",
    "pow",
    "reciprocal",
    "round",
    "rsub",
    "sin",
    "sqrt",
    "sub",
    "tan",
    "trunc",
    "where",
    "zeros_like",
}


@pytest.mark.parametrize(
    "fn, args",
    [
        (sg.lgamma, (torch.randn(3, 4),)),
        (sg.digamma, (torch.randn(3, 4),)),
        (lambda x: sg.polygamma(1, x), (torch.randn(3, 4),)),
        (lambda x: sg.polygamma(4, x), (torch.randn(3, 4),)),
        (sg.zeta, (torch.randn(3, 1), torch.randn(4))),
        (sg.erfinv, (torch.randn(3, 4),)),
        (sg.ndtri, (torch.randn(3, 4),)),
        (sg.erfcx, (torch.randn(5),)),
        (sg.log_ndtr, (torch.randn(5),)),
        (sg.frexp, (torch.randn(3, 4),)),
    ],
)
def test_traces_to_elementwise_ops_on_fake_tensors(fn: Callable[..., object], args: tuple[torch.Tensor, ...]) -> None:
    graph = make_fx(fn, tracing_mode="fake")(*args).graph
    used = {node.target.__name__.split(".")[0] for node in graph.nodes if node.op == "call_function"}  # type: ignore[union-attr]
    assert used <= ALLOWED_OPS, used - ALLOWED_OPS
