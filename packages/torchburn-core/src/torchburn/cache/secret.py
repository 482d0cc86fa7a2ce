"""The per-user secret that authenticates disk cache entries.

Every entry carries a keyed BLAKE3 MAC. The key is 32 random bytes made on first use and kept in the
user's private data dir (``platformdirs.user_data_dir("torchburn")/cache.key``, mode 0600 in a 0700
folder), never in the cache dir and never in an entry: a cache dir that is shared, copied from another
machine or edited by hand carries no key, so its entries fail verification and are rebuilt rather
than run.
"""

from __future__ import annotations

import os
import secrets
import stat
import threading
from pathlib import Path

import platformdirs

KEY_BYTES = 32
KEY_NAME = "cache.key"

_lock = threading.Lock()
_cached: tuple[Path, bytes] | None = None


class CacheKeyError(OSError):
    """The cache key cannot be made or is not private to this user; the disk cache is then not used."""


def key_path() -> Path:
    return Path(platformdirs.user_data_dir("torchburn")) / KEY_NAME


def _nofollow() -> int:
    return getattr(os, "O_NOFOLLOW", 0)


def _check_private(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise CacheKeyError(f"{path} is not a regular file")
    if os.name == "posix":
        if st.st_uid != os.getuid():
            raise CacheKeyError(f"{path} belongs to another user (uid {st.st_uid})")
        if st.st_mode & 0o077:
            raise CacheKeyError(
                f"{path} is readable or writable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                "it must be 600: run chmod 600 on it, or delete it to make a new key"
            )


def _read(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | _nofollow())
    try:
        _check_private(fd, path)
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != KEY_BYTES:
        raise CacheKeyError(f"{path} holds {len(data)} bytes, a cache key has {KEY_BYTES}; delete it to make a new one")
    return data


def _create(path: Path) -> None:
    """Write a fresh key next to ``path`` and link it into place, so that a concurrent process sees
    either no key or a whole one, and the first to link wins."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{KEY_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _nofollow(), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: use theirs
        except OSError:
            # a file system without hard links: exclusive create, then the same bytes
            try:
                fd2 = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _nofollow(), 0o600)
            except FileExistsError:
                return
            with os.fdopen(fd2, "wb") as f:
                f.write(tmp.read_bytes())
    finally:
        tmp.unlink(missing_ok=True)


def cache_key() -> bytes:
    """This user's cache key, made on first use. Raises ``CacheKeyError`` (an ``OSError``) when it
    cannot be made or is not private."""
    global _cached
    path = key_path()
    with _lock:
        if _cached is not None and _cached[0] == path:
            return _cached[1]
        try:
            key = _read(path)
        except FileNotFoundError:
            _create(path)
            key = _read(path)
        _cached = (path, key)
        return key


def forget() -> None:
    """Drop the in-memory copy (the next use reads the file again)."""
    global _cached
    with _lock:
        _cached = None
