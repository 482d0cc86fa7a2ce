"""Upsampling on the native engine (``lowering/pool.py``, ``kernels/resample.rs``) against eager, strict:
bilinear (both corner conventions), nearest and nearest-exact, up and down, given sizes and given
factors, float32 and float64, NCHW and channels-last inputs. The op must reach the engine whole (one
kernel), not as the gathers of PyTorch's decomposition."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._dispatch.python import enable_python_dispatcher
from torch.fx.experimental.proxy_tensor import make_fx

import torchburn
from helpers import strict_compile

compile_ = strict_compile("native")

RESAMPLINGS: dict[str, dict[str, Any]] = {
    "bilinear_x2": {"scale_factor": 2, "mode": "bilinear"},
    "bilinear_x2_corners": {"scale_factor": 2, "mode": "bilinear", "align_corners": True},
    "bilinear_size": {"size": (11, 3), "mode": "bilinear"},  # up in one axis, down in the other
    "bilinear_factor": {"scale_factor": 1.7, "mode": "bilinear"},  # the factor, not the sizes, sets the grid
    "bilinear_recomputed": {"scale_factor": (0.5, 3), "mode": "bilinear", "recompute_scale_factor": True},
    "bilinear_same_size": {"size": (6, 10), "mode": "bilinear"},
    "nearest_x2": {"scale_factor": 2, "mode": "nearest"},
    "nearest_size": {"size": (9, 13), "mode": "nearest"},
    "nearest_down": {"scale_factor": 0.3, "mode": "nearest"},
    "nearest_exact": {"scale_factor": 1.5, "mode": "nearest-exact"},
}
KERNELS = {"bilinear": "aten.upsample_bilinear2d.default", "nearest": "aten.upsample_nearest2d.default"}
KERNELS["nearest-exact"] = "aten._upsample_nearest_exact2d.default"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(RESAMPLINGS))
def test_upsampling_matches_eager_as_one_kernel(name: str, dtype: torch.dtype) -> None:
    kwargs = RESAMPLINGS[name]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 6, 10, generator=g, dtype=dtype)
    torchburn.reset_coverage()
    with torch.no_grad():
        actual = compile_(lambda t: F.interpolate(t, **kwargs))(x)
    torch.testing.assert_close(actual, F.interpolate(x, **kwargs), rtol=1e-5, atol=1e-6)
    counts = torchburn.coverage()["native"]
    assert counts.get(KERNELS[kwargs["mode"]], {}).get("engine", 0) == 1, counts
    assert "aten.index.Tensor" not in counts and "aten._unsafe_index.Tensor" not in counts, counts


def test_many_planes_and_a_channels_last_input() -> None:
    """Enough rows for several tasks (each keeps its own width-interpolated rows), read through a copy
    of a channels-last input."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 40, 33, 47, generator=g).to(memory_format=torch.channels_last)
    fn = lambda t: F.interpolate(t, scale_factor=2, mode="bilinear")  # noqa: E731
    with torch.no_grad():
        actual = compile_(fn)(x)
    torch.testing.assert_close(actual, fn(x), rtol=1e-5, atol=1e-6)


def test_pytorchs_own_decomposition_is_left_in_place() -> None:
    """Keeping the op whole sets PyTorch's Python kernels aside only during the engine's trace: a trace
    afterwards still decomposes it."""
    x = torch.randn(1, 2, 4, 4)
    with torch.no_grad():
        compile_(lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"))(x)
        with enable_python_dispatcher():
            gm = make_fx(lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"))(x)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten.upsample_bilinear2d.default" not in targets
    assert "aten._unsafe_index.Tensor" in targets


def test_training_still_differentiates_the_decomposition() -> None:
    x = torch.randn(1, 2, 5, 5, requires_grad=True)
    fn = lambda t: F.interpolate(t, scale_factor=2, mode="bilinear").square().sum()  # noqa: E731
    compile_(fn)(x).backward()
    expected = x.grad.clone()
    x.grad = None
    fn(x).backward()
    torch.testing.assert_close(expected, x.grad)
