"""Elementwise ops: each becomes an expression over its operands, fused by the planner into the
kernel that finally writes a result; nothing here launches a kernel itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchburn.planning import ComputeType, Expr, Family, PlanError, expr

from .. import expr_code
from ..planner import Lazy, Planner, constant
from ..values import KINDS, Value
from . import ALL, ANY, F32, F32_HALF, FLOATS, INTS, NUMERIC, FxNode, lower, shape_of

aten = torch.ops.aten


def kind_of(x: Any) -> ComputeType:
    """The type a tensor operand or Python scalar computes in."""
    if isinstance(x, (Value, Lazy)):
        return KINDS[x.dtype]
    if isinstance(x, bool):
        return "bool"
    return "int" if isinstance(x, int) else "f32"


def operands(p: Planner, values: Sequence[Any], shape: tuple[int, ...], compute: ComputeType) -> list[Expr]:
    """Each of ``values`` as an expression of ``compute`` over ``shape``: tensors converted, Python
    scalars as exact constants of it (an integer constant in a float computation stays exact; a float
    one in an integer computation would mean PyTorch promoted the result to float, so it never comes)."""
    return [
        expr.cast(p.lazy(x, shape), compute) if isinstance(x, (Value, Lazy)) else constant(x, compute) for x in values
    ]


def result(tree: Expr, out: Any) -> Lazy:
    """``tree`` as a lazy result of the output's dtype and shape."""
    return Lazy(expr.cast(tree, KINDS[out.dtype]), out.dtype, shape_of(out))


def function(p: Planner, fn: str, values: Sequence[Any], out: Any, compute: ComputeType | None = None) -> Lazy:
    """``fn`` of the shared vocabulary over ``values``, computed in ``compute`` (by default the output's
    type); declined when the code table has no WGSL for it in that type."""
    compute = compute or KINDS[out.dtype]
    if not expr_code.supports(fn, compute):
        raise PlanError(f"elementwise {fn} over {compute}")
    return result(expr.apply(fn, *operands(p, values, shape_of(out), compute)), out)


UNARY_FLOAT = {
    aten.exp.default: "exp",
    aten.log.default: "log",
    aten.sqrt.default: "sqrt",
    aten.rsqrt.default: "rsqrt",
    aten.reciprocal.default: "reciprocal",
    aten.sin.default: "sin",
    aten.cos.default: "cos",
    aten.tanh.default: "tanh",
    aten.tan.default: "tan",
    aten.asin.default: "asin",
    aten.acos.default: "acos",
    aten.atan.default: "atan",
    aten.sinh.default: "sinh",
    aten.cosh.default: "cosh",
    aten.asinh.default: "asinh",
    aten.acosh.default: "acosh",
    aten.atanh.default: "atanh",
    aten.exp2.default: "exp2",
    aten.log2.default: "log2",
    aten.log10.default: "log10",
    aten.sigmoid.default: "sigmoid",
    aten.erf.default: "erf",
    aten.silu.default: "silu",
    aten.hardsigmoid.default: "hardsigmoid",
    aten.hardswish.default: "hardswish",
    aten.floor.default: "floor",
    aten.ceil.default: "ceil",
    aten.trunc.default: "trunc",
    aten.round.default: "round",
    aten.sign.default: "sign",
    aten.expm1.default: "expm1",
    aten.log1p.default: "log1p",
    aten.erfc.default: "erfc",
}


