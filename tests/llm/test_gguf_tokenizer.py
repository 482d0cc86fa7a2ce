"""The tokenizers a GGUF file carries: SentencePiece BPE (``llama``: Llama 2, Mistral, Gemma, Phi-3)
against ``sentencepiece`` itself on a model trained here, and byte-level BPE (``gpt2``) split by each
named pretokenizer as worked out by hand from its published rule; BOS where the file asks for it. Then
the vocabularies of real models llama.cpp keeps for its tests, against the ids llama.cpp gives."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sentencepiece as spm
from gguf import GGUFWriter

from torchburn_llm import LLM, ModelLoadError, default_model_path
from torchburn_llm import accuracy as acc
from torchburn_llm import tokenizer as tk
from torchburn_llm.gguf_header import GGUFHeader

SAMPLES = [
    "Hello world",
    "  two  spaces and\nnewline\n\n",
    "numbers 1234567 and 3.14",
    "emoji 🙂 and 漢字 é",  # characters no piece covers: their UTF-8 bytes
    "def f(x):\n    return x**2",
    "\ttab",
]


def _trained(space_prefix: bool) -> spm.SentencePieceProcessor:
    """A SentencePiece BPE model of 1,200 pieces with byte fallback, trained on the evaluation text
    without normalization (llama.cpp applies none)."""
    lines = acc.evaluation_text()[:300_000].splitlines()
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="bpe",
        vocab_size=1200,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=space_prefix,
        control_symbols=["<|turn|>", "<end_of_turn>"],
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def _fields(sp: spm.SentencePieceProcessor, space_prefix: bool) -> dict[str, Any]:
    """The vocabulary as llama.cpp's converter writes it into a GGUF file."""
    n = sp.get_piece_size()

    def kind(i: int) -> int:
        if sp.is_unknown(i):
            return tk.UNKNOWN
        if sp.is_control(i):
            return tk.CONTROL
        return tk.BYTE if sp.is_byte(i) else tk.NORMAL

    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": [sp.get_score(i) for i in range(n)],
        "tokenizer.ggml.token_type": [kind(i) for i in range(n)],
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.add_space_prefix": space_prefix,
    }


@pytest.mark.parametrize("space_prefix", [True, False])
def test_sentencepiece_vocabularies_tokenize_as_sentencepiece(space_prefix: bool) -> None:
    sp = _trained(space_prefix)
    tok = tk.from_gguf(_fields(sp, space_prefix), "test.gguf")
    text = acc.evaluation_text()
    for s in SAMPLES + text[5000:40000].split("\n\n")[:40]:
        ids = tok.encode(s, add_special_tokens=False).ids
        assert ids == sp.encode(s), s
        assert tok.decode(ids) == s, s
    # a control token in the text is one token, and (as llama.cpp does) the text after it starts a
    # new piece, with its own space prefix
    turn = sp.piece_to_id("<|turn|>")
    ids = tok.encode("<|turn|>Hello world", add_special_tokens=False).ids
    assert ids == [turn, *sp.encode("Hello world")]
    # BOS first where the file asks (llama.cpp's default for these vocabularies), not otherwise
    assert tok.encode("Hello", add_special_tokens=True).ids == [sp.bos_id(), *sp.encode("Hello")]
    off = tk.from_gguf({**_fields(sp, space_prefix), "tokenizer.ggml.add_bos_token": False}, "test.gguf")
    assert tk.begins_with(off) == [] and tk.begins_with(tok) == [sp.bos_id()]


def test_bad_sentencepiece_vocabularies_are_refused() -> None:
    fields = _fields(_trained(True), True)
    for change, message in [
        ({"tokenizer.ggml.scores": [0.0]}, "tokenizer.ggml.scores must be 1200 finite numbers"),
        ({"tokenizer.ggml.scores": [float("nan")] * 1200}, "finite numbers"),
        ({"tokenizer.ggml.tokens": ["a"] * 1200}, "lists a token twice"),
        ({"tokenizer.ggml.model": "t5"}, "'t5' is not supported"),
    ]:
        with pytest.raises(ModelLoadError, match=message):
            tk.from_gguf({**fields, **change}, "test.gguf")


# splits worked out by hand from each rule (and each checked against llama.cpp's tokenizer on a page of
# text while this was written): Llama 3 takes digits in threes and contractions whole; Qwen2
# digits one by one; GPT-2 digit runs whole, after an optional space; llama.cpp's default first isolates
# punctuation ("'"), then digit runs, then threes; SmolLM2 digits one by one before GPT-2's rule
SPLITS = {
    "llama-bpe": ["they", "'ll", "Ġ", "123", "45"],
    "qwen2": ["they", "'ll", "Ġ", "1", "2", "3", "4", "5"],
    "gpt-2": ["they", "'ll", "Ġ12345"],
    "default": ["they", "'", "ll", "Ġ", "123", "45"],
    "smollm": ["they", "'ll", "Ġ", "1", "2", "3", "4", "5"],
    # Tekken and GPT-4o also split words where lower case turns to upper; GPT-4o keeps contractions on
    "tekken": ["they", "'ll", "Ġ", "1", "2", "3", "4", "5"],
    "gpt-4o": ["they'll", "Ġ", "123", "45"],
}


