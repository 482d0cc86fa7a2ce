"""Loading is strict: an unknown architecture, a missing, unexpected or misshapen tensor, or a folder
that is not a checkpoint is a clear error naming what is wrong; a prompt too long for the context too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

from helpers import save_tiny_llama  # noqa: E402
from torchburn_llm import LLM, ContextLengthError, ModelLoadError  # noqa: E402


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    save_tiny_llama(tmp_path, seed=0, layers=2, max_positions=24)
    return tmp_path


def _rewrite(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    (path,) = folder.glob("*.safetensors")
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_missing_tensor_is_named(checkpoint: Path) -> None:
    _rewrite(checkpoint, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"1 missing: model\.layers\.1\.mlp\.up_proj\.weight"):
        LLM.from_pretrained(checkpoint)


def test_unexpected_tensor_is_named(checkpoint: Path) -> None:
    _rewrite(checkpoint, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(3)}))
    with pytest.raises(ModelLoadError, match=r"1 unexpected: model\.layers\.0\.extra\.weight"):
        LLM.from_pretrained(checkpoint)


def test_wrong_shape_is_named(checkpoint: Path) -> None:
    _rewrite(checkpoint, lambda t: t.update({"model.norm.weight": torch.ones(31)}))
    with pytest.raises(ModelLoadError, match=r"wrong shape: model\.norm\.weight \(31,\) \(expected \(32,\)\)"):
        LLM.from_pretrained(checkpoint)


def test_unknown_model_type_lists_the_supported_ones(checkpoint: Path) -> None:
    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (checkpoint / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelLoadError,
        match=r"'gpt_neox' is not supported; supported: gemma, gemma2, gemma3_text, llama, mistral, phi3, qwen2, qwen3",
    ):
        LLM.from_pretrained(checkpoint)


def test_folder_without_weights_or_config(tmp_path: Path, checkpoint: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match=r"has no config\.json"):
        LLM.from_pretrained(empty)
    for f in checkpoint.glob("*.safetensors"):
        f.unlink()
    (checkpoint / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weights"):
        LLM.from_pretrained(checkpoint)


def test_prompt_beyond_the_context_is_refused(checkpoint: Path) -> None:
    llm = LLM.from_pretrained(checkpoint)
    with pytest.raises(ContextLengthError, match="20 prompt tokens \\+ 5 new ones exceed the model's context of 24"):
        llm.generate_ids(list(range(20)), max_new_tokens=5)
    cache = llm.model.new_cache(4)
    llm.model.forward(torch.tensor([1, 2, 3]), cache)
    with pytest.raises(ContextLengthError, match="3 cached \\+ 2 new tokens exceed the KV cache's 4 positions"):
        llm.model.forward(torch.tensor([4, 5]), cache)
    assert cache.length == 3  # the refused call left the cache as it was


def test_bad_quant_and_device_list_the_choices(checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="quant='int3' is not available; choose one of fp32"):
        LLM.from_pretrained(checkpoint, quant="int3")
    with pytest.raises(ValueError, match="device='tpu' is not available"):
        LLM.from_pretrained(checkpoint, device="tpu")


def test_torchburn_exposes_the_runtime_as_torchburn_llm() -> None:
    import torchburn
    import torchburn_llm

    assert torchburn.LLM is torchburn_llm.LLM


def test_a_folder_defaults_to_int4_where_its_rows_are_whole_blocks(tmp_path: Path, checkpoint: Path) -> None:
    # the fixture's MLP is 48 wide: not whole blocks of 32, so it stays fp32
    assert LLM.from_pretrained(checkpoint).model.quant == "fp32"
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4
    )
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path / "blocks"
    reference.save_pretrained(folder, safe_serialization=True)
    model = LLM.from_pretrained(folder).model
    assert model.quant == "int4" and LLM.from_pretrained(folder, quant="fp32").model.quant == "fp32"
    ids = torch.arange(3, 13)
    with torch.no_grad():
        want = reference(ids[None]).logits[0]
    got = model.forward(ids, model.new_cache(16))
    # int4 weights: close to the fp32 model, not equal
    assert float((got - want).abs().max()) <= 0.1 * float(want.abs().max())
