"""Elementwise ops: each becomes an expression over its operands, fused by the planner into the
kernel that finally writes a result; nothing here launches a kernel itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchburn.planning import Family

from ..planner import INDEX, Expr, Lazy, Planner, cast, constant
from ..values import KINDS, Value
from . import ALL, ANY, F32, F32_HALF, FLOATS, INTS, NUMERIC, FxNode, lower, shape_of

aten = torch.ops.aten


def kind_of(x: Any) -> str:
    """The kind a tensor operand or Python scalar computes in."""
    if isinstance(x, (Value, Lazy)):
        return KINDS[x.dtype]
    if isinstance(x, bool):
        return "bool"
    return "i32" if isinstance(x, int) else "f32"


def expression(p: Planner, template: str, operands: Sequence[Any], out: Any, compute: str | None = None) -> Lazy:
    """``template`` over ``operands`` (each converted to ``compute``, by default the output's kind;
    Python scalars become exact constants of it), as a lazy result of the output's dtype and shape."""
    shape = shape_of(out)
    kind = compute or KINDS[out.dtype]
    args = tuple(cast(p.lazy(x, shape), kind) if isinstance(x, (Value, Lazy)) else _scalar(x, kind) for x in operands)
    return Lazy(cast(Expr(kind, template, args), KINDS[out.dtype]), out.dtype, shape)


def _scalar(x: float | int | bool, kind: str) -> Expr:
    # an integer constant in a float computation stays exact; a float one in an integer computation
    # (e.g. x * 0.5 with integer x) means PyTorch promoted the result to float, so it never gets here
    return constant(x, kind)


UNARY_FLOAT = {
    aten.exp.default: "exp({0})",
    aten.log.default: "log({0})",
    aten.sqrt.default: "sqrt({0})",
    aten.rsqrt.default: "inverseSqrt({0})",
    aten.reciprocal.default: "(1.0 / {0})",
    aten.sin.default: "sin({0})",
    aten.cos.default: "cos({0})",
    aten.tanh.default: "tb_tanh({0})",
    aten.sigmoid.default: "tb_sigmoid({0})",
    aten.erf.default: "tb_erf({0})",
    aten.silu.default: "({0} * tb_sigmoid({0}))",
    aten.hardsigmoid.default: "(tb_min(tb_max({0} + 3.0, 0.0), 6.0) / 6.0)",
    aten.hardswish.default: "({0} * tb_min(tb_max({0} + 3.0, 0.0), 6.0) / 6.0)",
    aten.floor.default: "floor({0})",
    aten.ceil.default: "ceil({0})",
    aten.trunc.default: "trunc({0})",
    aten.round.default: "round({0})",
    aten.sign.default: "sign({0})",
    # exp(x) - 1 and log(1 + x) lose every digit near 0: use the series there
    aten.expm1.default: "select(exp({0}) - 1.0, {0} + 0.5 * {0} * {0}, abs({0}) < 1e-4)",
    aten.log1p.default: "select(log(1.0 + {0}), {0} - 0.5 * {0} * {0}, abs({0}) < 1e-4)",
}


