"""Checkpoints by Hub id: from the Hugging Face cache (offline with ``HF_HUB_OFFLINE=1``) or downloaded
with progress bars. Only what the runtime reads is fetched (configs, tokenizer files, safetensors,
chat templates) — never pickled weights, never remote code.

``org/name:QUANT`` names one quantization of a GGUF repo (``Q4_K_M``, ``q8_0``: see :mod:`.gguf_quants`),
as ``llama-server -hf`` and ollama take it; only that file (or the parts of a split one) is fetched. A repo
that holds .gguf files and no safetensors gets the default pick without a tag."""

from __future__ import annotations

import fnmatch
import glob
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import hub_cache
from .errors import ModelLoadError
from .gguf_quants import GgufModel, gguf_models, pick

WANTED = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt"]
# the HTTP clients' "no answer" errors (requests: huggingface_hub < 1.0; httpx after)
CLIENT_ERRORS = (
    ("requests", "ConnectionError"),
    ("requests", "Timeout"),
    ("httpx2", "TransportError"),
    ("httpx", "TransportError"),
)
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")  # weights TorchBurn never loads: unpickling runs code


def looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def split_ref(ref: str) -> tuple[str, str | None]:
    """``("org/name", "Q4_K_M")`` for ``"org/name:Q4_K_M"``; no tag gives None."""
    repo_id, colon, quant = ref.partition(":")
    if not looks_like_repo_id(repo_id) or (colon and not quant):
        raise ValueError(f"{ref!r} is not a Hub model: write ORG/NAME, or ORG/NAME:QUANT for one file of a GGUF repo")
    return repo_id, quant or None


@dataclass(frozen=True)
class Target:
    """What a model reference fetches of its repo: one GGUF quant's file(s), or the checkpoint files."""

    repo_id: str
    gguf: GgufModel | None

    @property
    def name(self) -> str:
        """How to ask for it again: ``org/name:Q4_K_M`` for a GGUF quant, ``org/name`` for a checkpoint."""
        return f"{self.repo_id}:{self.gguf.label}" if self.gguf else self.repo_id

    @property
    def patterns(self) -> list[str]:
        # file names are patterns to snapshot_download: escaped, so that a '[' in one matches only itself
        return [glob.escape(f) for f in self.gguf.files] if self.gguf else WANTED


@dataclass(frozen=True)
class Pulled:
    """A model in the cache: what to pass as ``--model``, the path to load, its files and their size."""

    name: str
    path: Path
    files: list[Path]
    size: int
    split: bool  # a GGUF model in several parts, which cannot be loaded yet


def resolve(ref: str, revision: str | None = None, token: str | bool | None = None) -> Path:
    """The local path of Hub model ``ref`` (``org/name`` or ``org/name:QUANT``) at ``revision``: a
    checkpoint's snapshot folder, or a GGUF quant's file (its first part if split), downloaded when the
    Hub is reachable and not cached yet. ``token`` None uses ``HF_TOKEN`` or the login cache, as
    huggingface_hub does."""
    repo_id, quant = split_ref(ref)
    files, where = _listing(repo_id, quant, revision, token)
    target = _target(repo_id, quant, files, where, strict=False)
    folder = _fetch(target, quant, revision, token, online=False)
    return folder / target.gguf.files[0] if target.gguf else folder


def pull(ref: str, revision: str | None = None, token: str | bool | None = None) -> Pulled:
    """Download ``ref`` into the Hugging Face cache (the Hub must be reachable; cached files are kept)."""
    from huggingface_hub import constants

    repo_id, quant = split_ref(ref)
    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(f"cannot pull {ref}: HF_HUB_OFFLINE is set, and pulling needs the Hub")
    with _hub_errors(repo_id, quant, revision, online=True):
        files = _hub_files(repo_id, revision, token)
    target = _target(repo_id, quant, files, "", strict=True)
    folder = _fetch(target, quant, revision, token, online=True)
    if target.gguf:
        wanted = [folder / f for f in target.gguf.files]
        return Pulled(target.name, wanted[0], wanted, sum(f.stat().st_size for f in wanted), target.gguf.split)
    wanted = _matching(folder, WANTED)
    return Pulled(target.name, folder, wanted, sum(f.stat().st_size for f in wanted), False)


def _target(repo_id: str, quant: str | None, files: list[str], where: str, strict: bool) -> Target:
    """What of a repo holding ``files`` to fetch. ``strict`` (pull): a repo without weights TorchBurn
    reads is an error now rather than when loading."""
    models = gguf_models(files)
    checkpoint = any(f.endswith(".safetensors") for f in files)
    if quant is not None and not models and checkpoint:
        raise ModelLoadError(
            f"{repo_id} has no .gguf files{where}, only safetensors: load it as {repo_id} (and convert with "
            f"--quant int8 or int4 if you like); :{quant} picks a file of a GGUF repo"
        )
    if quant is not None or (models and not checkpoint):
        return Target(repo_id, pick(models, quant, repo_id, where))
    if strict and not checkpoint:
        pickled = sorted(f for f in files if f.endswith(PICKLED))
        raise ModelLoadError(
            f"{repo_id} has no .safetensors or .gguf weights"
            + (f", only pickled ones ({', '.join(pickled[:3])}), which are never loaded" if pickled else "")
        )
    return Target(repo_id, None)


