"""Reading a checkpoint's tensors: ``*.safetensors`` files, memory-mapped, single or sharded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from .errors import ModelLoadError

Shape = tuple[int, ...]


class SafetensorsCheckpoint:
    """The tensors of a folder's safetensors files, opened lazily: names and shapes first (for the
    strict check), then each tensor on request, backed by the mapped file rather than read into memory."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files = _shard_files(folder)
        self._where: dict[str, Path] = {}
        self.shapes: dict[str, Shape] = {}
        for path in self.files:
            try:
                with safe_open(str(path), framework="pt") as f:
                    for name in f.keys():
                        if name in self._where:
                            raise ModelLoadError(
                                f"tensor {name} appears in both {self._where[name].name} and {path.name}"
                            )
                        self._where[name] = path
                        self.shapes[name] = tuple(f.get_slice(name).get_shape())
            except ModelLoadError:
                raise
            except Exception as exc:  # safetensors raises its own error types for a damaged file
                raise ModelLoadError(f"{path} is not a readable safetensors file: {exc}") from exc

    def load(
        self,
        names: list[str],
        dtype: torch.dtype = torch.float32,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The named tensors converted to ``dtype`` (a view of the mapped file when already of it)."""
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self._where[name], []).append(name)
        out: dict[str, torch.Tensor] = {}
        for path, wanted in by_file.items():
            with safe_open(str(path), framework="pt") as f:
                for name in wanted:
                    out[name] = f.get_tensor(name).to(dtype)
                    if progress is not None:
                        progress(len(out), len(names))
        return out


def _shard_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {exc}") from exc
        files = sorted({folder / str(f) for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{index} names shard(s) that are not in {folder}: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {folder} (pytorch_model.bin is not read: it is a pickle)")
    return files
