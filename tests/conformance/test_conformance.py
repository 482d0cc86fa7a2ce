"""Run every conformance case on every installed, available engine and compare with PyTorch eager.

Complete engines run in strict mode (``fallback="error"``): any op they do not implement fails the case.
Engines that declare ``partial_opset`` run with fallbacks allowed; their values must still match.
"""

from __future__ import annotations

import pytest
import torch
from conformance.cases import CASES, Case

import torchburn
from helpers import engine_counts

ENGINES = [e.name for e in torchburn.list_engines() if e.available]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("engine", ENGINES)
def test_matches_eager(engine: str, case: Case) -> None:
    fn, inputs = case.build(torch.Generator().manual_seed(1234))
    partial = torchburn.get_engine(engine).partial_opset
    options = {"engine": engine, "fallback": "silent" if partial else "error"}
    with torch.no_grad():
        expected = fn(*inputs)
        actual = torch.compile(fn, backend="torchburn", options=options)(*inputs)
    torch.testing.assert_close(actual, expected, rtol=case.rtol, atol=case.atol, equal_nan=True)
    ran, fell = engine_counts(engine)
    if partial:
        assert ran + fell > 0, "the graph never reached the engine"
    else:
        assert ran > 0 and fell == 0
