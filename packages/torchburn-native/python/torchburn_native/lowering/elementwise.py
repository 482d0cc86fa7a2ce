"""Elementwise ops: each returns a ``Lazy`` expression, fused with its neighbours into one sweep."""

from __future__ import annotations

import math
from typing import Any

import torch

from torchburn.planning import ComputeType, Family, expr

from ..planner import PlanError, Planner, broadcast_shapes
from ..values import DOMAIN_TYPES, FLOAT_DTYPES, SUPPORTED_DTYPES, Domain, Lazy, Tensorish, Value, domain_of
from . import conv, lower, matmul

aten = torch.ops.aten
prims = torch.ops.prims

FLOATS = FLOAT_DTYPES
ANY = SUPPORTED_DTYPES


def _shape(x: Any) -> tuple[int, ...]:
    return x.shape if isinstance(x, (Value, Lazy)) else ()


def _is_float_operand(x: Any) -> bool:
    if isinstance(x, (Value, Lazy)):
        return x.dtype in FLOATS
    return isinstance(x, float)


def _domain_of_operands(*xs: Any) -> Domain:
    """Where a comparison or logical op computes: the promoted type of its operands."""
    tensors = [x for x in xs if isinstance(x, (Value, Lazy))]
    if any(x.dtype == torch.float64 for x in tensors):
        return "f64"
    if any(_is_float_operand(x) for x in xs):
        return "f32"
    return "i64"


def _node_type(fn: str, domain: Domain) -> ComputeType:
    return "bool" if fn in expr.PREDICATES else DOMAIN_TYPES[domain]


def unary_expr(p: Planner, fn: str, x: Tensorish, out_dtype: torch.dtype, domain: Domain | None = None) -> Lazy:
    """``fn(x)`` computed in ``domain`` (by default the output's), stored as ``out_dtype``."""
    d = domain or domain_of(out_dtype)
    a = p.lazy(x, d).expr
    return Lazy(expr.apply(fn, a, type=_node_type(fn, d)), out_dtype, _shape(x), d)


def binary_expr(p: Planner, fn: str, a: Any, b: Any, out_dtype: torch.dtype, domain: Domain | None = None) -> Lazy:
    """``fn(a, b)`` computed in ``domain`` (by default the output's), stored as ``out_dtype``."""
    d = domain or domain_of(out_dtype)
    shape = broadcast_shapes(_shape(a), _shape(b))
    node = expr.apply(fn, p.lazy(a, d).expr, p.lazy(b, d).expr, type=_node_type(fn, d))
    return Lazy(node, out_dtype, shape, d)


def where_expr(p: Planner, cond: Any, a: Any, b: Any, out_dtype: torch.dtype) -> Lazy:
    """``a`` where ``cond`` holds, else ``b``, all computed in the output's domain."""
    d = domain_of(out_dtype)
    shape = broadcast_shapes(_shape(cond), _shape(a), _shape(b))
    c, x, y = (p.lazy(v, d).expr for v in (cond, a, b))
    return Lazy(expr.where(c, x, y), out_dtype, shape, d)


def const(value: float | int | bool, dtype: torch.dtype, shape: tuple[int, ...] = ()) -> Lazy:
    d = domain_of(dtype)
    return Lazy(expr.const(value, DOMAIN_TYPES[d]), dtype, tuple(shape), d)


def _out_dtype(p: Planner) -> torch.dtype:
    dtype: torch.dtype = p.out_meta().dtype
    return dtype


