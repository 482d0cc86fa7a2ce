"""Every function of the shared elementwise vocabulary (``torchburn.planning.expr``), run through each
engine's code table, computes what PyTorch's op computes.

Each function is reached from an ATen op the engine lowers to it; a case where the op that reaches a
function differs by engine names the engine. The native table covers the whole vocabulary; the wgpu
table the functions it has WGSL for (its ``TEMPLATES``), and nothing outside the vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchburn
from helpers import engine_counts
from torchburn.planning.expr import BINARY, POLYNOMIALS, UNARY

Fn = Callable[..., Any]
g = torch.Generator().manual_seed(7)


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * 3


def _open_unit() -> torch.Tensor:
    return torch.rand(8, 33, generator=g) * 1.8 - 0.9


def _positive() -> torch.Tensor:
    return torch.rand(8, 33, generator=g) * 5 + 0.1


def _with_specials() -> torch.Tensor:
    x = _x(8, 33)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    return x


def _ints(low: int = -20, high: int = 20) -> torch.Tensor:
    return torch.randint(low, high, (8, 33), generator=g)


def _nonzero_ints() -> torch.Tensor:
    i = _ints(1, 9)
    return torch.where(torch.rand(8, 33, generator=g) < 0.5, -i, i)


def _bools() -> torch.Tensor:
    return torch.rand(8, 33, generator=g) < 0.5


def _degrees() -> torch.Tensor:
    """Degrees 0..11 as floats, some negative (the polynomial is then 0) or fractional (truncated)."""
    n = torch.randint(-1, 12, (8, 33), generator=g).float()
    return n + torch.where(torch.rand(8, 33, generator=g) < 0.2, 0.5, 0.0)


def _half_equal() -> tuple[torch.Tensor, torch.Tensor]:
    a = _x(8, 33).round()
    b = torch.where(torch.rand(8, 33, generator=g) < 0.5, a, _x(8, 33).round())
    return a, b


# function -> (callable, inputs), or {engine: (callable, inputs)} where the op reaching it differs
CASES: dict[str, Any] = {
    "identity": (lambda x: x.to(torch.int32), (_x(8, 33),)),
    "neg": (torch.neg, (_x(8, 33),)),
    "abs": (torch.abs, (_x(8, 33),)),
    "relu": (torch.relu, (_x(8, 33),)),
    "sign": (torch.sign, (_x(8, 33),)),
    "floor": (torch.floor, (_x(8, 33),)),
    "ceil": (torch.ceil, (_x(8, 33),)),
    "round": (torch.round, (_x(8, 33),)),
    "trunc": (torch.trunc, (_x(8, 33),)),
    "square": {"native": (lambda x: x**2, (_x(8, 33),)), "wgpu": (lambda x: x.var(1), (_x(8, 33),))},
    "reciprocal": (torch.reciprocal, (_positive(),)),
    "sqrt": (torch.sqrt, (_positive(),)),
    "rsqrt": (torch.rsqrt, (_positive(),)),
    "exp": (torch.exp, (_x(8, 33),)),
    "exp2": (torch.exp2, (_x(8, 33),)),
    "expm1": (torch.expm1, (_x(8, 33) * 1e-3,)),
    "log": (torch.log, (_positive(),)),
    "log2": (torch.log2, (_positive(),)),
    "log10": (torch.log10, (_positive(),)),
    "log1p": (torch.log1p, (_positive() * 1e-3,)),
    "sin": (torch.sin, (_x(8, 33),)),
    "cos": (torch.cos, (_x(8, 33),)),
    "tan": (torch.tan, (_open_unit(),)),
    "asin": (torch.asin, (_open_unit(),)),
    "acos": (torch.acos, (_open_unit(),)),
    "atan": (torch.atan, (_x(8, 33),)),
    "sinh": (torch.sinh, (_open_unit(),)),
    "cosh": (torch.cosh, (_open_unit(),)),
    "tanh": (torch.tanh, (_x(8, 33),)),
    "asinh": (torch.asinh, (_x(8, 33),)),
    "acosh": (torch.acosh, (_positive() + 1,)),
    "atanh": (torch.atanh, (_open_unit(),)),
    "erf": (torch.erf, (_x(8, 33),)),
    "erfc": (torch.erfc, (_x(8, 33),)),
    "sigmoid": (torch.sigmoid, (_x(8, 33),)),
    "silu": (F.silu, (_x(8, 33),)),
    "gelu": (F.gelu, (_x(8, 33),)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), (_x(8, 33),)),
    "hardswish": (F.hardswish, (_x(8, 33),)),
    "hardsigmoid": (F.hardsigmoid, (_x(8, 33),)),
    # wgpu reaches is_nan from the activations that pass NaN through
    "is_nan": {"native": (torch.isnan, (_with_specials(),)), "wgpu": (F.leaky_relu, (_with_specials(),))},
    "is_inf": (torch.isinf, (_with_specials(),)),
    "is_finite": (torch.isfinite, (_with_specials(),)),
    "signbit": (torch.signbit, (_with_specials(),)),
    "logical_not": (torch.logical_not, (_bools(),)),
    "bitwise_not": (torch.bitwise_not, (_ints(),)),
    "add": (torch.add, (_x(8, 33), _x(33))),
    "sub": (torch.sub, (_x(8, 33), _x(8, 1))),
    "mul": (torch.mul, (_x(8, 33), _x(8, 33))),
    "div": (torch.div, (_x(8, 33), _positive())),
    "div_trunc": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), (_ints(), _nonzero_ints())),
    "div_floor": (lambda a, b: torch.div(a, b, rounding_mode="floor"), (_ints(), _nonzero_ints())),
    "remainder": (torch.remainder, (_ints(), _nonzero_ints())),
    "fmod": (torch.fmod, (_x(8, 33), _positive())),
    "pow": (torch.pow, (_positive(), _x(8, 33) * 0.5)),
    "maximum": (torch.maximum, (_with_specials(), _x(8, 33))),
    "minimum": (torch.minimum, (_with_specials(), _x(8, 33))),
    "fmax": (torch.fmax, (_with_specials(), _x(8, 33))),
    "fmin": (torch.fmin, (_with_specials(), _x(8, 33))),
    "atan2": (torch.atan2, (_x(8, 33), _x(8, 33))),
    "copysign": (torch.copysign, (_x(8, 33), _with_specials())),
    "hypot": (torch.hypot, (_x(8, 33), _x(8, 33))),
    "bit_and": (torch.bitwise_and, (_ints(), _ints())),
    "bit_or": (torch.bitwise_or, (_ints(), _ints())),
    "bit_xor": (torch.bitwise_xor, (_ints(), _ints())),
    "shl": (torch.bitwise_left_shift, (_ints(), _ints(0, 8))),
    "shr": (torch.bitwise_right_shift, (_ints(), _ints(0, 8))),
    "eq": (torch.eq, _half_equal()),
    "ne": (torch.ne, _half_equal()),
    "lt": (torch.lt, _half_equal()),
    "le": (torch.le, _half_equal()),
    "gt": (torch.gt, _half_equal()),
    "ge": (torch.ge, _half_equal()),
    "logical_and": (torch.logical_and, (_bools(), _bools())),
    "logical_or": (torch.logical_or, (_bools(), _bools())),
    "logical_xor": (torch.logical_xor, (_bools(), _bools())),
    **{fn: (getattr(torch.special, name), (_open_unit() * 1.3, _degrees())) for fn, name in POLYNOMIALS.items()},
}


def _table(engine: str) -> set[str]:
    """The vocabulary functions an engine's code table has code for."""
    if engine == "native":
        from torchburn_native import expr_code

        return set(expr_code.UNARY_CODE) | set(expr_code.BINARY_CODE)
    from torchburn_wgpu import expr_code as wgsl

    return set(wgsl.TEMPLATES)


