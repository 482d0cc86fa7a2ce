"""Whole models through each engine in strict mode (fallback="error"), compared with PyTorch eager.

Inference only: eval mode and torch.no_grad(), seeded random weights, small inputs. Each test proves the
engine ran the graph (nodes counted in torchburn.coverage(), none fell back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torchvision
import transformers
from torch import nn

from helpers import calibrate_batchnorm, seeded_randn

F32 = {"rtol": 1e-4, "atol": 1e-4}
DEEP = {"rtol": 1e-3, "atol": 1e-3}  # ~20 stacked convolutions: summation order differences add up


def _run(
    compile_engine: Callable[..., Any], model: nn.Module, *args: Any, **kwargs: Any
) -> tuple[Any, Any, Callable[..., Any]]:
    """(eager result, compiled result, compiled model), inference mode."""
    model.eval()
    with torch.no_grad():
        expected = model(*args, **kwargs)
        fast = compile_engine(model)
        actual = fast(*args, **kwargs)
    return expected, actual, fast


def test_mlp(compile_engine: Callable[..., Any], assert_engine_ran: Callable[..., None]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 256))
    x = seeded_randn(32, 512)
    expected, actual, fast = _run(compile_engine, model, x)
    torch.testing.assert_close(actual, expected, **F32)
    assert actual.shape == (32, 256)
    with torch.no_grad():  # a second call with new values reuses the program
        x2 = seeded_randn(32, 512, seed=99)
        torch.testing.assert_close(fast(x2), model(x2), **F32)
    assert_engine_ran(3)  # two linears and the relu


@pytest.mark.parametrize("size", [64, 224])
def test_resnet18(size: int, compile_engine: Callable[..., Any], assert_engine_ran: Callable[..., None]) -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    calibrate_batchnorm(model, 2, 3, 64, 64)
    x = seeded_randn(1, 3, size, size)
    expected, actual, _ = _run(compile_engine, model, x)
    assert expected.abs().max() > 0.1  # a meaningful signal, not numerically ~0
    torch.testing.assert_close(actual, expected, **DEEP)
    assert_engine_ran(20)  # 20 convolutions alone


@pytest.mark.parametrize("variant", ["small", "large"])
def test_mobilenet_v3(variant: str, compile_engine: Callable[..., Any], assert_engine_ran: Callable[..., None]) -> None:
    torch.manual_seed(0)
    model = getattr(torchvision.models, f"mobilenet_v3_{variant}")(weights=None)
    calibrate_batchnorm(model, 2, 3, 64, 64)
    x = seeded_randn(1, 3, 64, 64)
    expected, actual, _ = _run(compile_engine, model, x)
    assert expected.abs().max() > 0.05
    torch.testing.assert_close(actual, expected, **DEEP)
    assert_engine_ran(30)


@pytest.fixture(params=[True, False], ids=["fastpath", "no_fastpath"])
def mha_fastpath(request: pytest.FixtureRequest) -> Iterator[bool]:
    """In eval + no_grad PyTorch's "fast path" turns a whole encoder layer into one fused ATen op
    (aten._transformer_encoder_layer_fwd); without it the layer lowers to matmuls, softmax, layer norm.
    Users get the fast path by default, so the engine must handle both."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(request.param)
    yield request.param
    torch.backends.mha.set_fastpath_enabled(before)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"norm_first": True, "activation": "gelu"}],
    ids=["post_norm_relu", "pre_norm_gelu"],
)
@pytest.mark.parametrize("padding_mask", [False, True], ids=["no_mask", "padding_mask"])
def test_transformer_encoder_layer(
    kwargs: dict[str, Any],
    padding_mask: bool,
    mha_fastpath: bool,
    compile_engine: Callable[..., Any],
    assert_engine_ran: Callable[..., None],
) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, batch_first=True, **kwargs)
    x = seeded_randn(2, 16, 64)
    call_kwargs = {}
    if padding_mask:
        mask = torch.zeros(2, 16, dtype=torch.bool)
        mask[1, 11:] = True  # the second sequence has 5 padding positions (never a fully masked row)
        call_kwargs["src_key_padding_mask"] = mask
    expected, actual, _ = _run(compile_engine, layer, x, **call_kwargs)
    torch.testing.assert_close(actual, expected, **F32)
    assert_engine_ran(1)


def _hf_ids(batch: int, seq: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_gpt2(attn: str, compile_engine: Callable[..., Any], assert_engine_ran: Callable[..., None]) -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_embd=64,
        n_head=4,
        n_layer=2,
        vocab_size=100,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation=attn,
    )
    model = transformers.GPT2Model(config)
    assert model.config._attn_implementation == attn
    ids = _hf_ids(2, 16, 100)
    expected, actual, _ = _run(compile_engine, model, input_ids=ids)
    torch.testing.assert_close(actual.last_hidden_state, expected.last_hidden_state, **F32)
    assert_engine_ran(10)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_bert_with_padding(
    attn: str, compile_engine: Callable[..., Any], assert_engine_ran: Callable[..., None]
) -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        intermediate_size=128,
        vocab_size=100,
        attn_implementation=attn,
    )
    model = transformers.BertModel(config)
    assert model.config._attn_implementation == attn
    ids = _hf_ids(2, 16, 100)
    attention_mask = torch.ones(2, 16, dtype=torch.long)
    attention_mask[1, 11:] = 0  # padding at the end of the second sequence
    expected, actual, _ = _run(compile_engine, model, input_ids=ids, attention_mask=attention_mask)
    torch.testing.assert_close(actual.last_hidden_state, expected.last_hidden_state, **F32)
    assert_engine_ran(10)
