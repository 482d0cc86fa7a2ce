"""Convolution gradients on the native engine against eager, strict: the weight gradient core writes as
a convolution over batch-and-channel-swapped views runs as one product over the batch
(``lowering/conv.py`` ``_weight_gradient``, ``kernels/conv_weight_grad.rs``), computing only the taps
its readers keep; the input gradient on small planes folds the batch's images into one product
(``kernels/conv.rs`` ``conv_transpose2d_folded``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

Regions = Callable[[], list[Any]]


@pytest.fixture
def recent_regions(engine_name: str) -> Regions:
    if engine_name == "reference":
        pytest.skip("native-only API")
    from torchburn_native.program import recent_regions as regions

    return regions


def _instrs(region: Any) -> list[dict[str, Any]]:
    with region._lock:
        plans = list(region._plans.values())
    return [i for _, planned in plans for i in json.loads(planned.plan_json)["instrs"]]


def _kinds(regions: list[Any]) -> list[str]:
    return [i["kind"] for r in regions for i in _instrs(r)]


# (batch, c_in, c_out, size, kernel, stride, padding, dilation)
GEOMETRIES = {
    "same_3x3": (2, 3, 4, 8, 3, 1, 1, 1),
    "stride2_3x3_even": (3, 4, 5, 8, 3, 2, 1, 1),  # the product has 4×4 taps, the readers keep 3×3
    "stem_7x7": (2, 3, 6, 20, 7, 2, 3, 1),
    "tiny_planes": (4, 8, 8, 2, 3, 1, 1, 1),
    "pointwise_stride2": (2, 6, 3, 7, 1, 2, 0, 1),
    "dilated": (2, 3, 4, 11, 3, 1, 2, 2),
    "one_image": (1, 5, 3, 6, 3, 1, 1, 1),
    "rectangular": (2, 3, 4, 9, (3, 2), (2, 1), (1, 0), 1),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_gradients_match_eager_with_the_weight_gradient_kernel(
    name: str, dtype: torch.dtype, compile_engine: Any, recent_regions: Regions, assert_engine_ran: Any
) -> None:
    n, c_in, c_out, size, kernel, stride, padding, dilation = GEOMETRIES[name]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, c_in, size, size + 1, generator=g, dtype=dtype)
    k = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    w = torch.randn(c_out, c_in, *k, generator=g, dtype=dtype)

    def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, None, stride, padding, dilation).sin().sum()

    x1, w1 = x.clone().requires_grad_(), w.clone().requires_grad_()
    compile_engine(loss)(x1, w1).backward()
    x2, w2 = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss(x2, w2).backward()
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}
    torch.testing.assert_close(w1.grad, w2.grad, **tol)
    torch.testing.assert_close(x1.grad, x2.grad, **tol)
    assert_engine_ran()
    grads = [i for r in recent_regions()[-2:] for i in _instrs(r) if i["kind"] == "conv2d_weight_grad"]
    assert len(grads) == 1, _kinds(recent_regions()[-2:])
    # only the taps the gradient keeps are computed
    assert grads[0]["out"]["shape"] == [c_out, c_in, *k]


def test_grouped_convolution_gradients_take_the_general_path(
    compile_engine: Any, recent_regions: Regions, assert_engine_ran: Any
) -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 4, 6, 6, generator=g)
    w = torch.randn(6, 2, 3, 3, generator=g)

    def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, None, 1, 1, 1, 2).square().sum()

    x1, w1 = x.clone().requires_grad_(), w.clone().requires_grad_()
    compile_engine(loss)(x1, w1).backward()
    x2, w2 = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss(x2, w2).backward()
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-4, atol=1e-4)
    assert_engine_ran()
    assert "conv2d_weight_grad" not in _kinds(recent_regions()[-2:])


@pytest.mark.parametrize("keep", ["full", "sliced", "sliced_and_full"])
def test_swapped_views_as_a_weight_gradient(
    keep: str, compile_engine: Any, recent_regions: Regions, assert_engine_ran: Any
) -> None:
    """The pattern itself, written by hand: the product's extra taps are computed when a reader keeps
    them, and left out when every reader slices them away."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 8, 8, generator=g)  # [N, C, H, W]
    grad = torch.randn(3, 5, 4, 4, generator=g)  # [N, O, Ho, Wo]: a stride-2 3×3 forward's gradient

    def product(x: torch.Tensor, grad: torch.Tensor) -> Any:
        full = torch.ops.aten.convolution.default(
            x.transpose(0, 1), grad.transpose(0, 1), None, [1, 1], [1, 1], [2, 2], False, [0, 0], 1
        )  # [C, O, 4, 4]
        sliced = full[:, :, :3, :3].transpose(0, 1)
        return {"full": (full,), "sliced": (sliced,), "sliced_and_full": (sliced, full * 2)}[keep]

    with torch.no_grad():
        got = compile_engine(product)(x, grad)
    want = product(x, grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert_engine_ran()
    grads = [i for i in _instrs(recent_regions()[-1]) if i["kind"] == "conv2d_weight_grad"]
    assert len(grads) == 1
    assert grads[0]["out"]["shape"][2:] == ([3, 3] if keep == "sliced" else [4, 4])


@pytest.mark.parametrize("stride", [1, 2])
def test_transposed_convolution_on_small_planes(stride: int, compile_engine: Any, assert_engine_ran: Any) -> None:
    """Input planes under 16 positions fold the batch's images into one product."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(6, 16, 2, 3, generator=g)
    w = torch.randn(16, 8, 3, 3, generator=g)
    b = torch.randn(8, generator=g)
    fn = lambda x, w, b: F.conv_transpose2d(x, w, b, stride, 1)  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(compile_engine(fn)(x, w, b), fn(x, w, b), rtol=1e-4, atol=1e-4)
    assert_engine_ran()
