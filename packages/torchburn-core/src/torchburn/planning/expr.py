"""Fused elementwise expressions, shared by every engine: the node, its function vocabulary and the
compute-type rule.

An elementwise chain is not written to memory op by op: each lowering returns an :class:`Expr` over its
operands, and the engine turns the whole tree into one sweep (a fused instruction, a generated shader)
when a result is needed in memory. The node and the names of its functions are the same for every
engine; each engine supplies a *code table* from these names to its own code (the native engine's
Rust instruction functions, the wgpu engine's WGSL templates) and declines a node its table lacks.

Which type a node computes in is PyTorch's own rule, as its CPU kernels apply it: half types (float16,
bfloat16) compute in float32 and are rounded when stored; float64 computes in float64; integers in the
engine's integer type; bool as bool where the engine has one. An engine maps these four compute types
to its own (the native engine computes integers and bools in i64, WGSL in i32 and bool).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .errors import PlanError

ComputeType = Literal["f64", "f32", "int", "bool"]

_HALF = frozenset({torch.float16, torch.bfloat16})


def compute_type(dtype: torch.dtype) -> ComputeType:
    """The type an expression producing or reading ``dtype`` computes in."""
    if dtype == torch.float64:
        return "f64"
    if dtype == torch.float32 or dtype in _HALF:
        return "f32"
    if dtype == torch.bool:
        return "bool"
    if dtype.is_floating_point or dtype.is_complex:
        raise ValueError(f"no elementwise compute type for {dtype}")
    return "int"


def promoted_compute_type(*dtypes: torch.dtype) -> ComputeType:
    """The compute type of an expression over operands of ``dtypes``: PyTorch's type promotion, then
    :func:`compute_type`."""
    result = dtypes[0]
    for dtype in dtypes[1:]:
        result = torch.promote_types(result, dtype)
    return compute_type(result)


# ---- the vocabulary ------------------------------------------------------------------------------
# Functions of one operand. Their meaning is PyTorch's op of the same name (``identity`` is a copy,
# ``square`` is x*x, ``is_*`` and ``signbit`` test a float).
UNARY = frozenset(
    {
        "identity", "neg", "abs", "relu", "sign", "floor", "ceil", "round", "trunc", "square",
        "reciprocal", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
        "erf", "erfc", "sigmoid", "silu", "gelu", "gelu_tanh", "hardswish", "hardsigmoid",
        "is_nan", "is_inf", "is_finite", "signbit", "logical_not", "bitwise_not",
    }
)  # fmt: skip
# Functions of two operands. ``div`` is true division, ``div_trunc``/``div_floor`` its rounding modes,
# ``remainder`` Python's modulo (the divisor's sign), ``fmod`` C's (the dividend's sign).
BINARY = frozenset(
    {
        "add", "sub", "mul", "div", "div_trunc", "div_floor", "remainder", "fmod", "pow",
        "maximum", "minimum", "fmax", "fmin", "atan2", "copysign", "hypot",
        "bit_and", "bit_or", "bit_xor", "shl", "shr",
        "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
        "chebyshev_t", "chebyshev_u", "chebyshev_v", "chebyshev_w", "hermite_h", "hermite_he",
        "laguerre_l", "legendre_p",
    }
)  # fmt: skip
# the orthogonal polynomials, by the ``torch.special`` function each one is
POLYNOMIALS = {
    "chebyshev_t": "chebyshev_polynomial_t",
    "chebyshev_u": "chebyshev_polynomial_u",
    "chebyshev_v": "chebyshev_polynomial_v",
    "chebyshev_w": "chebyshev_polynomial_w",
    "hermite_h": "hermite_polynomial_h",
    "hermite_he": "hermite_polynomial_he",
    "laguerre_l": "laguerre_polynomial_l",
    "legendre_p": "legendre_polynomial_p",
}
# the functions that yield a bool whatever their operands compute in
PREDICATES = frozenset(
    {"is_nan", "is_inf", "is_finite", "signbit", "logical_not", "eq", "ne", "lt", "le", "gt", "ge"}
    | {"logical_and", "logical_or", "logical_xor"}
)
# the nodes that are not functions: a load of an operand, a constant, the output's linear index (as
# ``arange`` and position masks need), a three-way select, and a conversion between compute types
LEAVES = frozenset({"load", "const", "position"})
STRUCTURE = frozenset({"where", "cast"})


@dataclass(frozen=True, eq=False)
class Expr:
    """One node of a fused elementwise expression.

    ``op`` is a function of :data:`UNARY` or :data:`BINARY` over ``args``, or ``where`` (args: condition,
    then the values for true and false), ``cast`` (one arg, converted to ``type``), ``load`` (``leaf``:
    the engine's own description of the operand), ``const`` (``value``) or ``position``. ``type`` is what
    the node yields. Nodes compare by identity: a shared sub-expression is computed once.
    """

    op: str
    type: ComputeType
    args: tuple[Expr, ...] = ()
    leaf: Any = None
    value: float | int | bool = 0

    def __post_init__(self) -> None:
        arity = 1 if self.op in UNARY or self.op == "cast" else 2 if self.op in BINARY else None
        if self.op == "where":
            arity = 3
        if self.op in LEAVES:
            arity = 0
        if arity is None:
            raise PlanError(f"{self.op!r} is not an elementwise function")
        if len(self.args) != arity:
            raise PlanError(f"{self.op} takes {arity} operands, got {len(self.args)}")


def load(leaf: Any, type: ComputeType) -> Expr:
    """A read of ``leaf`` (an engine's operand), converted to ``type``."""
    return Expr("load", type, leaf=leaf)


def const(value: float | int | bool, type: ComputeType) -> Expr:
    """A Python number as a constant of ``type``."""
    return Expr("const", type, value=value)


def position(type: ComputeType = "int") -> Expr:
    """The linear index of the output element being computed."""
    return Expr("position", type)


def apply(fn: str, *args: Expr, type: ComputeType | None = None) -> Expr:
    """``fn`` over ``args``; it yields bool for a predicate, else the first operand's type unless told."""
    if type is None:
        type = "bool" if fn in PREDICATES else args[0].type
    return Expr(fn, type, tuple(args))


def where(cond: Expr, if_true: Expr, if_false: Expr) -> Expr:
    """``if_true`` where ``cond`` holds, else ``if_false`` (both of one type)."""
    return Expr("where", if_true.type, (cond, if_true, if_false))


def cast(expr: Expr, type: ComputeType) -> Expr:
    """``expr`` converted to ``type`` the way PyTorch converts dtypes (float to int truncates)."""
    return expr if expr.type == type else Expr("cast", type, (expr,))


def nodes(expr: Expr) -> Iterator[Expr]:
    """Every distinct node of ``expr``, operands before the nodes that use them."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        e, expanded = stack.pop()
        if id(e) in seen:
            continue
        if expanded or not e.args:
            seen.add(id(e))
            yield e
            continue
        stack.append((e, True))
        stack.extend((a, False) for a in reversed(e.args))


def leaves(expr: Expr) -> list[Any]:
    """The distinct operands ``expr`` loads, in first-use order."""
    return list(dict.fromkeys(e.leaf for e in nodes(expr) if e.op == "load"))


def map_leaves(expr: Expr, change: Callable[[Any], Any]) -> Expr:
    """``expr`` with every load's operand replaced by ``change(operand)`` (shared nodes stay shared)."""
    done: dict[int, Expr] = {}
    for e in nodes(expr):
        if e.op == "load":
            done[id(e)] = Expr("load", e.type, leaf=change(e.leaf))
        elif e.args:
            done[id(e)] = Expr(e.op, e.type, tuple(done[id(a)] for a in e.args), value=e.value)
        else:
            done[id(e)] = e
    return done[id(expr)]


def require(table: Mapping[str, Any], engine: str, expr: Expr) -> None:
    """Raise :class:`PlanError` naming the first function of ``expr`` that ``engine``'s code table lacks."""
    for e in nodes(expr):
        if (e.op in UNARY or e.op in BINARY) and e.op not in table:
            raise PlanError(f"the {engine} engine has no code for elementwise {e.op!r}")
