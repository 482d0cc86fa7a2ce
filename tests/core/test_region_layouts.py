"""A graph that runs in pieces (the engine's regions, and ops PyTorch runs between them) sees at run time
the layouts it was traced with: a region hands each output back with its traced strides, since an op
that PyTorch runs may lay its result out like its input, and a view after it holds only for the traced
layout."""

from __future__ import annotations

import pytest
import torch

import torchburn
from helpers import engine_counts


@torch.library.custom_op("torchburn_tests::copy_like", mutates_args=())
def copy_like(x: torch.Tensor) -> torch.Tensor:
    """A copy in the input's own layout (as CPU attention lays its output out like its query): an op no
    engine runs."""
    return x.clone()


@copy_like.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def heads_round_trip(x: torch.Tensor) -> torch.Tensor:
    b, t, h, d = x.shape
    q = (x * 2.0).transpose(1, 2)  # [b, h, t, d], traced with [b, t, h, d]'s strides
    o = copy_like(q)
    return o.transpose(1, 2).reshape(b, t, h * d) + 1.0  # a view for the traced layout only


@pytest.mark.parametrize("engine", ["native", "wgpu"])
def test_a_region_output_keeps_its_traced_layout(engine: str) -> None:
    x = torch.randn(2, 5, 3, 4)
    torchburn.reset_coverage()
    compiled = torch.compile(heads_round_trip, backend="torchburn", options={"engine": engine, "fallback": "silent"})
    torch.testing.assert_close(compiled(x), heads_round_trip(x))
    ran, fell = engine_counts(engine)
    assert ran > 0 and fell > 0  # the engine ran the arithmetic, PyTorch the copy between