@pytest.mark.parametrize("pre", sorted(SPLITS))
def test_byte_level_vocabularies_split_by_their_named_rule(pre: str) -> None:
    fields = GGUFHeader(default_model_path()).fields
    tok = tk.from_gguf({**fields, "tokenizer.ggml.pre": pre}, "test.gguf")
    assert [piece for piece, _ in tok.pre_tokenizer.pre_tokenize_str("they'll 12345")] == SPLITS[pre]
    camel = [piece for piece, _ in tok.pre_tokenizer.pre_tokenize_str("camelCase")]
    assert camel == (["camel", "Case"] if pre in ("tekken", "gpt-4o") else ["camelCase"])
    text = "Llama 3 and Qwen2 split 2025 differently"
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text


def test_the_shipped_file_ends_answers_at_its_turn_end_and_its_text_end(smollm2: LLM) -> None:
    tokens = GGUFHeader(default_model_path()).fields["tokenizer.ggml.tokens"]
    assert [tokens[i] for i in smollm2.eos_ids] == ["<|im_end|>", "<|endoftext|>"]


def test_an_unknown_pretokenizer_loads_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    fields = GGUFHeader(default_model_path()).fields
    tok = tk.from_gguf({**fields, "tokenizer.ggml.pre": "brand-new"}, "test.gguf")
    assert "pretokenizer 'brand-new' is not known here" in caplog.text
    assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("they'll")] == ["they", "'", "ll"]


def test_a_sentencepiece_gguf_model_prompts_with_bos(tmp_path: Path) -> None:
    sp = _trained(True)
    fields = _fields(sp, True)
    n, hidden, inter, heads = sp.get_piece_size(), 32, 64, 4
    path = tmp_path / "spm.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(fields["tokenizer.ggml.tokens"])
    writer.add_token_scores(fields["tokenizer.ggml.scores"])
    writer.add_token_types(fields["tokenizer.ggml.token_type"])
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    rng = np.random.default_rng(0)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    writer.add_tensor("token_embd.weight", matrix(n, hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for name, shape in [
        ("attn_q", (hidden, hidden)),
        ("attn_k", (hidden, hidden)),
        ("attn_v", (hidden, hidden)),
        ("attn_output", (hidden, hidden)),
        ("ffn_gate", (inter, hidden)),
        ("ffn_up", (inter, hidden)),
        ("ffn_down", (hidden, inter)),
    ]:
        writer.add_tensor(f"blk.0.{name}.weight", matrix(*shape))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(hidden, np.float32))
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    llm = LLM.from_pretrained(path)
    # generation ends at the file's EOS and at the token that ends a turn in Gemma's template
    assert llm.eos_ids == (sp.eos_id(), sp.piece_to_id("<end_of_turn>"))
    bos = sp.bos_id()
    assert llm.encode("Hello world") == sp.encode("Hello world")
    assert llm.prompt_ids("Hello world") == [bos, *sp.encode("Hello world")]
    # a prompt that already starts with BOS (a rendered chat template) keeps one
    assert llm.prompt_ids(sp.id_to_piece(bos) + "Hello") == [bos, *sp.encode("Hello")]
    assert llm.generate("Hello", max_new_tokens=3, temperature=0) is not None


# llama.cpp's vocabularies of real models, each with sample texts (.inp) and the ids llama.cpp gives them
# (.out), in its sources (``nox -s tests`` fetches them and names the folder in this variable); files of
# tokenizer models or splitting rules not read here (BERT's WordPiece, Gemma 4's, Falcon's, MPT's) are left
VOCAB_SOURCES_ENV = "TORCHBURN_LLAMA_CPP_SOURCES"
REAL_VOCABULARIES = {
    "llama-spm",  # Llama 2, Mistral: SentencePiece
    "phi-3",
    "llama-bpe",  # Llama 3
    "qwen2",
    "qwen35",
    "gpt-2",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "refact",
    "starcoder",
}


@pytest.mark.parametrize("name", sorted(REAL_VOCABULARIES))
def test_real_vocabularies_give_llama_cpps_ids(name: str) -> None:
    folder = os.environ.get(VOCAB_SOURCES_ENV)
    assert folder, f"{VOCAB_SOURCES_ENV} names a folder of llama.cpp's sources; nox -s tests fetches it"
    path = Path(folder) / "models" / f"ggml-vocab-{name}.gguf"
    tok = tk.from_gguf(GGUFHeader(path).fields, str(path))
    texts = Path(f"{path}.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    ids = Path(f"{path}.out").read_text(encoding="utf-8").split("\n")
    assert len(texts) >= 40
    for text, want in zip(texts, ids, strict=False):
        assert tok.encode(text, add_special_tokens=False).ids == [int(i) for i in want.split()], repr(text)
