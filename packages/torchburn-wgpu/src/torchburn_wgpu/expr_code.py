"""The wgpu engine's code table for the shared elementwise expression (:mod:`torchburn.planning.expr`):
a WGSL template per function, by the type its operands compute in.

Templates name their operands ``{0}``, ``{1}``... (each a ``let`` the generated kernel already holds);
``tb_*`` helpers live in ``shaders/math.wgsl`` and ``shaders/math64.wgsl``. The shared ``int`` type is
WGSL's ``i32``. A function missing for a type is declined at planning (``PlanError``), and the node falls
back with the rest of its region.
"""

from __future__ import annotations

from torchburn.planning import ComputeType, Expr, PlanError, expr

from .kernels import f32_literal, f64_literal

# the WGSL type of each shared compute type
WGSL_KIND: dict[ComputeType, str] = {"f32": "f32", "f64": "f64", "int": "i32", "bool": "bool"}

# the "wrapped past zero" test of integer division and modulo, shared by their templates
_INEXACT = "({0} % {1} != 0i)"
_SIGNS_DIFFER = "(({0} < 0i) != ({1} < 0i))"

# function -> template for every operand type, or template per operand type
TEMPLATES: dict[str, str | dict[ComputeType, str]] = {
    "neg": "(-{0})",
    "abs": "abs({0})",
    "relu": {"f32": "tb_max({0}, 0.0)", "f64": "tb_max64({0}, 0.0lf)", "int": "max({0}, 0i)"},
    "square": "({0} * {0})",
    "exp": {"f32": "exp({0})"},
    "log": {"f32": "log({0})"},
    "sqrt": {"f32": "sqrt({0})"},
    "rsqrt": {"f32": "inverseSqrt({0})"},
    "reciprocal": {"f32": "(1.0 / {0})"},
    "sin": {"f32": "sin({0})"},
    "cos": {"f32": "cos({0})"},
    "tanh": {"f32": "tb_tanh({0})"},
    "tan": {"f32": "tan({0})"},
    # through atan2: some drivers' asin/acos are off by 1e-4 (1 - x² as (1 - x)(1 + x) keeps its digits)
    "asin": {"f32": "atan2({0}, sqrt((1.0 - {0}) * (1.0 + {0})))"},
    "acos": {"f32": "atan2(sqrt((1.0 - {0}) * (1.0 + {0})), {0})"},
    "atan": {"f32": "atan({0})"},
    "sinh": {"f32": "sinh({0})"},
    "cosh": {"f32": "cosh({0})"},
    # asinh through |x|: x + sqrt(x² + 1) cancels for large negative x
    "asinh": {"f32": "(sign({0}) * log(abs({0}) + sqrt({0} * {0} + 1.0)))"},
    "acosh": {"f32": "log({0} + sqrt({0} * {0} - 1.0))"},
    "atanh": {"f32": "(0.5 * log((1.0 + {0}) / (1.0 - {0})))"},
    "exp2": {"f32": "exp2({0})"},
    "log2": {"f32": "log2({0})"},
    "log10": {"f32": "(log2({0}) * 0.30102999566398120)"},
    "sigmoid": {"f32": "tb_sigmoid({0})"},
    "erf": {"f32": "tb_erf({0})"},
    "silu": {"f32": "({0} * tb_sigmoid({0}))"},
    "gelu": {"f32": "tb_gelu_erf({0})"},
    "gelu_tanh": {"f32": "tb_gelu_tanh({0})"},
    "hardsigmoid": {"f32": "(tb_min(tb_max({0} + 3.0, 0.0), 6.0) / 6.0)"},
    "hardswish": {"f32": "({0} * tb_min(tb_max({0} + 3.0, 0.0), 6.0) / 6.0)"},
    "floor": {"f32": "floor({0})"},
    "ceil": {"f32": "ceil({0})"},
    "trunc": {"f32": "trunc({0})"},
    "round": {"f32": "round({0})"},
    "sign": {"f32": "sign({0})"},
    # exp(x) - 1 and log(1 + x) lose every digit near 0: use the series there
    "expm1": {"f32": "select(exp({0}) - 1.0, {0} + 0.5 * {0} * {0}, abs({0}) < 1e-4)"},
    "log1p": {"f32": "select(log(1.0 + {0}), {0} - 0.5 * {0} * {0}, abs({0}) < 1e-4)"},
    "is_nan": {"f32": "tb_isnan({0})", "f64": "tb_isnan64({0})"},
    "is_inf": {"f32": "(abs({0}) == bitcast<f32>(0x7f800000u))"},
    "is_finite": {"f32": "((bitcast<u32>({0}) & 0x7f800000u) != 0x7f800000u)"},
    "signbit": {"f32": "((bitcast<u32>({0}) & 0x80000000u) != 0u)"},
    # 1 - erf(x) keeps erfc's absolute error; its relative error grows in the far tail (x > 3)
    "erfc": {"f32": "(1.0 - tb_erf({0}))"},
    "logical_not": {"bool": "(!{0})"},
    "add": "({0} + {1})",
    "sub": "({0} - {1})",
    "mul": "({0} * {1})",
    "div": {"f32": "({0} / {1})"},
    "pow": {"f32": "tb_pow({0}, {1})"},
    "atan2": {"f32": "atan2({0}, {1})"},
    "copysign": {"f32": "select(abs({0}), -abs({0}), (bitcast<u32>({1}) & 0x80000000u) != 0u)"},
    "hypot": {"f32": "tb_hypot({0}, {1})"},
    # torch.special's orthogonal polynomials (shaders/orthogonal.wgsl)
    **{fn: {"f32": f"tb_{fn}({{0}}, {{1}})"} for fn in expr.POLYNOMIALS},
    # NaN-ignoring: a NaN operand yields the other one
    "fmax": {"f32": "select(select(max({0}, {1}), {0}, tb_isnan({1})), {1}, tb_isnan({0}))"},
    "fmin": {"f32": "select(select(min({0}, {1}), {0}, tb_isnan({1})), {1}, tb_isnan({0}))"},
    "maximum": {"f32": "tb_max({0}, {1})", "f64": "tb_max64({0}, {1})", "int": "max({0}, {1})"},
    "minimum": {"f32": "tb_min({0}, {1})", "f64": "tb_min64({0}, {1})", "int": "min({0}, {1})"},
    # integers: WGSL's `/` truncates; floor division steps down when the signs differ and it is inexact
    # (PyTorch raises on integer division by zero; here it yields 0 rather than a hang or a crash)
    "div_trunc": {"f32": "trunc({0} / {1})", "int": "select({0} / {1}, 0i, {1} == 0i)"},
    "div_floor": {
        "f32": "floor({0} / {1})",
        "int": f"select({{0}} / {{1}} - select(0i, 1i, {_INEXACT} && {_SIGNS_DIFFER}), 0i, {{1}} == 0i)",
    },
    # Python's modulo: the result takes the divisor's sign
    "remainder": {
        "f32": "({0} - floor({0} / {1}) * {1})",
        "int": "select(select({0} % {1}, {0} % {1} + {1}, "
        "({0} % {1} != 0i) && (({0} % {1} < 0i) != ({1} < 0i))), 0i, {1} == 0i)",
    },
    # C's fmod: the result takes the dividend's sign (WGSL's `%` truncates, for floats and integers)
    "fmod": {"f32": "({0} % {1})", "int": "select({0} % {1}, 0i, {1} == 0i)"},
    "eq": "({0} == {1})",
    "ne": "({0} != {1})",
    "lt": "({0} < {1})",
    "le": "({0} <= {1})",
    "gt": "({0} > {1})",
    "ge": "({0} >= {1})",
    "logical_and": {"bool": "({0} && {1})"},
    "logical_or": {"bool": "({0} || {1})"},
    "logical_xor": {"bool": "({0} != {1})"},
}

