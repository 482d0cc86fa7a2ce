"""The models in the local Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``): what a snapshot holds,
one row per cached model for ``torchburn list``, and removals for ``torchburn rm``.

A removal never leaves the cache: every path it would delete (the repo folder, snapshot entries, blobs)
must lie in the repo's own folder, with no symlink on the way out of it; a snapshot entry that points
elsewhere stops the removal before anything is deleted. Deleting goes through huggingface_hub's own
strategies, which also free Xet blobs shared between repos."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from . import files
from .errors import ModelLoadError
from .gguf_quants import GgufModel, gguf_models, pick

COMMIT = re.compile(r"[0-9a-f]{40}")


def cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def human_size(size: int) -> str:
    """Bytes in decimal units, as the Hub and ollama show sizes: 4.1 GB, 920 MB, 12 kB."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def snapshot_files(repo_id: str, revision: str | None = None, cache: Path | None = None) -> list[str] | None:
    """The files of ``repo_id``'s cached snapshot for ``revision`` (a branch, tag or commit; default
    main), as paths inside the repo; None when that revision is not cached."""
    storage = (cache or cache_dir()) / _repo_folder(repo_id)
    revision = revision or "main"
    if ".." in PurePosixPath(revision).parts:
        return None
    commit = revision
    if not COMMIT.fullmatch(revision):
        ref = storage / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text().strip()
    snapshot = storage / "snapshots" / commit
    if not COMMIT.fullmatch(commit) or not snapshot.is_dir():
        return None
    found = []
    for folder, _, names in os.walk(snapshot):
        for name in names:
            path = Path(folder) / name
            if path.is_file():  # a symlink whose blob is missing is no file to load
                found.append(path.relative_to(snapshot).as_posix())
    return sorted(found)


@dataclass(frozen=True)
class CachedModel:
    """One ``torchburn list`` row: a GGUF quant of a repo, or the repo's checkpoint."""

    name: str  # org/name:QUANT for a GGUF quant, org/name for a checkpoint
    repo_id: str
    quant: str | None
    format: str  # "gguf", "safetensors", or "other" (a repo cached without weights TorchBurn reads)
    dtype: str | None  # the checkpoint's torch dtype from config.json
    size: int
    modified: float  # newest file's modification time (seconds since the epoch)
    path: Path  # what to load: the .gguf file (first part), or the newest snapshot folder
    revisions: tuple[str, ...] = field(default=())

    @property
    def kind(self) -> str:
        """The format column: ``gguf Q4_K_M``, ``safetensors bfloat16``."""
        detail = self.quant if self.format == "gguf" else self.dtype
        return f"{self.format} {detail}" if detail else self.format

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "repo_id": self.repo_id,
            "quant": self.quant,
            "format": self.format,
            "dtype": self.dtype,
            "size": self.size,
            "size_human": human_size(self.size),
            "modified": datetime.fromtimestamp(self.modified).astimezone().isoformat(timespec="seconds"),
            "path": str(self.path),
            "revisions": list(self.revisions),
        }


def _scan(cache: Path | None) -> Any:
    """huggingface_hub's scan of the cache (an empty one when the folder does not exist yet)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        return scan_cache_dir(cache or cache_dir())
    except CacheNotFound:
        return None


def _relative(file: Any, revision: Any) -> str:
    """A cached file's path inside its repo (``Q8_0/model-Q8_0-00001-of-00002.gguf``)."""
    return Path(file.file_path).relative_to(revision.snapshot_path).as_posix()


def _newest(revisions: Iterable[Any]) -> Any:
    return max(revisions, key=lambda r: r.last_modified)