ENGINES = [e.name for e in torchburn.list_engines() if e.available and e.name in ("native", "wgpu")]
PAIRS = [(engine, fn) for engine in ENGINES for fn in sorted(_table(engine))]


def test_every_function_has_a_case() -> None:
    assert set(CASES) == UNARY | BINARY


@pytest.mark.parametrize("engine", ENGINES)
def test_code_tables_speak_the_shared_vocabulary(engine: str) -> None:
    table = _table(engine)
    assert table <= UNARY | BINARY, f"{engine} has code for names outside the vocabulary: {table - UNARY - BINARY}"
    if engine == "native":
        assert table == UNARY | BINARY


@pytest.mark.parametrize(("engine", "fn"), PAIRS, ids=[f"{e}-{f}" for e, f in PAIRS])
def test_function_matches_eager(engine: str, fn: str) -> None:
    case = CASES[fn]
    op, inputs = case[engine] if isinstance(case, dict) else case
    with torch.no_grad():
        expected = op(*inputs)
        actual = torch.compile(op, backend="torchburn", options={"engine": engine, "fallback": "error"})(*inputs)
    torch.testing.assert_close(actual, expected, rtol=2e-5, atol=2e-5, equal_nan=True)
    ran, fell = engine_counts(engine)
    assert ran > 0 and fell == 0
