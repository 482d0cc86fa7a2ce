"""GEMM weights read as ``w.t()`` (as Linear does) go through a cached row-major copy: the `gemm` crate
would gather such an operand element by element on every call, and MKL packs a row-major block faster
than a transposed one (with MKL, a GEMM that splits its columns between threads reads the copy in one
panel per thread).

The copy is made once per version of the weight; these tests prove that every way of changing a weight
(in place, ``.data =``, a new tensor) is seen on the next call on both paths, and that an unchanged
weight is not copied again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

Compile = Callable[..., Callable[..., Any]]
Ran = Callable[..., None]


def _regions(engine_name: str) -> Any:
    if engine_name == "reference":
        pytest.skip("native-only API")
    from torchburn_native.program import recent_regions

    return recent_regions


def test_weight_changes_are_seen_and_unchanged_weights_are_not_recopied(
    engine_name: str, compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    recent_regions = _regions(engine_name)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128)).eval()
    x = torch.randn(8, 256)
    fast = compile_engine(model)

    def check() -> None:
        with torch.no_grad():
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)

    check()
    region = recent_regions()[-1]
    copies = [copy for _, copy in region.derived_copies()]
    import torchburn_native
    from torchburn_native import gemm_backend

    assert len(copies) == 2, "both Linear weights should be read from row-major copies"
    # the first GEMM (8x256 @ 256x512) splits its 512 columns between threads: with MKL and two or more
    # threads its copy is [panels, 256, P]; the second (8x512 @ 512x128) is too small to split
    threads = torchburn_native.num_threads()
    paneled = gemm_backend() == "mkl" and threads > 1
    first = -(-512 // threads)
    panel = -(-first // 16) * 16
    assert tuple(copies[0].shape) == ((-(-512 // panel), 256, panel) if paneled else (256, 512))
    assert tuple(copies[1].shape) == (512, 128)
    check()
    again = [copy for _, copy in region.derived_copies()]
    assert all(a is b for a, b in zip(copies, again, strict=True)), "an unchanged weight was copied again"

    with torch.no_grad():
        model[0].weight.mul_(-2.0)  # in place: the version counter moves
    check()
    # new weights at Linear's own scale: unscaled normals would give outputs in the hundreds, where
    # f32's rounding in another summation order alone exceeds the tolerance near cancellations
    model[2].weight.data = torch.randn(128, 512) / 512**0.5  # new storage, same Parameter
    check()
    model[0].weight = nn.Parameter(torch.randn(512, 256) / 256**0.5)  # another tensor altogether
    check()
    assert_engine_ran()


def test_the_crate_path_keeps_weight_copies_current() -> None:
    """The same checks with the `gemm` crate, which reads weights through the cached copies (in a
    fresh process on the native engine: the GEMM backend is chosen once per process)."""
    from helpers import run_python

    test_file = os.path.abspath(__file__)
    proc = run_python(
        f"""
        import sys, torch, torchburn
        sys.path.insert(0, {os.path.dirname(os.path.dirname(test_file))!r})
        from helpers import assert_engine_ran
        import importlib.util
        spec = importlib.util.spec_from_file_location("weights_test", {test_file!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        compile_engine = lambda fn: torch.compile(
            fn, backend="torchburn", options={{"engine": "native", "fallback": "error"}}
        )
        module.test_weight_changes_are_seen_and_unchanged_weights_are_not_recopied(
            "native", compile_engine, lambda: assert_engine_ran("native")
        )
        import torchburn_native
        print(torchburn_native.gemm_backend())
        """,
        env={"TORCHBURN_BLAS": "own"},
    )
    assert proc.stdout.split()[-1] == "gemm-crate"


@pytest.mark.parametrize("out_features", [500, 17 * 64 + 3])
def test_a_weight_split_in_panels_with_a_short_last_one(
    engine_name: str, compile_engine: Compile, assert_engine_ran: Ran, out_features: int
) -> None:
    """Column counts that leave the last panel short (zero-padded in the copy) give eager's values."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(384, out_features), nn.GELU()).eval()
    x = torch.randn(24, 384)
    fast = compile_engine(model)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
    assert_engine_ran()
