"""The Bessel-family decompositions agree with PyTorch's own kernels, branch by branch and at the edges.

Each decomposition is called eagerly on real tensors and compared with the ATen op it replaces (PyTorch's
CPU kernel is the ground truth): dense grids that cross every branch point of the algorithm, the float
neighbours of each branch point, and the special values (signed zeros, infinities, NaN, subnormals, huge
values, negative inputs to the K and Y functions).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode

from torchburn.special_functions.bessel import DECOMPOSITIONS

aten = torch.ops.aten

OPS: list[Any] = [
    aten.i0.default,
    aten.special_i0e.default,
    aten.special_i1.default,
    aten.special_i1e.default,
    aten.special_modified_bessel_i0.default,
    aten.special_modified_bessel_i1.default,
    aten.special_modified_bessel_k0.default,
    aten.special_modified_bessel_k1.default,
    aten.special_scaled_modified_bessel_k0.default,
    aten.special_scaled_modified_bessel_k1.default,
    aten.special_bessel_j0.default,
    aten.special_bessel_j1.default,
    aten.special_bessel_y0.default,
    aten.special_bessel_y1.default,
    aten.special_spherical_bessel_j0.default,
    aten.special_airy_ai.default,
]
IDS = [op.__name__.split(".")[0] for op in OPS]

# Where each kernel switches approximation (both signs are probed: the odd/even functions fold x to |x|).
BRANCH_POINTS: dict[Any, tuple[float, ...]] = {
    aten.i0.default: (8.0,),
    aten.special_i0e.default: (8.0,),
    aten.special_i1.default: (8.0,),
    aten.special_i1e.default: (8.0,),
    aten.special_modified_bessel_i0.default: (8.0,),
    aten.special_modified_bessel_i1.default: (8.0,),
    aten.special_modified_bessel_k0.default: (2.0,),
    aten.special_modified_bessel_k1.default: (2.0,),
    aten.special_scaled_modified_bessel_k0.default: (2.0,),
    aten.special_scaled_modified_bessel_k1.default: (2.0,),
    aten.special_bessel_j0.default: (5.0, 1e-5),
    aten.special_bessel_j1.default: (5.0,),
    aten.special_bessel_y0.default: (5.0, 1e-5),
    aten.special_bessel_y1.default: (5.0,),
    aten.special_spherical_bessel_j0.default: (0.5,),
    aten.special_airy_ai.default: (2.09, 8.3203353, 103.892),
}

SPECIAL_VALUES = [
    *(0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0),
    *(1e-45, 3e-45, 1e-40, 1e-38, 2e-38, 1e-30, 1e-10, 1e-6),  # subnormal and tiny
    *(30.0, 88.0, 88.8, 89.0, 92.0, 104.0, 200.0, 1e4, 1e6, 1e10, 1e30, 3e38),  # exp(x) overflows float32 from 88.7
]

# float32: PyTorch's kernels and the decompositions round differently (fused multiply-adds, library exp and
# sin), so results differ by a few ulps; near the zeros of the oscillating functions the absolute tolerance
# applies. Observed: relative error below 1e-6, absolute below 5e-7.
RTOL_32, ATOL_32 = 1e-5, 2e-6
RTOL_64, ATOL_64 = 1e-11, 1e-13


def _grid(op: Any, dtype: torch.dtype) -> torch.Tensor:
    """Dense points on [-30, 30] and [-100, 100], every branch point with its float neighbours (both
    signs), and the special values (both signs)."""
    points = [torch.linspace(-30.0, 30.0, 6001, dtype=dtype), torch.linspace(-100.0, 100.0, 4001, dtype=dtype)]
    branch = torch.tensor(BRANCH_POINTS[op], dtype=dtype)
    branch = torch.cat([branch, -branch])
    up, down = torch.full_like(branch, math.inf), torch.full_like(branch, -math.inf)
    for _ in range(3):  # three float steps either side
        points += [branch, torch.nextafter(branch, up), torch.nextafter(branch, down)]
        branch = torch.nextafter(branch, up)
    special = torch.tensor(SPECIAL_VALUES, dtype=dtype)
    points += [special, -special]
    return torch.cat(points)


def _check(op: Any, x: torch.Tensor, rtol: float, atol: float) -> None:
    expected = op(x)
    got = DECOMPOSITIONS[op](x)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    # infinities and NaN must sit exactly where PyTorch's are; finite values within tolerance
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)


def test_every_op_has_a_decomposition() -> None:
    assert set(DECOMPOSITIONS) == set(OPS)
    assert all(callable(fn) for fn in DECOMPOSITIONS.values())


def _airy_phase_tolerance(x: torch.Tensor) -> torch.Tensor:
    """Four float32 ulps of Ai's phase (2/3)|x|^1.5 for x < 0, times its amplitude |x|^-1/4 / sqrt(pi)."""
    ax = x.double().abs()
    return 4 * torch.finfo(torch.float32).eps * (2 / 3) * ax**1.5 * ax**-0.25 / math.sqrt(math.pi)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_float32_matches_torch(op: Any) -> None:
    x = _grid(op, torch.float32)
    if op is aten.special_airy_ai.default:
        # For x < -2.09, Ai is sin/cos of the phase (2/3)|x|^1.5 + pi/4, about 670 at x = -100 where a float32 ulp
        # is 6e-5, so a one-ulp difference in the phase moves Ai by up to an ulp of the phase times |Ai|. The
        # kernel's std::sqrt is correctly rounded; eager torch.sqrt on CPU is not always (one ulp off), so the
        # phases can differ by an ulp or two. test_airy_ai_negative_tail_given_a_correctly_rounded_sqrt shows
        # that this is the only difference.
        tail = x < -2.09
        _check(op, x[~tail], RTOL_32, ATOL_32)
        expected, got = op(x[tail]), DECOMPOSITIONS[op](x[tail])
        assert torch.equal(got.isnan(), expected.isnan())
        tolerance = ATOL_32 + RTOL_32 * expected.abs() + _airy_phase_tolerance(x[tail])
        finite = expected.isfinite()
        assert bool(((got - expected).abs() <= tolerance)[finite].all())
        return
    _check(op, x, RTOL_32, ATOL_32)