@lower(UNARY_FLOAT, family=Family.ELEMENTWISE, dtypes=F32_HALF)
def _unary_float(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    return function(p, UNARY_FLOAT[node.target], [args[0]], out)


SIGNED = {aten.neg.default: "neg", aten.abs.default: "abs"}


@lower(aten.relu.default, family=Family.ELEMENTWISE, dtypes=FLOATS | INTS)
def _relu(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    return function(p, "relu", [args[0]], p.out_meta())


@lower(SIGNED, family=Family.ELEMENTWISE, dtypes=FLOATS | INTS)
def _signed(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    return function(p, SIGNED[node.target], [args[0]], out)


def _gelu_check(spec: Any) -> bool | str:
    approximate = spec.kwargs.get("approximate", "none")
    return True if approximate in ("none", "tanh") else f"gelu approximate={approximate!r}"


@lower(aten.gelu.default, family=Family.ELEMENTWISE, dtypes=F32_HALF, check=_gelu_check)
def _gelu(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    fn = "gelu_tanh" if node.kwargs.get("approximate", "none") == "tanh" else "gelu"
    return function(p, fn, [args[0]], out)


# add/sub/mul compute in the output's type (ints stay ints)
ARITH = {
    aten.add.Tensor: "add",
    aten.add.Scalar: "add",
    aten.sub.Tensor: "sub",
    aten.sub.Scalar: "sub",
    aten.mul.Tensor: "mul",
    aten.mul.Scalar: "mul",
    aten.maximum.default: "maximum",
    aten.minimum.default: "minimum",
}


@lower(ARITH, family=Family.ELEMENTWISE, dtypes=ALL)
def _arith(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    # bools add and multiply as 0/1 integers, then turn back into bools (True + True is True)
    compute: ComputeType = "int" if out.dtype == torch.bool else KINDS[out.dtype]
    fn = ARITH[node.target]
    if not expr_code.supports(fn, compute):
        raise PlanError(f"elementwise {fn} over {compute}")
    alpha = node.kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    a, b = operands(p, args[:2], shape_of(out), compute)
    if alpha != 1:  # a ± alpha·b
        b = expr.apply("mul", b, constant(alpha, compute))
    return result(expr.apply(fn, a, b), out)


FLOAT_BINARY = {
    aten.div.Tensor: "div",
    aten.div.Scalar: "div",
    aten.pow.Tensor_Tensor: "pow",
    aten.pow.Tensor_Scalar: "pow",
    aten.pow.Scalar: "pow",
    aten.atan2.default: "atan2",
    aten.copysign.Tensor: "copysign",
    aten.hypot.default: "hypot",
    aten.fmax.default: "fmax",
    aten.fmin.default: "fmin",
}


def _true_division(spec: Any) -> bool | str:
    return True if spec.kwargs.get("rounding_mode") is None else "div with rounding_mode"


@lower(FLOAT_BINARY, family=Family.ELEMENTWISE, dtypes=NUMERIC | F32_HALF, check=_true_division)
def _float_binary(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    if KINDS[out.dtype] != "f32":
        raise PlanError(f"{node.target} with a {out.dtype} result")
    return function(p, FLOAT_BINARY[node.target], args[:2], out)


def _rounded_division(spec: Any) -> bool | str:
    mode = spec.kwargs.get("rounding_mode")
    return True if mode in ("floor", "trunc") else f"div with rounding_mode={mode!r}"


@lower(aten.div.Tensor_mode, family=Family.ELEMENTWISE, dtypes=NUMERIC, check=_rounded_division)
def _div_rounded(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    fn = "div_floor" if node.kwargs["rounding_mode"] == "floor" else "div_trunc"
    return function(p, fn, args[:2], out, "f32" if KINDS[out.dtype] == "f32" else "int")


_FMOD = (aten.fmod.Scalar, aten.fmod.Tensor)


@lower([aten.remainder.Scalar, aten.remainder.Tensor, *_FMOD], family=Family.ELEMENTWISE, dtypes=NUMERIC)
def _modulo(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    """``remainder`` is Python's modulo (the result takes the divisor's sign), ``fmod`` C's (the dividend's)."""
    out = p.out_meta()
    fn = "fmod" if node.target in _FMOD else "remainder"
    return function(p, fn, args[:2], out, "f32" if KINDS[out.dtype] == "f32" else "int")


def _positive_or_nan(x: Expr) -> Expr:
    """x > 0, or x is NaN (which the activations below pass through unchanged)."""
    return expr.apply("logical_or", expr.apply("gt", x, constant(0.0, x.type)), expr.apply("is_nan", x))


@lower(aten.elu.default, family=Family.ELEMENTWISE, dtypes=F32)
def _elu(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    alpha, scale, input_scale = (float(args[i]) if len(args) > i else 1.0 for i in (1, 2, 3))
    (x,) = operands(p, args[:1], shape_of(out), "f32")
    negative = expr.apply(
        "mul", constant(alpha, "f32"), expr.apply("expm1", expr.apply("mul", x, constant(input_scale, "f32")))
    )
    return result(expr.apply("mul", constant(scale, "f32"), expr.where(_positive_or_nan(x), x, negative)), out)


COMPARE: dict[Any, str] = {}


for _name in ("gt", "lt", "ge", "le", "eq", "ne"):
    for _overload in ("Tensor", "Scalar"):
        COMPARE[getattr(getattr(aten, _name), _overload)] = _name


@lower(COMPARE, family=Family.ELEMENTWISE, dtypes=ALL)
def _compare(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    # in the operands' promoted type: a float anywhere compares as float, else as integers
    kinds = {kind_of(x) for x in args[:2]}
    compute: ComputeType = "f64" if "f64" in kinds else "f32" if "f32" in kinds else "int"
    return function(p, COMPARE[node.target], args[:2], out, compute)


LOGICAL = {
    aten.logical_and.default: "logical_and",
    aten.logical_or.default: "logical_or",
    aten.logical_xor.default: "logical_xor",
    aten.bitwise_and.Tensor: "logical_and",
    aten.bitwise_or.Tensor: "logical_or",
    aten.bitwise_xor.Tensor: "logical_xor",
}


def _bool_bitwise(spec: Any) -> bool | str:
    if "bitwise" in str(spec.target) and any(s.dtype != torch.bool for s in spec.tensor_inputs):
        return "bitwise ops on integers"
    return True


@lower(LOGICAL, family=Family.ELEMENTWISE, dtypes=ANY, check=_bool_bitwise)
def _logical(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    return function(p, LOGICAL[node.target], args[:2], p.out_meta(), compute="bool")


@lower([aten.logical_not.default, aten.bitwise_not.default], family=Family.ELEMENTWISE, dtypes=ANY, check=_bool_bitwise)
def _logical_not(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    return function(p, "logical_not", args[:1], p.out_meta(), compute="bool")


@lower(aten.where.self, family=Family.ELEMENTWISE, dtypes=ALL)
def _where(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    shape = shape_of(out)
    (cond,) = operands(p, args[:1], shape, "bool")
    a, b = operands(p, args[1:3], shape, KINDS[out.dtype])
    return result(expr.where(cond, a, b), out)


@lower(
    [aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.hardtanh.default],
    family=Family.ELEMENTWISE,
    dtypes=F32_HALF | INTS,
)
def _clamp(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    if node.target == aten.clamp_min.default:
        lo, hi = args[1], None
    elif node.target == aten.clamp_max.default:
        lo, hi = None, args[1]
    elif node.target == aten.hardtanh.default:
        lo, hi = (args[1] if len(args) > 1 else -1.0), (args[2] if len(args) > 2 else 1.0)
    else:
        lo = node.kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = node.kwargs.get("max", args[2] if len(args) > 2 else None)
    return _clamped(p, args[0], lo, hi, out)


def _clamped(p: Planner, x: Any, lo: Any, hi: Any, out: Any) -> Lazy:
    """max(x, lo) then min(·, hi), in the output's type (bounds may be scalars or tensors)."""
    compute = KINDS[out.dtype]
    shape = shape_of(out)
    (tree,) = operands(p, [x], shape, compute)
    if lo is not None:
        (bound,) = operands(p, [lo], shape, compute)
        tree = expr.apply("maximum", tree, bound)
    if hi is not None:
        (bound,) = operands(p, [hi], shape, compute)
        tree = expr.apply("minimum", tree, bound)
    return result(tree, out)


@lower(aten.clamp.Tensor, family=Family.ELEMENTWISE, dtypes=F32_HALF | INTS)
def _clamp_tensor(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    lo = node.kwargs.get("min", args[1] if len(args) > 1 else None)
    hi = node.kwargs.get("max", args[2] if len(args) > 2 else None)
    return _clamped(p, args[0], lo, hi, p.out_meta())


@lower(aten.isnan.default, family=Family.COMPARISON, dtypes=ALL)
def _isnan(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    if kind_of(args[0]) in ("int", "bool"):  # integers are never NaN
        return result(constant(False, "bool"), out)
    return function(p, "is_nan", args[:1], out, compute=kind_of(args[0]))


FLOAT_TESTS = {aten.isinf.default: "is_inf", aten.isfinite.default: "is_finite", aten.signbit.default: "signbit"}


@lower(FLOAT_TESTS, family=Family.COMPARISON, dtypes=ALL)
def _float_test(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    """isinf, isfinite, signbit: of integers, as PyTorch answers them without looking at the bits."""
    out = p.out_meta()
    fn = FLOAT_TESTS[node.target]
    if kind_of(args[0]) in ("int", "bool"):
        if fn == "signbit":
            (x,) = operands(p, args[:1], shape_of(out), "int")
            return result(expr.apply("lt", x, constant(0, "int")), out)
        return result(constant(fn == "is_finite", "bool"), out)
    return function(p, fn, args[:1], out, compute=kind_of(args[0]))


@lower(aten.round.decimals, family=Family.ELEMENTWISE, dtypes=F32)
def _round_decimals(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    """PyTorch's rule: round(x·10^d)/10^d for d >= 0, round(x/10^-d)·10^-d below."""
    out = p.out_meta()
    decimals = int(node.kwargs.get("decimals", 0))
    scale = constant(10.0 ** abs(decimals), "f32")
    up, down = ("mul", "div") if decimals >= 0 else ("div", "mul")
    (x,) = operands(p, args[:1], shape_of(out), "f32")
    return result(expr.apply(down, expr.apply("round", expr.apply(up, x, scale)), scale), out)


@lower(aten.leaky_relu.default, family=Family.ELEMENTWISE, dtypes=F32)
def _leaky_relu(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    slope = float(args[1]) if len(args) > 1 else 0.01
    (x,) = operands(p, args[:1], shape_of(out), "f32")
    return result(expr.where(_positive_or_nan(x), x, expr.apply("mul", x, constant(slope, "f32"))), out)


def _stays_here(spec: Any) -> bool | str:
    device = spec.kwargs.get("device")
    return True if device is None or torch.device(device).type == "cpu" else "copy to another device"


@lower(
    [aten.clone.default, aten._to_copy.default, aten.lift_fresh_copy.default],
    family=Family.ELEMENTWISE,
    dtypes=ALL,
    check=_stays_here,
)
def _copy_of(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    """A fresh tensor, converted to the output's dtype the way PyTorch converts (float to int truncates)."""
    out = p.out_meta()
    (x,) = operands(p, args[:1], shape_of(out), kind_of(args[0]))
    return result(x, out)


# ``self`` gives only the output's shape and dtype, which the output's meta carries
@lower(aten.copy.default, family=Family.ELEMENTWISE, dtypes=ALL, reads=("self",))
def _copy(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    (x,) = operands(p, args[1:2], shape_of(out), kind_of(args[1]))
    return result(x, out)


def _fill_value(node: FxNode, args: Sequence[Any]) -> Any:
    if node.target in (aten.full.default, aten.full_like.default):
        return args[1]
    return args[0]


@lower(
    [aten.full.default, aten.full_like.default, aten.scalar_tensor.default],
    family=Family.ELEMENTWISE,
    dtypes=ALL,
    check=_stays_here,
)
def _full(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    return result(constant(_fill_value(node, args), KINDS[out.dtype]), out)


# the output's meta carries the shape, and the memory's order does not matter to a constant
@lower(
    [aten.zeros.default, aten.empty.memory_format, aten.empty_permuted.default, aten.ones.default],
    family=Family.CONSTANT,
    dtypes=ALL,
    check=_stays_here,
    reads=("size", "memory_format", "physical_layout"),
)
def _filled(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    return result(constant(1 if node.target == aten.ones.default else 0, KINDS[out.dtype]), out)


# ``end`` sets the output's length, which its meta carries
@lower(aten.arange.start_step, family=Family.ELEMENTWISE, dtypes=NUMERIC, check=_stays_here, reads=("end",))
def _arange(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    start = args[0]
    step = args[2] if len(args) > 2 else node.kwargs.get("step", 1)
    compute: ComputeType = "int" if KINDS[out.dtype] == "int" else "f32"
    index = expr.position(compute)  # a 1-d output: the linear index is the position
    first, delta = operands(p, [start, step], shape_of(out), compute)
    return result(expr.apply("add", first, expr.apply("mul", delta, index)), out)


# torch.special's orthogonal polynomials P_n(x): the value and the degree are tensors or scalars
POLYNOMIALS: dict[Any, str] = {
    getattr(getattr(aten, f"special_{name}"), overload): fn
    for fn, name in expr.POLYNOMIALS.items()
    for overload in ("default", "x_scalar", "n_scalar")
}


@lower(POLYNOMIALS, family=Family.ELEMENTWISE, dtypes=NUMERIC | F32_HALF)
def _polynomial(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    if KINDS[out.dtype] != "f32":
        raise PlanError(f"{node.target} with a {out.dtype} result")
    return function(p, POLYNOMIALS[node.target], args[:2], out)
