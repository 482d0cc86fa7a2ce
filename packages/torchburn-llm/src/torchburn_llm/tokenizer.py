"""Text <-> token ids: a folder's ``tokenizer.json``, or the byte-level BPE a GGUF file carries."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from . import files
from .checks import shown
from .errors import ModelLoadError

log = logging.getLogger("torchburn.llm")


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


# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # SentencePiece's visible space

# byte-level BPE pretokenization by ``tokenizer.ggml.pre`` (llama.cpp's names for the published
# splitting rules): a regular expression that splits the text before the bytes are mapped
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
# Mistral's Tekken (Nemo, Small 3) and GPT-4o's (Phi-4-mini): words split at case changes
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
TEKKEN_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTION}|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTION}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's rule for files that name none (or "default"): punctuation runs, then GPT-2's split, then
# digit runs, then those in threes, each splitting the pieces the one before left
DEFAULT_SPLITS = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT.removesuffix(r"|\s+"), r"\p{N}+", r"[0-9][0-9][0-9]")
# DeepSeek LLM's and Coder's (v1) rules: newlines alone, letter runs (DeepSeek LLM: the letters of its own
# list of scripts) and punctuation runs each after an optional space, trailing spaces, CJK runs, digits
_CJK = r"[一-龥ࠀ-一가-퟿]+"
DEEPSEEK_LLM_SPLITS = (
    r"[\r\n]",
    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    _CJK,
    r"\p{N}+",
)
DEEPSEEK_CODER_SPLITS = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")
# Qwen 3.5's: Qwen 2's with combining marks inside words
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# vocabularies whose pre-tokens that are whole tokens are taken as they are, merges or not (Llama 3's
# tokenizer.json says "ignore_merges"; a few words, such as " Việt", have no merge path to their token)
IGNORE_MERGES = frozenset({"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral", "tekken"})
PRETOKENIZERS = {
    "default": "default",
    "gpt-2": "gpt2",
    "gpt2": "gpt2",
    "phi-2": "gpt2",
    "llama-bpe": "llama3",
    "llama3": "llama3",
    "llama-v3": "llama3",
    "falcon3": "llama3",
    "pixtral": "llama3",
    "deepseek-llm": "deepseek-llm",
    "deepseek-coder": "deepseek-coder",
    "qwen35": "qwen35",
    "command-r": "digits",
    "smaug-bpe": "llama3",
    "qwen2": "qwen2",
    "deepseek-r1-qwen": "qwen2",
    "smollm": "digits",
    "tekken": "tekken",
    "gpt-4o": "gpt4o",
    "starcoder": "digits",
    "refact": "digits",
}


def from_gguf(fields: dict[str, Any], source: str) -> Any:
    """A ``tokenizers`` tokenizer from GGUF metadata (``tokenizer.ggml.*``, as plain values): byte-level
    BPE (``gpt2``: Llama 3, Qwen, SmolLM...) or SentencePiece BPE (``llama``: Llama 2, Mistral, Gemma,
    Phi-3), splitting and spacing text as llama.cpp does for the file."""
    kind = fields.get("tokenizer.ggml.model")
    if kind == "gpt2":
        tok = _byte_level_bpe(fields, source)
    elif kind == "llama":
        tok = _sentencepiece_bpe(fields, source)
    else:
        raise ModelLoadError(
            f"{source}: GGUF tokenizer model {shown(kind)} is not supported "
            "(supported: gpt2 = byte-level BPE, llama = SentencePiece BPE)"
        )
    _begin_with_bos(tok, fields, default=kind == "llama")
    return tok


def _begin_with_bos(tok: Any, fields: dict[str, Any], default: bool) -> None:
    """Where the file asks for it (``add_bos_token``; llama.cpp's default: on for SentencePiece
    vocabularies), the tokenizer's post-processor puts BOS before a prompt, as a Hugging Face tokenizer
    of the same model does (see ``begins_with``)."""
    from tokenizers import processors

    wanted = fields.get("tokenizer.ggml.add_bos_token", default)
    bos = fields.get("tokenizer.ggml.bos_token_id")
    tokens = fields["tokenizer.ggml.tokens"]
    if wanted is not True or not isinstance(bos, int) or isinstance(bos, bool) or not 0 <= bos < len(tokens):
        return
    token = tokens[bos]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{token}:0 $A:0", pair=f"{token}:0 $A:0 $B:1", special_tokens=[(token, bos)]
    )


def begins_with(tokenizer: Any) -> list[int]:
    """The ids a tokenizer puts before every prompt (BOS for Llama and Gemma, nothing for Qwen or
    SmolLM2): what it gives for an empty text with its special tokens on."""
    if tokenizer is None:
        return []
    return list(tokenizer.encode("", add_special_tokens=True).ids)


def _strings(fields: dict[str, Any], key: str, source: str) -> list[str]:
    values = fields.get(key)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ModelLoadError(f"{source}: no list of strings {key} in the GGUF metadata")
    return values


def _token_types(fields: dict[str, Any], count: int, source: str) -> list[int]:
    types = fields.get("tokenizer.ggml.token_type", [])
    if (
        not isinstance(types, list)
        or len(types) not in (0, count)
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in types)
    ):
        raise ModelLoadError(f"{source}: tokenizer.ggml.token_type must be a list of {count} integers, one per token")
    return types


def _byte_level_bpe(fields: dict[str, Any], source: str) -> Any:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tokens = _strings(fields, "tokenizer.ggml.tokens", source)
    merges: list[tuple[str, str]] = []
    for m in _strings(fields, "tokenizer.ggml.merges", source):
        left, _, right = m.partition(" ")
        merges.append((left, right))
    types = _token_types(fields, len(tokens), source)
    pre = fields.get("tokenizer.ggml.pre", "default")
    whole_tokens_first = pre in IGNORE_MERGES
    try:
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=whole_tokens_first))
    except Exception as exc:  # a merge of tokens outside the vocabulary, and the like
        raise ModelLoadError(f"{source}: the GGUF tokenizer cannot be built: {exc}") from exc
    rule = PRETOKENIZERS.get(pre) if isinstance(pre, str) else None
    if rule is None:
        log.warning(
            "%s: pretokenizer %s is not known here; splitting text as llama.cpp's default does (known: %s)",
            source,
            shown(pre),
            ", ".join(sorted(PRETOKENIZERS)),
        )
        rule = "default"
    splits = {
        "llama3": (LLAMA3_SPLIT,),
        "qwen2": (QWEN2_SPLIT,),
        "tekken": (TEKKEN_SPLIT,),
        "gpt4o": (GPT4O_SPLIT,),
        "qwen35": (QWEN35_SPLIT,),
        "deepseek-llm": DEEPSEEK_LLM_SPLITS,
        "deepseek-coder": DEEPSEEK_CODER_SPLITS,
        "default": DEFAULT_SPLITS,
    }.get(rule)
    if splits is not None:
        steps = [pre_tokenizers.Split(Regex(r), "isolated") for r in splits]
        tok.pre_tokenizer = pre_tokenizers.Sequence([*steps, pre_tokenizers.ByteLevel(False, use_regex=False)])
    elif rule == "digits":
        # digits one by one, then GPT-2's byte-level split
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True) for i, t in enumerate(types) if t == CONTROL])
    return tok


def _sentencepiece_bpe(fields: dict[str, Any], source: str) -> Any:
    """SentencePiece BPE as llama.cpp runs it: spaces as ``▁``, one more before the text (and after
    each special token) where ``add_space_prefix`` (default on), pieces merged pairwise in the order
    of the merged piece's score, and characters no piece covers as their UTF-8 byte tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    tokens = _strings(fields, "tokenizer.ggml.tokens", source)
    scores = fields.get("tokenizer.ggml.scores")
    if (
        not isinstance(scores, list)
        or len(scores) != len(tokens)
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in scores)
    ):
        raise ModelLoadError(f"{source}: tokenizer.ggml.scores must be {len(tokens)} finite numbers, one per token")
    types = _token_types(fields, len(tokens), source) or [NORMAL] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelLoadError(f"{source}: tokenizer.ggml.tokens lists a token twice")
    unk = fields.get("tokenizer.ggml.unknown_token_id", next((i for i, t in enumerate(types) if t == UNKNOWN), None))
    unk_token = tokens[unk] if isinstance(unk, int) and not isinstance(unk, bool) and 0 <= unk < len(tokens) else None
    try:
        model = models.BPE(
            vocab=vocab,
            merges=_merges_by_score(tokens, scores, types),
            unk_token=unk_token,
            fuse_unk=True,
            byte_fallback=True,
        )
        tok = Tokenizer(model)
    except Exception as exc:
        raise ModelLoadError(f"{source}: the GGUF tokenizer cannot be built: {exc}") from exc
    prefix = fields.get("tokenizer.ggml.add_space_prefix", True)
    spacing: list[Any] = [normalizers.Replace(" ", SPACE)]
    shown_back: list[Any] = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix is True:
        spacing.insert(0, normalizers.Prepend(SPACE))
        shown_back.append(decoders.Strip(" ", 1, 0))
    tok.normalizer = normalizers.Sequence(spacing)
    tok.decoder = decoders.Sequence(shown_back)
    tok.add_special_tokens([AddedToken(tokens[i], special=True) for i, t in enumerate(types) if t == CONTROL])
    tok.add_tokens([AddedToken(tokens[i], normalized=False) for i, t in enumerate(types) if t == USER_DEFINED])
    return tok


def _merges_by_score(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's scoring: every split of a piece into two pieces of the
    vocabulary is a merge, ranked by the score of the piece it makes (highest first; for one piece,
    splits with lower token ids first)."""
    ids = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, i in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            a, b = ids.get(left), ids.get(right)
            if a is not None and b is not None:
                ranked.append((-scores[i], a, b, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]
