"""Kernel families beyond the conformance suite's cases: edge layouts, errors the GPU reports, dtypes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import torchburn
from torchburn_wgpu.program import recent_regions


def test_an_index_out_of_range_is_an_error_not_garbage(gpu_compile: Callable[..., Any]) -> None:
    table = torch.randn(10, 4)
    f = gpu_compile(lambda t, i: F.embedding(i, t) * 2)
    ok = torch.tensor([[0, 9], [3, 4]])
    torch.testing.assert_close(f(table, ok), F.embedding(ok, table) * 2)
    with pytest.raises(IndexError, match="index out of range"):
        f(table, torch.tensor([[0, 10], [3, 4]]))
    # negative indices count from the end, as in PyTorch's indexing
    g = gpu_compile(lambda t, i: t[i])
    neg = torch.tensor([-1, 0, -10])
    torch.testing.assert_close(g(table, neg), table[neg])
    with pytest.raises(IndexError):
        g(table, torch.tensor([-11]))


def test_int64_beyond_32_bits_is_refused_with_the_range(gpu_compile: Callable[..., Any]) -> None:
    f = gpu_compile(lambda x: x * 2 + 1)
    small = torch.tensor([1, -5, 2**29], dtype=torch.int64)
    got = f(small)
    assert got.dtype == torch.int64
    torch.testing.assert_close(got, small * 2 + 1)
    # strict: the engine's refusal reaches the caller as a FallbackError carrying its message
    with pytest.raises(torchburn.FallbackError, match=r"stores int64 tensors as 32-bit integers.*\[0, 4294967296\]"):
        f(torch.tensor([0, 2**32], dtype=torch.int64))
    # by default the region runs eagerly instead, warned, with the right values
    torch._dynamo.reset()
    g = torch.compile(lambda x: x * 2 + 1, backend="torchburn", options={"engine": "wgpu"})
    big = torch.tensor([0, 2**32], dtype=torch.int64)
    with pytest.warns(torchburn.TorchBurnFallbackWarning, match="stores int64 tensors as 32-bit integers"):
        torch.testing.assert_close(g(big), big * 2 + 1)


def test_integer_division_and_remainder_follow_python(gpu_compile: Callable[..., Any]) -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.div(a, b, rounding_mode="floor"), torch.div(a, b, rounding_mode="trunc"), a % b

    a = torch.tensor([7, -7, 7, -7, 0, 6, -6])
    b = torch.tensor([2, 2, -2, -2, 3, -4, 4])
    for got, want in zip(gpu_compile(f)(a, b), f(a, b), strict=True):
        assert torch.equal(got, want), (got, want)


def test_float64_keeps_double_precision(gpu_compile: Callable[..., Any]) -> None:
    from torchburn_wgpu.device import gpu

    if not gpu().f64:
        pytest.skip("this adapter has no shader-f64 (float64 nodes are then declared unsupported)")
    a = torch.randn(20, 30, dtype=torch.float64)
    b = torch.randn(30, 10, dtype=torch.float64)
    f = gpu_compile(lambda a, b: torch.relu(a @ b + 0.1) - 1e-9)
    got = f(a, b)
    assert got.dtype == torch.float64
    # float32 arithmetic would be off by ~1e-6 here
    torch.testing.assert_close(got, torch.relu(a @ b + 0.1) - 1e-9, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("layout", "mode"),
    [
        ("row-major", "const A_VEC: bool = true;|const B_MODE: u32 = 1u;"),
        ("linear weight", "const A_VEC: bool = true;|const B_MODE: u32 = 2u;"),
        ("odd sizes", "const A_VEC: bool = false;|const B_MODE: u32 = 0u;"),
        ("both transposed", "const A_VEC: bool = false;|const B_MODE: u32 = 2u;"),
    ],
)
@pytest.mark.parametrize("tile", [128, 64])
def test_matmul_stages_each_operand_along_its_contiguous_dim(
    layout: str, mode: str, tile: int, gpu_compile: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchburn_wgpu.lowering import matmul

    # products this small take 64-tiles; forbid them (0) or force them (always below)
    monkeypatch.setattr(matmul, "SMALL_TILE_BELOW", 0 if tile == 128 else 1 << 30)
    torch.manual_seed(0)
    m, k, n = (37, 45, 29) if layout == "odd sizes" else (136, 72, 200)
    a, w = torch.randn(m, k), torch.randn(n, k)
    fn = {
        "row-major": lambda x, y: x @ y.t().contiguous(),
        "linear weight": lambda x, y: x @ y.t(),  # nn.Linear's x @ w.t(): B contiguous along k
        "odd sizes": lambda x, y: x @ y.t(),
        "both transposed": lambda x, y: x.t() @ y.t(),
    }[layout]
    x = a.t().contiguous() if layout == "both transposed" else a
    want = fn(x.double(), w.double()).float()
    torch.testing.assert_close(gpu_compile(fn)(x, w), want, rtol=1e-4, atol=1e-4)
    (plan,) = recent_regions()[-1].plans.values()
    (launch,) = [launch for launch in plan.launches if launch.family == "matmul"]
    for line in [*mode.split("|"), f"const TM: u32 = {tile}u;"]:
        assert line in launch.source


@pytest.mark.parametrize(
    ("stride", "padding", "dilation", "groups"),
    [(1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), (2, 1, 1, 4), (1, 1, 1, 8)],
)
def test_conv2d_layouts(stride: int, padding: int, dilation: int, groups: int, gpu_compile: Callable[..., Any]) -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 16, 3, stride=stride, padding=padding, dilation=dilation, groups=groups).eval()
    x = torch.randn(2, 8, 13, 11).permute(0, 1, 3, 2)  # a non-contiguous input
    with torch.no_grad():
        torch.testing.assert_close(gpu_compile(conv)(x), conv(x), rtol=1e-4, atol=1e-4)
    (plan,) = recent_regions()[-1].plans.values()
    assert [launch.family for launch in plan.launches] == ["conv"]  # no im2col buffer, no copy


@pytest.mark.parametrize(("stride", "padding", "output_padding"), [(2, 0, 0), (2, 1, 1), (3, 1, 2)])
def test_transposed_conv2d(stride: int, padding: int, output_padding: int, gpu_compile: Callable[..., Any]) -> None:
    torch.manual_seed(0)
    conv = torch.nn.ConvTranspose2d(6, 4, 3, stride=stride, padding=padding, output_padding=output_padding).eval()
    x = torch.randn(1, 6, 5, 7)
    with torch.no_grad():
        torch.testing.assert_close(gpu_compile(conv)(x), conv(x), rtol=1e-4, atol=1e-4)


def test_pooling_with_padding_ceil_mode_and_nan(gpu_compile: Callable[..., Any]) -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
            F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
            F.avg_pool2d(x, 2, divisor_override=3),
        )

    x = torch.randn(2, 3, 9, 10)
    x[0, 0, 4, 4] = float("nan")
    for got, want in zip(gpu_compile(f)(x), f(x), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_argmax_ties_and_nan_match_pytorch(gpu_compile: Callable[..., Any]) -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [float("nan"), 1.0, float("nan"), 5.0], [0.0, 0.0, 0.0, 0.0]])
    f = gpu_compile(lambda x: (x.argmax(-1), x.argmin(-1)))
    for got, want in zip(f(x), (x.argmax(-1), x.argmin(-1)), strict=True):
        assert torch.equal(got, want), (got, want)


def test_float16_is_stored_half_and_computed_in_float32(gpu_compile: Callable[..., Any]) -> None:
    from torchburn_wgpu.device import gpu

    if not gpu().f16:
        pytest.skip("this adapter has no shader-f16 (float16 nodes are then declared unsupported)")

    def f(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = F.gelu(a * b + 1.0)  # half in, half out
        return h, (a @ w).relu(), a.float().sum(-1), torch.cat([a, b], 0).half()

    torch.manual_seed(0)
    a, b, w = torch.randn(33, 17).half(), torch.randn(33, 17).half(), torch.randn(17, 9).half()
    got, want = gpu_compile(f)(a, b, w), f(a, b, w)
    for g, e in zip(got, want, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        # PyTorch rounds to half after each op; here a fused chain rounds once, so results may differ
        # by an ulp of float16
        torch.testing.assert_close(g.float(), e.float(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "products"])
@pytest.mark.parametrize(
    ("q_len", "k_len", "mask", "causal"),
    [(5, 7, None, False), (5, 7, None, True), (5, 7, "bool", False), (5, 7, "float", False), (3, 2500, None, False)],
)
def test_attention_kept_whole(
    q_len: int,
    k_len: int,
    mask: str | None,
    causal: bool,
    fused: bool,
    gpu_compile: Callable[..., Any],
    monkeypatch: Any,
) -> None:
    from torchburn_wgpu.lowering import attention

    # small problems take the two-products plan; force each plan in turn
    monkeypatch.setattr(attention, "SCORES_IN_MEMORY", 0 if fused else 1 << 30)
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, q_len, 16), torch.randn(2, 3, k_len, 16), torch.randn(2, 3, k_len, 16)
    m: torch.Tensor | None = None
    if mask == "bool":
        m = torch.rand(q_len, k_len) > 0.3
        m[1] = False  # a row that sees no key: PyTorch gives zeros there
    elif mask == "float":
        m = torch.randn(2, 1, q_len, k_len)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)

    with torch.no_grad():
        torch.testing.assert_close(gpu_compile(f)(q, k, v), f(q, k, v), rtol=1e-5, atol=1e-5)
    (plan,) = recent_regions()[-1].plans.values()
    families = [launch.family for launch in plan.launches]
    assert ("attention" in families) == fused, families