# ---- unary -------------------------------------------------------------------------------------
UNARY_FLOAT = {
    aten.sigmoid.default: "sigmoid",
    aten.tanh.default: "tanh",
    aten.exp.default: "exp",
    aten.exp2.default: "exp2",
    aten.expm1.default: "expm1",
    aten.log.default: "log",
    aten.log2.default: "log2",
    aten.log10.default: "log10",
    aten.log1p.default: "log1p",
    aten.sqrt.default: "sqrt",
    aten.rsqrt.default: "rsqrt",
    aten.reciprocal.default: "reciprocal",
    aten.sin.default: "sin",
    aten.cos.default: "cos",
    aten.tan.default: "tan",
    aten.asin.default: "asin",
    aten.acos.default: "acos",
    aten.atan.default: "atan",
    aten.sinh.default: "sinh",
    aten.cosh.default: "cosh",
    aten.asinh.default: "asinh",
    aten.acosh.default: "acosh",
    aten.atanh.default: "atanh",
    aten.erf.default: "erf",
    aten.erfc.default: "erfc",
    aten.silu.default: "silu",
    aten.hardswish.default: "hardswish",
    aten.hardsigmoid.default: "hardsigmoid",
}
UNARY_ANY = {
    aten.neg.default: "neg",
    aten.abs.default: "abs",
    aten.relu.default: "relu",
    aten.sign.default: "sign",
    aten.floor.default: "floor",
    aten.ceil.default: "ceil",
    aten.round.default: "round",
    aten.trunc.default: "trunc",
}
UNARY_TO_BOOL = {
    aten.isnan.default: "is_nan",
    aten.isinf.default: "is_inf",
    aten.logical_not.default: "logical_not",
    aten.signbit.default: "signbit",
}


def _unary(fn: str) -> Any:
    def lowering(p: Planner, node: Any, x: Tensorish) -> Any:
        out = _out_dtype(p)
        if fn in EPILOGUE_ACTIVATIONS:
            fused = _fuse_epilogue(p, node, x, fn)
            if fused is not None:
                return fused
        return unary_expr(p, fn, x, out)

    return lowering


for _op, _fn in UNARY_FLOAT.items():
    lower(_op, family=Family.ELEMENTWISE, dtypes=FLOATS)(_unary(_fn))
for _op, _fn in UNARY_ANY.items():
    lower(_op, family=Family.ELEMENTWISE, dtypes=ANY - {torch.bool})(_unary(_fn))


def _unary_to_bool(fn: str) -> Any:
    def lowering(p: Planner, node: Any, x: Tensorish) -> Lazy:
        return unary_expr(p, fn, x, torch.bool, domain_of(x.dtype))

    return lowering


for _op, _fn in UNARY_TO_BOOL.items():
    lower(_op, family=Family.ELEMENTWISE, dtypes=ANY)(_unary_to_bool(_fn))


@lower(aten.isfinite.default, family=Family.ELEMENTWISE, dtypes=ANY)
def isfinite(p: Planner, node: Any, x: Tensorish) -> Lazy:
    return unary_expr(p, "is_finite", x, torch.bool, domain_of(x.dtype))


@lower(aten.bitwise_not.default, family=Family.ELEMENTWISE, dtypes=ANY - FLOATS)
def bitwise_not(p: Planner, node: Any, x: Tensorish) -> Lazy:
    fn = "logical_not" if x.dtype == torch.bool else "bitwise_not"
    return unary_expr(p, fn, x, x.dtype, "i64")