# conversions between compute types, as PyTorch converts dtypes (float to int truncates)
CASTS: dict[tuple[ComputeType, ComputeType], str] = {
    ("bool", "f32"): "select(0.0, 1.0, {0})",
    ("bool", "int"): "select(0i, 1i, {0})",
    ("bool", "f64"): "select(0.0lf, 1.0lf, {0})",
    ("int", "f32"): "f32({0})",
    ("int", "f64"): "f64({0})",
    ("f32", "int"): "i32({0})",
    ("f32", "f64"): "f64({0})",
    ("f64", "f32"): "f32({0})",
    ("f64", "int"): "i32({0})",
    ("f32", "bool"): "({0} != 0.0)",
    ("f64", "bool"): "({0} != 0.0lf)",
    ("int", "bool"): "({0} != 0i)",
}

INT_MIN = -(2**31)


def supports(fn: str, operand_type: ComputeType) -> bool:
    """Whether the table has ``fn`` over operands computed in ``operand_type``."""
    entry = TEMPLATES.get(fn)
    return isinstance(entry, str) or (entry is not None and operand_type in entry)


def template(e: Expr) -> str:
    """The WGSL template of a function, ``where`` or ``cast`` node."""
    if e.op == "where":
        return "select({2}, {1}, {0})"
    if e.op == "cast":
        return CASTS[(e.args[0].type, e.type)]
    entry = TEMPLATES.get(e.op)
    operand = e.args[0].type
    if isinstance(entry, dict):
        entry = entry.get(operand)
    if entry is None:
        raise PlanError(f"the wgpu engine has no code for elementwise {e.op!r} over {operand}")
    return entry


def literal(e: Expr, index: str) -> str:
    """A leaf that is no load, inline: a constant (exact in its type) or the output's linear index."""
    if e.op == "position":
        return f"{WGSL_KIND[e.type]}({index})"
    value = e.value
    if e.type == "bool":
        return "true" if value else "false"
    if e.type == "int":
        if float(value) != int(value) or not INT_MIN <= int(value) < 2**31:
            raise PlanError(f"constant {value} is not a 32-bit integer")
        # -2**31 has no literal: its magnitude is out of range before the minus applies
        return "bitcast<i32>(0x80000000u)" if int(value) == INT_MIN else f"i32({int(value)})"
    if e.type == "f64":
        return f64_literal(float(value))
    return f32_literal(float(value))
