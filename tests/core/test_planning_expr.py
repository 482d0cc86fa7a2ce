"""The shared elementwise expression node: its shape rules, traversal and compute-type rule."""

from __future__ import annotations

import pytest
import torch

from torchburn.planning import PlanError, compute_type, promoted_compute_type
from torchburn.planning import expr as E


def test_functions_take_their_arity_and_unknown_names_are_refused() -> None:
    x = E.load("x", "f32")
    with pytest.raises(PlanError, match="takes 2 operands"):
        E.apply("add", x)
    with pytest.raises(PlanError, match="takes 1 operands"):
        E.apply("exp", x, x)
    with pytest.raises(PlanError, match="'frobnicate' is not an elementwise function"):
        E.apply("frobnicate", x)


def test_predicates_yield_bool_and_other_functions_their_operand_type() -> None:
    a, b = E.load("a", "int"), E.load("b", "int")
    assert E.apply("lt", a, b).type == "bool"
    assert E.apply("is_nan", E.load("x", "f64")).type == "bool"
    assert E.apply("add", a, b).type == "int"
    assert E.where(E.apply("lt", a, b), E.const(1.0, "f32"), E.const(2.0, "f32")).type == "f32"


def test_cast_is_skipped_when_the_type_already_matches() -> None:
    x = E.load("x", "f32")
    assert E.cast(x, "f32") is x
    converted = E.cast(x, "int")
    assert converted.op == "cast" and converted.type == "int" and converted.args == (x,)


def test_nodes_visit_shared_subexpressions_once_operands_first() -> None:
    x = E.load("x", "f32")
    shared = E.apply("exp", x)
    root = E.apply("mul", shared, E.apply("add", shared, E.load("y", "f32")))
    order = list(E.nodes(root))
    assert len(order) == len({id(n) for n in order}) == 5  # x, exp, y, add, mul
    position = {id(n): i for i, n in enumerate(order)}
    for n in order:
        assert all(position[id(a)] < position[id(n)] for a in n.args)
    assert E.leaves(root) == ["x", "y"]


def test_a_long_chain_does_not_exhaust_the_stack() -> None:
    total = E.load("x", "f32")
    for _ in range(20_000):
        total = E.apply("add", total, E.const(1.0, "f32"))
    assert len(list(E.nodes(total))) == 40_001


def test_map_leaves_replaces_operands_and_keeps_sharing() -> None:
    x = E.load("x", "f32")
    shared = E.apply("sigmoid", x)
    root = E.apply("mul", shared, shared)
    moved = E.map_leaves(root, str.upper)
    assert E.leaves(moved) == ["X"]
    assert moved.args[0] is moved.args[1]
    assert E.leaves(root) == ["x"]  # the original is untouched


def test_require_names_the_missing_function() -> None:
    root = E.apply("add", E.apply("atanh", E.load("x", "f32")), E.const(1, "f32"))
    E.require({"add": "+", "atanh": "atanh"}, "tiny", root)
    with pytest.raises(PlanError, match="the tiny engine has no code for elementwise 'atanh'"):
        E.require({"add": "+"}, "tiny", root)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.float32, "f32"),
        (torch.float16, "f32"),
        (torch.bfloat16, "f32"),
        (torch.float64, "f64"),
        (torch.int8, "int"),
        (torch.int64, "int"),
        (torch.uint8, "int"),
        (torch.bool, "bool"),
    ],
)
def test_compute_type_follows_pytorchs_cpu_kernels(dtype: torch.dtype, expected: str) -> None:
    assert compute_type(dtype) == expected


def test_promotion_is_pytorchs() -> None:
    assert promoted_compute_type(torch.int32, torch.float16) == "f32"
    assert promoted_compute_type(torch.float32, torch.float64) == "f64"
    assert promoted_compute_type(torch.bool, torch.int8) == "int"
    assert promoted_compute_type(torch.bool, torch.bool) == "bool"
    with pytest.raises(ValueError, match="no elementwise compute type"):
        compute_type(torch.complex64)