# Activations with an epilogue form: when their input is a fresh matmul result used nowhere else, the
# matmul applies them to its output while it is still in cache.
EPILOGUE_ACTIVATIONS = {"relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "silu"}


def only_use(p: Planner, src: Any, x: Value) -> bool:
    """Whether the node being lowered is the only reader of ``x``'s buffer: ``src`` (its argument)
    and every view between it and the node that made the buffer have exactly one user each."""
    node = src
    while isinstance(node, torch.fx.Node):
        if len(node.users) != 1:
            return False
        prev = node.args[0] if node.args else None
        made = p.env.get(prev) if isinstance(prev, torch.fx.Node) else None
        if not (isinstance(made, Value) and made.buffer is x.buffer):
            return True  # `node` made the buffer (its first argument is something else)
        node = prev
    return False


def _fuse_epilogue(p: Planner, node: Any, x: Tensorish, act: str) -> Value | None:
    if not isinstance(x, Value) or act not in EPILOGUE_ACTIVATIONS or x.dtype not in (torch.float32, torch.float64):
        return None
    producer = p.producer.get(id(x.buffer))
    if producer is None:
        return None
    instr = p.instrs[producer]
    src = node.args[0]
    if not only_use(p, src, x):
        return None
    if instr["kind"] == "conv2d" and act == "relu":
        found = conv.conv_epilogue(p, x)
        if found is None or found[0]["relu"]:
            return None
        found[0]["relu"] = True
        return x
    if instr["kind"] != "matmul" or instr.get("act") is not None:
        return None
    if instr["out"]["buf"] is not x.buffer or not x.is_contiguous:
        return None
    instr["act"] = act
    return x


@lower(aten.gelu.default, family=Family.ACTIVATION, dtypes=FLOATS)
def gelu(p: Planner, node: Any, x: Tensorish, approximate: str = "none") -> Any:
    fn = "gelu_tanh" if approximate == "tanh" else "gelu"
    fused = _fuse_epilogue(p, node, x, fn)
    if fused is not None:
        return fused
    return unary_expr(p, fn, x, _out_dtype(p))


@lower(aten.leaky_relu.default, family=Family.ACTIVATION, dtypes=FLOATS)
def leaky_relu(p: Planner, node: Any, x: Tensorish, negative_slope: float = 0.01) -> Lazy:
    out = _out_dtype(p)
    xl = p.lazy(x, domain_of(out))
    cond = binary_expr(p, "gt", xl, 0.0, torch.bool, xl.domain)
    scaled = binary_expr(p, "mul", xl, float(negative_slope), out)
    return where_expr(p, cond, xl, scaled, out)


@lower(aten.elu.default, family=Family.ACTIVATION, dtypes=FLOATS)
def elu(p: Planner, node: Any, x: Tensorish, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Lazy:
    out = _out_dtype(p)
    xl = p.lazy(x, domain_of(out))
    cond = binary_expr(p, "gt", xl, 0.0, torch.bool, xl.domain)
    neg = binary_expr(
        p, "mul", unary_expr(p, "expm1", binary_expr(p, "mul", xl, float(input_scale), out), out), float(alpha), out
    )
    return binary_expr(p, "mul", where_expr(p, cond, xl, neg, out), float(scale), out)


@lower(aten.softplus.default, family=Family.ACTIVATION, dtypes=FLOATS)
def softplus(p: Planner, node: Any, x: Tensorish, beta: float = 1.0, threshold: float = 20.0) -> Lazy:
    out = _out_dtype(p)
    xl = p.lazy(x, domain_of(out))
    bx = binary_expr(p, "mul", xl, float(beta), out)
    soft = binary_expr(p, "div", unary_expr(p, "log1p", unary_expr(p, "exp", bx, out), out), float(beta), out)
    cond = binary_expr(p, "gt", bx, float(threshold), torch.bool, xl.domain)
    return where_expr(p, cond, xl, soft, out)


# ---- binary ------------------------------------------------------------------------------------
ARITH = {
    "add": (aten.add.Tensor, aten.add.Scalar),
    "sub": (aten.sub.Tensor, aten.sub.Scalar),
    "mul": (aten.mul.Tensor, aten.mul.Scalar),
    "maximum": (aten.maximum.default,),
    "minimum": (aten.minimum.default,),
    "fmax": (aten.fmax.default,),
    "fmin": (aten.fmin.default,),
    "atan2": (aten.atan2.default,),
    "fmod": (aten.fmod.Tensor, aten.fmod.Scalar),
    "remainder": (aten.remainder.Tensor, aten.remainder.Scalar),
    "copysign": (aten.copysign.Tensor,),
    "hypot": (aten.hypot.default,),
    "bit_and": (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar),
    "bit_or": (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar),
    "bit_xor": (aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar),
    "shl": (aten.bitwise_left_shift.Tensor,),
    "shr": (aten.bitwise_right_shift.Tensor,),
}
COMPARE = {
    "eq": (aten.eq.Tensor, aten.eq.Scalar),
    "ne": (aten.ne.Tensor, aten.ne.Scalar),
    "lt": (aten.lt.Tensor, aten.lt.Scalar),
    "le": (aten.le.Tensor, aten.le.Scalar),
    "gt": (aten.gt.Tensor, aten.gt.Scalar),
    "ge": (aten.ge.Tensor, aten.ge.Scalar),
    "logical_and": (aten.logical_and.default,),
    "logical_or": (aten.logical_or.default,),
    "logical_xor": (aten.logical_xor.default,),
}
FLOAT_ONLY = {"atan2", "copysign", "hypot"}
INT_ONLY = {"bit_and", "bit_or", "bit_xor", "shl", "shr"}


def _fused_residual(p: Planner, node: Any, a: Any, b: Any) -> Value | None:
    """``a + b`` where one side is a fresh matmul result read nowhere else: the matmul adds the other
    side itself (see :func:`.matmul.fuse_residual`)."""
    for x, r, src in ((a, b, node.args[0]), (b, a, node.args[1])):
        if (
            isinstance(x, Value)
            and isinstance(r, Value)
            and x.dtype == _out_dtype(p)
            and only_use(p, src, x)
            and matmul.fuse_residual(p, x, r)
        ):
            return x
    return None


def _binary(fn: str) -> Any:
    def lowering(p: Planner, node: Any, a: Any, b: Any, alpha: Any = 1) -> Tensorish:
        out = _out_dtype(p)
        if fn == "add" and alpha == 1:
            fused = _fused_residual(p, node, a, b)
            if fused is not None:
                return fused
        if fn in ("add", "sub") and alpha != 1:
            b = binary_expr(p, "mul", b, alpha, out)
        if fn in INT_ONLY and out == torch.bool:
            return binary_expr(
                p, {"bit_and": "logical_and", "bit_or": "logical_or", "bit_xor": "logical_xor"}[fn], a, b, out, "i64"
            )
        return binary_expr(p, fn, a, b, out)

    return lowering


for _fn, _ops in ARITH.items():
    _dtypes = FLOATS if _fn in FLOAT_ONLY else (ANY - FLOATS if _fn in INT_ONLY else ANY)
    lower(*_ops, family=Family.ELEMENTWISE, dtypes=_dtypes)(_binary(_fn))


def _compare(fn: str) -> Any:
    def lowering(p: Planner, node: Any, a: Any, b: Any) -> Lazy:
        return binary_expr(p, fn, a, b, torch.bool, _domain_of_operands(a, b))

    return lowering


for _fn, _ops in COMPARE.items():
    lower(*_ops, family=Family.COMPARISON, dtypes=ANY)(_compare(_fn))


@lower(aten.div.Tensor, aten.div.Scalar, family=Family.ELEMENTWISE, dtypes=ANY)
def div(p: Planner, node: Any, a: Any, b: Any) -> Lazy:
    return binary_expr(p, "div", a, b, _out_dtype(p))


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode, family=Family.ELEMENTWISE, dtypes=ANY)
def div_mode(p: Planner, node: Any, a: Any, b: Any, rounding_mode: str | None = None) -> Lazy:
    fn = {"trunc": "div_trunc", "floor": "div_floor", None: "div"}[rounding_mode]
    return binary_expr(p, fn, a, b, _out_dtype(p))


@lower(aten.floor_divide.default, family=Family.ELEMENTWISE, dtypes=ANY)
def floor_divide(p: Planner, node: Any, a: Any, b: Any) -> Lazy:
    return binary_expr(p, "div_floor", a, b, _out_dtype(p))


def _pow_const(p: Planner, x: Tensorish, e: float, out: torch.dtype) -> Lazy:
    """x ** e for a constant exponent, as multiplies or a root when it is one of the usual ones."""
    d = domain_of(out)
    if d != "i64":
        if e == 0.5:
            return unary_expr(p, "sqrt", x, out)
        if e == -0.5:
            return unary_expr(p, "rsqrt", x, out)
        if e == -1:
            return unary_expr(p, "reciprocal", x, out)
        if e == -2:
            return unary_expr(p, "reciprocal", unary_expr(p, "square", x, out), out)
    if e == 1:
        return unary_expr(p, "identity", x, out)
    if e == 2:
        return unary_expr(p, "square", x, out)
    if e == 3:
        xl = p.lazy(x, d)
        return binary_expr(p, "mul", unary_expr(p, "square", xl, out), xl, out)
    if e == 4:
        return unary_expr(p, "square", unary_expr(p, "square", x, out), out)
    return binary_expr(p, "pow", x, int(e) if d == "i64" else float(e), out)


@lower(aten.pow.Tensor_Scalar, family=Family.ELEMENTWISE, dtypes=ANY - {torch.bool})
def pow_tensor_scalar(p: Planner, node: Any, x: Tensorish, e: float) -> Lazy:
    return _pow_const(p, x, e, _out_dtype(p))


@lower(aten.pow.Tensor_Tensor, aten.pow.Scalar, family=Family.ELEMENTWISE, dtypes=ANY - {torch.bool})
def pow_tensor(p: Planner, node: Any, a: Any, b: Any) -> Lazy:
    return binary_expr(p, "pow", a, b, _out_dtype(p))


@lower(aten.where.self, family=Family.ELEMENTWISE, dtypes=ANY)
def where(p: Planner, node: Any, cond: Any, a: Any, b: Any) -> Lazy:
    return where_expr(p, cond, a, b, _out_dtype(p))


@lower(aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar, family=Family.ELEMENTWISE, dtypes=ANY)
def where_scalar(p: Planner, node: Any, cond: Any, a: Any, b: Any) -> Lazy:
    return where(p, node, cond, a, b)


def _clamp(p: Planner, x: Any, lo: Any, hi: Any, out: torch.dtype) -> Lazy:
    r: Any = x
    if lo is not None:
        r = binary_expr(p, "maximum", r, lo, out)
    if hi is not None:
        r = binary_expr(p, "minimum", r, hi, out)
    if isinstance(r, Lazy):
        return r
    return unary_expr(p, "identity", r, out)


@lower(aten.clamp.default, aten.clamp.Tensor, family=Family.ELEMENTWISE, dtypes=ANY - {torch.bool})
def clamp(p: Planner, node: Any, x: Any, min: Any = None, max: Any = None) -> Lazy:
    return _clamp(p, x, min, max, _out_dtype(p))


@lower(aten.clamp_min.default, aten.clamp_min.Tensor, family=Family.ELEMENTWISE, dtypes=ANY - {torch.bool})
def clamp_min(p: Planner, node: Any, x: Any, lo: Any) -> Lazy:
    return _clamp(p, x, lo, None, _out_dtype(p))


@lower(aten.clamp_max.default, aten.clamp_max.Tensor, family=Family.ELEMENTWISE, dtypes=ANY - {torch.bool})
def clamp_max(p: Planner, node: Any, x: Any, hi: Any) -> Lazy:
    return _clamp(p, x, None, hi, _out_dtype(p))


@lower(aten.hardtanh.default, family=Family.ACTIVATION, dtypes=FLOATS)
def hardtanh(p: Planner, node: Any, x: Any, lo: float = -1.0, hi: float = 1.0) -> Lazy:
    return _clamp(p, x, float(lo), float(hi), _out_dtype(p))


# ---- conversions, copies and constants ------------------------------------------------------------
def convert(p: Planner, x: Tensorish, dtype: torch.dtype) -> Tensorish:
    if dtype not in SUPPORTED_DTYPES:
        raise PlanError(f"conversion to {dtype} not supported")
    if x.dtype == dtype:
        return x
    if dtype == torch.bool:
        return binary_expr(p, "ne", x, 0, torch.bool, domain_of(x.dtype))
    narrowing = dtype in (torch.float16, torch.bfloat16) and x.dtype in FLOATS
    if narrowing:
        # round now: later ops must see the narrowed value, as they do in eager
        return p.materialize(p.lazy(x, domain_of(dtype)), dtype=dtype)
    return unary_expr(p, "identity", x, dtype)


@lower(prims.convert_element_type.default, family=Family.CONVERSION, dtypes=ANY)
def convert_element_type(p: Planner, node: Any, x: Tensorish, dtype: torch.dtype) -> Tensorish:
    return convert(p, x, dtype)


def _cpu_only(node: Any) -> bool | str:
    device = node.kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return f"device {device} not supported"
    return True


@lower(aten._to_copy.default, family=Family.CONVERSION, dtypes=ANY, check=_cpu_only)
def to_copy(p: Planner, node: Any, x: Tensorish, **kwargs: Any) -> Tensorish:
    return convert(p, x, kwargs.get("dtype") or x.dtype)


@lower(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, family=Family.COPY, dtypes=ANY)
def clone(p: Planner, node: Any, x: Tensorish, **kwargs: Any) -> Tensorish:
    # graphs are functional: nothing writes to x afterwards, so the copy can be skipped
    return x


@lower(aten.copy.default, family=Family.COPY, dtypes=ANY)
def copy(p: Planner, node: Any, dst: Tensorish, src: Any, non_blocking: bool = False) -> Lazy:
    d = domain_of(dst.dtype)
    return Lazy(expr.apply("identity", p.lazy(src, d).expr), dst.dtype, dst.shape, d)


def _full(p: Planner, shape: Any, value: Any) -> Lazy:
    meta = p.out_meta()
    return const(value, meta.dtype, tuple(meta.shape))


@lower(aten.full.default, family=Family.CONSTANT, dtypes=ANY, check=_cpu_only)
def full(p: Planner, node: Any, size: Any, value: Any, **kwargs: Any) -> Lazy:
    return _full(p, size, value)


# ``self`` gives only the output's shape and dtype, which the output's meta carries
@lower(aten.full_like.default, family=Family.CONSTANT, dtypes=ANY, check=_cpu_only, reads=("self",))
def full_like(p: Planner, node: Any, x: Any, value: Any, **kwargs: Any) -> Lazy:
    return _full(p, None, value)


# ``self`` gives only the output's shape and dtype, which the output's meta carries
@lower(
    aten.zeros_like.default,
    aten.empty_like.default,
    family=Family.CONSTANT,
    dtypes=ANY,
    check=_cpu_only,
    reads=("self",),
)
def zeros_like(p: Planner, node: Any, x: Any, **kwargs: Any) -> Lazy:
    return _full(p, None, 0)


# ``self`` gives only the output's shape and dtype, which the output's meta carries
@lower(aten.ones_like.default, family=Family.CONSTANT, dtypes=ANY, check=_cpu_only, reads=("self",))
def ones_like(p: Planner, node: Any, x: Any, **kwargs: Any) -> Lazy:
    return _full(p, None, 1)


@lower(
    aten.zeros.default,
    aten.empty.memory_format,
    family=Family.CONSTANT,
    dtypes=ANY,
    check=_cpu_only,
)
def zeros(p: Planner, node: Any, size: Any, **kwargs: Any) -> Lazy:
    return _full(p, size, 0)


# the physical layout only orders the (uninitialised) memory; the region hands its outputs back contiguous
@lower(aten.empty_permuted.default, family=Family.CONSTANT, dtypes=ANY, check=_cpu_only, reads=("physical_layout",))
def empty_permuted(p: Planner, node: Any, size: Any, physical_layout: Any, **kwargs: Any) -> Lazy:
    return _full(p, size, 0)


@lower(aten.ones.default, family=Family.CONSTANT, dtypes=ANY, check=_cpu_only)
def ones(p: Planner, node: Any, size: Any, **kwargs: Any) -> Lazy:
    return _full(p, size, 1)


# ``self`` gives only the output's shape and dtype, which the output's meta carries
@lower(
    aten.new_zeros.default, aten.new_empty.default, family=Family.CONSTANT, dtypes=ANY, check=_cpu_only, reads=("self",)
)
def new_zeros(p: Planner, node: Any, x: Any, size: Any, **kwargs: Any) -> Lazy:
    return _full(p, size, 0)


# ``self`` gives only the output's shape and dtype, which the output's meta carries
@lower(aten.new_ones.default, family=Family.CONSTANT, dtypes=ANY, check=_cpu_only, reads=("self",))
def new_ones(p: Planner, node: Any, x: Any, size: Any, **kwargs: Any) -> Lazy:
    return _full(p, size, 1)


# ``self`` gives only the output's shape and dtype, which the output's meta carries
@lower(aten.new_full.default, family=Family.CONSTANT, dtypes=ANY, check=_cpu_only, reads=("self",))
def new_full(p: Planner, node: Any, x: Any, size: Any, value: Any, **kwargs: Any) -> Lazy:
    return _full(p, size, value)


@lower(aten.scalar_tensor.default, family=Family.CONSTANT, dtypes=ANY, check=_cpu_only)
def scalar_tensor(p: Planner, node: Any, value: Any, **kwargs: Any) -> Lazy:
    return _full(p, (), value)


# ``self`` gives only the output's shape and dtype, which the output's meta carries
@lower(aten.fill.Scalar, family=Family.CONSTANT, dtypes=ANY, reads=("self",))
def fill(p: Planner, node: Any, x: Any, value: Any) -> Lazy:
    return _full(p, None, value)


@lower(
    aten.arange.start_step, aten.arange.default, aten.arange.start, family=Family.CONSTANT, dtypes=ANY, check=_cpu_only
)
def arange(p: Planner, node: Any, *args: Any, **kwargs: Any) -> Value:
    nums = [a for a in args if isinstance(a, (int, float))]
    start: float = 0
    step: float = 1
    if len(nums) >= 2:
        start = nums[0]
    if len(nums) >= 3:
        step = nums[2]
    meta = p.out_meta()
    d = domain_of(meta.dtype)
    (n,) = meta.shape
    idx = Lazy(expr.position(DOMAIN_TYPES[d]), torch.int64, (n,), d)
    val = binary_expr(p, "add", binary_expr(p, "mul", idx, step, meta.dtype), start, meta.dtype)
    return p.materialize(val)


@lower(aten.round.decimals, family=Family.ELEMENTWISE, dtypes=FLOATS)
def round_decimals(p: Planner, node: Any, x: Tensorish, *, decimals: int = 0) -> Lazy:
    """PyTorch's rule: round(x·10^d)/10^d for d >= 0, round(x/10^-d)·10^-d below."""
    out = _out_dtype(p)
    scale = 10.0 ** abs(decimals)
    up, down = ("mul", "div") if decimals >= 0 else ("div", "mul")
    return binary_expr(p, down, unary_expr(p, "round", binary_expr(p, up, x, scale, out), out), scale, out)


@lower(aten.lerp.Scalar, aten.lerp.Tensor, family=Family.ELEMENTWISE, dtypes=FLOATS)
def lerp(p: Planner, node: Any, a: Any, b: Any, w: Any) -> Lazy:
    out = _out_dtype(p)
    return binary_expr(p, "add", a, binary_expr(p, "mul", w, binary_expr(p, "sub", b, a, out), out), out)


@lower(aten.addcmul.default, family=Family.ELEMENTWISE, dtypes=FLOATS)
def addcmul(p: Planner, node: Any, x: Any, a: Any, b: Any, value: float = 1) -> Lazy:
    out = _out_dtype(p)
    return binary_expr(p, "add", x, binary_expr(p, "mul", binary_expr(p, "mul", a, b, out), value, out), out)


@lower(aten.addcdiv.default, family=Family.ELEMENTWISE, dtypes=FLOATS)
def addcdiv(p: Planner, node: Any, x: Any, a: Any, b: Any, value: float = 1) -> Lazy:
    out = _out_dtype(p)
    return binary_expr(p, "add", x, binary_expr(p, "mul", binary_expr(p, "div", a, b, out), value, out), out)


@lower(aten.nan_to_num.default, family=Family.ELEMENTWISE, dtypes=FLOATS)
def nan_to_num(
    p: Planner, node: Any, x: Any, nan: float | None = None, posinf: float | None = None, neginf: float | None = None
) -> Lazy:
    out = _out_dtype(p)
    d = domain_of(out)
    info = torch.finfo(out)
    xl = p.lazy(x, d)
    r = where_expr(p, unary_expr(p, "is_nan", xl, torch.bool, d), float(nan or 0.0), xl, out)
    big = float(info.max if posinf is None else posinf)
    small = float(info.min if neginf is None else neginf)
    is_pos = binary_expr(p, "eq", xl, math.inf, torch.bool, d)
    is_neg = binary_expr(p, "eq", xl, -math.inf, torch.bool, d)
    r = where_expr(p, is_pos, big, r, out)
    return where_expr(p, is_neg, small, r, out)


# torch.special's orthogonal polynomials P_n(x): the value and the degree are tensors or scalars
POLYNOMIALS: dict[Any, str] = {
    getattr(getattr(aten, f"special_{name}"), overload): fn
    for fn, name in expr.POLYNOMIALS.items()
    for overload in ("default", "x_scalar", "n_scalar")
}


def _polynomial(fn: str) -> Any:
    def lowering(p: Planner, node: Any, x: Any, n: Any) -> Lazy:
        out = _out_dtype(p)
        if out not in FLOATS:
            raise PlanError(f"{node.target} with a {out} result")
        return binary_expr(p, fn, x, n, out)

    return lowering


for _op, _fn in POLYNOMIALS.items():  # an integer degree (or value) is promoted like PyTorch does
    lower(_op, family=Family.ELEMENTWISE, dtypes=ANY)(_polynomial(_fn))
