"""What each supported ATen op becomes on the GPU: the registry core partitions by, and the lowerings.

Elementwise ops become expressions (fused by the planner); views become new strides over the same
buffer; the rest launch one kernel of their family (matmul, reduce, softmax, layer_norm).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from torchburn.ops import OpRegistry

from .kernels import Launch, f32_bits, grid, params, reduce_source
from .planner import Expr, Lazy, PlanError, Planner, Tensorish
from .shaders import source
from .values import Value, contiguous

aten = torch.ops.aten

OPS = OpRegistry("wgpu")
LOWERINGS: dict[Any, Callable[..., Any]] = {}

# a torch.fx.Node: typed loosely, since its args are a wide union no lowering benefits from
FxNode = Any
LoweringFn = TypeVar("LoweringFn", bound=Callable[..., Any])

F32 = frozenset({torch.float32})
F32_BOOL = frozenset({torch.float32, torch.bool})
BOOL = frozenset({torch.bool})


def lower(
    ops: Any | Iterable[Any], *, family: str, dtypes: frozenset[torch.dtype] = F32, check: Any = None
) -> Callable[[LoweringFn], LoweringFn]:
    """Registers ``fn`` as the lowering of ``ops`` and enters them in the engine's op table."""
    overloads = [ops] if isinstance(ops, torch._ops.OpOverload) else list(ops)

    def register(fn: LoweringFn) -> LoweringFn:
        OPS.add(overloads, family=family, dtypes=dtypes, check=check)
        for op in overloads:
            LOWERINGS[op] = fn
        return fn

    return register


def _shape(meta: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in meta.shape)


# ---- elementwise -------------------------------------------------------------------------------
def _ew(p: Planner, template: str, kind: str, operands: list[Any], out: Any) -> Lazy:
    shape = _shape(out)
    exprs = tuple(p.lazy(x, shape, out.dtype if not isinstance(x, (Value, Lazy)) else x.dtype) for x in operands)
    return Lazy(Expr(kind, template, exprs), out.dtype, shape)


UNARY = {
    aten.neg.default: "(-{0})",
    aten.abs.default: "abs({0})",
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
    aten.relu.default: "tb_max({0}, 0.0)",
    aten.silu.default: "({0} * tb_sigmoid({0}))",
    aten.floor.default: "floor({0})",
    aten.ceil.default: "ceil({0})",
    aten.trunc.default: "trunc({0})",
    aten.round.default: "round({0})",
    aten.sign.default: "sign({0})",
    # exp(x) - 1 and log(1 + x) lose every digit near 0: use the series there
    aten.expm1.default: "select(exp({0}) - 1.0, {0} + 0.5 * {0} * {0}, abs({0}) < 1e-4)",
    aten.log1p.default: "select(log(1.0 + {0}), {0} - 0.5 * {0} * {0}, abs({0}) < 1e-4)",
}