def _hub_files(repo_id: str, revision: str | None, token: str | bool | None) -> list[str]:
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo_id, revision=revision, token=token)
    return [s.rfilename for s in info.siblings or ()]


def _listing(repo_id: str, quant: str | None, revision: str | None, token: str | bool | None) -> tuple[list[str], str]:
    """The repo's files from the Hub, else (offline, unreachable, refused) those of its cached snapshot, as
    huggingface_hub's own downloads fall back; the second item says where they came from, for errors."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, RevisionNotFoundError

    failure: Exception | None = None
    refused: tuple[type[Exception], ...] = (HfHubHTTPError, *_unreachable())
    if not constants.HF_HUB_OFFLINE:
        try:
            return _hub_files(repo_id, revision, token), ""
        except RevisionNotFoundError as exc:
            raise _mapped(exc, repo_id, quant, revision) from exc
        except refused as exc:
            failure = exc
    cached = hub_cache.snapshot_files(repo_id, revision)
    if cached is not None:
        return cached, " in the Hugging Face cache"
    if failure is not None:
        raise _mapped(failure, repo_id, quant, revision) from failure
    raise _not_cached(repo_id, quant, revision)


def _fetch(target: Target, quant: str | None, revision: str | None, token: str | bool | None, online: bool) -> Path:
    """The snapshot folder holding the target's files, downloaded if need be."""
    from huggingface_hub import snapshot_download

    with _hub_errors(target.repo_id, quant, revision, online):
        folder = snapshot_download(target.repo_id, revision=revision, token=token, allow_patterns=target.patterns)
    return Path(str(folder))


def _matching(folder: Path, patterns: list[str]) -> list[Path]:
    """The files of a snapshot that ``patterns`` select, matched as snapshot_download matches them."""
    names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    return [folder / n for n in sorted(names) if any(fnmatch.fnmatch(n, p) for p in patterns)]


def _unreachable() -> tuple[type[Exception], ...]:
    """What huggingface_hub raises when the Hub cannot be reached: its OfflineModeIsEnabled (a
    ConnectionError), timeouts, and the transport errors of the HTTP client its version is built on
    (requests, or httpx). Other OSErrors (a full disk) are not about the network and pass through."""
    errors: list[type[Exception]] = [ConnectionError, TimeoutError]
    for module_name, name in CLIENT_ERRORS:
        error = getattr(sys.modules.get(module_name), name, None)
        if isinstance(error, type) and issubclass(error, Exception):
            errors.append(error)
    return tuple(errors)


def _shown(repo_id: str, quant: str | None, revision: str | None) -> str:
    return f"{repo_id}{':' + quant if quant else ''}{'@' + revision if revision else ''}"


def _not_cached(repo_id: str, quant: str | None, revision: str | None) -> ModelLoadError:
    return ModelLoadError(
        f"{_shown(repo_id, quant, revision)} is not in the Hugging Face cache and the Hub cannot be reached "
        f"(HF_HUB_OFFLINE set, or no network): download it first (torchburn pull), or pass a local folder"
    )


def _mapped(
    exc: Exception, repo_id: str, quant: str | None, revision: str | None, online: bool = False
) -> ModelLoadError:
    """One line that says what went wrong, for huggingface_hub's errors. ``online``: the Hub was needed
    (a pull), so being unreachable is not about the cache."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, LocalEntryNotFoundError):
        return _not_cached(repo_id, quant, revision)
    if isinstance(exc, RevisionNotFoundError):
        return ModelLoadError(f"{repo_id} has no revision {revision!r}")
    if isinstance(exc, GatedRepoError):
        return ModelLoadError(f"{repo_id} is gated: accept its terms on the Hub and set HF_TOKEN (or pass token=)")
    if isinstance(exc, RepositoryNotFoundError):
        return ModelLoadError(f"{repo_id} is not a model on the Hub (or it is private: set HF_TOKEN or pass token=)")
    if isinstance(exc, HfHubHTTPError):
        return ModelLoadError(f"downloading {repo_id} failed: {' '.join(str(exc).split())}")
    if not online:
        return _not_cached(repo_id, quant, revision)
    return ModelLoadError(
        f"cannot reach the Hugging Face Hub at {constants.ENDPOINT} ({exc}): check the network or HF_ENDPOINT"
    )


@contextmanager
def _hub_errors(repo_id: str, quant: str | None, revision: str | None, online: bool) -> Iterator[None]:
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    caught: tuple[type[Exception], ...] = (HfHubHTTPError, LocalEntryNotFoundError, *_unreachable())
    try:
        yield
    except caught as exc:
        raise _mapped(exc, repo_id, quant, revision, online) from exc
