"""A model's files are untrusted: every number in a config or a GGUF header is checked before anything is
sized by it, and a model folder's files (its safetensors index included) must lie inside it. Each bad file
is a one-line ModelLoadError naming the field or file — never a ZeroDivisionError, KeyError, TypeError,
RecursionError or MemoryError, and never a file read from outside the folder. The attack files are built
here."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from torchburn_llm import LLM, ModelConfig, ModelLoadError, architecture_for
from torchburn_llm.errors import ChatTemplateError
from torchburn_llm.gguf_file import GGUFCheckpoint
from torchburn_llm.gguf_header import GGUFHeader

# --- a tiny checkpoint folder -----------------------------------------------------------------------

CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def _save_folder(folder: Path, config: dict[str, Any] | None = None) -> Path:
    """A random Llama checkpoint: config.json and model.safetensors (built without transformers)."""
    folder.mkdir(parents=True, exist_ok=True)
    raw = config or CONFIG
    (folder / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_dict(raw)
    gen = torch.Generator().manual_seed(0)
    shapes = architecture_for("llama").tensors(cfg)
    save_file({n: torch.randn(s, generator=gen) for n, s in shapes.items()}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    return _save_folder(tmp_path / "model")


def _load_error(path: Path) -> str:
    """The message of the ModelLoadError loading ``path`` raises (one line)."""
    with pytest.raises(ModelLoadError) as caught:
        LLM.from_pretrained(path)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


# --- config.json --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"num_hidden_layers": -1}, "num_hidden_layers"),
        ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
        ({"num_hidden_layers": "2"}, "num_hidden_layers"),
        ({"num_hidden_layers": 2.0}, "num_hidden_layers"),
        ({"num_hidden_layers": True}, "num_hidden_layers"),
        ({"num_attention_heads": 0}, "num_attention_heads"),
        ({"num_attention_heads": 6}, "hidden_size 32 does not split into num_attention_heads 6"),
        ({"num_attention_heads": 4.5}, "num_attention_heads"),
        ({"num_key_value_heads": 0}, "num_key_value_heads"),
        ({"num_key_value_heads": 3}, "num_attention_heads 4 do not split into num_key_value_heads 3"),
        ({"num_key_value_heads": 8}, "num_key_value_heads"),
        ({"head_dim": 0}, "head_dim"),
        ({"head_dim": 7}, "head_dim must be even"),
        ({"head_dim": "8"}, "head_dim"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"hidden_size": 64.5}, "hidden_size"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"vocab_size": [64]}, "vocab_size"),
        ({"intermediate_size": -48}, "intermediate_size"),
        ({"max_position_embeddings": 0}, "max_position_embeddings"),
        ({"max_position_embeddings": "64"}, "max_position_embeddings"),
        ({"rms_norm_eps": 0}, "rms_norm_eps"),
        ({"rms_norm_eps": "1e-6"}, "rms_norm_eps"),
        ({"rope_theta": -1}, "rope_theta"),
        ({"rope_theta": math.inf}, "rope_theta"),
        ({"rope_theta": "1e4"}, "rope_theta"),
        ({"rope_scaling": {"rope_type": "linear"}}, "needs 'factor'"),
        ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "rope_scaling.factor"),
        ({"rope_scaling": {"rope_type": "linear", "factor": -2}}, "rope_scaling.factor"),
        ({"rope_scaling": {"rope_type": "linear", "factor": math.nan}}, "rope_scaling.factor"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4}}, "high_freq_factor"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8, "original_max_position_embeddings": 0}},
            "original_max_position_embeddings",
        ),
        ({"eos_token_id": 64}, "eos_token_id"),  # the vocabulary holds ids 0..63
        ({"eos_token_id": "2"}, "eos_token_id"),
        ({"eos_token_id": [2, None]}, "eos_token_id"),
        ({"bos_token_id": -1}, "bos_token_id"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
        ({"attention_bias": 1}, "attention_bias"),
        ({"model_type": ["llama"]}, "model_type"),
        ({"sliding_window": -4}, "sliding_window"),
        ({"use_sliding_window": "no"}, "use_sliding_window"),
    ],
)
def test_every_config_number_is_checked(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ModelLoadError) as caught:
        ModelConfig.from_dict({**CONFIG, **change}, source="config.json")
    message = str(caught.value)
    assert message.startswith("config.json: ") and field in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_attention_heads": 0}, "num_attention_heads"),  # was a ZeroDivisionError
        ({"num_key_value_heads": 0}, "num_key_value_heads"),  # was read as "as many as the heads"
        ({"head_dim": 7}, "head_dim"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 2, "high_freq_factor": 2}}, "freq"),
        ({"eos_token_id": 1000}, "eos_token_id"),
        ({"num_hidden_layers": "2"}, "num_hidden_layers"),
    ],
)
def test_a_bad_config_stops_the_load_with_one_line(folder: Path, change: dict[str, Any], field: str) -> None:
    (folder / "config.json").write_text(json.dumps({**CONFIG, **change}))
    assert field in _load_error(folder)


def test_config_json_that_would_crash_the_parser(folder: Path) -> None:
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert _load_error(folder) == f"{folder / 'config.json'} nests too deeply to be a model file"
    (folder / "config.json").write_text("[]")
    assert _load_error(folder) == f"{folder / 'config.json'} holds a JSON list, not an object"


@pytest.mark.parametrize(
    ("generation", "field"),
    [
        ({"do_sample": True, "temperature": "hot"}, "temperature"),
        ({"do_sample": True, "top_k": 2.5}, "top_k"),
        ({"do_sample": True, "top_p": 0}, "top_p"),
        ({"do_sample": "yes"}, "do_sample"),
        ({"repetition_penalty": -1}, "repetition_penalty"),
        ({"eos_token_id": [2, 640]}, "eos_token_id"),
    ],
)
def test_generation_config_is_checked(folder: Path, generation: dict[str, Any], field: str) -> None:
    (folder / "generation_config.json").write_text(json.dumps(generation))
    assert field in _load_error(folder)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(folder: Path) -> None:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 tokens for a vocabulary of 64
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))
    assert "the tokenizer has 256 tokens but vocab_size is 64" in _load_error(folder)


def test_a_chat_template_file_is_bounded(folder: Path) -> None:
    (folder / "chat_template.jinja").write_text("x" * (2 << 20))
    assert "chat_template.jinja is larger than 1,048,576 bytes" in _load_error(folder)
    (folder / "chat_template.jinja").write_text("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}")
    llm = LLM.from_pretrained(folder)
    with pytest.raises(ChatTemplateError, match="the chat template hit its depth limit"):
        llm.apply_chat_template([{"role": "user", "content": "hi"}])


# --- files inside the folder --------------------------------------------------------------------------


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    """Another checkpoint, next to the model folder: what an attacker would have the loader read."""
    return _save_folder(tmp_path / "elsewhere")


def _index(folder: Path, weight_map: Any) -> None:
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize(
    "shard",
    [
        "ABSOLUTE",
        "../elsewhere/model.safetensors",
        "sub/../../elsewhere/model.safetensors",
        "..\\elsewhere\\model.safetensors",
        "C:/elsewhere/model.safetensors",
        "config.json",
    ],
)
def test_the_safetensors_index_names_only_files_inside_the_folder(folder: Path, outside: Path, shard: str) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "sub").mkdir()
    name = str(outside / "model.safetensors") if shard == "ABSOLUTE" else shard
    _index(folder, {"model.embed_tokens.weight": name})
    message = _load_error(folder)
    assert "model.safetensors.index.json: shard" in message and "is not allowed" in message, message


@pytest.mark.parametrize(
    ("weight_map", "message"),
    [
        ({"model.norm.weight": 5}, "weight_map['model.norm.weight'] must be a file name, got 5"),
        ({"model.norm.weight": ["model.safetensors"]}, "must be a file name"),
        (["model.safetensors"], "has no weight_map object"),
    ],
)
def test_the_safetensors_index_is_checked(folder: Path, weight_map: Any, message: str) -> None:
    _index(folder, weight_map)
    assert message in _load_error(folder)


@pytest.mark.parametrize(
    "name", ["config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "generation_config.json"]
)
def test_a_symlink_out_of_the_folder_is_not_followed(folder: Path, outside: Path, name: str) -> None:
    target = outside / name
    if not target.exists():
        target.write_text("{}" if name.endswith(".json") else "{{ messages }}")
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(target)
    message = _load_error(folder)
    assert f"{folder / name} resolves to {target}, outside the model folder {folder}" in message, message


def test_a_sharded_index_inside_the_folder_still_loads(folder: Path, outside: Path) -> None:
    # the shard itself a symlink out of the folder: refused; a real file: loads
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    _index(folder, {"model.norm.weight": "model-00001-of-00001.safetensors"})
    assert LLM.from_pretrained(folder).config.num_layers == 2
    (folder / "model-00001-of-00001.safetensors").unlink()
    (folder / "model-00001-of-00001.safetensors").symlink_to(outside / "model.safetensors")
    assert "outside the model folder" in _load_error(folder)


def test_the_hugging_face_cache_layout_may_link_within_its_repo_only(tmp_path: Path) -> None:
    # snapshots/<revision>/<file> -> ../../blobs/<hash>, as huggingface_hub lays them out
    repo = tmp_path / "hub" / "models--acme--tiny"
    built = _save_folder(tmp_path / "built")
    snapshot = repo / "snapshots" / ("a" * 40)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(built.iterdir())):
        blob = repo / "blobs" / f"{i:040x}"
        file.rename(blob)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    assert LLM.from_pretrained(snapshot).config.num_layers == 2
    # a link out of the repo's cache folder (here into another repo's blobs) is not followed
    other = _save_folder(tmp_path / "hub" / "models--evil--other" / "blobs")
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(other / "config.json")
    assert f"outside the model folder {repo}" in _load_error(snapshot)


# --- GGUF ---------------------------------------------------------------------------------------------

U32, I32, F32, BOOL, STRING, ARRAY, U64 = 4, 5, 6, 7, 8, 9, 10
SCALAR = {U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q"}
TOKENS = [chr(c) for c in range(ord("a"), ord("a") + 16)]  # a vocabulary of 16 one-letter tokens


def _value(kind: int, value: Any) -> bytes:
    if kind == STRING:
        data = value.encode()
        return struct.pack("<Q", len(data)) + data
    if kind == ARRAY:
        item, items = value
        return struct.pack("<IQ", item, len(items)) + b"".join(_value(item, v) for v in items)
    return struct.pack(SCALAR[kind], value)


Fields = dict[str, tuple[int, Any]]


def _gguf(
    fields: Fields | list[tuple[str, tuple[int, Any]]],
    tensors: list[tuple[str, tuple[int, ...], int, int]],
    data: bytes,
) -> bytes:
    """A GGUF v3 file: ``fields`` (key -> (type, value)), tensor entries (name, dims fastest first, type,
    offset), then ``data`` at the 32-byte aligned start of the data section."""
    pairs = list(fields.items()) if isinstance(fields, dict) else fields
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(pairs))
    for key, (kind, value) in pairs:
        out += _value(STRING, key) + struct.pack("<I", kind) + _value(kind, value)
    for name, dims, kind, offset in tensors:
        out += _value(STRING, name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind, offset)
    return out + b"\0" * (-len(out) % 32) + data


def _llama_fields(**changes: tuple[int, Any] | None) -> Fields:
    """The metadata of the tiny Llama; ``changes`` by key with "__" for ".", None to leave a key out."""
    fields: Fields = {
        "general.architecture": (STRING, "llama"),
        "llama.block_count": (U32, 1),
        "llama.context_length": (U32, 64),
        "llama.embedding_length": (U32, 8),
        "llama.feed_forward_length": (U32, 16),
        "llama.attention.head_count": (U32, 2),
        "llama.attention.head_count_kv": (U32, 1),
        "llama.attention.layer_norm_rms_epsilon": (F32, 1e-5),
        "llama.rope.freq_base": (F32, 10000.0),
        "tokenizer.ggml.model": (STRING, "gpt2"),
        "tokenizer.ggml.tokens": (ARRAY, (STRING, TOKENS)),
        "tokenizer.ggml.merges": (ARRAY, (STRING, [])),
        "tokenizer.ggml.token_type": (ARRAY, (I32, [1] * len(TOKENS))),
        "tokenizer.ggml.bos_token_id": (U32, 1),
        "tokenizer.ggml.eos_token_id": (U32, 2),
    }
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            fields.pop(key)
        else:
            fields[key] = value
    return fields


def _llama_tensors() -> tuple[list[tuple[str, tuple[int, ...], int, int]], bytes]:
    """f32 tensors of a 1-layer Llama (hidden 8, 2 heads of 4, 1 KV head, MLP 16, vocabulary 16)."""
    shapes = {
        "token_embd.weight": (8, 16),
        "output_norm.weight": (8,),
        "blk.0.attn_norm.weight": (8,),
        "blk.0.ffn_norm.weight": (8,),
        "blk.0.attn_q.weight": (8, 8),
        "blk.0.attn_k.weight": (8, 4),
        "blk.0.attn_v.weight": (8, 4),
        "blk.0.attn_output.weight": (8, 8),
        "blk.0.ffn_gate.weight": (8, 16),
        "blk.0.ffn_up.weight": (8, 16),
        "blk.0.ffn_down.weight": (16, 8),
    }
    rng = np.random.default_rng(0)
    entries, data = [], b""
    for name, dims in shapes.items():
        entries.append((name, dims, 0, len(data)))
        data += rng.standard_normal(math.prod(dims), dtype=np.float32).tobytes()
        data += b"\0" * (-len(data) % 32)
    return entries, data


def _write_gguf(tmp_path: Path, fields: Fields | None = None, tensors: Any = None) -> Path:
    entries, data = _llama_tensors()
    path = tmp_path / "tiny.gguf"
    path.write_bytes(_gguf(fields or _llama_fields(), entries if tensors is None else tensors, data))
    return path


def test_the_tiny_gguf_model_loads_and_runs(tmp_path: Path) -> None:
    llm = LLM.from_pretrained(_write_gguf(tmp_path))
    assert (llm.config.num_heads, llm.config.num_kv_heads, llm.config.head_dim) == (2, 1, 4)
    assert len(llm.generate_ids([3, 4, 5], max_new_tokens=4)) <= 4
    # and the same file with one bad number is refused, naming it
    bad = _write_gguf(tmp_path, _llama_fields(llama__attention__head_count=(U32, 0)))
    assert "llama.attention.head_count must be between 1 and 4096, got 0" in _load_error(bad)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"llama__attention__head_count": (U32, 0)}, "llama.attention.head_count"),
        ({"llama__attention__head_count": None}, "required GGUF metadata llama.attention.head_count is missing"),
        ({"llama__attention__head_count": (F32, 2.5)}, "llama.attention.head_count must be a whole number"),
        ({"llama__attention__head_count": (BOOL, True)}, "llama.attention.head_count must be a whole number"),
        ({"llama__attention__head_count": (ARRAY, (U32, [2]))}, "llama.attention.head_count"),
        ({"llama__attention__head_count": (STRING, "2")}, "llama.attention.head_count"),
        ({"llama__attention__head_count_kv": (U32, 0)}, "llama.attention.head_count_kv"),
        ({"llama__attention__head_count_kv": (U32, 3)}, "does not split into llama.attention.head_count_kv 3"),
        ({"llama__block_count": (U32, 0)}, "llama.block_count"),
        ({"llama__block_count": (U64, 10**9)}, "llama.block_count"),
        ({"llama__block_count": None}, "llama.block_count is missing"),
        ({"llama__embedding_length": (U32, 7)}, "llama.embedding_length 7 does not split"),
        ({"llama__attention__key_length": (U32, 3)}, "the head size must be even"),
        ({"llama__feed_forward_length": (I32, -16)}, "llama.feed_forward_length"),
        ({"llama__context_length": (U32, 0)}, "llama.context_length"),
        ({"llama__attention__layer_norm_rms_epsilon": (F32, 0.0)}, "llama.attention.layer_norm_rms_epsilon"),
        ({"llama__rope__freq_base": (F32, -1.0)}, "llama.rope.freq_base"),
        ({"llama__rope__scaling__type": (STRING, "linear")}, "llama.rope.scaling.factor is missing"),
        (
            {"llama__rope__scaling__type": (STRING, "linear"), "llama__rope__scaling__factor": (STRING, "x")},
            "llama.rope.scaling.factor must be a number",
        ),
        ({"llama__vocab_size": (U32, 0)}, "llama.vocab_size"),
        ({"llama__vocab_size": (U32, 8)}, "tokenizer.ggml.tokens lists 16 tokens, more than llama.vocab_size 8"),
        ({"tokenizer__ggml__eos_token_id": (U32, 16)}, "tokenizer.ggml.eos_token_id"),
        ({"tokenizer__ggml__eos_token_id": (STRING, "2")}, "tokenizer.ggml.eos_token_id"),
        ({"tokenizer__ggml__bos_token_id": (I32, -1)}, "tokenizer.ggml.bos_token_id"),
        ({"general__alignment": (BOOL, True)}, "general.alignment True is not a power of two"),
        ({"general__alignment": (ARRAY, (U32, [32]))}, "general.alignment [32] is not a power of two"),
    ],
)
def test_every_gguf_number_is_checked(tmp_path: Path, changes: dict[str, Any], field: str) -> None:
    path = _write_gguf(tmp_path, _llama_fields(**changes))
    with pytest.raises(ModelLoadError) as caught:
        GGUFCheckpoint(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and field in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tokenizer__ggml__token_type": (ARRAY, (I32, [1] * 20))}, "tokenizer.ggml.token_type must be a list of 16"),
        ({"tokenizer__ggml__token_type": (ARRAY, (I32, [1] * 3))}, "tokenizer.ggml.token_type must be a list of 16"),
        ({"tokenizer__ggml__merges": (ARRAY, (STRING, ["x y"]))}, "the GGUF tokenizer cannot be built"),
        ({"tokenizer__chat_template": (U32, 5)}, "tokenizer.chat_template must be a string"),
    ],
)
def test_the_gguf_tokenizer_and_template_are_checked(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    assert message in _load_error(_write_gguf(tmp_path, _llama_fields(**changes)))


def _header_error(path: Path) -> str:
    with pytest.raises(ModelLoadError) as caught:
        GGUFHeader(path)
    assert "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: [*t, t[0]], "tensor 'token_embd.weight' appears twice"),
        (lambda t: [(*t[0][:1], (), *t[0][2:]), *t[1:]], "has 0 dimensions"),
        (lambda t: [(*t[0][:1], (8, 16, 1, 1, 1), *t[0][2:]), *t[1:]], "has 5 dimensions"),
        (lambda t: [(*t[0][:1], (8, 0), *t[0][2:]), *t[1:]], "has a dimension of 0"),
        (lambda t: [(*t[0][:1], (8, 2**40), *t[0][2:]), *t[1:]], "tensor 'token_embd.weight' runs past the end"),
        (lambda t: [(*t[0][:1], (8, 2**62, 2**62), *t[0][2:]), *t[1:]], "runs past the end"),
        (lambda t: [(*t[0][:3], 2**40), *t[1:]], "runs past the end"),
        (lambda t: [(*t[0][:3], 4), *t[1:]], "starts at offset 4, not a multiple of 32"),
        (lambda t: [t[0], (*t[1][:3], 0), *t[2:]], "overlap"),
        (lambda t: [(*t[0][:2], 99, t[0][3]), *t[1:]], "has unknown GGUF type 99"),
        (lambda t: [(*t[0][:2], 2, t[0][3]), *t[1:]], "rows of 8 are not whole blocks of 32"),  # Q4_0
    ],
)
def test_gguf_tensor_entries_are_checked(tmp_path: Path, edit: Any, message: str) -> None:
    entries, _ = _llama_tensors()
    assert message in _header_error(_write_gguf(tmp_path, tensors=edit(entries)))


def test_gguf_counts_cannot_claim_more_than_the_file_holds(tmp_path: Path) -> None:
    good = _write_gguf(tmp_path).read_bytes()
    path = tmp_path / "bad.gguf"
    for offset, count, what in ((8, 2**60, "tensors"), (16, 2**60, "metadata fields")):
        path.write_bytes(good[:offset] + struct.pack("<Q", count) + good[offset + 8 :])
        assert f"the header claims {count} {what}" in _header_error(path)
    # an array of 2**60 strings, and arrays of arrays nested a hundred thousand deep
    path.write_bytes(_one_field(ARRAY, struct.pack("<IQ", STRING, 2**60) + b"\0" * 64))
    assert f"the header claims {2**60} array items" in _header_error(path)
    path.write_bytes(_one_field(ARRAY, struct.pack("<IQ", ARRAY, 1) * 100_000))
    assert "arrays nest more than 4 deep" in _header_error(path)
    # a key twice
    path.write_bytes(_gguf([("x", (U32, 1)), ("x", (U32, 2))], [], b""))
    assert "metadata key 'x' appears twice" in _header_error(path)


def _one_field(kind: int, payload: bytes) -> bytes:
    """A GGUF file of one metadata field "x" of type ``kind`` whose value's bytes are ``payload``."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _value(STRING, "x") + struct.pack("<I", kind) + payload


def test_two_gguf_tensors_with_one_hugging_face_name_are_refused(tmp_path: Path) -> None:
    entries, data = _llama_tensors()
    _, dims, kind, offset = entries[0]
    copy = ("model.embed_tokens.weight", dims, kind, len(data))  # its own bytes: the same values again
    path = tmp_path / "twice.gguf"
    path.write_bytes(_gguf(_llama_fields(), [copy, *entries], data + data[offset : offset + 8 * 16 * 4]))
    with pytest.raises(ModelLoadError, match=r"tensors model\.embed_tokens\.weight and token_embd\.weight are both"):
        GGUFCheckpoint(path)