class _CorrectlyRoundedSqrt(TorchFunctionMode):
    """``torch.sqrt`` rounded once from float64, as the C++ kernels' ``std::sqrt``."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func is torch.sqrt:
            (x,) = args
            return torch.sqrt(x.double()).to(x.dtype)
        return func(*args, **(kwargs or {}))


def test_airy_ai_negative_tail_given_a_correctly_rounded_sqrt() -> None:
    x = torch.linspace(-100.0, -2.09, 20001)
    expected = torch.special.airy_ai(x)
    with _CorrectlyRoundedSqrt():
        got = DECOMPOSITIONS[aten.special_airy_ai.default](x)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=2e-7)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_float64_matches_torch(op: Any) -> None:
    x = _grid(op, torch.float64)
    if op is aten.special_airy_ai.default:
        x = x[x.isnan() | (x.abs() <= 1e6)]  # beyond, the float64 phase is noise too (see the float32 test)
    _check(op, x, RTOL_64, ATOL_64)


@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_special_values_are_exact(op: Any, dtype: torch.dtype) -> None:
    """0, -0, +-inf, NaN, subnormals and huge values give exactly PyTorch's inf/NaN/0 (and close values)."""
    special = torch.tensor(SPECIAL_VALUES, dtype=dtype)
    x = torch.cat([special, -special])
    expected, got = op(x), DECOMPOSITIONS[op](x)
    assert torch.equal(got.isnan(), expected.isnan())
    finite = expected.isfinite()
    assert torch.equal(got[~finite & ~expected.isnan()], expected[~finite & ~expected.isnan()])
    assert torch.equal(got[finite] == 0, expected[finite] == 0)
    rtol, atol = (RTOL_32, ATOL_32) if dtype == torch.float32 else (RTOL_64, ATOL_64)
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_sign_of_zero(op: Any) -> None:
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf])
    expected, got = op(x), DECOMPOSITIONS[op](x)
    zero = expected == 0
    assert torch.equal(torch.signbit(got[zero]), torch.signbit(expected[zero]))


