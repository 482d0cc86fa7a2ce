"""GGUF files as people get them: tiny random checkpoints of every supported family turned into GGUF by
llama.cpp's own ``convert_hf_to_gguf.py`` (the converter behind the files on the Hub), then run in
their stored types against ``transformers`` on the checkpoint they came from. Where
``test_gguf_stored`` writes its files itself, these carry whatever metadata, tensor names, row orders
and stored norm offsets the converter really writes.

``nox -s tests`` fetches the converter from the pinned llama-cpp-python's sources and names their folder
in ``TORCHBURN_LLAMA_CPP_SOURCES``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from torchburn_llm import LLM
from torchburn_llm.accuracy import teacher_forced_logits

transformers = pytest.importorskip("transformers")

SOURCES_ENV = "TORCHBURN_LLAMA_CPP_SOURCES"
HIDDEN = 64
COMMON: dict[str, Any] = {
    "hidden_size": HIDDEN,
    "intermediate_size": 2 * HIDDEN,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
GEMMA = {"head_dim": HIDDEN // 4, "query_pre_attn_scalar": HIDDEN // 4, "sliding_window": 8}
# per case: the transformers config class and its own settings
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "llama_tied_wide_heads": ("LlamaConfig", {"tie_word_embeddings": True, "head_dim": HIDDEN // 2}),
    # the converter stores Llama 3.1's rescaled rates as a rope_freqs tensor
    "llama3.1": (
        "LlamaConfig",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": True}),
    "qwen2_yarn": (
        "Qwen2Config",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    "qwen3": ("Qwen3Config", {"head_dim": HIDDEN // 2, "tie_word_embeddings": True}),
    "gemma2": ("Gemma2Config", {**GEMMA, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}),
    # seven layers: the sixth is global, the others windowed, and the global ones rescale their rates
    # linearly as Gemma 3's larger models do
    "gemma3": (
        "Gemma3TextConfig",
        {
            **GEMMA,
            "num_hidden_layers": 7,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        },
    ),
    "phi3": ("Phi3Config", {"pad_token_id": 0}),
}

# The tiny checkpoints all carry SmolLM2's BPE vocabulary. The converter reads Gemma's and Phi-3's
# from a SentencePiece model file of their own, and recognizes a BPE pre-tokenizer by hashing its
# output; these patches have it take the BPE vocabulary as it is, under SmolLM2's pre-tokenizer name.
CONVERT = """
import runpy, sys
converter, folder, out = sys.argv[1:4]
sys.path[:0] = [converter, converter + "/gguf-py"]
from conversion import base, phi
base.TextModel._set_vocab_sentencepiece = lambda self, *a, **k: self._set_vocab_gpt2()
base.TextModel._set_vocab_llama_hf = lambda self, *a, **k: self._set_vocab_gpt2()
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
phi.Phi3MiniModel.set_vocab = lambda self: self._set_vocab_gpt2()
sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", out, "--outtype", sys.argv[4]]
runpy.run_path(converter + "/convert_hf_to_gguf.py", run_name="__main__")
"""


@pytest.fixture(scope="module")
def converter() -> Path:
    folder = os.environ.get(SOURCES_ENV)
    assert folder, f"{SOURCES_ENV} names a folder of llama.cpp's sources; nox -s tests fetches it"
    path = Path(folder)
    assert (path / "convert_hf_to_gguf.py").is_file(), f"{path} holds no convert_hf_to_gguf.py"
    return path


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """SmolLM2's tokenizer as a Hugging Face folder holds it (read by transformers from the GGUF)."""
    folder = tmp_path_factory.mktemp("tokenizer")
    tok = transformers.AutoTokenizer.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)
    tok.save_pretrained(folder)
    return folder


def _convert(converter: Path, folder: Path, out: Path, outtype: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CONVERT, str(converter), str(folder), str(out), outtype],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"llama.cpp's converter failed:\n{result.stderr[-4000:]}"


