"""Reading a model folder's files, which are untrusted: only regular files that resolve inside the folder
(a symlink out of it is refused), never more bytes than a limit, and JSON that cannot crash the parser.

A snapshot of the Hugging Face cache (``models--org--name/snapshots/<revision>``) holds symlinks into the
repo's ``blobs`` folder, two levels up: for such a folder, the repo's cache folder is the boundary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import ModelLoadError

MAX_JSON_BYTES = 64 << 20  # a tokenizer_config.json with a big vocabulary of added tokens runs to a few MB
MAX_TOKENIZER_BYTES = 256 << 20  # tokenizer.json: tens of MB for the largest vocabularies
MAX_TEMPLATE_BYTES = 1 << 20  # chat_template.jinja: tens of KB for the largest templates


def boundary(folder: Path) -> Path:
    """The folder that ``folder``'s files must resolve inside: itself, or for a Hugging Face cache snapshot
    the repo's cache folder (its files are symlinks into ``../../blobs``)."""
    real = _resolve(folder)
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith(("models--", "datasets--")):
        return real.parent.parent
    return real


def inside(path: Path, folder: Path) -> Path:
    """``path`` resolved, once it is known to be a regular file within ``folder``'s boundary."""
    root = boundary(folder)
    real = _resolve(path)
    if not real.is_relative_to(root):
        raise ModelLoadError(
            f"{path} resolves to {real}, outside the model folder {root}: a model's files must lie inside its folder"
        )
    if not real.is_file():
        raise ModelLoadError(f"{path} is not a regular file")
    return real


def present(path: Path) -> bool:
    """Whether ``path`` is there at all (a dangling symlink is: reading it then says why it cannot be read)."""
    return path.is_symlink() or path.exists()


def read_bytes(path: Path, folder: Path, limit: int) -> bytes:
    real = inside(path, folder)
    try:
        with open(real, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if len(data) > limit:
        raise ModelLoadError(f"{path} is larger than {limit:,} bytes, the most such a file is read to")
    return data


def read_text(path: Path, folder: Path, limit: int) -> str:
    try:
        return read_bytes(path, folder, limit).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelLoadError(f"{path} is not UTF-8 text: {exc}") from exc


def read_json(path: Path, folder: Path, limit: int = MAX_JSON_BYTES) -> Any:
    text = read_text(path, folder, limit)
    try:
        return json.loads(text)
    except RecursionError:  # [[[[... ]]]] a hundred thousand deep: Python's parser recurses
        raise ModelLoadError(f"{path} nests too deeply to be a model file") from None
    except ValueError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc


def read_json_object(path: Path, folder: Path, limit: int = MAX_JSON_BYTES) -> dict[str, Any]:
    raw = read_json(path, folder, limit)
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path} holds a JSON {type(raw).__name__}, not an object")
    return raw


def _resolve(path: Path) -> Path:
    try:
        return path.resolve(strict=False)
    except (OSError, RuntimeError) as exc:  # a symlink loop: RuntimeError before Python 3.13
        raise ModelLoadError(f"cannot resolve {path}: {exc}") from exc