@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool], ids=["int64", "int32", "bool"])
def test_integer_input_promotes_to_default_dtype(op: Any, dtype: torch.dtype) -> None:
    x = torch.arange(-12, 13).to(dtype)
    expected, got = op(x), DECOMPOSITIONS[op](x)
    assert got.dtype == expected.dtype == torch.get_default_dtype()
    torch.testing.assert_close(got, expected, rtol=RTOL_32, atol=ATOL_32, equal_nan=True)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_integer_input_follows_a_float64_default(op: Any) -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        x = torch.arange(-12, 13)
        expected, got = op(x), DECOMPOSITIONS[op](x)
    finally:
        torch.set_default_dtype(previous)
    assert got.dtype == expected.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=RTOL_64, atol=ATOL_64, equal_nan=True)


@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_types_compute_in_float32(op: Any, dtype: torch.dtype) -> None:
    x = torch.linspace(-12.0, 12.0, 241).to(dtype)
    got = DECOMPOSITIONS[op](x)
    assert got.dtype == dtype
    # PyTorch's CPU kernels upcast to float32 and round the result back (where they take half types at all);
    # float32 results a few ulps apart can round to neighbouring half values: the default half tolerances
    expected = op(x.float()).to(dtype)
    torch.testing.assert_close(got, expected, equal_nan=True)
    if op in (aten.i0.default, aten.special_i0e.default, aten.special_i1.default, aten.special_i1e.default):
        torch.testing.assert_close(got, op(x), equal_nan=True)


@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (2, 3, 4)], ids=["0d", "empty", "empty2d", "3d"])
def test_shapes(op: Any, shape: tuple[int, ...]) -> None:
    x = torch.full(shape, 1.75) if shape == () else torch.linspace(-6.0, 6.0, math.prod(shape)).reshape(shape)
    expected, got = op(x), DECOMPOSITIONS[op](x)
    assert got.shape == torch.Size(shape)
    torch.testing.assert_close(got, expected, rtol=RTOL_32, atol=ATOL_32, equal_nan=True)


def test_odd_functions_keep_their_symmetry() -> None:
    x = torch.linspace(0.0, 40.0, 4001)
    for op in (aten.special_i1.default, aten.special_i1e.default, aten.special_bessel_j1.default):
        fn = DECOMPOSITIONS[op]
        assert torch.equal(fn(-x), -fn(x))
    for op in (aten.i0.default, aten.special_bessel_j0.default, aten.special_spherical_bessel_j0.default):
        fn = DECOMPOSITIONS[op]
        assert torch.equal(fn(-x), fn(x))


# What an elementwise engine is guaranteed to have: arithmetic, exp/log/sqrt, trigonometry, comparisons,
# where, constant fills and dtype casts.
ALLOWED = {
    aten._to_copy.default,
    aten.abs.default,
    aten.add.Tensor,
    aten.sub.Tensor,
    aten.mul.Tensor,
    aten.div.Tensor,
    aten.neg.default,
    aten.reciprocal.default,
    aten.exp.default,
    aten.log.default,
    aten.sqrt.default,
    aten.sin.default,
    aten.cos.default,
    aten.isinf.default,
    aten.eq.Scalar,
    aten.lt.Scalar,
    aten.le.Scalar,
    aten.gt.Scalar,
    aten.ge.Scalar,
    aten.where.self,
    aten.full_like.default,
    aten.zeros_like.default,
    aten.ones_like.default,
}


@pytest.mark.parametrize("op", OPS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int64], ids=str)
def test_traces_to_basic_elementwise_ops(op: Any, dtype: torch.dtype) -> None:
    """Under fake tensors (no value reads) the decomposition is a graph of basic elementwise ops only."""
    fn: Callable[[torch.Tensor], torch.Tensor] = DECOMPOSITIONS[op]
    graph = make_fx(fn, tracing_mode="fake")(torch.ones(2, 3, dtype=dtype)).graph
    used = {node.target for node in graph.nodes if node.op == "call_function"}
    assert used <= ALLOWED, used - ALLOWED


def test_float32_errors_are_small_away_from_zeros() -> None:
    """The tolerance above is not what hides a wrong branch: the non-oscillating functions agree with
    PyTorch to a few ulps everywhere they are finite and nonzero."""
    x = torch.cat([torch.linspace(-30.0, 30.0, 6001), torch.logspace(-30, 1.9, 500)])
    for op in OPS[:10]:
        expected, got = op(x), DECOMPOSITIONS[op](x)
        keep = expected.isfinite() & (expected != 0)
        rel = ((got - expected).abs() / expected.abs())[keep]
        assert rel.max().item() < 4e-6, op