@lower(UNARY_FLOAT, family=Family.ELEMENTWISE, dtypes=F32_HALF)
def _unary_float(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    return expression(p, UNARY_FLOAT[node.target], [args[0]], out)


SIGNED = {aten.neg.default: "(-{0})", aten.abs.default: "abs({0})"}


@lower(aten.relu.default, family=Family.ELEMENTWISE, dtypes=FLOATS | INTS)
def _relu(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    template = {"f32": "tb_max({0}, 0.0)", "f64": "tb_max64({0}, 0.0lf)", "i32": "max({0}, 0i)"}
    return expression(p, template[KINDS[out.dtype]], [args[0]], out)


@lower(SIGNED, family=Family.ELEMENTWISE, dtypes=FLOATS | INTS)
def _signed(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    return expression(p, SIGNED[node.target], [args[0]], out)


def _gelu_check(spec: Any) -> bool | str:
    approximate = spec.kwargs.get("approximate", "none")
    return True if approximate in ("none", "tanh") else f"gelu approximate={approximate!r}"


@lower(aten.gelu.default, family=Family.ELEMENTWISE, dtypes=F32_HALF, check=_gelu_check)
def _gelu(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    fn = "tb_gelu_tanh" if node.kwargs.get("approximate", "none") == "tanh" else "tb_gelu_erf"
    return expression(p, fn + "({0})", [args[0]], out)


# add/sub/mul compute in the output's kind (ints stay ints); max/min pick the NaN-aware form for floats
ARITH = {
    aten.add.Tensor: "({0} + {1})",
    aten.add.Scalar: "({0} + {1})",
    aten.sub.Tensor: "({0} - {1})",
    aten.sub.Scalar: "({0} - {1})",
    aten.mul.Tensor: "({0} * {1})",
    aten.mul.Scalar: "({0} * {1})",
    aten.maximum.default: "max({0}, {1})",
    aten.minimum.default: "min({0}, {1})",
}


FLOAT_MAXMIN = {
    torch.float32: {aten.maximum.default: "tb_max({0}, {1})", aten.minimum.default: "tb_min({0}, {1})"},
    torch.float16: {aten.maximum.default: "tb_max({0}, {1})", aten.minimum.default: "tb_min({0}, {1})"},
    torch.float64: {aten.maximum.default: "tb_max64({0}, {1})", aten.minimum.default: "tb_min64({0}, {1})"},
}


@lower(ARITH, family=Family.ELEMENTWISE, dtypes=ALL)
def _arith(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    template = FLOAT_MAXMIN.get(out.dtype, {}).get(node.target, ARITH[node.target])
    # bools add and multiply as 0/1 integers, then turn back into bools (True + True is True)
    compute = "i32" if out.dtype == torch.bool else None
    alpha = node.kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    if alpha != 1:  # a ± alpha·b
        return expression(p, template.replace("{1}", "({1} * {2})"), [args[0], args[1], alpha], out, compute)
    return expression(p, template, [args[0], args[1]], out, compute)


FLOAT_BINARY = {
    aten.div.Tensor: "({0} / {1})",
    aten.div.Scalar: "({0} / {1})",
    aten.pow.Tensor_Tensor: "tb_pow({0}, {1})",
    aten.pow.Tensor_Scalar: "tb_pow({0}, {1})",
}


def _true_division(spec: Any) -> bool | str:
    return True if spec.kwargs.get("rounding_mode") is None else "div with rounding_mode"


@lower(FLOAT_BINARY, family=Family.ELEMENTWISE, dtypes=NUMERIC | F32_HALF, check=_true_division)
def _float_binary(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    if KINDS[out.dtype] != "f32":
        from ..planner import PlanError

        raise PlanError(f"{node.target} with a {out.dtype} result")
    return expression(p, FLOAT_BINARY[node.target], [args[0], args[1]], out)


def _rounded_division(spec: Any) -> bool | str:
    mode = spec.kwargs.get("rounding_mode")
    return True if mode in ("floor", "trunc") else f"div with rounding_mode={mode!r}"


@lower(aten.div.Tensor_mode, family=Family.ELEMENTWISE, dtypes=NUMERIC, check=_rounded_division)
def _div_rounded(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    floor = node.kwargs["rounding_mode"] == "floor"
    if KINDS[out.dtype] == "f32":
        return expression(p, ("floor" if floor else "trunc") + "({0} / {1})", args[:2], out)
    # integers: WGSL's `/` truncates; floor division steps down when the signs differ and it is inexact
    # (PyTorch raises on division by zero; here it yields 0 rather than a hang or a crash)
    if floor:
        inexact = "({0} % {1} != 0i) && (({0} < 0i) != ({1} < 0i))"
        template = f"select({{0}} / {{1}} - select(0i, 1i, {inexact}), 0i, {{1}} == 0i)"
    else:
        template = "select({0} / {1}, 0i, {1} == 0i)"
    return expression(p, template, args[:2], out, compute="i32")


@lower([aten.remainder.Scalar, aten.remainder.Tensor], family=Family.ELEMENTWISE, dtypes=NUMERIC)
def _remainder(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    """Python's modulo: the result takes the divisor's sign."""
    out = p.out_meta()
    if KINDS[out.dtype] == "f32":
        return expression(p, "({0} - floor({0} / {1}) * {1})", args[:2], out)
    wrong_sign = "({0} % {1} != 0i) && (({0} % {1} < 0i) != ({1} < 0i))"
    template = f"select(select({{0}} % {{1}}, {{0}} % {{1}} + {{1}}, {wrong_sign}), 0i, {{1}} == 0i)"
    return expression(p, template, args[:2], out, compute="i32")


@lower(aten.elu.default, family=Family.ELEMENTWISE, dtypes=F32)
def _elu(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    alpha = float(args[1]) if len(args) > 1 else 1.0
    scale = float(args[2]) if len(args) > 2 else 1.0
    input_scale = float(args[3]) if len(args) > 3 else 1.0
    template = "({2} * select({1} * (exp({0} * {3}) - 1.0), {0}, {0} > 0.0 || tb_isnan({0})))"
    return expression(p, template, [args[0], alpha, scale, input_scale], out)


COMPARE: dict[Any, str] = {}


for _name, _symbol in (("gt", ">"), ("lt", "<"), ("ge", ">="), ("le", "<="), ("eq", "=="), ("ne", "!=")):
    for _overload in ("Tensor", "Scalar"):
        COMPARE[getattr(getattr(aten, _name), _overload)] = f"({{0}} {_symbol} {{1}})"


@lower(COMPARE, family=Family.ELEMENTWISE, dtypes=ALL)
def _compare(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    # in the operands' promoted kind: a float anywhere compares as float, else as integers
    kinds = {kind_of(x) for x in args[:2]}
    compute = "f64" if "f64" in kinds else "f32" if "f32" in kinds else "i32"
    shape = shape_of(out)
    operands = tuple(
        cast(p.lazy(x, shape), compute) if isinstance(x, (Value, Lazy)) else _scalar(x, compute) for x in args[:2]
    )
    return Lazy(Expr("bool", COMPARE[node.target], operands), torch.bool, shape)


LOGICAL = {
    aten.logical_and.default: "({0} && {1})",
    aten.logical_or.default: "({0} || {1})",
    aten.logical_xor.default: "({0} != {1})",
    aten.bitwise_and.Tensor: "({0} && {1})",
    aten.bitwise_or.Tensor: "({0} || {1})",
    aten.bitwise_xor.Tensor: "({0} != {1})",
}


def _bool_bitwise(spec: Any) -> bool | str:
    if "bitwise" in str(spec.target) and any(s.dtype != torch.bool for s in spec.tensor_inputs):
        return "bitwise ops on integers"
    return True


@lower(LOGICAL, family=Family.ELEMENTWISE, dtypes=ANY, check=_bool_bitwise)
def _logical(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    return expression(p, LOGICAL[node.target], args[:2], out, compute="bool")


@lower([aten.logical_not.default, aten.bitwise_not.default], family=Family.ELEMENTWISE, dtypes=ANY, check=_bool_bitwise)
def _logical_not(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    return expression(p, "(!{0})", args[:1], out, compute="bool")


@lower(aten.where.self, family=Family.ELEMENTWISE, dtypes=ALL)
def _where(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    shape = shape_of(out)
    kind = KINDS[out.dtype]
    cond = cast(p.lazy(args[0], shape), "bool")
    a, b = (cast(p.lazy(x, shape), kind) for x in args[1:3])
    return Lazy(Expr(kind, "select({2}, {1}, {0})", (cond, a, b)), out.dtype, shape)


@lower(
    [aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.hardtanh.default],
    family=Family.ELEMENTWISE,
    dtypes=F32_HALF,
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
    template, operands = "{0}", [args[0]]
    if lo is not None:
        template = f"tb_max({template}, {{{len(operands)}}})"
        operands.append(float(lo))
    if hi is not None:
        template = f"tb_min({template}, {{{len(operands)}}})"
        operands.append(float(hi))
    return expression(p, template, operands, out)


@lower(aten.leaky_relu.default, family=Family.ELEMENTWISE, dtypes=F32)
def _leaky_relu(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    slope = float(args[1]) if len(args) > 1 else 0.01
    return expression(p, "select({0} * {1}, {0}, {0} > 0.0 || tb_isnan({0}))", [args[0], slope], out)


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
    return expression(p, "{0}", [args[0]], out, compute=kind_of(args[0]))


# ``self`` gives only the output's shape and dtype, which the output's meta carries
@lower(aten.copy.default, family=Family.ELEMENTWISE, dtypes=ALL, reads=("self",))
def _copy(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    return expression(p, "{0}", [args[1]], out, compute=kind_of(args[1]))


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
    value = _fill_value(node, args)
    return expression(p, "{0}", [value], out)


# ``end`` sets the output's length, which its meta carries
@lower(aten.arange.start_step, family=Family.ELEMENTWISE, dtypes=NUMERIC, check=_stays_here, reads=("end",))
def _arange(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Lazy:
    out = p.out_meta()
    start = args[0]
    step = args[2] if len(args) > 2 else node.kwargs.get("step", 1)
    compute = "i32" if KINDS[out.dtype] == "i32" else "f32"
    index = Expr(compute, f"{compute}({INDEX})")  # a 1-d output: the linear index is the position
    shape = shape_of(out)
    first, delta = (cast(p.lazy(v, shape), compute) for v in (start, step))
    return Lazy(Expr(compute, "({0} + {1} * {2})", (first, delta, index)), out.dtype, shape)
