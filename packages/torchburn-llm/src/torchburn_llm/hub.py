"""Checkpoints by Hub id: from the Hugging Face cache (offline with ``HF_HUB_OFFLINE=1``) or downloaded
with progress bars. Only what the runtime reads is fetched (configs, tokenizer files, safetensors,
chat templates) — never pickled weights, never remote code."""

from __future__ import annotations

from pathlib import Path

from .errors import ModelLoadError

WANTED = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt"]


def looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def resolve(repo_id: str, revision: str | None = None, token: str | bool | None = None) -> Path:
    """The local snapshot folder of ``repo_id`` at ``revision``. ``token`` None uses ``HF_TOKEN`` or
    the login cache, as huggingface_hub does."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        folder = snapshot_download(repo_id, revision=revision, token=token, allow_patterns=WANTED)
    except LocalEntryNotFoundError as exc:
        raise ModelLoadError(
            f"{repo_id}{'@' + revision if revision else ''} is not in the Hugging Face cache and the Hub "
            f"cannot be reached (HF_HUB_OFFLINE set, or no network): download it first, or pass a local folder"
        ) from exc
    except RevisionNotFoundError as exc:
        raise ModelLoadError(f"{repo_id} has no revision {revision!r}") from exc
    except GatedRepoError as exc:
        raise ModelLoadError(
            f"{repo_id} is gated: accept its terms on the Hub and pass token= or set HF_TOKEN"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ModelLoadError(f"{repo_id} is not a model on the Hub (or it is private: pass token=)") from exc
    except HfHubHTTPError as exc:
        raise ModelLoadError(f"downloading {repo_id} failed: {exc}") from exc
    return Path(str(folder))
