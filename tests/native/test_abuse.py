"""Edge cases an engine gets wrong first: empty tensors, broadcasting, NaN/inf, odd and huge sizes, strided
inputs, integer/bool/half dtypes, threads, and memory over many calls.

Every case runs in strict mode (fallback="error"), is compared with PyTorch eager (same dtype, output dtype
checked) and proves the engine ran it (torchburn.coverage(): nodes ran in the engine, none fell back).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchburn

Compile = Callable[..., Callable[..., Any]]
Ran = Callable[..., None]

NAN, INF = float("nan"), float("inf")
EXACT = {"rtol": 0.0, "atol": 0.0}


def _randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _check(
    compile_engine: Compile,
    assert_engine_ran: Ran,
    fn: Callable[..., Any],
    *inputs: Any,
    rtol: float = 1e-4,
    atol: float = 1e-4,
    **compile_kwargs: Any,
) -> Any:
    """Compile ``fn`` strictly, run it, compare with eager (NaN == NaN, dtypes equal); returns the result."""
    with torch.no_grad():
        expected = fn(*inputs)
        actual = compile_engine(fn, **compile_kwargs)(*inputs)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    assert_engine_ran()
    return actual


# --- zero-size tensors ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0)], ids=str)
def test_zero_size_elementwise_reductions_softmax(
    shape: tuple[int, ...], compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            (x * 2 + y).relu(),
            x.exp() - y.sigmoid(),
            x.sum(),  # 0.0
            x.sum(-1),  # zeros for (3, 0)
            x.mean(),  # nan
            x.mean(0),
            x.softmax(-1),
            torch.where(x > y, x, y),
        )

    out = _check(compile_engine, assert_engine_ran, f, _randn(*shape), _randn(*shape, seed=1))
    assert out[2].item() == 0.0


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((3, 0), (0, 4)), ((0, 5), (5, 4)), ((3, 5), (5, 0)), ((2, 3, 0), (2, 0, 4))],
    ids=["k0", "m0", "n0", "bmm_k0"],
)
def test_zero_size_matmul(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    """k == 0 must give zeros (an engine that skips the loop and leaves its output buffer unset fails)."""
    out = _check(compile_engine, assert_engine_ran, lambda a, b: a @ b, _randn(*a_shape), _randn(*b_shape))
    assert out.shape == (*a_shape[:-1], b_shape[-1])
    assert torch.count_nonzero(out) == 0


def test_zero_size_linear_is_bias(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    out = _check(compile_engine, assert_engine_ran, F.linear, _randn(3, 0), _randn(4, 0), _randn(4, seed=2))
    torch.testing.assert_close(out, _randn(4, seed=2).expand(3, 4), **EXACT)


def test_zero_size_cat_piece(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    def f(a: torch.Tensor, e: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.cat([a, e, b]) * 1, torch.cat([e, a], 0) + 1, torch.cat([a.t(), e.t()], 1) - 1

    _check(compile_engine, assert_engine_ran, f, _randn(2, 5), _randn(0, 5), _randn(3, 5, seed=3), **EXACT)


# --- broadcasting --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((1,), (5,)),
        ((5,), (1,)),
        ((3, 1), (1, 4)),
        ((2, 1, 4), (3, 1)),
        ((), (3, 4)),
        ((3, 4), ()),
        ((), ()),
        ((1, 1, 1), (1, 5, 1)),
        ((4, 1, 3, 1), (5, 1, 6)),
        ((1, 7), (1, 1, 7)),
    ],
    ids=str,
)
def test_broadcasting(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            a + b,
            a * b - b,
            torch.maximum(a, b),
            torch.where(a > b, a, b),
            a / (b.abs() + 1.0),
            (a - b).pow(2) + 1.5,
        )

    a, b = _randn(*a_shape, seed=1), _randn(*b_shape, seed=2)
    out = _check(compile_engine, assert_engine_ran, f, a, b)
    assert out[0].shape == torch.broadcast_shapes(a.shape, b.shape)


def test_expand_then_op(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    def f(x: torch.Tensor, y: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        big = x.unsqueeze(0).expand(4, 3, 5)
        return big * y + s, x.expand(3, 5) - y[0], (big + 1).sum(0), y.expand(2, 4, 3, 5).amax(1) * s

    _check(compile_engine, assert_engine_ran, f, _randn(3, 1), _randn(1, 3, 5, seed=1), torch.tensor(2.5))


# --- NaN and inf ---------------------------------------------------------------------------------
def _specials() -> tuple[torch.Tensor, torch.Tensor]:
    """(6, 8) inputs: rows 0-2 hold NaN / ±inf / ±0 / huge values, rows 3-5 are ordinary."""
    x = _randn(6, 8, seed=11)
    y = _randn(6, 8, seed=12)
    x[0, :6] = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 1e30])
    x[1, 1] = INF
    x[1, 5] = -INF
    x[2, 3] = NAN
    y[0, :6] = torch.tensor([1.0, -INF, -INF, INF, NAN, -1e30])
    y[2, 0] = -INF
    return x, y


NAN_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
    "exp": lambda x, y: x.exp(),
    "log": lambda x, y: x.log(),  # log(negative) = nan, log(±0) = -inf
    "relu": lambda x, y: x.relu(),  # relu(nan) is nan, not 0
    "gelu": lambda x, y: F.gelu(x),
    "sigmoid": lambda x, y: x.sigmoid(),
    "tanh": lambda x, y: x.tanh(),
    "maximum": lambda x, y: torch.maximum(x, y),  # propagates nan (unlike fmax)
    "minimum": lambda x, y: torch.minimum(x, y),
    "max_min_dim": lambda x, y: (x.max(-1).values, x.min(0).values),
    "sum": lambda x, y: (x.sum(-1), x.sum()),
    "amax_amin": lambda x, y: (x.amax(-1), x.amin(0), x.amax()),
    "softmax": lambda x, y: (x.softmax(-1), x.log_softmax(0)),
    "matmul": lambda x, y: x @ y.t(),
}


@pytest.mark.parametrize("op", list(NAN_OPS))
def test_nan_inf_propagation(op: str, compile_engine: Compile, assert_engine_ran: Ran) -> None:
    x, y = _specials()
    expected = NAN_OPS[op](x, y)
    first = expected[0] if isinstance(expected, tuple) else expected
    assert not torch.isfinite(first).all(), "the case must produce a non-finite value"
    _check(compile_engine, assert_engine_ran, NAN_OPS[op], x, y)


def test_softmax_of_all_minus_inf_row(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    """A fully masked attention row: eager gives NaN; an engine that subtracts max must not invent zeros."""
    x = _randn(3, 6)
    x[1] = -INF
    x[2, :3] = -INF
    out = _check(compile_engine, assert_engine_ran, lambda t: t.softmax(-1), x)
    assert torch.isnan(out[1]).all()


# --- odd and large sizes -------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1009, 4099, 65537])
def test_prime_sizes(n: int, compile_engine: Compile, assert_engine_ran: Ran) -> None:
    """Lengths that are no multiple of any SIMD width or block size: tails must be right."""

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x * 2 + y).relu(), x.exp() * y, x.sum(), x.amax(), x.softmax(-1), x.view(1, n) + y.view(n, 1)[:7]

    _check(compile_engine, assert_engine_ran, f, _randn(n), _randn(n, seed=1), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((1, 4099), (4099, 1)),
        ((4099, 1), (1, 3)),
        ((1, 4099), (4099, 7)),
        ((7, 4099), (4099, 1)),
        ((1009, 1), (1, 1009)),
    ],
    ids=["dot", "outer", "row_times_matrix", "matrix_times_col", "outer_square"],
)
def test_thin_matmul(
    a_shape: tuple[int, int], b_shape: tuple[int, int], compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    _check(
        compile_engine, assert_engine_ran, torch.mm, _randn(*a_shape), _randn(*b_shape, seed=1), rtol=1e-4, atol=1e-3
    )


@pytest.mark.parametrize(("rows", "cols"), [(1, 4099), (4099, 1)], ids=["1xN", "Nx1"])
def test_thin_elementwise(rows: int, cols: int, compile_engine: Compile, assert_engine_ran: Ran) -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x + y, (x * y).relu(), x.sum(0), x.sum(1), x.softmax(0), x.softmax(1)

    _check(compile_engine, assert_engine_ran, f, _randn(rows, cols), _randn(rows, cols, seed=1), atol=1e-3)


def test_large_elementwise(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    n = 2**24 + 3
    x = _randn(n)
    out = _check(compile_engine, assert_engine_ran, lambda t: (t * 2 + 1).relu() - t, x, **EXACT)
    assert out.shape == (n,)


# --- non-contiguous inputs -----------------------------------------------------------------------
def _layouts() -> dict[str, Callable[[], torch.Tensor]]:
    """Ways to hand a (7, 5) float tensor to a program; all but "contiguous" are views."""
    return {
        "contiguous": lambda: _randn(7, 5, seed=20),
        "transposed": lambda: _randn(5, 7, seed=21).t(),
        "step_slice": lambda: _randn(7, 10, seed=22)[:, ::2],
        "row_step_col_step": lambda: _randn(14, 15, seed=23)[::2, 1::3],
        "expanded_rows": lambda: _randn(1, 5, seed=24).expand(7, 5),
        "expanded_cols": lambda: _randn(7, 1, seed=25).expand(7, 5),
        "storage_offset": lambda: _randn(8, 7, seed=26)[1:, 2:],
        "offset_transposed": lambda: _randn(9, 8, seed=27)[3:8, 1:].t(),
    }


LAYOUTS = list(_layouts())


def _exact_ops(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # each output is one correctly rounded op (x * 2 is exact), so any engine must match eager bit for bit
    return x + y, x * y, torch.maximum(x, y), (x - y).abs(), torch.where(x > y, x, -y), x.relu(), x * 2 + y


@pytest.mark.parametrize("layout", LAYOUTS[1:])
def test_non_contiguous_inputs_exact(layout: str, compile_engine: Compile, assert_engine_ran: Ran) -> None:
    layouts = _layouts()
    x = layouts[layout]()
    other = LAYOUTS[(LAYOUTS.index(layout) + 3) % len(LAYOUTS)]  # pair it with a different layout
    y = layouts[other]()
    assert x.shape == y.shape == (7, 5) and not x.is_contiguous()
    _check(compile_engine, assert_engine_ran, _exact_ops, x, y, **EXACT)
    _check(compile_engine, assert_engine_ran, _exact_ops, y, x, **EXACT)


def test_same_tensor_twice_and_channels_last(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    img = _randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert not img.is_contiguous()
    _check(compile_engine, assert_engine_ran, _exact_ops, img, img, **EXACT)


def test_non_contiguous_matmul_and_reductions(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a @ b, a.t() @ a, a.sum(0), a.sum(1), a.softmax(0), b.amax(1)

    layouts = _layouts()
    a = layouts["storage_offset"]()  # (7, 5), offset view
    b = _randn(9, 5, seed=30)[1:6].t()[:, ::2]  # (5, 3): offset, transposed, stepped
    _check(compile_engine, assert_engine_ran, f, a, b)


# --- dtypes --------------------------------------------------------------------------------------
INT_VALUES = {
    torch.int64: [2**40 + 1, -(2**41) + 7, 2**53 + 1, 2**61 - 1, -5, 0, 123456789012, -(2**62)],
    torch.int32: [2**30 + 1, -(2**30) + 7, 2**24 + 1, 2**31 - 1, -5, 0, 123456789, -(2**31)],
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_integer_arithmetic_is_exact(dtype: torch.dtype, compile_engine: Compile, assert_engine_ran: Ran) -> None:
    """Values beyond 2**24 (2**53 for int64) are not representable in float32 (float64): no float detour."""
    x = torch.tensor(INT_VALUES[dtype], dtype=dtype)
    y = torch.tensor([3, -7, 11, 2, 5, -1, 13, 1], dtype=dtype)

    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            a + 1,
            a - b,
            (a // 4) * 2,  # floor division then a product that stays in range
            a % 7,
            torch.div(a, b, rounding_mode="floor"),
            torch.div(a, b, rounding_mode="trunc"),
            torch.remainder(a, b),
            -a[:-1],  # -(min) would overflow
            torch.maximum(a, b),
            a.view(2, 4).sum(1) // 2,  # halves of sums: no overflow
            a == a + 0,
            a > b,
        )

    out = _check(compile_engine, assert_engine_ran, f, x, y, **EXACT)
    assert out[0][0].item() == INT_VALUES[dtype][0] + 1
    assert out[0].dtype == dtype and out[-1].dtype == torch.bool


def test_int64_sum_and_type_promotion(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    i = torch.tensor([2**40 + 1, 3, -(2**35), 2**50 + 7])
    f32 = _randn(4)

    def f(a: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask = a > 0
        return a.sum(), a * 0.5, a / 3, a + x, mask + a, mask.sum(), a.float(), (x * 100).long(), x.to(torch.int32)

    out = _check(compile_engine, assert_engine_ran, f, i, f32)
    assert out[0].item() == 2**40 + 1 + 3 - 2**35 + 2**50 + 7
    assert [o.dtype for o in out] == [
        torch.int64,
        torch.float32,
        torch.float32,
        torch.float32,
        torch.int64,
        torch.int64,
        torch.float32,
        torch.int64,
        torch.int32,
    ]


def test_comparisons_bool_and_where(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gt, ge, eq, ne, lt = a > b, a >= b, a == b, a != b, a < 0.25
        mask = (gt & ~lt) | eq
        return gt, ge, eq, ne, lt, mask, ~mask ^ ne, torch.where(mask, a, b), a.masked_fill(lt, -1.0), mask.any(1)

    a = _randn(5, 9)
    b = a.clone()
    b[::2] = _randn(3, 9, seed=1)  # some equal elements so == and >= matter
    out = _check(compile_engine, assert_engine_ran, f, a, b, **EXACT)
    assert all(o.dtype == torch.bool for i, o in enumerate(out) if i not in (7, 8))


def _float_ops(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        a * b + a,
        (a * 0.5).exp(),
        a.tanh(),
        F.gelu(a),
        b.sigmoid(),
        (a - b).relu() * 3,
        a @ b.t(),
        F.linear(a, b[:4], bias[:4]),
        F.layer_norm(a, (a.shape[-1],), w, bias),
        a.sum(-1),
        a.softmax(-1),
    )


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [
        (torch.float64, 1e-10),  # tight enough to catch a silent float32 detour (~1e-7)
        (torch.float16, 1e-2),
        (torch.bfloat16, 1e-2),
    ],
    ids=str,
)
def test_float_dtypes(dtype: torch.dtype, tol: float, compile_engine: Compile, assert_engine_ran: Ran) -> None:
    inputs = (
        _randn(8, 32, seed=1, dtype=dtype),
        _randn(8, 32, seed=2, dtype=dtype),
        (torch.rand(32, generator=torch.Generator().manual_seed(3)) + 0.5).to(dtype),
        _randn(32, seed=4, dtype=dtype),
    )
    out = _check(compile_engine, assert_engine_ran, _float_ops, *inputs, rtol=tol, atol=tol)
    assert all(o.dtype == dtype for o in out)


# --- threads -------------------------------------------------------------------------------------
def test_concurrent_calls_of_one_compiled_model(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    """8 threads x 50 calls, each thread its own input; every result is kept and checked at the end, so an
    engine that shares scratch or output buffers between threads or calls shows up."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16)).eval()
    threads, calls = 8, 50
    inputs = [_randn(4, 32, seed=100 + t) for t in range(threads)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
        fast = compile_engine(model)
        torch.testing.assert_close(fast(inputs[0]), expected[0], rtol=1e-4, atol=1e-4)  # compiles here
    compiled_once = torchburn.coverage()

    def worker(t: int) -> list[torch.Tensor]:
        # grad mode and Dynamo config patches are per thread; a recompile here would be a bug: raise on it
        with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
            return [fast(inputs[t]) for _ in range(calls)]

    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(worker, range(threads)))
    for t, outs in enumerate(results):
        assert len(outs) == calls
        for out in outs:
            torch.testing.assert_close(out, expected[t], rtol=1e-4, atol=1e-4)
    assert torchburn.coverage() == compiled_once, "the threads recompiled instead of reusing the program"
    assert_engine_ran(3)


# --- memory --------------------------------------------------------------------------------------
@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """PyTorch's own ops (eager, and the reference engine) on one thread for the duration of a test.

    On a small, busy machine, tiny ops on PyTorch's intra-op thread pool can cost ~10 ms each (threads
    waiting for each other), which would make 11,000 calls take minutes; with one thread they take ~0.1 ms.
    (An engine that sizes its pool from torch.get_num_threads() may see 1 too: irrelevant to memory.)"""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_torch_thread")
def test_repeated_calls_do_not_grow_memory(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU()).eval()
    x = _randn(8, 64)
    process = psutil.Process()
    with torch.no_grad():
        expected = model(x)
        fast = compile_engine(model)
        for _ in range(1_000):
            fast(x)
        gc.collect()
        before = process.memory_info().rss
        for _ in range(10_000):
            out = fast(x)
        gc.collect()
        after = process.memory_info().rss
    growth_mib = (after - before) / 2**20
    print(f"RSS growth over 10,000 calls: {growth_mib:.2f} MiB")
    assert growth_mib < 20, f"RSS grew {growth_mib:.1f} MiB over 10,000 calls"
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert_engine_ran(2)