@lower(UNARY, family="elementwise")
def _unary(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    return _ew(p, UNARY[node.target], "f32", [args[0]], out)


def _gelu_check(spec: Any) -> bool | str:
    approximate = spec.kwargs.get("approximate", "none")
    return True if approximate in ("none", "tanh") else f"gelu approximate={approximate!r}"


@lower(aten.gelu.default, family="elementwise", check=_gelu_check)
def _gelu(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    fn = "tb_gelu_tanh" if node.kwargs.get("approximate", "none") == "tanh" else "tb_gelu_erf"
    return _ew(p, fn + "({0})", "f32", [args[0]], out)


ARITH = {
    aten.add.Tensor: "({0} + {1})",
    aten.sub.Tensor: "({0} - {1})",
    aten.mul.Tensor: "({0} * {1})",
    aten.div.Tensor: "({0} / {1})",
    aten.maximum.default: "tb_max({0}, {1})",
    aten.minimum.default: "tb_min({0}, {1})",
    aten.pow.Tensor_Tensor: "tb_pow({0}, {1})",
    aten.pow.Tensor_Scalar: "tb_pow({0}, {1})",
    aten.add.Scalar: "({0} + {1})",
    aten.sub.Scalar: "({0} - {1})",
    aten.mul.Scalar: "({0} * {1})",
    aten.div.Scalar: "({0} / {1})",
}


def _no_rounding_mode(spec: Any) -> bool | str:
    return True if spec.kwargs.get("rounding_mode") is None else "div with rounding_mode"


@lower(ARITH, family="elementwise", check=_no_rounding_mode)
def _arith(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    a, b = args[0], args[1]
    alpha = node.kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    template = ARITH[node.target]
    if alpha != 1:  # add/sub with alpha: a ± alpha·b
        template = template.replace("{1}", "({1} * {2})")
        return _ew(p, template, "f32", [a, b, float(alpha)], out)
    return _ew(p, template, "f32", [a, b], out)


COMPARE = {}
for _name, _sym in (("gt", ">"), ("lt", "<"), ("ge", ">="), ("le", "<="), ("eq", "=="), ("ne", "!=")):
    for _overload in ("Tensor", "Scalar"):
        COMPARE[getattr(getattr(aten, _name), _overload)] = f"({{0}} {_sym} {{1}})"


def _float_operands(spec: Any) -> bool | str:
    bad = [s for s in spec.tensor_inputs if s.dtype != torch.float32]
    return True if not bad else "comparison of non-float32 tensors"


@lower(COMPARE, family="elementwise", dtypes=F32_BOOL, check=_float_operands)
def _compare(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    shape = _shape(out)
    exprs = tuple(p.lazy(x, shape, torch.float32) for x in args[:2])
    return Lazy(Expr("bool", COMPARE[node.target], exprs), torch.bool, shape)


LOGICAL = {aten.logical_and.default: "({0} && {1})", aten.logical_or.default: "({0} || {1})"}


@lower(LOGICAL, family="elementwise", dtypes=BOOL)
def _logical(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    return _ew(p, LOGICAL[node.target], "bool", args[:2], out)


@lower(aten.logical_not.default, family="elementwise", dtypes=BOOL)
def _logical_not(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    return _ew(p, "(!{0})", "bool", args[:1], out)


def _where_check(spec: Any) -> bool | str:
    cond = spec.inputs[0]
    return True if cond is not None and cond.dtype == torch.bool else "where with a non-bool condition"


@lower(aten.where.self, family="elementwise", dtypes=F32_BOOL, check=_where_check)
def _where(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    shape = _shape(out)
    cond = p.lazy(args[0], shape, torch.bool)
    kind = "bool" if out.dtype == torch.bool else "f32"
    a, b = (p.lazy(x, shape, out.dtype) for x in args[1:3])
    return Lazy(Expr(kind, "select({2}, {1}, {0})", (cond, a, b)), out.dtype, shape)


@lower(
    [aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.hardtanh.default], family="elementwise"
)
def _clamp(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    x = args[0]
    if node.target == aten.clamp_min.default:
        lo, hi = args[1], None
    elif node.target == aten.clamp_max.default:
        lo, hi = None, args[1]
    elif node.target == aten.hardtanh.default:
        lo, hi = (args[1] if len(args) > 1 else -1.0), (args[2] if len(args) > 2 else 1.0)
    else:
        lo = node.kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = node.kwargs.get("max", args[2] if len(args) > 2 else None)
    template, operands = "{0}", [x]
    if lo is not None:
        template = f"tb_max({template}, {{{len(operands)}}})"
        operands.append(float(lo))
    if hi is not None:
        template = f"tb_min({template}, {{{len(operands)}}})"
        operands.append(float(hi))
    return _ew(p, template, "f32", operands, out)


@lower(aten.leaky_relu.default, family="elementwise")
def _leaky_relu(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    slope = float(args[1]) if len(args) > 1 else 0.01
    return _ew(p, "select({0} * {1}, {0}, {0} > 0.0 || tb_isnan({0}))", "f32", [args[0], slope], out)


def _same_dtype_copy(spec: Any) -> bool | str:
    src, dst = spec.inputs[0], spec.outputs[0]
    if src is None or dst is None or src.dtype != dst.dtype:
        return "dtype conversion"
    device = spec.kwargs.get("device")
    return True if device is None or torch.device(device).type == "cpu" else "copy to another device"


@lower([aten.clone.default, aten._to_copy.default], family="elementwise", dtypes=F32_BOOL, check=_same_dtype_copy)
def _clone(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    shape = _shape(out)
    return Lazy(p.lazy(args[0], shape, out.dtype), out.dtype, shape)


@lower(aten.copy.default, family="elementwise", dtypes=F32_BOOL)
def _copy(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    shape = _shape(out)
    return Lazy(p.lazy(args[1], shape, out.dtype), out.dtype, shape)


def _float_fill(spec: Any) -> bool | str:
    out = spec.outputs[0]
    return True if out is not None and out.dtype in F32_BOOL else "fill of an unsupported dtype"


@lower([aten.full.default, aten.scalar_tensor.default], family="elementwise", dtypes=F32_BOOL, check=_float_fill)
def _full(p: Planner, node: FxNode, args: list[Any], out: Any) -> Lazy:
    value = args[1] if node.target == aten.full.default else args[0]
    shape = _shape(out)
    if out.dtype == torch.bool:
        return Lazy(Expr("bool", "true" if value else "false"), torch.bool, shape)
    return Lazy(p.lazy(float(value), shape, torch.float32), torch.float32, shape)


# ---- views: new strides over the same buffer ---------------------------------------------------
VIEWS = [
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.permute.default,
    aten.transpose.int,
    aten.t.default,
    aten.expand.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.slice.Tensor,
    aten.select.int,
    aten.alias.default,
]


@lower(VIEWS, family="view", dtypes=F32_BOOL)
def _view(p: Planner, node: FxNode, args: list[Any], out: Any) -> Value:
    x = p.materialize(args[0])
    try:
        return x.with_layout(node.target(x.meta(), *args[1:], **node.kwargs))
    except RuntimeError:
        # a reshape that strides cannot express (e.g. merging dims of a transposed view): copy first
        x = p.dense(x)
        return x.with_layout(node.target(x.meta(), *args[1:], **node.kwargs))


@lower(aten.cat.default, family="view", dtypes=F32_BOOL)
def _cat(p: Planner, node: FxNode, args: list[Any], out: Any) -> Value:
    result = p.new_value(out.dtype, _shape(out))
    dim = args[1] if len(args) > 1 else node.kwargs.get("dim", 0)
    dim = dim % max(len(result.shape), 1)
    start = 0
    for part in args[0]:
        if isinstance(part, (Value, Lazy)) and part.numel > 0:
            size = part.shape[dim]
            window = result.with_layout(result.meta().narrow(dim, start, size))
            p.materialize(part, out=window)
            start += size
    return result


# ---- matmul ------------------------------------------------------------------------------------
def _matmul_launch(p: Planner, a: Value, b: Value, bias: Value | None, alpha: float, beta: float, batch: int) -> Value:
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    shape = (batch, m, n) if a.rank == 3 else (m, n)
    out = p.new_value(torch.float32, shape)
    if out.numel == 0:
        return out

    def batch_stride(v: Value) -> int:
        return v.strides[0] if v.rank == 3 else 0

    words = [m, n, k, a.offset, batch_stride(a), a.strides[-2], a.strides[-1]]
    words += [b.offset, batch_stride(b), b.strides[-2], b.strides[-1]]
    if bias is not None:
        words += [bias.offset, batch_stride(bias), bias.strides[-2], bias.strides[-1], 1]
    else:
        words += [0, 0, 0, 0, 0]
    words += [f32_bits(alpha), f32_bits(beta)]
    slots = [out.slot, a.slot, b.slot, (bias or a).slot]
    p.launches.append(Launch("matmul", source("matmul"), slots, params(words), (-(-n // 64), -(-m // 64), batch)))
    return out


@lower([aten.mm.default, aten.bmm.default], family="matmul")
def _mm(p: Planner, node: FxNode, args: list[Any], out: Any) -> Value:
    a, b = p.materialize(args[0]), p.materialize(args[1])
    batch = a.shape[0] if a.rank == 3 else 1
    return _matmul_launch(p, a, b, None, 1.0, 0.0, batch)


@lower(aten.addmm.default, family="matmul")
def _addmm(p: Planner, node: FxNode, args: list[Any], out: Any) -> Value:
    bias, a, b = (p.materialize(x) for x in args[:3])
    beta = float(node.kwargs.get("beta", 1.0))
    alpha = float(node.kwargs.get("alpha", 1.0))
    shape = (a.shape[0], b.shape[1])
    from .values import broadcast_strides

    bias = Value(bias.slot, bias.dtype, shape, broadcast_strides(bias, shape), bias.offset, bias.buffer_numel)
    return _matmul_launch(p, a, b, bias, alpha, beta, 1)


# ---- reductions --------------------------------------------------------------------------------
REDUCE = {
    aten.sum.dim_IntList: "sum",
    aten.sum.default: "sum",
    aten.mean.dim: "mean",
    aten.mean.default: "mean",
    aten.amax.default: "amax",
    aten.amin.default: "amin",
}


def _reduce_check(spec: Any) -> bool | str:
    dtype = spec.kwargs.get("dtype")
    return True if dtype in (None, torch.float32) else f"reduction to {dtype}"


@lower(REDUCE, family="reduce", check=_reduce_check)
def _reduce(p: Planner, node: FxNode, args: list[Any], out: Any) -> Value:
    x = p.materialize(args[0])
    dims_arg = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else node.kwargs.get("dim")
    rank = x.rank
    dims = set(range(rank)) if not dims_arg else {d % max(rank, 1) for d in dims_arg}
    kept = [d for d in range(rank) if d not in dims]
    red = sorted(dims)
    result = p.new_value(torch.float32, _shape(out))
    if result.numel == 0:
        return result
    n_red = 1
    for d in red:
        n_red *= x.shape[d]
    words = [result.numel, n_red, x.offset]
    words += [x.shape[d] for d in kept] + [x.strides[d] for d in kept]
    words += [x.shape[d] for d in red] + [x.strides[d] for d in red]
    code = reduce_source(REDUCE[node.target], len(kept), len(red))
    p.launches.append(Launch("reduce", code, [result.slot, x.slot], params(words), grid(result.numel)))
    return result


# ---- softmax and norms -------------------------------------------------------------------------
@lower([aten._softmax.default, aten._log_softmax.default], family="softmax")
def _softmax(p: Planner, node: FxNode, args: list[Any], out: Any) -> Value:
    x = p.materialize(args[0])
    result = p.new_value(torch.float32, x.shape)
    if result.numel == 0:
        return result
    if x.rank == 0:
        x = Value(x.slot, x.dtype, (1,), (1,), x.offset, x.buffer_numel)
    dim = args[1] % x.rank
    outer = [d for d in range(x.rank) if d != dim]
    out_strides = contiguous(x.shape)
    rows = result.numel // x.shape[dim]
    words = [rows, x.shape[dim], x.offset, x.strides[dim], out_strides[dim]]
    words += [x.shape[d] for d in outer] + [x.strides[d] for d in outer] + [out_strides[d] for d in outer]
    log = "true" if node.target == aten._log_softmax.default else "false"
    code = source("softmax", OUTER_RANK=str(len(outer)), LOG=log)
    p.launches.append(Launch("softmax", code, [result.slot, x.slot], params(words), grid(rows)))
    return result


@lower(aten.native_layer_norm.default, family="norm")
def _layer_norm(p: Planner, node: FxNode, args: list[Any], out: Any) -> tuple[Value, Value, Value]:
    x = p.dense(args[0])
    normalized, weight, bias, eps = args[1], args[2], args[3], float(args[4])
    length = 1
    for s in normalized:
        length *= int(s)
    y = p.new_value(torch.float32, x.shape)
    mean = p.new_value(torch.float32, _shape(out[1]))
    rstd = p.new_value(torch.float32, _shape(out[2]))
    rows = x.numel // length if length else 0
    if rows == 0 or length == 0:
        if length == 0 and rows:
            raise PlanError("layer norm over zero elements")
        return y, mean, rstd
    w = p.dense(weight) if weight is not None else None
    b = p.dense(bias) if bias is not None else None
    words = [rows, length, f32_bits(eps), int(w is not None), int(b is not None)]
    slots = [y.slot, mean.slot, rstd.slot, x.slot, (w or x).slot, (b or x).slot]
    p.launches.append(Launch("layer_norm", source("layer_norm"), slots, params(words), grid(rows), writes=3))
    return y, mean, rstd


def keep_whole() -> frozenset[Any]:
    """Ops the engine runs directly, so core must not decompose them."""
    return frozenset({aten.gelu.default, aten.silu.default, aten.native_layer_norm.default, aten.hardtanh.default})


__all__ = ["LOWERINGS", "OPS", "Tensorish", "keep_whole"]
