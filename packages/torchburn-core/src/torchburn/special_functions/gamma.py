"""Gamma-family and error-function special functions as branch-free elementwise arithmetic.

An engine that lowers only basic elementwise ops (arithmetic, ``exp``/``log``, ``sin``/``tan``, ``erf``,
comparisons and ``where``) cannot run ``lgamma``, ``digamma``, ``polygamma``, the Hurwitz ``zeta``,
``erfinv``, ``ndtri``, ``erfcx``, ``log_ndtr`` or ``frexp`` itself. Each function here rewrites one of
them into such ops so that the rest of the graph stays on the engine.

The algorithms and coefficients are the ones PyTorch's CPU kernels use (``ATen/native/Math.h``), so
the results agree with eager PyTorch, including where PyTorch returns ``inf`` or ``nan``:

* ``digamma``, ``polygamma``/``trigamma``, ``zeta`` and ``ndtri`` follow the Cephes Math Library
  (Copyright (c) 2018, Steven Moshier; 3-clause BSD licence, see PyTorch's NOTICE);
* ``lgamma`` is ``std::lgamma`` in PyTorch; here it is Cephes' ``lgam`` (rational approximation on
  [2, 3), recurrence below 13, Stirling's series above, reflection for negative arguments);
* ``erfcx`` is Steven G. Johnson's algorithm from the Faddeeva package (Copyright (c) 2012
  Massachusetts Institute of Technology, MIT licence), including its table of 100 Chebyshev fits;
* ``erfinv`` is PyTorch's rational approximation refined by two Newton steps, ``log_ndtr`` SciPy's
  formula on top of ``erfcx``.

Rules every function keeps, so that any engine and a fake-tensor trace can run it:

* every branch is computed for every element and the right one is picked with ``torch.where``; the
  branches not picked may hold ``inf`` or ``nan``;
* loops have a fixed trip count (Horner's rule over a coefficient list, a bounded number of
  recurrence steps guarded by ``where``), never one that depends on tensor values;
* arithmetic stays in the input's floating dtype (``float16``/``bfloat16`` in ``float32``, the result
  cast back; integer and bool inputs in the default dtype, as PyTorch promotes them), without
  bit reinterpretation, in-place ops or masked indexing;
* ``erfc`` is never called: engines often compute it as ``1 - erf``, which loses the tail; the tail
  comes from ``erfcx`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

aten = torch.ops.aten

_PI = math.pi
_INF = math.inf
_NAN = math.nan


# --------------------------------------------------------------------------------------------------
# dtype handling and small helpers
# --------------------------------------------------------------------------------------------------


def _dtypes(dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
    """(dtype to compute in, dtype of the result) for an input of ``dtype``."""
    if dtype.is_complex:
        raise TypeError(f"complex inputs ({dtype}) are not supported")
    if not dtype.is_floating_point:
        # integers and bools promote to the default floating dtype, as in PyTorch
        dtype = torch.get_default_dtype()
    if dtype in (torch.float16, torch.bfloat16):
        # too few bits for the recurrences: compute in float32, round once at the end
        return torch.float32, dtype
    return dtype, dtype


def _unary_input(x: Tensor) -> tuple[Tensor, torch.dtype]:
    compute, result = _dtypes(x.dtype)
    return x.to(compute), result


def _full(ref: Tensor, value: float) -> Tensor:
    return torch.full_like(ref, value)


def _select(mask: Tensor, value: float, other: Tensor) -> Tensor:
    """``where(mask, value, other)`` for a constant ``value``, as a tensor-tensor ``where``."""
    return torch.where(mask, _full(other, value), other)


def _horner(z: Tensor, coeffs: Sequence[float]) -> Tensor:
    """Polynomial with coefficients from the highest power down (Cephes' ``polevl``)."""
    result = _full(z, coeffs[0])
    for c in coeffs[1:]:
        result = result * z + c
    return result


def _horner_monic(z: Tensor, coeffs: Sequence[float]) -> Tensor:
    """Like :func:`_horner` with an implicit leading coefficient of 1 (Cephes' ``p1evl``)."""
    result = z + coeffs[0]
    for c in coeffs[1:]:
        result = result * z + c
    return result


def _is_integer(x: Tensor) -> Tensor:
    # true for +-inf too, as in the C++ ``x == floor(x)`` tests this mirrors
    return x == torch.floor(x)


# --------------------------------------------------------------------------------------------------
# lgamma: Cephes lgam
# --------------------------------------------------------------------------------------------------

# Stirling's series for log Gamma, correction in 1/x**2 (highest power first)
_LGAMMA_STIRLING = (
    8.11614167470508450300e-4,
    -5.95061904284301438324e-4,
    7.93650340457716943945e-4,
    -2.77777777730099687205e-3,
    8.33333333333331927722e-2,
)
# log Gamma(2 + z) = z P(z) / Q(z) for 0 <= z < 1 (highest power first; Q has a leading 1)
_LGAMMA_P = (
    -1.37825152569120859100e3,
    -3.88016315134637840924e4,
    -3.31612992738871184744e5,
    -1.16237097492762307383e6,
    -1.72173700820839662146e6,
    -8.53555664245765465627e5,
)
_LGAMMA_Q = (
    -3.51815701436523470549e2,
    -1.70642106651881159223e4,
    -2.20528590553854454839e5,
    -1.13933444367982507207e6,
    -2.53252307177582951285e6,
    -2.01889141433532773231e6,
)
_LOG_SQRT_2PI = 0.91893853320467274178
_LOG_PI = 1.14472988584940017414
# Stirling's series from here up; below it, the recurrence down (or up) to [2, 3)
_LGAMMA_STIRLING_FROM = 13.0


def _lgamma_nonnegative(x: Tensor) -> Tensor:
    """log |Gamma(x)| for x >= 0; other lanes are don't-care."""
    # (x - 1/2) log x - x + log sqrt(2 pi), regrouped so that x = inf gives inf (not inf - inf) and
    # x log x cannot overflow before the result does
    stirling = (
        (x - 0.5) * (torch.log(x) - 1.0)
        + (_LOG_SQRT_2PI - 0.5)
        + _horner(torch.reciprocal(x * x), _LGAMMA_STIRLING) / x
    )

    # Below 13: Gamma(x) = Gamma(2 + z) * num / den, num collecting the factors of stepping down from
    # [3, 13), den those of stepping up from (0, 2). Each step is taken only where it applies.
    small = x < _LGAMMA_STIRLING_FROM
    start = torch.where(small, x, _full(x, 2.5))  # keeps the Stirling lanes finite here
    u = start
    offset = torch.zeros_like(start)
    num = torch.ones_like(start)
    for _ in range(10):  # [3, 13) -> [2, 3)
        step = u >= 3.0
        offset = torch.where(step, offset - 1.0, offset)
        u = torch.where(step, start + offset, u)
        num = torch.where(step, num * u, num)
    den = torch.ones_like(start)
    for _ in range(2):  # (0, 2) -> [2, 3)
        step = u < 2.0
        den = torch.where(step, den * u, den)
        offset = torch.where(step, offset + 1.0, offset)
        u = torch.where(step, start + offset, u)
    # z from the original argument rather than u - 2, so that a tiny x keeps all its digits
    z = start + (offset - 2.0)
    # log(num) - log(den) rather than log(num / den): 1 / den overflows for subnormal x
    recurrence = torch.log(num) - torch.log(den) + z * _horner(z, _LGAMMA_P) / _horner_monic(z, _LGAMMA_Q)
    return torch.where(small, recurrence, stirling)


def lgamma(x: Tensor) -> Tensor:
    """``aten.lgamma``: log |Gamma(x)|."""
    x, dtype = _unary_input(x)
    negative = x < 0
    positive_part = _lgamma_nonnegative(torch.where(negative, 1.0 - x, x))
    # reflection: |Gamma(x) Gamma(1 - x)| = pi / |sin(pi x)|, with sin taken of the distance to the
    # nearest integer (exact to compute, also for tiny x) so that its argument stays small
    distance = torch.abs(x - torch.round(x))
    # log sin(pi d) = log(pi d) + log(1 - (pi d)**2 / 6 + ...) for small d, where pi * d would round
    # a subnormal d to fewer digits still
    pi_d2 = (_PI * distance) ** 2
    log_sin_small = _LOG_PI + torch.log(distance) + torch.log1p(-pi_d2 / 6.0 * (1.0 - pi_d2 / 20.0))
    log_sin = torch.where(distance < 1e-3, log_sin_small, torch.log(torch.sin(_PI * distance)))
    reflected = _LOG_PI - log_sin - positive_part
    result = torch.where(negative, reflected, positive_part)
    # poles at the negative integers and -inf (0 comes out as inf already)
    result = _select(torch.logical_and(negative, _is_integer(x)), _INF, result)
    return result.to(dtype)


# --------------------------------------------------------------------------------------------------
# digamma, trigamma, polygamma
# --------------------------------------------------------------------------------------------------

_PSI_10 = 2.25175258906672110764  # digamma(10)
# asymptotic series of digamma in 1/x**2 (highest power first)
_DIGAMMA_ASYMPTOTIC = (
    8.33333333333333333333e-2,
    -2.10927960927960927961e-2,
    7.57575757575757575758e-3,
    -4.16666666666666666667e-3,
    3.96825396825396825397e-3,
    -8.33333333333333333333e-3,
    8.33333333333333333333e-2,
)


def _digamma_positive(x: Tensor) -> Tensor:
    """digamma(x) for x > 0; other lanes are don't-care."""
    # psi(x) = psi(x + 1) - 1/x up to x >= 10 (ten steps suffice from any x > 0), then the series
    acc = torch.zeros_like(x)
    for _ in range(10):
        step = x < 10.0
        acc = torch.where(step, acc - torch.reciprocal(x), acc)
        x = torch.where(step, x + 1.0, x)
    z = torch.reciprocal(x * x)
    series = _select(x >= 1e17, 0.0, z * _horner(z, _DIGAMMA_ASYMPTOTIC))
    asymptotic = acc + torch.log(x) - 0.5 / x - series
    # PyTorch returns the tabulated value when the steps land on 10 exactly
    return torch.where(x == 10.0, acc + _PSI_10, asymptotic)


def digamma(x: Tensor) -> Tensor:
    """``aten.digamma``: d/dx log Gamma(x), PyTorch's float algorithm (Cephes psi)."""
    x, dtype = _unary_input(x)
    negative = x < 0
    positive_part = _digamma_positive(torch.where(negative, 1.0 - x, x))
    # reflection psi(x) = psi(1 - x) - pi cot(pi x), with cot's argument reduced by its period (exact).
    # For float32 PyTorch takes tan in double precision; to come as close in float32 the reduction goes
    # to x - round(x) in [-1/2, 1/2], where pi * r rounds little even next to a pole. For float64
    # PyTorch's own x - trunc(x) is kept, so that results agree there too.
    reduced = x - torch.trunc(x) if x.dtype == torch.float64 else x - torch.round(x)
    reflected = positive_part - _PI / torch.tan(_PI * reduced)
    result = torch.where(negative, reflected, positive_part)
    result = _select(torch.logical_and(negative, _is_integer(x)), _NAN, result)  # poles (and -inf)
    # psi(+-0) = -+inf
    return torch.where(x == 0, torch.copysign(_full(x, _INF), -x), result).to(dtype)


def _trigamma(x: Tensor) -> Tensor:
    """PyTorch's trigamma (polygamma with n = 1): reflection, six steps up, asymptotic series."""
    reflect = x < 0.5
    # like PyTorch, sin(pi x) of the raw argument, so that near the poles the result is as large
    # (and as finite) as PyTorch's
    sin_pi_x = torch.sin(_PI * x)
    acc = torch.where(reflect, -(_PI * _PI) / (sin_pi_x * sin_pi_x), torch.zeros_like(x))
    y = torch.where(reflect, 1.0 - x, x)
    for _ in range(6):
        acc = acc + torch.reciprocal(y * y)
        y = y + 1.0
    ixx = torch.reciprocal(y * y)
    acc = acc + (1.0 + 1.0 / (2.0 * y) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / y
    return torch.where(reflect, -acc, acc)


def polygamma(n: int, x: Tensor) -> Tensor:
    """``aten.polygamma``: the n-th derivative of digamma, (-1)**(n+1) n! zeta(n + 1, x) for n >= 2."""
    if n < 0:
        raise ValueError(f"polygamma(n, x) does not support negative n, got {n}")
    if n == 0:
        return digamma(x)
    x, dtype = _unary_input(x)
    if n == 1:
        return _trigamma(x).to(dtype)
    # n! as exp(lgamma(n + 1)) in the compute dtype, like PyTorch: it overflows to inf where PyTorch's does
    factorial = torch.exp(_full(x, math.lgamma(n + 1.0)))
    sign = 1.0 if n % 2 else -1.0
    return (sign * factorial * _zeta(float(n + 1), x)).to(dtype)


# --------------------------------------------------------------------------------------------------
# Hurwitz zeta: Cephes zeta
# --------------------------------------------------------------------------------------------------

# (2k)! / B_2k, the denominators of the Euler-Maclaurin correction terms
_ZETA_EULER_MACLAURIN = (
    12.0,
    -720.0,
    30240.0,
    -1209600.0,
    47900160.0,
    -1.8924375803183791606e9,
    7.47242496e10,
    -2.950130727918164224e12,
    1.1646782814350067249e14,
    -4.5979787224074726105e15,
    1.8152105401943546773e17,
    -7.1661652561756670113e18,
)
# terms after q**-s summed one by one before Euler-Maclaurin takes over (at w = q + 9 > 9 for q > 0)
_ZETA_DIRECT_TERMS = 9


def _neg_power(a: Tensor, s: Tensor | float) -> Tensor:
    """a ** -s for a >= 0."""
    if isinstance(s, Tensor):
        # no pow with a tensor exponent among the primitives
        return torch.exp(-s * torch.log(a))
    return a.pow(-s)


def _hurwitz_zeta_positive(s: Tensor | float, q: Tensor) -> Tensor:
    """sum_k (q + k)**-s for s > 1 and q > 0; other lanes are don't-care.

    Ten terms directly, then Euler-Maclaurin around w = q + 9. PyTorch leaves its loops as soon as a term
    drops below double epsilon; running them to the end changes the result only below that.
    """
    a = q
    term = _neg_power(a, s)
    total = term
    for _ in range(_ZETA_DIRECT_TERMS):
        a = a + 1.0
        term = _neg_power(a, s)
        total = total + term
    w = a
    # the tail's integral, w**(1 - s) / (s - 1). Cephes writes it as term * w / (s - 1), which is 0 when
    # term underflows although the integral does not (huge q), so it is computed on its own
    total = total + _neg_power(w, s - 1.0) / (s - 1.0)
    total = total - 0.5 * term
    # t_i = s (s + 1) ... (s + 2i) w**(-s-2i-1) / A_i: a running product from the last term, so that the
    # rising factorial never stands alone (it overflows float32 for large s, where w**-s is 0)
    factor = term
    k = 0.0
    for coeff in _ZETA_EULER_MACLAURIN:
        factor = factor * (s + k) / w
        total = total + factor / coeff
        factor = factor * (s + (k + 1.0)) / w
        k += 2.0
    return total


def _zeta(s: Tensor | float, q: Tensor) -> Tensor:
    """Hurwitz zeta(s, q) with PyTorch's special values; s a tensor of q's shape or a number."""
    negative = q < 0
    # For q < 0 (finite only for integer s) PyTorch sums terms until q + k > 9, an unbounded loop.
    # Splitting the sum at zero instead, with f = frac(q) and g = frac(-q) = 1 - f,
    #   zeta(s, q) = f**-s + zeta(s, 1 + f) + (-1)**s (g**-s + zeta(s, 1 + g) - zeta(s, 1 - q)),
    # three sums over positive arguments. The two leading terms are split off because for odd s they
    # nearly cancel around q = k + 1/2, which float32 must not see as a difference of two sums.
    f = q - torch.floor(q)
    g = -q - torch.floor(-q)
    main = _hurwitz_zeta_positive(s, torch.where(negative, f + 1.0, q))
    mirrored = _hurwitz_zeta_positive(s, g + 1.0) - _hurwitz_zeta_positive(s, 1.0 - q)
    f_power = _neg_power(f, s)
    g_power = _neg_power(g, s)
    # f**-s - g**-s = g**-s expm1(-s log1p((f - g) / g)) where f and g are close, with f - g taken
    # as 2q - (2 floor(q) + 1): exact there, while f itself is rounded for -1/2 < q < 0. Elsewhere the
    # plain difference does not cancel.
    close = torch.abs(f - 0.5) <= 1.0 / 6.0
    f_minus_g = 2.0 * q - (2.0 * torch.floor(q) + 1.0)
    lead_difference = torch.where(close, g_power * torch.expm1(-s * torch.log1p(f_minus_g / g)), f_power - g_power)
    if isinstance(s, Tensor):
        odd = (s - 2.0 * torch.floor(0.5 * s)) == 1.0
        reflected = torch.where(odd, lead_difference + (main - mirrored), f_power + g_power + (main + mirrored))
    elif s % 2 == 1:
        reflected = lead_difference + (main - mirrored)
    else:
        reflected = f_power + g_power + (main + mirrored)
    result = torch.where(negative, reflected, main)

    # PyTorch's special cases, the later ones taking precedence
    if isinstance(s, Tensor):
        result = _select(torch.logical_and(negative, torch.logical_not(_is_integer(s))), _NAN, result)
    elif s != math.floor(s):
        result = _select(negative, _NAN, result)
    # q = inf: PyTorch's Euler-Maclaurin step meets 0 * inf
    result = _select(q == _INF, _NAN, result)
    result = _select(torch.logical_and(q <= 0, _is_integer(q)), _INF, result)
    if isinstance(s, Tensor):
        # s = inf: q**-inf is inf below 1, 1 at 1; above 1 PyTorch's loop ends in 0 * inf = nan
        at_inf = _select(q == 1.0, 1.0, _select(q < 1.0, _INF, _full(q, _NAN)))
        result = torch.where(s == _INF, at_inf, result)
        result = _select(s < 1.0, _NAN, result)
        result = _select(s == 1.0, _INF, result)
    elif s < 1.0:
        result = _full(q, _NAN)
    elif s == 1.0:
        result = _full(q, _INF)
    return result


def zeta(x: Tensor, q: Tensor) -> Tensor:
    """``aten.special_zeta``: Hurwitz zeta sum_k (q + k)**-x, broadcasting x and q."""
    compute, dtype = _dtypes(torch.result_type(x, q))
    x = x.to(compute)
    q = q.to(compute)
    # broadcast with elementwise adds only (x + 0 keeps every value of x that matters here)
    x, q = x + torch.zeros_like(q), q + torch.zeros_like(x)
    return _zeta(x, q).to(dtype)


def zeta_self_scalar(self: float, other: Tensor) -> Tensor:
    """``aten.special_zeta.self_scalar``: zeta with a number for x."""
    return zeta(torch.full_like(other, self, dtype=torch.result_type(self, other)), other)


def zeta_other_scalar(self: Tensor, other: float) -> Tensor:
    """``aten.special_zeta.other_scalar``: zeta with a number for q."""
    return zeta(self, torch.full_like(self, other, dtype=torch.result_type(self, other)))


# --------------------------------------------------------------------------------------------------
# erfinv and ndtri
# --------------------------------------------------------------------------------------------------

# rational approximations of erfinv (lowest power first, as PyTorch lists them)
_ERFINV_A = (0.886226899, -1.645349621, 0.914624893, -0.140543331)
_ERFINV_B = (-2.118377725, 1.442710462, -0.329097515, 0.012229801)
_ERFINV_C = (-1.970840454, -1.624906493, 3.429567803, 1.641345311)
_ERFINV_D = (3.543889200, 1.637067800)
_ERFINV_CENTRAL = 0.7
_TWO_OVER_SQRT_PI = 2.0 * 0.564189583547756286948


def erfinv(y: Tensor) -> Tensor:
    """``aten.erfinv``: inverse error function, rational start plus two Newton steps."""
    y, dtype = _unary_input(y)
    y_abs = torch.abs(y)
    # |y| <= 0.7: odd rational function of y
    z = y * y
    central = y * _horner(z, _ERFINV_A[::-1]) / _horner(z, (*_ERFINV_B[::-1], 1.0))
    # tails: rational function of sqrt(-log((1 - |y|) / 2))
    r = torch.sqrt(-torch.log((1.0 - y_abs) / 2.0))
    tail = torch.copysign(_horner(r, _ERFINV_C[::-1]), y) / _horner(r, (*_ERFINV_D[::-1], 1.0))
    x = torch.where(y_abs <= _ERFINV_CENTRAL, central, tail)
    # two Newton steps on erf(x) = y bring the start to full precision where erf can tell x apart.
    # Near +-1 it cannot: in float32 erf is within one rounding of 1 - 2**-24 all over [3.80, 3.86], and
    # whether a vectorised erf rounds up or down there (CPUs differ) would move x by 0.03. A step no
    # larger than what one rounding of erf(x) moves x by is that noise, and the start (good to 1e-5
    # there) is kept.
    eps = torch.finfo(x.dtype).eps
    for _ in range(2):
        slope = _TWO_OVER_SQRT_PI * torch.exp(-x * x)
        step = (torch.erf(x) - y) / slope
        noise = eps * y_abs / slope
        x = torch.where(torch.abs(step) > noise, x - step, x)
    x = torch.where(y_abs == 1.0, torch.copysign(_full(y, _INF), y), x)
    return _select(y_abs > 1.0, _NAN, x).to(dtype)


# Cephes ndtri (highest power first)
# 0 <= |p - 1/2| <= 3/8
_NDTRI_P0 = (
    -5.99633501014107895267e1,
    9.80010754185999661536e1,
    -5.66762857469070293439e1,
    1.39312609387279679503e1,
    -1.23916583867381258016e0,
)
_NDTRI_Q0 = (
    1.00000000000000000000e0,
    1.95448858338141759834e0,
    4.67627912898881538453e0,
    8.63602421390890590575e1,
    -2.25462687854119370527e2,
    2.00260212380060660359e2,
    -8.20372256168333339912e1,
    1.59056225126211695515e1,
    -1.18331621121330003142e0,
)
# sqrt(-2 log p) in [2, 8), p in [exp(-32), exp(-2))
_NDTRI_P1 = (
    4.05544892305962419923e0,
    3.15251094599893866154e1,
    5.71628192246421288162e1,
    4.40805073893200834700e1,
    1.46849561928858024014e1,
    2.18663306850790267539e0,
    -1.40256079171354495875e-1,
    -3.50424626827848203418e-2,
    -8.57456785154685413611e-4,
)
_NDTRI_Q1 = (
    1.00000000000000000000e0,
    1.57799883256466749731e1,
    4.53907635128879210584e1,
    4.13172038254672030440e1,
    1.50425385692907503408e1,
    2.50464946208309415979e0,
    -1.42182922854787788574e-1,
    -3.80806407691578277194e-2,
    -9.33259480895457427372e-4,
)
# sqrt(-2 log p) in [8, 64), p below exp(-32)
_NDTRI_P2 = (
    3.23774891776946035970e0,
    6.91522889068984211695e0,
    3.93881025292474443415e0,
    1.33303460815807542389e0,
    2.01485389549179081538e-1,
    1.23716634817820021358e-2,
    3.01581553508235416007e-4,
    2.65806974686737550832e-6,
    6.23974539184983293730e-9,
)
_NDTRI_Q2 = (
    1.00000000000000000000e0,
    6.02427039364742014255e0,
    3.67983563856160859403e0,
    1.37702099489081330271e0,
    2.16236993594496635890e-1,
    1.34204006088543189037e-2,
    3.28014464682127739104e-4,
    2.89247864745380683936e-6,
    6.79019408009981274425e-9,
)
_EXP_MINUS_2 = 0.13533528323661269189
_SQRT_2PI = 2.50662827463100050242


def ndtri(p: Tensor) -> Tensor:
    """``aten.special_ndtri``: the x at which the standard normal CDF equals p."""
    p, dtype = _unary_input(p)
    # work in the lower half (mirrored back at the end) so that 1 - p never loses the tail
    upper = p > 1.0 - _EXP_MINUS_2
    y = torch.where(upper, 1.0 - p, p)
    # central part: odd rational function of y - 1/2
    c = y - 0.5
    c2 = c * c
    central = (c + c * (c2 * _horner(c2, _NDTRI_P0) / _horner(c2, _NDTRI_Q0))) * _SQRT_2PI
    # tails: asymptotic start sqrt(-2 log y) minus a rational correction in its reciprocal
    r = torch.sqrt(-2.0 * torch.log(y))
    inv = torch.reciprocal(r)
    correction = torch.where(
        r < 8.0,
        inv * _horner(inv, _NDTRI_P1) / _horner(inv, _NDTRI_Q1),
        inv * _horner(inv, _NDTRI_P2) / _horner(inv, _NDTRI_Q2),
    )
    tail = r - torch.log(r) / r - correction
    tail = torch.where(upper, tail, -tail)
    result = torch.where(y > _EXP_MINUS_2, central, tail)
    result = _select(torch.logical_or(p < 0.0, p > 1.0), _NAN, result)
    result = _select(p == 0.0, -_INF, result)
    return _select(p == 1.0, _INF, result).to(dtype)


# --------------------------------------------------------------------------------------------------
# erfcx and log_ndtr: Faddeeva package erfcx (S. G. Johnson), SciPy log_ndtr
# --------------------------------------------------------------------------------------------------

# Johnson's piecewise Chebyshev fits of erfcx: row k covers y = 4 / (4 + x) in [k/100, (k+1)/100) and
# holds c0..c6 of sum_j c_j t**j with t = 200 y - (2k + 1) in [-1, 1).
# fmt: off
_ERFCX_Y100_TABLE: tuple[tuple[float, ...], ...] = (
    (0.70878032454106438663e-3, 0.71234091047026302958e-3, 0.35779077297597742384e-5, 0.17403143962587937815e-7,
     0.81710660047307788845e-10, 0.36885022360434957634e-12, 0.15917038551111111111e-14),  # [0.00, 0.01)
    (0.21479143208285144230e-2, 0.72686402367379996033e-3, 0.36843175430938995552e-5, 0.18071841272149201685e-7,
     0.85496449296040325555e-10, 0.38852037518534291510e-12, 0.16868473576888888889e-14),  # [0.01, 0.02)
    (0.36165255935630175090e-2, 0.74182092323555510862e-3, 0.37948319957528242260e-5, 0.18771627021793087350e-7,
     0.89484715122415089123e-10, 0.40935858517772440862e-12, 0.17872061464888888889e-14),  # [0.02, 0.03)
    (0.51154983860031979264e-2, 0.75722840734791660540e-3, 0.39096425726735703941e-5, 0.19504168704300468210e-7,
     0.93687503063178993915e-10, 0.43143925959079664747e-12, 0.18939926435555555556e-14),  # [0.03, 0.04)
    (0.66457513172673049824e-2, 0.77310406054447454920e-3, 0.40289510589399439385e-5, 0.20271233238288381092e-7,
     0.98117631321709100264e-10, 0.45484207406017752971e-12, 0.20076352213333333333e-14),  # [0.04, 0.05)
    (0.82082389970241207883e-2, 0.78946629611881710721e-3, 0.41529701552622656574e-5, 0.21074693344544655714e-7,
     0.10278874108587317989e-9, 0.47965201390613339638e-12, 0.21285907413333333333e-14),  # [0.05, 0.06)
    (0.98039537275352193165e-2, 0.80633440108342840956e-3, 0.42819241329736982942e-5, 0.21916534346907168612e-7,
     0.10771535136565470914e-9, 0.50595972623692822410e-12, 0.22573462684444444444e-14),  # [0.06, 0.07)
    (0.11433927298290302370e-1, 0.82372858383196561209e-3, 0.44160495311765438816e-5, 0.22798861426211986056e-7,
     0.11291291745879239736e-9, 0.53386189365816880454e-12, 0.23944209546666666667e-14),  # [0.07, 0.08)
    (0.13099232878814653979e-1, 0.84167002467906968214e-3, 0.45555958988457506002e-5, 0.23723907357214175198e-7,
     0.11839789326602695603e-9, 0.56346163067550237877e-12, 0.25403679644444444444e-14),  # [0.08, 0.09)
    (0.14800987015587535621e-1, 0.86018092946345943214e-3, 0.47008265848816866105e-5, 0.24694040760197315333e-7,
     0.12418779768752299093e-9, 0.59486890370320261949e-12, 0.26957764568888888889e-14),  # [0.09, 0.10)
    (0.16540351739394069380e-1, 0.87928458641241463952e-3, 0.48520195793001753903e-5, 0.25711774900881709176e-7,
     0.13030128534230822419e-9, 0.62820097586874779402e-12, 0.28612737351111111111e-14),  # [0.10, 0.11)
    (0.18318536789842392647e-1, 0.89900542647891721692e-3, 0.50094684089553365810e-5, 0.26779777074218070482e-7,
     0.13675822186304615566e-9, 0.66358287745352705725e-12, 0.30375273884444444444e-14),  # [0.11, 0.12)
    (0.20136801964214276775e-1, 0.91936908737673676012e-3, 0.51734830914104276820e-5, 0.27900878609710432673e-7,
     0.14357976402809042257e-9, 0.70114790311043728387e-12, 0.32252476000000000000e-14),  # [0.12, 0.13)
    (0.21996459598282740954e-1, 0.94040248155366777784e-3, 0.53443911508041164739e-5, 0.29078085538049374673e-7,
     0.15078844500329731137e-9, 0.74103813647499204269e-12, 0.34251892320000000000e-14),  # [0.13, 0.14)
    (0.23898877187226319502e-1, 0.96213386835900177540e-3, 0.55225386998049012752e-5, 0.30314589961047687059e-7,
     0.15840826497296335264e-9, 0.78340500472414454395e-12, 0.36381553564444444445e-14),  # [0.14, 0.15)
    (0.25845480155298518485e-1, 0.98459293067820123389e-3, 0.57082915920051843672e-5, 0.31613782169164830118e-7,
     0.16646478745529630813e-9, 0.82840985928785407942e-12, 0.38649975768888888890e-14),  # [0.15, 0.16)
    (0.27837754783474696598e-1, 0.10078108563256892757e-2, 0.59020366493792212221e-5, 0.32979263553246520417e-7,
     0.17498524159268458073e-9, 0.87622459124842525110e-12, 0.41066206488888888890e-14),  # [0.16, 0.17)
    (0.29877251304899307550e-1, 0.10318204245057349310e-2, 0.61041829697162055093e-5, 0.34414860359542720579e-7,
     0.18399863072934089607e-9, 0.92703227366365046533e-12, 0.43639844053333333334e-14),  # [0.17, 0.18)
    (0.31965587178596443475e-1, 0.10566560976716574401e-2, 0.63151633192414586770e-5, 0.35924638339521924242e-7,
     0.19353584758781174038e-9, 0.98102783859889264382e-12, 0.46381060817777777779e-14),  # [0.18, 0.19)
    (0.34104450552588334840e-1, 0.10823541191350532574e-2, 0.65354356159553934436e-5, 0.37512918348533521149e-7,
     0.20362979635817883229e-9, 0.10384187833037282363e-11, 0.49300625262222222221e-14),  # [0.19, 0.20)
    (0.36295603928292425716e-1, 0.11089526167995268200e-2, 0.67654845095518363577e-5, 0.39184292949913591646e-7,
     0.21431552202133775150e-9, 0.10994259106646731797e-11, 0.52409949102222222221e-14),  # [0.20, 0.21)
    (0.38540888038840509795e-1, 0.11364917134175420009e-2, 0.70058230641246312003e-5, 0.40943644083718586939e-7,
     0.22563034723692881631e-9, 0.11642841011361992885e-11, 0.55721092871111111110e-14),  # [0.21, 0.22)
    (0.40842225954785960651e-1, 0.11650136437945673891e-2, 0.72569945502343006619e-5, 0.42796161861855042273e-7,
     0.23761401711005024162e-9, 0.12332431172381557035e-11, 0.59246802364444444445e-14),  # [0.22, 0.23)
    (0.43201627431540222422e-1, 0.11945628793917272199e-2, 0.75195743532849206263e-5, 0.44747364553960993492e-7,
     0.25030885216472953674e-9, 0.13065684400300476484e-11, 0.63000532853333333334e-14),  # [0.23, 0.24)
    (0.45621193513810471438e-1, 0.12251862608067529503e-2, 0.77941720055551920319e-5, 0.46803119830954460212e-7,
     0.26375990983978426273e-9, 0.13845421370977119765e-11, 0.66996477404444444445e-14),  # [0.24, 0.25)
    (0.48103121413299865517e-1, 0.12569331386432195113e-2, 0.80814333496367673980e-5, 0.48969667335682018324e-7,
     0.27801515481905748484e-9, 0.14674637611609884208e-11, 0.71249589351111111110e-14),  # [0.25, 0.26)
    (0.50649709676983338501e-1, 0.12898555233099055810e-2, 0.83820428414568799654e-5, 0.51253642652551838659e-7,
     0.29312563849675507232e-9, 0.15556512782814827846e-11, 0.75775607822222222221e-14),  # [0.26, 0.27)
    (0.53263363664388864181e-1, 0.13240082443256975769e-2, 0.86967260015007658418e-5, 0.53662102750396795566e-7,
     0.30914568786634796807e-9, 0.16494420240828493176e-11, 0.80591079644444444445e-14),  # [0.27, 0.28)
    (0.55946601353500013794e-1, 0.13594491197408190706e-2, 0.90262520233016380987e-5, 0.56202552975056695376e-7,
     0.32613310410503135996e-9, 0.17491936862246367398e-11, 0.85713381688888888890e-14),  # [0.28, 0.29)
    (0.58702059496154081813e-1, 0.13962391363223647892e-2, 0.93714365487312784270e-5, 0.58882975670265286526e-7,
     0.34414937110591753387e-9, 0.18552853109751857859e-11, 0.91160736711111111110e-14),  # [0.29, 0.30)
    (0.61532500145144778048e-1, 0.14344426411912015247e-2, 0.97331446201016809696e-5, 0.61711860507347175097e-7,
     0.36325987418295300221e-9, 0.19681183310134518232e-11, 0.96952238400000000000e-14),  # [0.30, 0.31)
    (0.64440817576653297993e-1, 0.14741275456383131151e-2, 0.10112293819576437838e-4, 0.64698236605933246196e-7,
     0.38353412915303665586e-9, 0.20881176114385120186e-11, 0.10310784480000000000e-13),  # [0.31, 0.32)
    (0.67430045633130393282e-1, 0.15153655418916540370e-2, 0.10509857606888328667e-4, 0.67851706529363332855e-7,
     0.40504602194811140006e-9, 0.22157325110542534469e-11, 0.10964842115555555556e-13),  # [0.32, 0.33)
    (0.70503365513338850709e-1, 0.15582323336495709827e-2, 0.10926868866865231089e-4, 0.71182482239613507542e-7,
     0.42787405890153386710e-9, 0.23514379522274416437e-11, 0.11659571751111111111e-13),  # [0.33, 0.34)
    (0.73664114037944596353e-1, 0.16028078812438820413e-2, 0.11364423678778207991e-4, 0.74701423097423182009e-7,
     0.45210162777476488324e-9, 0.24957355004088569134e-11, 0.12397238257777777778e-13),  # [0.34, 0.35)
    (0.76915792420819562379e-1, 0.16491766623447889354e-2, 0.11823685320041302169e-4, 0.78420075993781544386e-7,
     0.47781726956916478925e-9, 0.26491544403815724749e-11, 0.13180196462222222222e-13),  # [0.35, 0.36)
    (0.80262075578094612819e-1, 0.16974279491709504117e-2, 0.12305888517309891674e-4, 0.82350717698979042290e-7,
     0.50511496109857113929e-9, 0.28122528497626897696e-11, 0.14010889635555555556e-13),  # [0.36, 0.37)
    (0.83706822008980357446e-1, 0.17476561032212656962e-2, 0.12812343958540763368e-4, 0.86506399515036435592e-7,
     0.53409440823869467453e-9, 0.29856186620887555043e-11, 0.14891851591111111111e-13),  # [0.37, 0.38)
    (0.87254084284461718231e-1, 0.17999608886001962327e-2, 0.13344443080089492218e-4, 0.90900994316429008631e-7,
     0.56486134972616465316e-9, 0.31698707080033956934e-11, 0.15825697795555555556e-13),  # [0.38, 0.39)
    (0.90908120182172748487e-1, 0.18544478050657699758e-2, 0.13903663143426120077e-4, 0.95549246062549906177e-7,
     0.59752787125242054315e-9, 0.33656597366099099413e-11, 0.16815130613333333333e-13),  # [0.39, 0.40)
    (0.94673404508075481121e-1, 0.19112284419887303347e-2, 0.14491572616545004930e-4, 0.10046682186333613697e-6,
     0.63221272959791000515e-9, 0.35736693975589130818e-11, 0.17862931591111111111e-13),  # [0.40, 0.41)
    (0.98554641648004456555e-1, 0.19704208544725622126e-2, 0.15109836875625443935e-4, 0.10567036667675984067e-6,
     0.66904168640019354565e-9, 0.37946171850824333014e-11, 0.18971959040000000000e-13),  # [0.41, 0.42)
    (0.10255677889470089531e0, 0.20321499629472857418e-2, 0.15760224242962179564e-4, 0.11117756071353507391e-6,
     0.70814785110097658502e-9, 0.40292553276632563925e-11, 0.20145143075555555556e-13),  # [0.42, 0.43)
    (0.10668502059865093318e0, 0.20965479776148731610e-2, 0.16444612377624983565e-4, 0.11700717962026152749e-6,
     0.74967203250938418991e-9, 0.42783716186085922176e-11, 0.21385479360000000000e-13),  # [0.43, 0.44)
    (0.11094484319386444474e0, 0.21637548491908170841e-2, 0.17164995035719657111e-4, 0.12317915750735938089e-6,
     0.79376309831499633734e-9, 0.45427901763106353914e-11, 0.22696025653333333333e-13),  # [0.44, 0.45)
    (0.11534201115268804714e0, 0.22339187474546420375e-2, 0.17923489217504226813e-4, 0.12971465288245997681e-6,
     0.84057834180389073587e-9, 0.48233721206418027227e-11, 0.24079890062222222222e-13),  # [0.45, 0.46)
    (0.11988259392684094740e0, 0.23071965691918689601e-2, 0.18722342718958935446e-4, 0.13663611754337957520e-6,
     0.89028385488493287005e-9, 0.51210161569225846701e-11, 0.25540227111111111111e-13),  # [0.46, 0.47)
    (0.12457298393509812907e0, 0.23837544771809575380e-2, 0.19563942105711612475e-4, 0.14396736847739470782e-6,
     0.94305490646459247016e-9, 0.54366590583134218096e-11, 0.27080225920000000000e-13),  # [0.47, 0.48)
    (0.12941991566142438816e0, 0.24637684719508859484e-2, 0.20450821127475879816e-4, 0.15173366280523906622e-6,
     0.99907632506389027739e-9, 0.57712760311351625221e-11, 0.28703099555555555556e-13),  # [0.48, 0.49)
    (0.13443048593088696613e0, 0.25474249981080823877e-2, 0.21385669591362915223e-4, 0.15996177579900443030e-6,
     0.10585428844575134013e-8, 0.61258809536787882989e-11, 0.30412080142222222222e-13),  # [0.49, 0.50)
    (0.13961217543434561353e0, 0.26349215871051761416e-2, 0.22371342712572567744e-4, 0.16868008199296822247e-6,
     0.11216596910444996246e-8, 0.65015264753090890662e-11, 0.32210394506666666666e-13),  # [0.50, 0.51)
    (0.14497287157673800690e0, 0.27264675383982439814e-2, 0.23410870961050950197e-4, 0.17791863939526376477e-6,
     0.11886425714330958106e-8, 0.68993039665054288034e-11, 0.34101266222222222221e-13),  # [0.51, 0.52)
    (0.15052089272774618151e0, 0.28222846410136238008e-2, 0.24507470422713397006e-4, 0.18770927679626136909e-6,
     0.12597184587583370712e-8, 0.73203433049229821618e-11, 0.36087889048888888890e-13),  # [0.52, 0.53)
    (0.15626501395774612325e0, 0.29226079376196624949e-2, 0.25664553693768450545e-4, 0.19808568415654461964e-6,
     0.13351257759815557897e-8, 0.77658124891046760667e-11, 0.38173420035555555555e-13),  # [0.53, 0.54)
    (0.16221449434620737567e0, 0.30276865332726475672e-2, 0.26885741326534564336e-4, 0.20908350604346384143e-6,
     0.14151148144240728728e-8, 0.82369170665974313027e-11, 0.40360957457777777779e-13),  # [0.54, 0.55)
    (0.16837910595412130659e0, 0.31377844510793082301e-2, 0.28174873844911175026e-4, 0.22074043807045782387e-6,
     0.14999481055996090039e-8, 0.87348993661930809254e-11, 0.42653528977777777779e-13),  # [0.55, 0.56)
    (0.17476916455659369953e0, 0.32531815370903068316e-2, 0.29536024347344364074e-4, 0.23309632627767074202e-6,
     0.15899007843582444846e-8, 0.92610375235427359475e-11, 0.45054073102222222221e-13),  # [0.56, 0.57)
    (0.18139556223643701364e0, 0.33741744168096996041e-2, 0.30973511714709500836e-4, 0.24619326937592290996e-6,
     0.16852609412267750744e-8, 0.98166442942854895573e-11, 0.47565418097777777779e-13),  # [0.57, 0.58)
    (0.18826980194443664549e0, 0.35010775057740317997e-2, 0.32491914440014267480e-4, 0.26007572375886319028e-6,
     0.17863299617388376116e-8, 0.10403065638343878679e-10, 0.50190265831111111110e-13),  # [0.58, 0.59)
    (0.19540403413693967350e0, 0.36342240767211326315e-2, 0.34096085096200907289e-4, 0.27479061117017637474e-6,
     0.18934228504790032826e-8, 0.11021679075323598664e-10, 0.52931171733333333334e-13),  # [0.59, 0.60)
    (0.20281109560651886959e0, 0.37739673859323597060e-2, 0.35791165457592409054e-4, 0.29038742889416172404e-6,
     0.20068685374849001770e-8, 0.11673891799578381999e-10, 0.55790523093333333334e-13),  # [0.60, 0.61)
    (0.21050455062669334978e0, 0.39206818613925652425e-2, 0.37582602289680101704e-4, 0.30691836231886877385e-6,
     0.21270101645763677824e-8, 0.12361138551062899455e-10, 0.58770520160000000000e-13),  # [0.61, 0.62)
    (0.21849873453703332479e0, 0.40747643554689586041e-2, 0.39476163820986711501e-4, 0.32443839970139918836e-6,
     0.22542053491518680200e-8, 0.13084879235290858490e-10, 0.61873153262222222221e-13),  # [0.62, 0.63)
    (0.22680879990043229327e0, 0.42366354648628516935e-2, 0.41477956909656896779e-4, 0.34300544894502810002e-6,
     0.23888264229264067658e-8, 0.13846596292818514601e-10, 0.65100183751111111110e-13),  # [0.63, 0.64)
    (0.23545076536988703937e0, 0.44067409206365170888e-2, 0.43594444916224700881e-4, 0.36268045617760415178e-6,
     0.25312606430853202748e-8, 0.14647791812837903061e-10, 0.68453122631111111110e-13),  # [0.64, 0.65)
    (0.24444156740777432838e0, 0.45855530511605787178e-2, 0.45832466292683085475e-4, 0.38352752590033030472e-6,
     0.26819103733055603460e-8, 0.15489984390884756993e-10, 0.71933206364444444445e-13),  # [0.65, 0.66)
    (0.25379911500634264643e0, 0.47735723208650032167e-2, 0.48199253896534185372e-4, 0.40561404245564732314e-6,
     0.28411932320871165585e-8, 0.16374705736458320149e-10, 0.75541379822222222221e-13),  # [0.66, 0.67)
    (0.26354234756393613032e0, 0.49713289477083781266e-2, 0.50702455036930367504e-4, 0.42901079254268185722e-6,
     0.30095422058900481753e-8, 0.17303497025347342498e-10, 0.79278273368888888890e-13),  # [0.67, 0.68)
    (0.27369129607732343398e0, 0.51793846023052643767e-2, 0.53350152258326602629e-4, 0.45379208848865015485e-6,
     0.31874057245814381257e-8, 0.18277905010245111046e-10, 0.83144182364444444445e-13),  # [0.68, 0.69)
    (0.28426714781640316172e0, 0.53983341916695141966e-2, 0.56150884865255810638e-4, 0.48003589196494734238e-6,
     0.33752476967570796349e-8, 0.19299477888083469086e-10, 0.87139049137777777779e-13),  # [0.69, 0.70)
    (0.29529231465348519920e0, 0.56288077305420795663e-2, 0.59113671189913307427e-4, 0.50782393781744840482e-6,
     0.35735475025851713168e-8, 0.20369760937017070382e-10, 0.91262442613333333334e-13),  # [0.70, 0.71)
    (0.30679050522528838613e0, 0.58714723032745403331e-2, 0.62248031602197686791e-4, 0.53724185766200945789e-6,
     0.37827999418960232678e-8, 0.21490291930444538307e-10, 0.95513539182222222221e-13),  # [0.71, 0.72)
    (0.31878680111173319425e0, 0.61270341192339103514e-2, 0.65564012259707640976e-4, 0.56837930287837738996e-6,
     0.40035151353392378882e-8, 0.22662596341239294792e-10, 0.99891109760000000000e-13),  # [0.72, 0.73)
    (0.33130773722152622027e0, 0.63962406646798080903e-2, 0.69072209592942396666e-4, 0.60133006661885941812e-6,
     0.42362183765883466691e-8, 0.23888182347073698382e-10, 0.10439349811555555556e-12),  # [0.73, 0.74)
    (0.34438138658041336523e0, 0.66798829540414007258e-2, 0.72783795518603561144e-4, 0.63619220443228800680e-6,
     0.44814499336514453364e-8, 0.25168535651285475274e-10, 0.10901861383111111111e-12),  # [0.74, 0.75)
    (0.35803744972380175583e0, 0.69787978834882685031e-2, 0.76710543371454822497e-4, 0.67306815308917386747e-6,
     0.47397647975845228205e-8, 0.26505114141143050509e-10, 0.11376390933333333333e-12),  # [0.75, 0.76)
    (0.37230734890119724188e0, 0.72938706896461381003e-2, 0.80864854542670714092e-4, 0.71206484718062688779e-6,
     0.50117323769745883805e-8, 0.27899342394100074165e-10, 0.11862637614222222222e-12),  # [0.76, 0.77)
    (0.38722432730555448223e0, 0.76260375162549802745e-2, 0.85259785810004603848e-4, 0.75329383305171327677e-6,
     0.52979361368388119355e-8, 0.29352606054164086709e-10, 0.12360253370666666667e-12),  # [0.77, 0.78)
    (0.40282355354616940667e0, 0.79762880915029728079e-2, 0.89909077342438246452e-4, 0.79687137961956194579e-6,
     0.55989731807360403195e-8, 0.30866246101464869050e-10, 0.12868841946666666667e-12),  # [0.78, 0.79)
    (0.41914223158913787649e0, 0.83456685186950463538e-2, 0.94827181359250161335e-4, 0.84291858561783141014e-6,
     0.59154537751083485684e-8, 0.32441553034347469291e-10, 0.13387957943111111111e-12),  # [0.79, 0.80)
    (0.43621971639463786896e0, 0.87352841828289495773e-2, 0.10002929142066799966e-3, 0.89156148280219880024e-6,
     0.62480008150788597147e-8, 0.34079760983458878910e-10, 0.13917107176888888889e-12),  # [0.80, 0.81)
    (0.45409763548534330981e0, 0.91463027755548240654e-2, 0.10553137232446167258e-3, 0.94293113464638623798e-6,
     0.65972492312219959885e-8, 0.35782041795476563662e-10, 0.14455745872000000000e-12),  # [0.81, 0.82)
    (0.47282001668512331468e0, 0.95799574408860463394e-2, 0.11135019058000067469e-3, 0.99716373005509038080e-6,
     0.69638453369956970347e-8, 0.37549499088161345850e-10, 0.15003280712888888889e-12),  # [0.82, 0.83)
    (0.49243342227179841649e0, 0.10037550043909497071e-1, 0.11750334542845234952e-3, 0.10544006716188967172e-5,
     0.73484461168242224872e-8, 0.39383162326435752965e-10, 0.15559069118222222222e-12),  # [0.83, 0.84)
    (0.51298708979209258326e0, 0.10520454564612427224e-1, 0.12400930037494996655e-3, 0.11147886579371265246e-5,
     0.77517184550568711454e-8, 0.41283980931872622611e-10, 0.16122419680000000000e-12),  # [0.84, 0.85)
    (0.53453307979101369843e0, 0.11030120618800726938e-1, 0.13088741519572269581e-3, 0.11784797595374515432e-5,
     0.81743383063044825400e-8, 0.43252818449517081051e-10, 0.16692592640000000000e-12),  # [0.85, 0.86)
    (0.55712643071169299478e0, 0.11568077107929735233e-1, 0.13815797838036651289e-3, 0.12456314879260904558e-5,
     0.86169898078969313597e-8, 0.45290446811539652525e-10, 0.17268801084444444444e-12),  # [0.86, 0.87)
    (0.58082532122519320968e0, 0.12135935999503877077e-1, 0.14584223996665838559e-3, 0.13164068573095710742e-5,
     0.90803643355106020163e-8, 0.47397540713124619155e-10, 0.17850211608888888889e-12),  # [0.87, 0.88)
    (0.60569124025293375554e0, 0.12735396239525550361e-1, 0.15396244472258863344e-3, 0.13909744385382818253e-5,
     0.95651595032306228245e-8, 0.49574672127669041550e-10, 0.18435945564444444444e-12),  # [0.88, 0.89)
    (0.63178916494715716894e0, 0.13368247798287030927e-1, 0.16254186562762076141e-3, 0.14695084048334056083e-5,
     0.10072078109604152350e-7, 0.51822304995680707483e-10, 0.19025081422222222222e-12),  # [0.89, 0.90)
    (0.65918774689725319200e0, 0.14036375850601992063e-1, 0.17160483760259706354e-3, 0.15521885688723188371e-5,
     0.10601827031535280590e-7, 0.54140790105837520499e-10, 0.19616655146666666667e-12),  # [0.90, 0.91)
    (0.68795950683174433822e0, 0.14741765091365869084e-1, 0.18117679143520433835e-3, 0.16392004108230585213e-5,
     0.11155116068018043001e-7, 0.56530360194925690374e-10, 0.20209663662222222222e-12),  # [0.91, 0.92)
    (0.71818103808729967036e0, 0.15486504187117112279e-1, 0.19128428784550923217e-3, 0.17307350969359975848e-5,
     0.11732656736113607751e-7, 0.58991125287563833603e-10, 0.20803065333333333333e-12),  # [0.92, 0.93)
    (0.74993321911726254661e0, 0.16272790364044783382e-1, 0.20195505163377912645e-3, 0.18269894883203346953e-5,
     0.12335161021630225535e-7, 0.61523068312169087227e-10, 0.21395783431111111111e-12),  # [0.93, 0.94)
    (0.78330143531283492729e0, 0.17102934132652429240e-1, 0.21321800585063327041e-3, 0.19281661395543913713e-5,
     0.12963340087354341574e-7, 0.64126040998066348872e-10, 0.21986708942222222222e-12),  # [0.94, 0.95)
    (0.81837581041023811832e0, 0.17979364149044223802e-1, 0.22510330592753129006e-3, 0.20344732868018175389e-5,
     0.13617902941839949718e-7, 0.66799760083972474642e-10, 0.22574701262222222222e-12),  # [0.95, 0.96)
    (0.85525144775685126237e0, 0.18904632212547561026e-1, 0.23764237370371255638e-3, 0.21461248251306387979e-5,
     0.14299555071870523786e-7, 0.69543803864694171934e-10, 0.23158593688888888889e-12),  # [0.96, 0.97)
    (0.89402868170849933734e0, 0.19881418399127202569e-1, 0.25086793128395995798e-3, 0.22633402747585233180e-5,
     0.15008997042116532283e-7, 0.72357609075043941261e-10, 0.23737194737777777778e-12),  # [0.97, 0.98)
    (0.93481333942870796363e0, 0.20912536329780368893e-1, 0.26481403465998477969e-3, 0.23863447359754921676e-5,
     0.15746923065472184451e-7, 0.75240468141720143653e-10, 0.24309291271111111111e-12),  # [0.98, 0.99)
    (0.97771701335885035464e0, 0.22000938572830479551e-1, 0.27951610702682383001e-3, 0.25153688325245314530e-5,
     0.16514019547822821453e-7, 0.78191526829368231251e-10, 0.24873652355555555556e-12),  # [0.99, 1.00)
)
# fmt: on
# rows below this one serve y < 0.0741, i.e. x > 50, where the continued fraction is used instead
_ERFCX_FIRST_ROW = 7
_INV_SQRT_PI = 0.56418958354775628694807945156
_SQRT1_2 = 0.707106781186547524400844362104849039


def _erfcx_y100(y100: Tensor) -> Tensor:
    """erfcx(x) for 0 <= x <= 50, given y100 = 400 / (4 + x) in [7.4, 100]."""
    row = torch.floor(y100)
    t = 2.0 * y100 - (2.0 * row + 1.0)
    # The C++ switch over the row, as a chain of selects per coefficient (no gather among the
    # primitives); the last row is the default, rows that no x <= 50 reaches are left out.
    coeffs = [_full(y100, c) for c in _ERFCX_Y100_TABLE[-1]]
    for k in range(_ERFCX_FIRST_ROW, len(_ERFCX_Y100_TABLE) - 1):
        hit = row == float(k)
        coeffs = [torch.where(hit, _full(y100, c), prev) for c, prev in zip(_ERFCX_Y100_TABLE[k], coeffs, strict=True)]
    result = coeffs[-1]
    for c_tensor in reversed(coeffs[:-1]):
        result = result * t + c_tensor
    # y100 = 100 only for x < 4 eps, where erfcx is 1 to within 1e-15 (the switch's fallthrough)
    return _select(y100 >= 100.0, 1.0, result)


def _erfcx_nonnegative(x: Tensor) -> Tensor:
    """erfcx(x) for x >= 0; other lanes are don't-care."""
    table = _erfcx_y100(400.0 / (4.0 + x))
    # x > 50: continued fraction 1/sqrt(pi) / (x + 0.5/(x + 1/(x + 1.5/(x + 2/x)))), multiplied out
    x2 = x * x
    fraction = _INV_SQRT_PI * (x2 * (x2 + 4.5) + 2.0) / (x * (x2 * (x2 + 5.0) + 3.75))
    # x > 5e7: its first term only, where x**4 would overflow
    leading = _INV_SQRT_PI / x
    return torch.where(x > 50.0, torch.where(x > 5e7, leading, fraction), table)


def erfcx(x: Tensor) -> Tensor:
    """``aten.special_erfcx``: exp(x**2) erfc(x)."""
    x, dtype = _unary_input(x)
    positive = _erfcx_nonnegative(torch.abs(x))
    # x < 0: erfcx(x) = 2 exp(x**2) - erfcx(-x); below -6.1 the second term no longer shows,
    # below -26.7 the first overflows even float64
    twice_exp = 2.0 * torch.exp(x * x)
    negative = torch.where(x < -6.1, twice_exp, twice_exp - positive)
    negative = _select(x < -26.7, _INF, negative)
    result = torch.where(x >= 0.0, positive, negative)
    return torch.where(torch.isnan(x), x, result).to(dtype)


def _exp_neg_square(t: Tensor) -> Tensor:
    """exp(-t**2) for t >= 0 without the rounding error of t*t.

    t*t is off by up to t**2 eps / 2, which exp turns into a relative error as large (3e-6 at t = 9 in
    float32). With t = hi + lo, hi a multiple of 2**-7 below 30, hi*hi is exact and lo (t + hi) small.
    """
    t = torch.clamp(t, max=30.0)  # exp(-900) is 0 even in float64; keeps hi*hi exact
    hi = torch.round(t * 128.0) / 128.0
    lo = t - hi
    return torch.exp(-hi * hi) * torch.exp(-lo * (t + hi))


def log_ndtr(x: Tensor) -> Tensor:
    """``aten.special_log_ndtr``: log of the standard normal CDF, log(erfc(-x / sqrt 2) / 2)."""
    x, dtype = _unary_input(x)
    t = x * _SQRT1_2
    # one erfcx of |t| serves both branches: -t for x < -1, t where t >= 0.5
    scaled = _erfcx_nonnegative(torch.abs(t))
    # x < -1: log(erfc(t) / 2) with erfc(t) = exp(-t**2) erfcx(-t), the exponent kept out of the log
    lower = torch.log(scaled / 2.0) - t * t
    # x >= -1: log1p(-erfc(t) / 2); erfc as 1 - erf while it is near 1, from erfcx in the tail
    erfc_t = torch.where(t < 0.5, 1.0 - torch.erf(t), _exp_neg_square(t) * scaled)
    upper = torch.log1p(-0.5 * erfc_t)
    return torch.where(x < -1.0, lower, upper).to(dtype)


# --------------------------------------------------------------------------------------------------
# frexp
# --------------------------------------------------------------------------------------------------


def frexp(x: Tensor) -> tuple[Tensor, Tensor]:
    """``aten.frexp.Tensor``: x = mantissa * 2**exponent with 0.5 <= |mantissa| < 1, exactly.

    Without bit access the exponent is found by binary search: scale by 2**-p where |m| >= 2**p for
    p = 64, 32, ..., 1, then by 2**p where |m| < 2**-p. Multiplying by a power of two is exact, and each
    intermediate lies between x and the result, so nothing overflows or underflows. 0, +-inf and nan
    come back unchanged with exponent 0, as in PyTorch.
    """
    if not x.dtype.is_floating_point:
        raise TypeError(f"frexp only supports floating-point dtypes, got {x.dtype}")
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    # float32 spans 2**-149 .. 2**128, float64 2**-1074 .. 2**1024 (the first upward step twice: the
    # largest power of two cannot cover the subnormals in one step)
    top = 512 if compute == torch.float64 else 64
    down_steps = [top >> i for i in range(top.bit_length())]
    up_steps = [top, *down_steps]
    m = x.to(compute)
    exponent = torch.zeros_like(m)
    for p in down_steps:
        step = torch.abs(m) >= 2.0**p
        m = torch.where(step, m * 2.0**-p, m)
        exponent = torch.where(step, exponent + p, exponent)
    step = torch.abs(m) >= 1.0
    m = torch.where(step, m * 0.5, m)
    exponent = torch.where(step, exponent + 1.0, exponent)
    for p in up_steps:
        step = torch.abs(m) < 2.0**-p
        m = torch.where(step, m * 2.0**p, m)
        exponent = torch.where(step, exponent - p, exponent)
    special = torch.logical_or(x == 0, torch.logical_not(torch.isfinite(x)))
    mantissa = torch.where(special, x, m.to(x.dtype))
    exponent = torch.where(special, torch.zeros_like(exponent), exponent)
    return mantissa, exponent.to(torch.int32)


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.lgamma.default: lgamma,
    aten.digamma.default: digamma,
    aten.polygamma.default: polygamma,
    aten.special_zeta.default: zeta,
    aten.special_zeta.self_scalar: zeta_self_scalar,
    aten.special_zeta.other_scalar: zeta_other_scalar,
    aten.erfinv.default: erfinv,
    aten.special_ndtri.default: ndtri,
    aten.special_erfcx.default: erfcx,
    aten.special_log_ndtr.default: log_ndtr,
    aten.frexp.Tensor: frexp,
}
