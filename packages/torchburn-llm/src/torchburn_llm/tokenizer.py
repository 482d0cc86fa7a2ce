"""Text <-> token ids: a folder's ``tokenizer.json``, or the byte-level BPE a GGUF file carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ModelLoadError

CONTROL = 3  # GGUF token type of special (control) tokens


def from_folder(folder: Path) -> Any:
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        return None  # token ids still work; text needs the tokenizer
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise ModelLoadError(f"{path} is not a readable tokenizer: {exc}") from exc


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
        raise ModelLoadError(f"{source}: GGUF tokenizer model {kind!r} is not supported (supported: gpt2)")
    tokens = strings("tokenizer.ggml.tokens")
    merges: list[tuple[str, str]] = []
    for m in strings("tokenizer.ggml.merges"):
        left, _, right = m.partition(" ")
        merges.append((left, right))
    types = [int(t) for t in fields.get("tokenizer.ggml.token_type", [])]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    # digits one by one, then GPT-2's byte-level split (the pretokenization these BPE vocabularies use)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True) for i, t in enumerate(types) if t == CONTROL])
    return tok
