"""Model families through each engine in strict mode (fallback="error"), compared with PyTorch eager.

One case per family: the torchvision classification families and the `transformers` families people run,
each built from a tiny configuration (a few channels or a hidden size of 32-64, two layers or stages, small
images, a small vocabulary) with seeded random weights, so the whole sweep stays fast enough for CI while
every building block of the family (grouped and depthwise convolutions, squeeze-excitation, channel
shuffle, shifted windows, grouped-query attention, rotary embeddings, relative position buckets, ...)
still appears in the graph. Inference only: eval mode and torch.no_grad(). Each test proves the engine ran
the graph (nodes counted in torchburn.coverage(), none fell back).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torchvision
import transformers
from torch import nn
from torchvision.models import efficientnet, regnet, resnet, swin_transformer

from helpers import calibrate_batchnorm, engine_counts, seeded_randn

F32 = {"rtol": 1e-4, "atol": 1e-4}
DEEP = {"rtol": 1e-3, "atol": 1e-3}  # tens of stacked convolutions: summation order differences add up

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class Family:
    """A model family: ``build()`` gives the model and its call arguments; the output is compared with
    ``tol`` and the engine must have run at least ``min_nodes`` graph nodes."""

    build: Callable[[], tuple[nn.Module, Inputs]]
    min_nodes: int
    tol: dict[str, float] = field(default_factory=lambda: dict(F32))

    def make(self) -> tuple[nn.Module, Inputs]:
        """The model in eval mode and its inputs, the same on every run (seeded random weights)."""
        torch.manual_seed(0)
        model, inputs = self.build()
        return model.eval(), inputs


def _tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of a model output, flattened in order (a tensor, a tuple, or a transformers ModelOutput,
    whose to_tuple() drops the fields that are None)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, transformers.utils.ModelOutput):
        out = out.to_tuple()
    if isinstance(out, tuple | list):
        return [t for item in out for t in _tensors(item)]
    raise TypeError(f"unexpected model output {type(out).__name__}")


# --------------------------------------------------------------------------------------------------
# torchvision: the smallest variant of each family, or its class built with a few channels
# --------------------------------------------------------------------------------------------------


def _vision(model: nn.Module, size: int, batch: int = 1) -> tuple[nn.Module, Inputs]:
    """``model`` with PyTorch's default Linear init, calibrated BatchNorm (if any) and a batch of ``size`` x
    ``size`` images: one for the CNNs (convolutions dominate the time, on a software Vulkan driver most of
    all), two for the vision transformers, whose window partitions fold the batch into other dimensions.

    torchvision's own Linear inits (normal with std 0.01 or 0.02, a zero ViT classifier) are made for
    training from scratch: at random init the logits are ~1e-2 or exactly 0, where an absolute tolerance
    of 1e-4 would hide a wrong kernel. The default init keeps them O(1).
    """
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.reset_parameters()
    # a batch of 8 for the statistics: the last stages are 1x1 or 2x2, where two images give near-zero
    # variances and eval-mode outputs in the millions
    calibrate_batchnorm(model, 8, 3, size, size)
    return model, ((seeded_randn(batch, 3, size, size),), {})


def _resnet() -> tuple[nn.Module, Inputs]:
    # one BasicBlock per stage: every shape of resnet18's blocks (the downsampling 1x1 shortcut included)
    return _vision(resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1], num_classes=10), 64)


def _resnext() -> tuple[nn.Module, Inputs]:
    # Bottleneck blocks with grouped 3x3 convolutions (groups=8), the ResNeXt shape at a fraction of its depth
    model = resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], groups=8, width_per_group=4, num_classes=10)
    return _vision(model, 64)


def _regnet() -> tuple[nn.Module, Inputs]:
    # a RegNetY: grouped convolutions and squeeze-excitation (se_ratio), narrow widths
    params = regnet.BlockParams.from_init_params(depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25)
    return _vision(regnet.RegNet(params, num_classes=10, stem_width=16), 64)


def _densenet() -> tuple[nn.Module, Inputs]:
    # two dense blocks and the transition between them: channel concatenation, BN-ReLU-conv, average pooling
    model = torchvision.models.DenseNet(
        growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2, num_classes=10
    )
    return _vision(model, 64)


def _mobilenet_v2() -> tuple[nn.Module, Inputs]:
    return _vision(torchvision.models.MobileNetV2(width_mult=0.25, num_classes=10), 64)


def _mobilenet_v3() -> tuple[nn.Module, Inputs]:
    # hardswish, hardsigmoid squeeze-excitation (test_models.py covers both full-width variants)
    return _vision(torchvision.models.mobilenet_v3_small(width_mult=0.5, num_classes=10), 64)


def _efficientnet_v1() -> tuple[nn.Module, Inputs]:
    # MBConv with SiLU and squeeze-excitation; stochastic depth is the identity in eval mode
    setting, last_channel = efficientnet._efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    return _vision(torchvision.models.EfficientNet(setting, dropout=0.2, num_classes=10, last_channel=last_channel), 64)


def _efficientnet_v2() -> tuple[nn.Module, Inputs]:
    # efficientnet_v2_s's two block kinds (FusedMBConv, then MBConv) with a few channels each
    setting = [
        efficientnet.FusedMBConvConfig(1, 3, 1, 8, 8, 1),
        efficientnet.FusedMBConvConfig(4, 3, 2, 8, 16, 1),
        efficientnet.MBConvConfig(4, 3, 2, 16, 24, 1),
        efficientnet.MBConvConfig(6, 3, 1, 24, 32, 1),
    ]
    return _vision(torchvision.models.EfficientNet(setting, dropout=0.2, num_classes=10, last_channel=64), 64)


def _convnext() -> tuple[nn.Module, Inputs]:
    # 7x7 depthwise convolutions, channels-last LayerNorm2d. layer_scale=1: with the default 1e-6 every block
    # adds ~nothing to its residual and a wrong block would go unnoticed.
    setting = [
        torchvision.models.convnext.CNBlockConfig(16, 32, 1),
        torchvision.models.convnext.CNBlockConfig(32, None, 1),
    ]
    return _vision(torchvision.models.ConvNeXt(setting, layer_scale=1.0, num_classes=10), 32)


def _vit() -> tuple[nn.Module, Inputs]:
    model = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
    )
    return _vision(model, 32, batch=2)


def _swin(v2: bool) -> Callable[[], tuple[nn.Module, Inputs]]:
    def build() -> tuple[nn.Module, Inputs]:
        # 32x32 images in 4x4 patches: an 8x8 grid of 4x4 windows, so the second block of the first stage
        # shifts its windows (torch.roll and the shifted-window attention mask); v2 adds cosine attention
        # with a learned logit scale and the continuous position bias MLP
        kwargs: dict[str, Any] = {}
        if v2:
            kwargs = {
                "block": swin_transformer.SwinTransformerBlockV2,
                "downsample_layer": swin_transformer.PatchMergingV2,
            }
        model = torchvision.models.SwinTransformer(
            patch_size=[4, 4],
            embed_dim=16,
            depths=[2, 2],
            num_heads=[2, 4],
            window_size=[4, 4],
            num_classes=10,
            **kwargs,
        )
        return _vision(model, 32, batch=2)

    return build


def _maxvit() -> tuple[nn.Module, Inputs]:
    # MBConv, block attention and grid attention; every stage's grid (32, 16, 8 after the stem) divides by 4
    model = torchvision.models.MaxVit(
        input_size=(64, 64),
        stem_channels=16,
        partition_size=4,
        block_channels=[16, 32],
        block_layers=[1, 1],
        head_dim=8,
        stochastic_depth_prob=0.0,
        num_classes=10,
    )
    return _vision(model, 64, batch=2)


def _squeezenet() -> tuple[nn.Module, Inputs]:
    # fire modules (channel concatenation), max pooling with ceil_mode
    return _vision(torchvision.models.squeezenet1_1(num_classes=10), 64)


def _shufflenet() -> tuple[nn.Module, Inputs]:
    # channel split and channel shuffle (view, transpose, contiguous)
    return _vision(torchvision.models.shufflenet_v2_x0_5(num_classes=10), 64)


def _googlenet() -> tuple[nn.Module, Inputs]:
    # inception modules: four branches concatenated; aux_logits are only returned in training mode
    return _vision(torchvision.models.GoogLeNet(num_classes=10, aux_logits=False, init_weights=True), 64)


def _inception_v3() -> tuple[nn.Module, Inputs]:
    # 75x75 is the smallest input Inception v3's strides and kernel sizes accept
    return _vision(torchvision.models.Inception3(num_classes=10, aux_logits=False, init_weights=True), 75)


# --------------------------------------------------------------------------------------------------
# transformers: tiny configs (hidden 64, 2 layers, 4 heads, vocab 128), the default attention (sdpa), a
# batch of two sequences where the second is padded at the end (padding at the end never masks a whole
# row, which would make eager's softmax NaN). use_cache=False: the forward pass returns only tensors.
# --------------------------------------------------------------------------------------------------

VOCAB, SEQ, PAD = 128, 16, 1


def _ids(seed: int = 5) -> torch.Tensor:
    ids = torch.randint(2, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(seed))
    ids[1, 11:] = PAD  # five padding tokens, as a tokenizer writes them
    return ids


def _attention_mask() -> torch.Tensor:
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, 11:] = 0
    return mask


def _text(model: nn.Module, **extra: Any) -> tuple[nn.Module, Inputs]:
    kwargs = {"input_ids": _ids(), "attention_mask": _attention_mask(), **extra}
    return model.eval(), ((), kwargs)


_DECODER = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query attention: two query heads share each key/value head
    "max_position_embeddings": 64,
    "pad_token_id": PAD,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "use_cache": False,
}


def _causal_lm(config_cls: type, **overrides: Any) -> Callable[[], tuple[nn.Module, Inputs]]:
    def build() -> tuple[nn.Module, Inputs]:
        model = transformers.AutoModelForCausalLM.from_config(config_cls(**{**_DECODER, **overrides}))
        return _text(model)

    return build


def _gpt2() -> tuple[nn.Module, Inputs]:
    config = transformers.GPT2Config(
        n_embd=64,
        n_head=4,
        n_layer=2,
        vocab_size=VOCAB,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return _text(transformers.GPT2LMHeadModel(config))


def _gpt_neox() -> tuple[nn.Module, Inputs]:
    # partial rotary embeddings (a quarter of each head) and the parallel attention + MLP residual
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        rotary_pct=0.25,
        use_parallel_residual=True,
        pad_token_id=PAD,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return _text(transformers.GPTNeoXForCausalLM(config))


_ENCODER = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "pad_token_id": PAD,
}


def _bert() -> tuple[nn.Module, Inputs]:
    # the masked-LM head (dense, GELU, LayerNorm, tied decoder) on top of the encoder; two token types
    token_type_ids = torch.zeros(2, SEQ, dtype=torch.long)
    token_type_ids[:, 8:] = 1
    return _text(transformers.BertForMaskedLM(transformers.BertConfig(**_ENCODER)), token_type_ids=token_type_ids)


def _roberta() -> tuple[nn.Module, Inputs]:
    # position ids are computed from the input ids (a cumulative sum that skips padding tokens)
    return _text(transformers.RobertaModel(transformers.RobertaConfig(**_ENCODER, bos_token_id=0, eos_token_id=2)))


def _t5() -> tuple[nn.Module, Inputs]:
    # encoder-decoder with relative position buckets (log-spaced: log, floor, where) and RMS norm
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
        eos_token_id=0,
        use_cache=False,
    )
    decoder_ids = torch.randint(2, VOCAB, (2, 8), generator=torch.Generator().manual_seed(6))
    return _text(transformers.T5ForConditionalGeneration(config), decoder_input_ids=decoder_ids)


def _bart() -> tuple[nn.Module, Inputs]:
    # the decoder input is the encoder input shifted right inside the model (shift_tokens_right)
    config = transformers.BartConfig(
        vocab_size=VOCAB,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        use_cache=False,
    )
    return _text(transformers.BartForConditionalGeneration(config))


def _whisper_encoder() -> tuple[nn.Module, Inputs]:
    # two Conv1d over log-mel features (the second with stride 2), then the transformer encoder
    config = transformers.WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=16,
        d_model=64,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_layers=2,
        decoder_attention_heads=4,
        decoder_ffn_dim=128,
        max_source_positions=16,  # the encoder takes exactly 2 * 16 feature frames
        max_target_positions=16,
        pad_token_id=PAD,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=0,
    )
    encoder = transformers.WhisperForConditionalGeneration(config).get_encoder()
    return encoder.eval(), ((), {"input_features": seeded_randn(2, 16, 32)})


def _clip() -> tuple[nn.Module, Inputs]:
    # both towers (quick_gelu), the text pooling at the end-of-text token and the image-text logits
    config = transformers.CLIPConfig(
        text_config={
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": SEQ,
            "pad_token_id": PAD,
            "bos_token_id": 0,
            "eos_token_id": 3,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        projection_dim=16,
    )
    ids = _ids()
    ids[:, 10] = 3  # every sequence has its end-of-text token (the pooled position)
    kwargs = {"input_ids": ids, "attention_mask": _attention_mask(), "pixel_values": seeded_randn(2, 3, 32, 32)}
    return transformers.CLIPModel(config).eval(), ((), kwargs)


def _mamba() -> tuple[nn.Module, Inputs]:
    # the selective scan as transformers writes it without mamba_ssm: torch.vmap over the state, whose
    # levels the graph enters and leaves as ops of its own
    config = transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, state_size=8, pad_token_id=PAD, use_cache=False
    )
    return transformers.MambaForCausalLM(config).eval(), ((), {"input_ids": _ids()})


# min_nodes: about 80% of the ATen nodes each graph has today, so that a graph that shrank (a layer traced
# away, a region silently left to PyTorch) fails rather than passes on the few nodes that remain
FAMILIES: dict[str, Family] = {
    # torchvision classification
    "resnet": Family(_resnet, 30, DEEP),
    "resnext": Family(_resnext, 40, DEEP),
    "regnet": Family(_regnet, 60, DEEP),
    "densenet": Family(_densenet, 35, DEEP),
    "mobilenet_v2": Family(_mobilenet_v2, 120, DEEP),
    "mobilenet_v3": Family(_mobilenet_v3, 120, DEEP),
    "efficientnet_v1": Family(_efficientnet_v1, 80, DEEP),
    "efficientnet_v2": Family(_efficientnet_v2, 35, DEEP),
    "convnext": Family(_convnext, 35, DEEP),
    "vit": Family(_vit, 80),
    "swin": Family(_swin(v2=False), 280),
    "swin_v2": Family(_swin(v2=True), 380),
    "maxvit": Family(_maxvit, 300, DEEP),
    "squeezenet": Family(_squeezenet, 50, DEEP),
    "shufflenet": Family(_shufflenet, 190, DEEP),
    "googlenet": Family(_googlenet, 150, DEEP),
    "inception_v3": Family(_inception_v3, 250, DEEP),
    # transformers
    "llama": Family(_causal_lm(transformers.LlamaConfig), 160),
    "qwen2": Family(_causal_lm(transformers.Qwen2Config), 160),
    "qwen3": Family(_causal_lm(transformers.Qwen3Config, head_dim=16), 180),  # q/k RMS norm per head
    "mistral": Family(_causal_lm(transformers.MistralConfig, sliding_window=8), 160),  # the sliding-window mask
    "gemma": Family(_causal_lm(transformers.GemmaConfig, num_key_value_heads=1, head_dim=16), 160),  # multi-query
    "phi3": Family(_causal_lm(transformers.Phi3Config), 160),  # fused qkv and gate_up projections
    "gpt2": Family(_gpt2, 90),
    "gpt_neox": Family(_gpt_neox, 110),
    "bert": Family(_bert, 90),
    "roberta": Family(_roberta, 100),
    "t5": Family(_t5, 320),
    "bart": Family(_bart, 240),
    "whisper_encoder": Family(_whisper_encoder, 75),
    "clip": Family(_clip, 180),
    "mamba": Family(_mamba, 240),  # the scan under torch.vmap
    # mixtures of experts: tokens sorted by expert, a grouped product over offsets (transformers' op)
    "mixtral": Family(_causal_lm(transformers.MixtralConfig, num_local_experts=4, num_experts_per_tok=2), 220),
    "qwen3_moe": Family(
        _causal_lm(
            transformers.Qwen3MoeConfig, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16
        ),
        235,
    ),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family(name: str, compile_engine: Callable[..., Any], assert_engine_ran: Callable[..., None]) -> None:
    family = FAMILIES[name]
    model, (args, kwargs) = family.make()
    with torch.no_grad():
        expected = _tensors(model(*args, **kwargs))
        actual = _tensors(compile_engine(model)(*args, **kwargs))
    # a meaningful signal, not numerically ~0 (where an absolute tolerance would accept anything)
    assert max(t.abs().max().item() for t in expected if t.is_floating_point()) > 0.05
    torch.testing.assert_close(actual, expected, **family.tol)
    assert_engine_ran(family.min_nodes)


@pytest.mark.parametrize("name", ["llama", "mixtral"])
def test_bf16_model_matches_eager(engine_name: str, name: str) -> None:
    # models as checkpoints load them: in bfloat16. The native engine runs all of it (attention in
    # float32, stored back); another engine may leave ops to PyTorch, and the graph then runs in pieces
    torch.manual_seed(0)
    model, (args, kwargs) = FAMILIES[name].build()
    model = model.to(torch.bfloat16)
    options = {"engine": engine_name, "fallback": "silent"}
    with torch.no_grad():
        expected = model(*args, **kwargs).logits.float()
        actual = torch.compile(model, backend="torchburn", options=options)(*args, **kwargs).logits.float()
    # bfloat16 keeps 8 bits: two roundings of one value differ by up to 2^-7 of it
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=0.02 * expected.abs().max().item())
    ran, fell = engine_counts(engine_name)
    assert ran > 0 and (fell == 0 or engine_name != "native")


def test_generate_with_a_compiled_forward_matches_eager(engine_name: str) -> None:
    # the way transformers users compile: the forward inside generate(), its KV cache growing step by
    # step (keys and values then have lengths of their own symbols, which attention must take as equal)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**{**_DECODER, "use_cache": True}))
    model.eval()
    ids = torch.randint(3, VOCAB, (1, 7), generator=torch.Generator().manual_seed(0))
    settings = {"max_new_tokens": 10, "do_sample": False, "pad_token_id": PAD}
    with torch.no_grad():
        expected = model.generate(ids, **settings)
        model.forward = torch.compile(
            model.forward, backend="torchburn", options={"engine": engine_name, "fallback": "error"}
        )
        actual = model.generate(ids, **settings)
    assert torch.equal(actual, expected)
    ran, fell = engine_counts(engine_name)
    assert ran > 0 and fell == 0