def _tiny_checkpoint(family: str, folder: Path, tokenizer_files: Path, vocab: int) -> Any:
    """A random checkpoint of ``family`` saved in ``folder`` with the tokenizer; weights large enough
    that a wrong layout shows in the logits."""
    config_class, settings = FAMILIES[family]
    config = getattr(transformers, config_class)(vocab_size=vocab, **{**COMMON, **settings})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0, 0.08)
            elif "norm" in name:  # Gemma's norms are stored as offsets from 1
                p.uniform_(-0.5, 0.5) if family.startswith("gemma") else p.uniform_(0.5, 1.5)
    model.save_pretrained(folder, safe_serialization=True)
    for f in tokenizer_files.iterdir():
        shutil.copy(f, folder / f.name)
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_files_from_llama_cpps_converter_match_transformers(
    tmp_path: Path, converter: Path, tokenizer_files: Path, family: str
) -> None:
    vocab = len(transformers.AutoTokenizer.from_pretrained(tokenizer_files))
    reference = _tiny_checkpoint(family, tmp_path / "hf", tokenizer_files, vocab)
    path = tmp_path / f"{family}.gguf"
    _convert(converter, tmp_path / "hf", path, "f32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every matrix computed in as stored: none dequantized to fp32
        llm = LLM.from_pretrained(path)
    # 40 positions: past the windows of 8 and the rescaled rates' original context of 16 and 32
    ids = [1, *torch.randint(3, vocab, (40,), generator=torch.Generator().manual_seed(1)).tolist()]
    with torch.no_grad():
        want = reference(torch.tensor([ids])).logits[0]  # [T, V]
    for path_kind in ("prefill", "decode"):
        got = teacher_forced_logits(llm, [*ids, 0], path_kind)  # [T, V], each from its prefix
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * float(want.abs().max()), msg=path_kind)


def test_converted_q8_0_file_runs_as_stored(tmp_path: Path, converter: Path, tokenizer_files: Path) -> None:
    # the converter's own Q8_0 blocks, computed in as stored, against the same file dequantized
    vocab = len(transformers.AutoTokenizer.from_pretrained(tokenizer_files))
    _tiny_checkpoint("qwen2", tmp_path / "hf", tokenizer_files, vocab)
    path = tmp_path / "qwen2-q8_0.gguf"
    _convert(converter, tmp_path / "hf", path, "q8_0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stored = LLM.from_pretrained(path)
    assert stored.model.quant == "stored"
    exact = LLM.from_pretrained(path, quant="fp32")
    ids = [1, *torch.randint(3, vocab, (24,), generator=torch.Generator().manual_seed(2)).tolist()]
    want = teacher_forced_logits(exact, ids, "prefill")
    for path_kind in ("prefill", "decode"):
        got = teacher_forced_logits(stored, ids, path_kind)
        torch.testing.assert_close(got, want, rtol=0, atol=2e-3 * float(want.abs().max()), msg=path_kind)


DEFAULT_TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
TOOL_TEMPLATE = "TOOLS {{ tools | tojson }}\n" + DEFAULT_TEMPLATE


def test_a_tool_use_template_is_read_from_the_folder_and_the_converted_file(
    tmp_path: Path, converter: Path, tokenizer_files: Path
) -> None:
    # as transformers saves them: chat_template.jinja, and the named ones in additional_chat_templates/;
    # llama.cpp's converter stores the latter as tokenizer.chat_template.tool_use
    vocab = len(transformers.AutoTokenizer.from_pretrained(tokenizer_files))
    folder = tmp_path / "hf"
    _tiny_checkpoint("llama", folder, tokenizer_files, vocab)
    (folder / "chat_template.jinja").write_text(DEFAULT_TEMPLATE)
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text(TOOL_TEMPLATE)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    path = tmp_path / "llama.gguf"
    _convert(converter, folder, path, "f32")
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    for source in (folder, path):
        llm = LLM.from_pretrained(source)
        assert (llm.chat_template, llm.tool_chat_template) == (DEFAULT_TEMPLATE, TOOL_TEMPLATE), source
        assert llm.apply_chat_template(messages) == "[user] Weather in Paris?\n[assistant]"
        with_tools = llm.apply_chat_template(messages, tools=tools)
        assert with_tools == f"TOOLS {json.dumps(tools)}\n[user] Weather in Paris?\n[assistant]"