def cached_models(cache: Path | None = None) -> list[CachedModel]:
    """Every model repo of the cache as rows: one per cached GGUF quant, and one for the rest of the repo
    when it holds safetensors or no GGUF file at all. Sizes count each blob once, over all revisions."""
    scan = _scan(cache)
    rows: list[CachedModel] = []
    for repo in sorted(scan.repos if scan else (), key=lambda r: r.repo_id.casefold()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        entries = [(rev, f, _relative(f, rev)) for rev in repo.revisions for f in rev.files]
        models = gguf_models({name for _, _, name in entries})
        in_gguf = {name for m in models for name in m.files}
        for model in models:
            rows.append(_row(repo, model, [(r, f) for r, f, name in entries if name in model.files]))
        rest = [(r, f, name) for r, f, name in entries if name not in in_gguf]
        if any(name.endswith(".safetensors") for _, _, name in rest) or not models:
            rows.append(_checkpoint_row(repo, rest))
    return rows


def _row(repo: Any, model: GgufModel, entries: list[tuple[Any, Any]]) -> CachedModel:
    revision = _newest(r for r, _ in entries)
    path = Path(revision.snapshot_path) / model.files[0]
    return CachedModel(
        name=f"{repo.repo_id}:{model.label}",
        repo_id=repo.repo_id,
        quant=model.label,
        format="gguf",
        dtype=None,
        size=sum({f.blob_path: f.size_on_disk for _, f in entries}.values()),
        modified=max(f.blob_last_modified for _, f in entries),
        path=path,
        revisions=tuple(sorted({r.commit_hash for r, _ in entries})),
    )


def _checkpoint_row(repo: Any, entries: list[tuple[Any, Any, str]]) -> CachedModel:
    revisions = {r for r, _, _ in entries} or set(repo.revisions)
    newest = _newest(revisions)
    checkpoint = any(name.endswith(".safetensors") for _, _, name in entries)
    return CachedModel(
        name=repo.repo_id,
        repo_id=repo.repo_id,
        quant=None,
        format="safetensors" if checkpoint else "other",
        dtype=_dtype(Path(newest.snapshot_path)) if checkpoint else None,
        size=sum({f.blob_path: f.size_on_disk for _, f, _ in entries}.values()),
        modified=max((f.blob_last_modified for _, f, _ in entries), default=repo.last_modified),
        path=Path(newest.snapshot_path),
        revisions=tuple(sorted(r.commit_hash for r in revisions)),
    )


def _dtype(snapshot: Path) -> str | None:
    """config.json's ``torch_dtype`` (``dtype`` in newer transformers), if the snapshot has a readable one."""
    config = snapshot / "config.json"
    if not files.present(config):
        return None
    try:
        raw = files.read_json_object(config, snapshot)
    except ModelLoadError:
        return None
    dtype = raw.get("dtype") or raw.get("torch_dtype")
    return dtype if isinstance(dtype, str) else None


@dataclass
class Removal:
    """What ``torchburn rm`` deletes: shown first, then :meth:`execute`."""

    name: str
    paths: list[Path]  # the repo folder, or the quant's snapshot entries
    size: int  # bytes freed
    strategy: Any  # huggingface_hub's DeleteCacheStrategy (or the same shape, for versions without delete_files)
    snapshots: list[Path]  # folders to tidy of the empty subfolders a removed quant leaves

    def execute(self) -> None:
        self.strategy.execute()
        for snapshot in self.snapshots:
            _remove_empty_folders(snapshot)


def plan_removal(repo_id: str, quant: str | None, cache: Path | None = None) -> Removal:
    """The removal of ``repo_id`` from the cache (every revision), or with ``quant`` of that GGUF quant's
    file(s) alone — their blobs too when no other snapshot links them. Raises ModelLoadError for a model
    that is not cached, and for anything that would be deleted outside the repo's folder."""
    cache = cache or cache_dir()
    scan = _scan(cache)
    repos = [r for r in (scan.repos if scan else ()) if r.repo_type == "model"]
    repo = next((r for r in repos if r.repo_id == repo_id), None) or next(
        (r for r in repos if r.repo_id.casefold() == repo_id.casefold()), None
    )
    if repo is None:
        raise ModelLoadError(f"{repo_id} is not in the Hugging Face cache ({cache}); `torchburn list` shows what is")
    everything = [f for rev in repo.revisions for f in rev.files]
    if quant is not None:
        model = pick(
            gguf_models({_relative(f, r) for r in repo.revisions for f in r.files}),
            quant,
            repo.repo_id,
            " in the cache",
        )
        chosen = [(r, f) for r in repo.revisions for f in r.files if _relative(f, r) in model.files]
        if len(chosen) < len(everything):
            selected = [f for _, f in chosen]
            strategy = _delete_files(scan, selected)
            _check_inside(strategy, repo.repo_path, cache)
            return Removal(
                f"{repo.repo_id}:{model.label}",
                sorted(Path(f.file_path) for f in selected),
                strategy.expected_freed_size,
                strategy,
                sorted({Path(r.snapshot_path) for r, _ in chosen}),
            )
        name = f"{repo.repo_id}:{model.label}"  # the repo's only files: the whole repo goes, not an empty shell
    else:
        name = repo.repo_id
    strategy = scan.delete_revisions(*[r.commit_hash for r in repo.revisions])
    _check_inside(strategy, repo.repo_path, cache)
    return Removal(name, [Path(repo.repo_path)], strategy.expected_freed_size, strategy, [])


def _delete_files(scan: Any, selected: list[Any]) -> Any:
    """huggingface_hub's strategy for deleting single files, or for versions without one, the same:
    the snapshot entries, and the blobs no other cached file links."""
    if hasattr(scan, "delete_files"):
        return scan.delete_files(*selected)
    keep = {f.blob_path for repo in scan.repos for rev in repo.revisions for f in rev.files if f not in selected}
    blobs = {f.blob_path: f.size_on_disk for f in selected if f.blob_path not in keep}
    entries = frozenset(Path(f.file_path) for f in selected)
    return _FileDeletion(entries, frozenset(set(blobs) - entries), sum(blobs.values()))


@dataclass(frozen=True)
class _FileDeletion:
    files: frozenset[Path]
    blobs: frozenset[Path]
    expected_freed_size: int

    def execute(self) -> None:
        for path in (*self.files, *self.blobs):  # links before the blobs they point to
            Path(path).unlink(missing_ok=True)


def _check_inside(strategy: Any, repo_path: Path, cache: Path) -> None:
    """Refuse a deletion that would reach outside the repo's folder in the cache. Each path is judged by
    the real location of the folder it sits in: deleting a symlink removes the link, not its target,
    but a folder on the way that is a symlink could lead anywhere."""
    repo_real = Path(os.path.realpath(repo_path))
    if Path(repo_path).is_symlink() or repo_real.parent != Path(os.path.realpath(cache)):
        raise ModelLoadError(f"{repo_path} is not a folder of the Hugging Face cache {cache}: nothing deleted")
    for kind in ("repos", "snapshots", "refs", "files", "blobs"):
        for path in getattr(strategy, kind, ()):
            path = Path(path)
            if kind == "repos":
                ok = path == Path(repo_path)
            else:
                where = Path(os.path.realpath(path.parent))
                ok = where.is_relative_to(repo_real) and not (kind == "snapshots" and path.is_symlink())
            if not ok:
                raise ModelLoadError(
                    f"{path} lies outside {repo_path} (a symlink leads out of the cache): nothing deleted"
                )


def _remove_empty_folders(snapshot: Path) -> None:
    """Remove the folders a removed quant left empty inside ``snapshot`` (never following a symlink)."""
    for folder, _, _ in os.walk(snapshot, topdown=False):  # children first, so that emptied parents go too
        if Path(folder) != snapshot and not os.listdir(folder):
            try:
                os.rmdir(folder)
            except OSError:
                pass  # filled again meanwhile: leaving it is harmless
