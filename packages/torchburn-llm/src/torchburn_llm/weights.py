"""Reading a checkpoint's tensors: ``*.safetensors`` files, memory-mapped, single or sharded."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath, PureWindowsPath

import torch
from safetensors import safe_open

from . import files
from .checks import shown
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

    def load_one(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The tensor ``name`` converted to ``dtype``."""
        with safe_open(str(self._where[name]), framework="pt") as f:
            tensor: torch.Tensor = f.get_tensor(name).to(dtype)
        return tensor


class LazyTensors(Mapping[str, torch.Tensor]):
    """Tensors by name, each read by ``read`` when first looked up: a model that converts its weights
    one by one (to int4, say) holds one of them in fp32 at a time, not the whole checkpoint. A tensor
    still alive when looked up again is the same object (a tied embedding is read once)."""

    def __init__(
        self,
        names: list[str],
        read: Callable[[str], torch.Tensor],
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self._names = dict.fromkeys(names)
        self._read, self._progress = read, progress
        self._alive: weakref.WeakValueDictionary[str, torch.Tensor] = weakref.WeakValueDictionary()
        self._seen: set[str] = set()

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        tensor = self._alive.get(name)
        if tensor is None:
            tensor = self._read(name)
            self._alive[name] = tensor
            self._seen.add(name)
            if self._progress is not None:
                self._progress(len(self._seen), len(self._names))
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _shard_files(folder: Path) -> list[Path]:
    """The safetensors files of ``folder``, resolved: those its index names, else every ``*.safetensors``.
    Each must be a regular file inside the folder (see :mod:`files`)."""
    index = folder / "model.safetensors.index.json"
    if files.present(index):
        weight_map = files.read_json_object(index, folder).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index} is not a valid safetensors index: it has no weight_map object")
        names = set()
        for tensor, shard in weight_map.items():
            if not isinstance(shard, str):
                raise ModelLoadError(f"{index}: weight_map[{shown(tensor)}] must be a file name, got {shown(shard)}")
            _check_shard_name(shard, index)
            names.add(shard)
        missing = sorted(n for n in names if not files.present(folder / n))
        if missing:
            raise ModelLoadError(f"{index} names shard(s) that are not in {folder}: {', '.join(map(shown, missing))}")
        return [files.inside(folder / n, folder) for n in sorted(names)]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise ModelLoadError(f"no *.safetensors weights in {folder} (pytorch_model.bin is not read: it is a pickle)")
    return [files.inside(path, folder) for path in found]


def _check_shard_name(name: str, index: Path) -> None:
    """Refuse a shard name that could lead out of the folder before it is ever joined to it: an absolute
    path, a drive, a ``..`` step or a backslash (a separator on Windows)."""
    parts = PurePosixPath(name).parts
    if (
        not name.endswith(".safetensors")
        or name.startswith("/")
        or "\\" in name
        or "\0" in name
        or PureWindowsPath(name).drive
        or ".." in parts
    ):
        raise ModelLoadError(
            f"{index}: shard {shown(name)} is not allowed: shards are *.safetensors files named relative to "
            "the model folder, without '..', a leading '/' or a backslash"
        )
