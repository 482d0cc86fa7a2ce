"""Core decomposes an op only for an engine that does not lower it, and the result runs strictly."""

from __future__ import annotations

import pytest
import torch

import torchburn
from helpers import assert_engine_ran, strict_compile
from torchburn.aten_graph import decomposition_table
from torchburn.decompositions import OWN, WHEN_MISSING, for_missing_ops

aten = torch.ops.aten


def test_only_missing_ops_are_decomposed() -> None:
    lowered = {aten.addmv.default}
    table = for_missing_ops(lowered, frozenset({aten.native_group_norm.default}))
    assert aten.addmv.default not in table  # the engine lowers it
    assert aten.native_group_norm.default not in table  # the engine keeps it whole
    assert aten._native_batch_norm_legit_functional.default in table
    assert set(table) <= set(WHEN_MISSING) | set(OWN)


def test_the_reference_engine_keeps_its_functional_ops() -> None:
    reference = torchburn.get_engine("reference")  # runs every functional ATen op
    missing = [op for op in for_missing_ops(reference.ops, reference.keep_whole()) if op.namespace == "aten"]
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


# (spatial dims, batch, in channels, out channels, size, kernel, stride, padding, dilation, groups)
CONVOLUTIONS = [
    (2, 2, 4, 6, 9, 3, 2, 1, 1, 2),
    (2, 2, 3, 4, 8, 3, 1, 1, 2, 1),
    (1, 3, 4, 4, 11, 2, 3, 0, 1, 4),
    (2, 2, 6, 3, 7, 3, 2, 1, 1, 3),
]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("shape", CONVOLUTIONS, ids=str)
def test_convolution_gradients_as_convolutions_match_eagers_kernel(shape: tuple[int, ...], transposed: bool) -> None:
    dims, n, c, o, size, k, stride, padding, dilation, groups = shape
    g = torch.Generator().manual_seed(1)
    x = torch.randn([n, c] + [size] * dims, generator=g)
    w_shape = [c, o // groups] if transposed else [o, c // groups]
    w = torch.randn(w_shape + [k] * dims, generator=g)
    extra = [1 if transposed and stride > 1 else 0] * dims
    args = ([stride] * dims, [padding] * dims, [dilation] * dims, transposed, extra, groups)
    y = aten.convolution(x, w, None, *args)
    grad = torch.randn(y.shape, generator=g)
    bias_size = [w.shape[1] * groups if transposed else o]
    expected = aten.convolution_backward(grad, x, w, bias_size, *args, [True, True, True])
    got = OWN[aten.convolution_backward.default](grad, x, w, bias_size, *args, [True, True, True])
    for name, a, b in zip(("input", "weight", "bias"), got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"{name} gradient: {m}")


@pytest.mark.parametrize(
    ("causal", "mask", "kv_heads", "source"),
    [(False, None, 4, 7), (True, None, 2, 6), (False, "additive", 4, 7), (True, "additive", 4, 9)],
)
def test_attention_gradients_from_lse_match_eagers_kernel(
    causal: bool, mask: str | None, kv_heads: int, source: int
) -> None:
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 6, 8, generator=g)
    k, v = torch.randn(2, kv_heads, source, 8, generator=g), torch.randn(2, kv_heads, source, 8, generator=g)
    kwargs = {} if mask is None else {"attn_mask": torch.randn(6, source, generator=g)}
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, **kwargs)
    grad = torch.randn(out.shape, generator=g)
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward
    expected = backward(grad, q, k, v, out, lse, 0.0, causal, **kwargs)
    got = OWN[backward.default](grad, q, k, v, out, lse, 0.0, causal, **kwargs)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _assert_native_gradients_match_eager(model: torch.nn.Module, x: torch.Tensor) -> None:
    """One backward of a squared-sum loss, eager then compiled strictly on native: equal gradients."""
    model(x).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad()
    strict_compile("native")(model)(x).square().sum().backward()
    for got, want in zip((p.grad for p in model.parameters()), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert_engine_ran("native")


def test_transposed_and_grouped_convolutions_train_on_the_native_engine() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2),
        torch.nn.ReLU(),
        torch.nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),
    )
    x = torch.randn(2, 4, 10, 10)
    _assert_native_gradients_match_eager(model, x)
    assert "aten.convolution_backward.default" not in torchburn.coverage()["native"]


def test_a_network_with_bilinear_upsampling_trains_on_the_native_engine() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.Upsample(scale_factor=2, mode="bilinear"),
        torch.nn.Conv2d(4, 2, 1),
    )
    x = torch.randn(2, 3, 6, 5)
    _assert_native_gradients_match_eager(model, x)  # strict: gathers forward, accumulating index_put backward


def test_3d_convolutions_train_on_the_native_engine_as_2d_ones() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv3d(4, 6, (3, 3, 2), stride=(2, 1, 1), padding=(1, 1, 0), dilation=(1, 2, 1), groups=2),
        torch.nn.ReLU(),
        torch.nn.ConvTranspose3d(6, 3, 3, stride=(2, 2, 1), padding=1, output_padding=(1, 0, 0)),
    )
    x = torch.randn(2, 4, 7, 8, 6)
    _assert_native_gradients_match_eager(model, x)
    assert "aten.convolution.default" in torchburn.coverage()["native"]


def test_transformers_grouped_product_becomes_atens_where_the_engine_lowers_it() -> None:
    transformers_moe = pytest.importorskip("transformers.integrations.moe")  # registers the op
    op = torch.ops.transformers.grouped_mm_fallback.default
    assert op not in for_missing_ops(set(), frozenset())  # nothing to become
    table = for_missing_ops({aten._grouped_mm.default}, frozenset())
    rows, weights = torch.randn(11, 8), torch.randn(4, 8, 12)
    offs = torch.tensor([3, 3, 7, 11])  # int64, as transformers' cumsum may give them; group 1 empty
    expected = transformers_moe._grouped_mm_fallback(rows, weights, offs)
    torch.testing.assert_close(table[op](rows, weights, offs), expected)
