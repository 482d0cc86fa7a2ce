"""Core decomposes an op only for an engine that does not lower it, and the result runs strictly."""

from __future__ import annotations

import torch

import torchburn
from helpers import assert_engine_ran, strict_compile
from torchburn.aten_graph import decomposition_table
from torchburn.decompositions import WHEN_MISSING, for_missing_ops

aten = torch.ops.aten


def test_only_missing_ops_are_decomposed() -> None:
    lowered = {aten.addmv.default}
    table = for_missing_ops(lowered, frozenset({aten.native_group_norm.default}))
    assert aten.addmv.default not in table  # the engine lowers it
    assert aten.native_group_norm.default not in table  # the engine keeps it whole
    assert aten._native_batch_norm_legit_functional.default in table
    assert set(table) <= set(WHEN_MISSING)


def test_the_reference_engine_keeps_its_functional_ops() -> None:
    reference = torchburn.get_engine("reference")  # runs every functional ATen op
    missing = for_missing_ops(reference.ops, reference.keep_whole())
    assert all(op._schema.is_mutable for op in missing)  # what it refuses: ops that write their inputs
    assert aten._native_batch_norm_legit_functional.default not in decomposition_table(reference)


def test_batch_norm_in_training_runs_on_the_native_engine() -> None:
    bn = torch.nn.BatchNorm2d(3).train()
    x = torch.randn(4, 3, 5, 5)
    expected = bn(x)  # also moves the running statistics once
    running = bn.running_mean.clone()
    got = strict_compile("native")(bn)(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert_engine_ran("native")
    # the compiled call updated the running statistics as eager does (a second step from `running`)
    assert not torch.equal(bn.running_mean, running)
