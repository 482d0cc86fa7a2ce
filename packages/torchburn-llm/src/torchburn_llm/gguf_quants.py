"""Which .gguf file of a Hub repo a quant tag names, as ``llama-server -hf org/name:Q4_K_M`` and ollama read
``org/name:TAG``: GGUF repos hold one file per quantization, named after it (``model-Q4_K_M.gguf``,
``model.q8_0.gguf``, ``Q8_0/model-Q8_0-00001-of-00002.gguf`` for a model split into parts). Only file names
are read here; nothing is downloaded."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .errors import ModelLoadError

DEFAULT_QUANT = "Q4_K_M"  # what llama.cpp and ollama pick when no tag is given: small, and close to 8 bits

# llama-gguf-split's part names: model-00001-of-00003.gguf
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# llama.cpp's file types in file names (Q4_K_M, IQ4_XS, TQ1_0, Q8_0, F16, BF16, MXFP4_MOE), with Unsloth's
# "UD-" prefix for its dynamic quants; between separators, so that Q4_K does not match inside Q4_K_M
TAG = re.compile(
    r"(?<![A-Za-z0-9])(?:UD-)?(?:[IT]?Q\d+(?:_[A-Za-z0-9]+)*|B?F16|F32|FP16|FP32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])",
    re.IGNORECASE,
)
SEPARATORS = "-./ "


@dataclass(frozen=True)
class GgufModel:
    """One quantization of a GGUF repo: a file, or the parts of a split one in order."""

    label: str  # the tag it is asked for by (Q4_K_M), unique within its repo
    files: tuple[str, ...]  # paths inside the repo

    @property
    def split(self) -> bool:
        return len(self.files) > 1 or split_parts(self.files[0]) not in (None, (1, 1))


def split_parts(name: str | Path) -> tuple[int, int] | None:
    """(part, of) for a part of a split GGUF file, else None."""
    found = SPLIT.search(str(name))
    return (int(found.group(1)), int(found.group(2))) if found else None


def quant_tag(path: str) -> str:
    """The quantization a .gguf file's name carries (its last tag, in capitals as llama.cpp names the types),
    else its name without the extension."""
    stem = _stem(path)
    tags = TAG.findall(stem)
    return tags[-1].upper() if tags else stem


def _stem(path: str) -> str:
    """The file name without its folder, split-part suffix and extension."""
    name = SPLIT.sub("", PurePosixPath(path).name)
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def gguf_models(paths: Iterable[str]) -> list[GgufModel]:
    """The GGUF models among a repo's files, by label. Vision projectors (``mmproj``) are not models."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        if path.lower().endswith(".gguf") and "mmproj" not in PurePosixPath(path).name.lower():
            groups.setdefault(SPLIT.sub("", path), []).append(path)
    tags = {key: quant_tag(key) for key in groups}
    counts = Counter(tag.casefold() for tag in tags.values())
    models = []
    for key, members in groups.items():
        # two files with the same tag (model-7b-Q4_K_M.gguf, model-13b-Q4_K_M.gguf) go by their names instead
        label = tags[key] if counts[tags[key].casefold()] == 1 else _stem(key)
        models.append(GgufModel(label, tuple(sorted(members, key=lambda m: split_parts(m) or (0, 0)))))
    return sorted(models, key=lambda m: m.label.casefold())


def _names(model: GgufModel, tag: str) -> bool:
    """Whether ``tag`` stands between separators in the model's file name (Q4_K_XL in model-UD-Q4_K_XL.gguf)."""
    name, tag = SPLIT.sub("", model.files[0]).casefold(), tag.casefold()
    start = name.find(tag)
    while start >= 0:
        end = start + len(tag)
        if (start == 0 or name[start - 1] in SEPARATORS) and (end == len(name) or name[end] in SEPARATORS):
            return True
        start = name.find(tag, start + 1)
    return False


def pick(models: list[GgufModel], quant: str | None, name: str, where: str = "") -> GgufModel:
    """The model ``quant`` names (case-insensitive), or with no tag the default pick: Q4_K_M if there is
    one, else the only model. ``name`` (org/name) and ``where`` (" in the cache") go into the errors."""
    available = ", ".join(m.label for m in models) or "none"
    if not models:
        raise ModelLoadError(f"{name} has no .gguf files{where}")
    if quant is None:
        default = [m for m in models if m.label.casefold() == DEFAULT_QUANT.casefold()]
        if default or len(models) == 1:
            return (default or models)[0]
        raise ModelLoadError(f"{name} holds several GGUF quants{where}: pick one as {name}:QUANT from {available}")
    found = [m for m in models if m.label.casefold() == quant.casefold()] or [m for m in models if _names(m, quant)]
    if len(found) == 1:
        return found[0]
    if found:
        raise ModelLoadError(
            f"{name}:{quant} names several GGUF files{where}: {', '.join(m.label for m in found)}; use the full label"
        )
    raise ModelLoadError(f"{name} has no GGUF quant {quant!r}{where}; available: {available}")


def merge_hint(path: Path) -> str:
    """How to make one loadable file of the split GGUF model that ``path`` is a part of."""
    parts = split_parts(path.name) or (1, 1)
    first = path.with_name(SPLIT.sub(f"-00001-of-{parts[1]:05d}.gguf", path.name))
    return f"merge them with llama.cpp's `llama-gguf-split --merge {first} merged.gguf` and load merged.gguf"


def refuse_split(path: Path) -> None:
    """Loading a part of a split GGUF file is an error that says how to merge it (parts are not read yet)."""
    parts = split_parts(path.name)
    if parts is not None and parts[1] > 1:
        raise ModelLoadError(
            f"{path} is part {parts[0]} of a GGUF model split into {parts[1]} files, and split GGUF files cannot be "
            f"loaded yet: {merge_hint(path)}"
        )
