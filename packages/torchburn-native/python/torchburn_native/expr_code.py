"""The native engine's code table for the shared elementwise expression (:mod:`torchburn.planning.expr`):
how each node becomes a step of the fused ``elementwise`` instruction (``src/plan/expr.rs`` decodes
the steps, ``src/kernels/elementwise.rs`` runs them).

Every step writes one register; registers hold the instruction's one domain (f32, f64 or i64), so a
predicate's bool is 0 or 1 there and converting a bool into the domain is free.
"""

from __future__ import annotations

from typing import Any

from torchburn.planning import Expr, PlanError
from torchburn.planning.expr import BINARY, UNARY

from .values import Value

# vocabulary function -> the instruction's function (``UnaryFn``/``BinaryFn``, serialised by name)
UNARY_CODE: dict[str, str] = {fn: fn for fn in UNARY}
BINARY_CODE: dict[str, str] = {fn: fn for fn in BINARY}

LoadKey = tuple[int, int, tuple[int, ...], tuple[int, ...]]


def steps(expr: Expr) -> tuple[list[dict[str, Any]], list[Value], int]:
    """``expr`` as the instruction's steps (each shared node once), the Values it loads (one per
    distinct view) and the number of registers; the last step's register holds the result."""
    code: list[dict[str, Any]] = []
    loads: list[Value] = []
    load_index: dict[LoadKey, int] = {}
    reg: dict[int, int] = {}
    # iterative: a long chain (a thousand-term sum) must not overflow Python's stack
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        e, ready = stack.pop()
        if id(e) in reg:
            continue
        if e.args and not ready:
            stack.append((e, True))
            stack.extend((a, False) for a in reversed(e.args))
            continue
        d = len(reg)
        code.append(_step(e, d, [reg[id(a)] for a in e.args], loads, load_index))
        reg[id(e)] = d
    return code, loads, len(reg)


def _step(e: Expr, d: int, args: list[int], loads: list[Value], load_index: dict[LoadKey, int]) -> dict[str, Any]:
    if e.op == "load":
        v: Value = e.leaf
        key = (id(v.buffer), v.offset, v.shape, v.strides)
        if key not in load_index:
            load_index[key] = len(loads)
            loads.append(v)
        return {"op": "load", "d": d, "input": load_index[key]}
    if e.op == "const":
        c = e.value
        ivalue = int(c) if isinstance(c, (int, bool)) or (float(c).is_integer() and abs(c) < 2**63) else 0
        return {"op": "const", "d": d, "value": float(c), "ivalue": ivalue}
    if e.op == "position":
        return {"op": "iota", "d": d}
    if e.op == "where":
        return {"op": "where", "d": d, "c": args[0], "a": args[1], "b": args[2]}
    if e.op == "cast":
        if e.args[0].type == "bool":  # already 0 or 1 in the domain
            return {"op": "unary", "d": d, "f": "identity", "a": args[0]}
        raise PlanError(f"a {e.args[0].type} to {e.type} conversion inside one fused instruction")
    if e.op in UNARY_CODE:
        return {"op": "unary", "d": d, "f": UNARY_CODE[e.op], "a": args[0]}
    if e.op in BINARY_CODE:
        return {"op": "binary", "d": d, "f": BINARY_CODE[e.op], "a": args[0], "b": args[1]}
    raise PlanError(f"the native engine has no code for elementwise {e.op!r}")
