"""Text <-> token ids: a folder's ``tokenizer.json``, or the byte-level BPE a GGUF file carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import files
from .checks import shown
from .errors import ModelLoadError

CONTROL = 3  # GGUF token type of special (control) tokens


def from_folder(folder: Path) -> Any:
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not files.present(path):
        return None  # token ids still work; text needs the tokenizer
    data = files.read_bytes(path, folder, files.MAX_TOKENIZER_BYTES)
    try:
        return Tokenizer.from_buffer(data)
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise ModelLoadError(f"{path} is not a readable tokenizer: {exc}") from exc


def check_vocabulary(tokenizer: Any, vocab_size: int, source: str) -> None:
    """A tokenizer whose ids reach past the model's embedding rows would fail on the first such token."""
    if tokenizer is None:
        return
    size = int(tokenizer.get_vocab_size(with_added_tokens=True))
    if size > vocab_size:
        raise ModelLoadError(
            f"{source}: the tokenizer has {size} tokens but vocab_size is {vocab_size}: "
            f"ids from {vocab_size} on have no embedding"
        )


def from_gguf(fields: dict[str, Any], source: str) -> Any:
    """A ``tokenizers`` tokenizer from GGUF metadata (``tokenizer.ggml.*``, as plain values); GPT-2-style
    BPE only."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    def strings(key: str) -> list[str]:
        values = fields.get(key)
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ModelLoadError(f"{source}: no list of strings {key} in the GGUF metadata")
        return values

    kind = fields.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(f"{source}: GGUF tokenizer model {shown(kind)} is not supported (supported: gpt2)")
    tokens = strings("tokenizer.ggml.tokens")
    merges: list[tuple[str, str]] = []
    for m in strings("tokenizer.ggml.merges"):
        left, _, right = m.partition(" ")
        merges.append((left, right))
    types = fields.get("tokenizer.ggml.token_type", [])
    if (
        not isinstance(types, list)
        or len(types) not in (0, len(tokens))
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in types)
    ):
        raise ModelLoadError(
            f"{source}: tokenizer.ggml.token_type must be a list of {len(tokens)} integers, one per token"
        )
    try:
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    except Exception as exc:  # a merge of tokens outside the vocabulary, and the like
        raise ModelLoadError(f"{source}: the GGUF tokenizer cannot be built: {exc}") from exc
    # digits one by one, then GPT-2's byte-level split (the pretokenization these BPE vocabularies use)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True) for i, t in enumerate(types) if t == CONTROL])
    return tok
