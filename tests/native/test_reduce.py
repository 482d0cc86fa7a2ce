"""Sums, means and variances on the native engine (``lowering/reduce.py``, ``kernels/reduce.rs``) against
eager, strict: the f32 fast path over contiguous and strided blocks, the staged path of the other
dtypes, and ``var_mean`` as one instruction that writes both results."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch


def _input(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    # an offset far from zero, so a variance computed as E[x²] - E[x]² would lose its digits
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 1000).to(dtype)


def _reduce_instrs() -> list[dict[str, Any]]:
    from torchburn_native.program import recent_regions

    region = recent_regions()[-1]
    with region._lock:
        plans = list(region._plans.values())
    instrs = [i for _, planned in plans for i in json.loads(planned.plan_json)["instrs"]]
    return [i for i in instrs if i["kind"] == "reduce"]


def _check(
    compile_engine: Callable[..., Any],
    assert_engine_ran: Callable[..., None],
    fn: Callable[..., Any],
    x: torch.Tensor,
    tol: float,
) -> None:
    with torch.no_grad():
        expected = fn(x)
        actual = compile_engine(fn)(x)
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)
    assert_engine_ran()


# (shape, dims, view of the input): a contiguous row, a channel's planes (batch norm's statistics), a
# reduction across rows (runs of stride > 1), every dim, a transposed input
CASES = {
    "rows": ((64, 1000), -1, None),
    "batch_norm_planes": ((4, 6, 9, 11), [0, 2, 3], None),
    "columns": ((300, 17), 0, None),
    "all": ((5, 7, 33), None, None),
    "transposed": ((40, 24), 1, "t"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("keepdim", [False, True])
def test_var_mean_is_one_instruction_writing_both(
    case: str, keepdim: bool, engine_name: str, compile_engine: Any, assert_engine_ran: Any
) -> None:
    shape, dims, view = CASES[case]
    x = _input(shape)

    def fn(t: torch.Tensor) -> Any:
        t = t.t() if view == "t" else t
        return torch.var_mean(t, dims, correction=1, keepdim=keepdim)

    _check(compile_engine, assert_engine_ran, fn, x, 1e-5)
    if engine_name == "native":
        (instr,) = _reduce_instrs()
        assert instr["op"] == "var" and "mean_out" in instr


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("op", ["sum", "mean", "var", "std"])
def test_f32_sums_and_variances(case: str, op: str, compile_engine: Any, assert_engine_ran: Any) -> None:
    shape, dims, view = CASES[case]
    x = _input(shape)
    reduce: Callable[..., torch.Tensor] = getattr(torch, op)

    def fn(t: torch.Tensor) -> torch.Tensor:
        t = t.t() if view == "t" else t
        return reduce(t) if dims is None else reduce(t, dims)

    _check(compile_engine, assert_engine_ran, fn, x, 1e-5)


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float64, 1e-10), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)], ids=str
)
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_var_mean_other_dtypes_and_corrections(
    dtype: torch.dtype, tol: float, correction: int, compile_engine: Any, assert_engine_ran: Any
) -> None:
    x = (torch.randn(6, 50, generator=torch.Generator().manual_seed(5)) * 2 + 3).to(dtype)
    _check(compile_engine, assert_engine_ran, lambda t: torch.var_mean(t, 1, correction=correction), x, tol)


def test_var_mean_of_too_few_elements_is_nan(compile_engine: Any, assert_engine_ran: Any) -> None:
    x = _input((4, 1))
    with torch.no_grad():
        var, mean = compile_engine(lambda t: torch.var_mean(t, 1))(x)
    assert torch.isnan(var).all()
    torch.testing.assert_close(mean, x[:, 0])
    assert_engine_ran()
