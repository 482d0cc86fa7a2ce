"""Indexing by a tensor of positions (``index.wgsl``): embedding, index_select, ``x[idx]``, gather and
scatter. Each is one pass over an iteration space whose dims step through the source, the index and
the output by their own strides; only the stride that the index value multiplies differs between them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchburn.planning import Expr, Family, expr

from ..kernels import Launch, grid, params
from ..planner import Lazy, PlanError, Planner, constant
from ..shaders import source
from ..values import WGSL_TYPES, Value, broadcast_strides
from . import ANY, FxNode, lower, shape_of

aten = torch.ops.aten


# scatter_reduce's reductions as a function of the old and the new value, by compute type
COMBINE = {
    "sum": {"f32": "a + b", "i32": "a + b"},
    "prod": {"f32": "a * b", "i32": "a * b"},
    "amax": {"f32": "tb_max(a, b)", "i32": "max(a, b)"},
    "amin": {"f32": "tb_min(a, b)", "i32": "min(a, b)"},
}


def _bodies(mode: str, wgsl_type: str, combine: str | None) -> dict[str, str]:
    """The fills of ``index.wgsl`` for a gather, a plain scatter or a combining one."""
    if mode == "gather":
        return {
            "OUT_ELEMENT": wgsl_type,
            "GATHER_ZERO": f"out[o] = {wgsl_type}(0);",
            "BODY": "out[o] = src[s + moved];",
        }
    if mode == "scatter":
        return {"OUT_ELEMENT": wgsl_type, "GATHER_ZERO": "", "BODY": "out[o + moved] = src[s];"}
    if wgsl_type not in ("f32", "i32") or combine is None:
        raise PlanError(f"a combining scatter of {wgsl_type}")
    bits = "u32" if wgsl_type == "f32" else "i32"
    read, write = ("bitcast<f32>(old)", "bitcast<u32>") if wgsl_type == "f32" else ("old", "")
    body = "\n".join(
        [
            "let place = o + moved;",
            "    let value = src[s];",
            "    var old = atomicLoad(&out[place]);",
            "    loop {",
            f"        let swapped = atomicCompareExchangeWeak(&out[place], old, {write}(combine({read}, value)));",
            "        if (swapped.exchanged) {",
            "            break;",
            "        }",
            "        old = swapped.old_value;",
            "    }",
        ]
    )
    return {"OUT_ELEMENT": f"atomic<{bits}>", "GATHER_ZERO": "", "BODY": body}


def _launch(
    p: Planner,
    out: Value,
    src: Value,
    index: Value,
    *,
    bound: int,
    gather_stride: int,
    shape: Sequence[int],
    steps: tuple[Sequence[int], Sequence[int], Sequence[int]],
    offsets: tuple[int, int, int],
    mode: str = "gather",
    combine: str | None = None,
) -> None:
    """One ``index.wgsl`` pass: ``mode`` gather (out[o] = src[s + at]), scatter (out[o + at] = src[s])
    or combine (out[o + at] = combine(out[o + at], src[s]), ``combine`` a key of :data:`COMBINE`)."""
    count = 1
    for s in shape:
        count *= s
    if count == 0:
        return
    src_steps, index_steps, out_steps = steps
    words = [count, bound, gather_stride, *offsets, *shape, *src_steps, *index_steps, *out_steps]
    wgsl_type = WGSL_TYPES[out.dtype]
    rule = COMBINE[combine].get(wgsl_type, "a") if combine is not None else "a"
    fills = _bodies(mode, wgsl_type, combine)
    modes = {"gather": "0", "scatter": "1", "combine": "2"}
    code = source("index", TYPE=wgsl_type, RANK=str(len(shape)), MODE=modes[mode], COMBINE=rule, **fills)
    slots = [out.slot, src.slot, index.slot, p.error_flag()]
    p.launches.append(Launch("index", code, slots, params(words), grid(-(-count // 256)), writes=1))


def _index_value(p: Planner, x: Any) -> Value:
    v = p.materialize(x)
    if v.dtype not in (torch.int64, torch.int32):
        raise PlanError(f"indices of dtype {v.dtype}")
    return v


# padding_idx, scale_grad_by_freq and sparse change only the gradient
@lower(aten.embedding.default, family=Family.INDEX, dtypes=ANY, reads=("padding_idx", "scale_grad_by_freq", "sparse"))
def _embedding(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    out = p.out_meta()
    weight, ids = p.materialize(args[0]), _index_value(p, args[1])
    result = p.new_value(shape_of(out), weight.dtype)
    d = weight.shape[1]
    shape = [*ids.shape, d]
    _launch(
        p,
        result,
        weight,
        ids,
        bound=weight.shape[0],
        gather_stride=weight.strides[0],
        shape=shape,
        steps=([0] * ids.rank + [weight.strides[1]], [*ids.strides, 0], list(result.strides)),
        offsets=(weight.offset, ids.offset, 0),
    )
    return result


def _select_along(p: Planner, x: Value, dim: int, idx: Value, out: Any) -> Value:
    """``x`` with dim ``dim`` replaced by the dims of ``idx``: index_select and ``x[..., idx, ...]``."""
    result = p.new_value(shape_of(out), x.dtype)
    pre, post = x.shape[:dim], x.shape[dim + 1 :]
    shape = [*pre, *idx.shape, *post]
    src_steps = [*x.strides[:dim], *([0] * idx.rank), *x.strides[dim + 1 :]]
    index_steps = [*([0] * len(pre)), *idx.strides, *([0] * len(post))]
    _launch(
        p,
        result,
        x,
        idx,
        bound=x.shape[dim],
        gather_stride=x.strides[dim],
        shape=shape,
        steps=(src_steps, index_steps, list(result.strides)),
        offsets=(x.offset, idx.offset, 0),
    )
    return result


@lower(aten.index_select.default, family=Family.INDEX, dtypes=ANY)
def _index_select(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    out = p.out_meta()
    x = p.materialize(args[0])
    idx = _index_value(p, args[2])
    if x.rank == 0 or idx.rank == 0:  # a 0-d tensor or index is a 1-element dim here
        x = x.with_layout(x.meta().reshape(x.shape or (1,)))
        idx = idx.with_layout(idx.meta().reshape(idx.shape or (1,)))
        dim = args[1] % x.rank
        shape = (*x.shape[:dim], *idx.shape, *x.shape[dim + 1 :])
        flat = _select_along(p, x, dim, idx, torch.empty(shape, dtype=x.dtype, device="meta"))
        return flat.with_layout(flat.meta().reshape(shape_of(out)))
    return _select_along(p, x, args[1] % x.rank, idx, out)


def _integer_indices(spec: Any) -> bool | str:
    bools = [s for s in spec.tensor_inputs[1:] if s.dtype == torch.bool]
    return "indexing by a boolean mask (its result's size depends on the values)" if bools else True


@lower(aten.index.Tensor, family=Family.INDEX, dtypes=ANY, check=_integer_indices)
def _index(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    out = p.out_meta()
    x = p.materialize(args[0])
    given = [(d, _index_value(p, i)) for d, i in enumerate(args[1]) if i is not None]
    if len(given) == 1:
        dim, idx = given[0]
        return _select_along(p, x, dim, idx, out)
    return _index_many(p, x, given, out)


def _offsets(
    p: Planner, shape: Sequence[int], strides: Sequence[int], given: list[tuple[int, Value]]
) -> tuple[Value, tuple[int, ...]]:
    """The element offsets that index tensors ``given`` (dim, indices) select in a tensor of ``shape``
    and ``strides``, summed into one int32 tensor of their broadcast shape by an elementwise kernel; a
    position out of range gets a negative offset, which the index kernel reports. Returns the offsets
    and the broadcast shape."""
    shapes = [tuple(i.shape) for _, i in given]
    batch: tuple[int, ...] = tuple(torch.Size(torch.broadcast_shapes(*shapes)))  # type: ignore[no-untyped-call]
    linear: Expr = constant(0, "int")
    valid: Expr = constant(True, "bool")
    for dim, idx in given:
        size, stride = shape[dim], strides[dim]
        i = expr.cast(p.lazy(idx, batch), "int")
        wrapped = expr.where(expr.apply("lt", i, constant(0, "int")), expr.apply("add", i, constant(size, "int")), i)
        linear = expr.apply("add", linear, expr.apply("mul", wrapped, constant(stride, "int")))
        in_range = expr.apply(
            "logical_and",
            expr.apply("ge", wrapped, constant(0, "int")),
            expr.apply("lt", wrapped, constant(size, "int")),
        )
        valid = expr.apply("logical_and", valid, in_range)
    offsets = expr.where(valid, linear, constant(-(2**31), "int"))
    return p.materialize(Lazy(offsets, torch.int32, batch)), batch


def _around(rank: int, indexed: list[int]) -> tuple[list[int], list[int]]:
    """The dims before and after the broadcast index dims in ``x[i, j, ...]``: adjacent indexed dims
    are replaced in place, others (PyTorch's rule) go first."""
    rest = [d for d in range(rank) if d not in indexed]
    if indexed == list(range(indexed[0], indexed[-1] + 1)):
        return [d for d in rest if d < indexed[0]], [d for d in rest if d > indexed[-1]]
    return [], rest


def _index_many(p: Planner, x: Value, given: list[tuple[int, Value]], out: Any) -> Value:
    """``x[i, j, ...]`` with several index tensors: their element offsets summed into one index tensor
    (:func:`_offsets`), then one gather with unit stride."""
    index, batch = _offsets(p, x.shape, x.strides, given)
    result = p.new_value(shape_of(out), x.dtype)
    pre, post = _around(x.rank, [d for d, _ in given])
    shape = [*(x.shape[d] for d in pre), *batch, *(x.shape[d] for d in post)]
    src_steps = [*(x.strides[d] for d in pre), *([0] * len(batch)), *(x.strides[d] for d in post)]
    index_steps = [*([0] * len(pre)), *index.strides, *([0] * len(post))]
    _launch(
        p,
        result,
        x,
        index,
        bound=2**31 - 1,
        gather_stride=1,
        shape=shape,
        steps=(src_steps, index_steps, list(result.strides)),
        offsets=(x.offset, index.offset, 0),
    )
    return result


def _index_put_check(spec: Any) -> bool | str:
    accumulate = spec.args[3] if len(spec.args) > 3 else spec.kwargs.get("accumulate", False)
    if accumulate and _combinable(spec) is not True:
        return _combinable(spec)
    indices = [i for i in spec.args[1] if i is not None]
    if not indices:
        return "index_put without an index tensor"
    if any(i.meta["val"].dtype not in (torch.int64, torch.int32) for i in indices):
        return "index_put by a boolean mask (the positions depend on the values)"
    return True


@lower(aten.index_put.default, family=Family.INDEX, dtypes=ANY, check=_index_put_check)
def _index_put(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    """``x[i, j, ...] = values`` on a copy of ``x``: the offsets of the indexed positions in the copy
    (:func:`_offsets`), then one scatter of ``values`` broadcast to the indexed shape. Where positions
    repeat, which value stays is unspecified (as in PyTorch); with ``accumulate`` they all add up."""
    accumulate = args[3] if len(args) > 3 else node.kwargs.get("accumulate", False)
    out = p.out_meta()
    result = p.new_value(shape_of(out), out.dtype)
    p.materialize(Lazy(p.lazy(args[0], result.shape), out.dtype, result.shape), out=result)
    given = [(d, _index_value(p, i)) for d, i in enumerate(args[1]) if i is not None]
    index, batch = _offsets(p, result.shape, result.strides, given)
    pre, post = _around(result.rank, [d for d, _ in given])
    shape = (*(result.shape[d] for d in pre), *batch, *(result.shape[d] for d in post))
    values = p.materialize(Lazy(p.lazy(args[2], shape), out.dtype, shape)) if args[2].dtype != out.dtype else None
    src = values if values is not None else p.materialize(args[2])
    out_steps = [*(result.strides[d] for d in pre), *([0] * len(batch)), *(result.strides[d] for d in post)]
    index_steps = [*([0] * len(pre)), *index.strides, *([0] * len(post))]
    _launch(
        p,
        result,
        src,
        index,
        bound=2**31 - 1,
        gather_stride=1,
        shape=shape,
        steps=(list(broadcast_strides(src, shape)), index_steps, out_steps),
        offsets=(src.offset, index.offset, 0),
        mode="combine" if accumulate else "scatter",
        combine="sum" if accumulate else None,
    )
    return result


@lower(aten.gather.default, family=Family.INDEX, dtypes=ANY, reads=("sparse_grad",))  # gradient layout only
def _gather(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    out = p.out_meta()
    x, idx = p.materialize(args[0]), _index_value(p, args[2])
    dim = args[1] % max(x.rank, 1)
    result = p.new_value(shape_of(out), x.dtype)
    src_steps = [0 if d == dim else s for d, s in enumerate(x.strides)]
    _launch(
        p,
        result,
        x,
        idx,
        bound=x.shape[dim],
        gather_stride=x.strides[dim],
        shape=list(idx.shape),
        steps=(src_steps, list(idx.strides), list(result.strides)),
        offsets=(x.offset, idx.offset, 0),
    )
    return result


def _scatter_into_copy(p: Planner, args: Sequence[Any], combine: str | None) -> Value:
    """A copy of ``x``, then each ``src`` element written (or, with ``combine``, folded) where its
    index says along ``dim``."""
    out = p.out_meta()
    x, idx, src = args[0], _index_value(p, args[2]), p.materialize(args[3])
    result = p.new_value(shape_of(out), out.dtype)
    p.materialize(Lazy(p.lazy(x, result.shape), out.dtype, result.shape), out=result)
    if src.dtype != result.dtype:
        src = p.materialize(Lazy(p.lazy(src, src.shape), result.dtype, src.shape))
    dim = args[1] % max(result.rank, 1)
    out_steps = [0 if d == dim else s for d, s in enumerate(result.strides)]
    _launch(
        p,
        result,
        src,
        idx,
        bound=result.shape[dim],
        gather_stride=result.strides[dim],
        shape=list(idx.shape),
        steps=(list(src.strides), list(idx.strides), out_steps),
        offsets=(src.offset, idx.offset, 0),
        mode="scatter" if combine is None else "combine",
        combine=combine,
    )
    return result


@lower(aten.scatter.src, family=Family.INDEX, dtypes=ANY)
def _scatter(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    """Where two elements land on one place, which one stays is unspecified (as in PyTorch)."""
    return _scatter_into_copy(p, args, None)


def _combinable(spec: Any) -> bool | str:
    out = spec.outputs[0]
    if out is None or out.dtype not in (torch.float32, torch.int32, torch.int64):
        return f"a combining scatter into {out.dtype if out is not None else 'nothing'}"
    return True


@lower(aten.scatter_add.default, family=Family.INDEX, dtypes=ANY, check=_combinable)
def _scatter_add(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    """The sums land in an order the GPU picks: float results differ from eager's by rounding."""
    return _scatter_into_copy(p, args, "sum")


def _scatter_reduce_check(spec: Any) -> bool | str:
    reduce = spec.args[4]
    include_self = spec.args[5] if len(spec.args) > 5 else spec.kwargs.get("include_self", True)
    if reduce not in COMBINE:
        return f"scatter_reduce with reduce={reduce!r}"
    if not include_self:
        return "scatter_reduce with include_self=False"
    return _combinable(spec)


@lower(aten.scatter_reduce.two, family=Family.INDEX, dtypes=ANY, check=_scatter_reduce_check)
def _scatter_reduce(p: Planner, node: FxNode, *args: Any, **kwargs: Any) -> Value:
    include_self = args[5] if len(args) > 5 else node.kwargs.get("include_self", True)
    assert include_self  # declined by the check otherwise
    return _scatter_into_copy(p, args, args[4])
