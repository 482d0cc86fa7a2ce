"""Where compiled programs are kept: an in-memory LRU and an authenticated on-disk store.

Disk entries live under ``root/v2/<engine>/<aa>/<digest>.tbp`` and are
``MAGIC | u32 header length | JSON header | payload``; the header names the key, the engine, the
payload's length and a keyed BLAKE3 MAC (the per-user secret of :mod:`.secret`) over all of them, so
an entry this user did not write (another user's, a copied or hand-edited one) is ignored with a
warning and rebuilt. Writers write a private temporary file and rename it into place, so concurrent
processes never see half an entry. Nothing is ever unpickled.

The cache dir is untrusted: below its root every folder is opened without following symlinks
(``O_NOFOLLOW`` relative to the parent's descriptor), so neither reads, writes nor ``clear`` ever
leave it. Entries that are symlinks or not regular files are skipped, never read or deleted.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import os
import re
import secrets
import stat
import struct
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3

from ..errors import CacheCorruptionWarning
from .secret import cache_key

MAGIC = b"TBURNC2\n"
LAYOUT = "v2"  # subfolder of the cache dir that TorchBurn owns; clear_cache only ever deletes inside it
OLD_LAYOUTS = ("v1",)  # earlier formats: never read, removed by clear
_HEADER = struct.Struct("<I")
MAX_HEADER = 1 << 16
MAX_ENTRY_BYTES = 1 << 30  # a larger file in the cache dir is not an entry TorchBurn wrote
_ENGINE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_ENTRY = re.compile(r"^[0-9a-f]{64}\.tbp$")
_TEMP = re.compile(r"^\.[0-9a-f]{16}\.[A-Za-z0-9_]+\.tmp$")
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
# O_NONBLOCK: opening a FIFO planted in the cache dir must not hang the reader
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_SAFE_FDS = os.name == "posix" and os.open in os.supports_dir_fd and os.unlink in os.supports_dir_fd


class MemoryCache:
    """A thread-safe LRU of live programs keyed by digest."""

    def __init__(self, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str) -> Any | None:
        with self._lock:
            item = self._items.get(digest)
            if item is not None:
                self._items.move_to_end(digest)
            return item

    def put(self, digest: str, item: Any) -> None:
        with self._lock:
            self._items[digest] = item
            self._items.move_to_end(digest)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


def _mac(key: bytes, engine: str, digest: str, payload: bytes) -> str:
    """Keyed BLAKE3 over the entry's engine, key digest and payload (length-prefixed fields)."""
    hasher = blake3.blake3(key=key)
    for field in (MAGIC, engine.encode(), digest.encode(), payload):
        hasher.update(len(field).to_bytes(8, "little"))
        hasher.update(field)
    return str(hasher.hexdigest())


def _check_names(engine: str, digest: str) -> None:
    if not _ENGINE_NAME.match(engine) or engine in (".", ".."):
        raise ValueError(f"engine name {engine!r} cannot name a cache folder")
    if not _DIGEST.match(digest):
        raise ValueError(f"cache key {digest!r} is not a 64-digit hex BLAKE3 digest")


@contextlib.contextmanager
def _dir_fd(path: Path) -> Iterator[int]:
    """The root folder, opened as the user named it (a symlinked root is the user's own choice)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        yield fd
    finally:
        os.close(fd)


def _sub_fd(parent: int, name: str, create: bool) -> int:
    """``name`` inside ``parent``, opened without following a symlink (made, mode 0700, if asked)."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
    return os.open(name, _DIR_FLAGS, dir_fd=parent)


@contextlib.contextmanager
def _walk_down(root: Path, names: list[str], create: bool) -> Iterator[int]:
    """The descriptor of ``root/names[0]/names[1]/...``, each step refusing symlinks."""
    fds: list[int] = []
    try:
        with _dir_fd(root) as top:
            current = top
            for name in names:
                current = _sub_fd(current, name, create)
                fds.append(current)
            yield current
    finally:
        for fd in fds:
            os.close(fd)


def _subdirs(fd: int) -> list[str]:
    """Names of the real folders (not symlinks) directly inside the folder ``fd``."""
    with os.scandir(fd) as it:
        return [e.name for e in it if e.is_dir(follow_symlinks=False)]


def _files(fd: int, pattern: re.Pattern[str]) -> list[tuple[str, int]]:
    """(name, size) of the regular files (not symlinks) in folder ``fd`` whose name matches."""
    found = []
    with os.scandir(fd) as it:
        for e in it:
            if pattern.match(e.name) and e.is_file(follow_symlinks=False):
                found.append((e.name, e.stat(follow_symlinks=False).st_size))
    return found


class DiskStore:
    """Authenticated program payloads under ``root/v2/<engine>/<aa>/<digest>.tbp``."""

    def __init__(self, root: Path, key: Callable[[], bytes] = cache_key) -> None:
        self.root = root
        self.corrupt_seen = 0  # entries found bad by read() on this store
        self._key = key
        self._warned_unwritable = False

    @property
    def base(self) -> Path:
        return self.root / LAYOUT

    def path(self, engine: str, digest: str) -> Path:
        return self.base / engine / digest[:2] / f"{digest}.tbp"

    def _location(self, engine: str, digest: str) -> list[str]:
        _check_names(engine, digest)
        return [LAYOUT, engine, digest[:2]]

    def _warn_bad(self, path: Path, problem: str) -> None:
        self.corrupt_seen += 1
        warnings.warn(
            f"torchburn cache: ignoring corrupted entry {path} ({problem}); it will be rebuilt",
            CacheCorruptionWarning,
            stacklevel=3,
        )

    def read(self, engine: str, digest: str) -> bytes | None:
        """The verified payload, None when absent; an entry that fails verification warns, is removed
        and reads as None."""
        path = self.path(engine, digest)
        try:
            key = self._key()
        except OSError as exc:
            self._warn_unusable(exc)
            return None
        try:
            blob = self._read_file(engine, digest)
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None
        except _NotAnEntry as exc:
            self._warn_bad(path, str(exc))
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
                self._warn_bad(path, "a symlink where an entry or its folder belongs; skipped")
                return None
            warnings.warn(f"torchburn cache: cannot read {path}: {exc}", CacheCorruptionWarning, stacklevel=2)
            return None
        problem = _verify(blob, engine, digest, key)
        if isinstance(problem, bytes):
            return problem
        self._warn_bad(path, problem)
        self._discard(engine, digest)
        return None

    def _read_file(self, engine: str, digest: str) -> bytes:
        name = f"{digest}.tbp"
        if not _SAFE_FDS:
            path = self.path(engine, digest)
            if any(p.is_symlink() for p in (path, *list(path.parents)[:3])):
                raise _NotAnEntry("a symlink where an entry or its folder belongs; skipped")
            return path.read_bytes()
        with _walk_down(self.root, self._location(engine, digest), create=False) as d:
            fd = os.open(name, _READ_FLAGS, dir_fd=d)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise _NotAnEntry("not a regular file; skipped")
                if st.st_size > MAX_ENTRY_BYTES:
                    raise _NotAnEntry(f"{st.st_size} bytes, more than any entry")
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)

    def write(self, engine: str, digest: str, payload: bytes) -> bool:
        try:
            _check_names(engine, digest)
            key = self._key()
        except (OSError, ValueError) as exc:
            self._warn_unusable(exc)
            return False
        header = json.dumps(
            {"key": digest, "engine": engine, "length": len(payload), "mac": _mac(key, engine, digest, payload)},
            sort_keys=True,
        ).encode()
        blob = MAGIC + _HEADER.pack(len(header)) + header + payload
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            if _SAFE_FDS:
                self._write_at(engine, digest, blob)
            else:
                self._write_by_path(engine, digest, blob)
        except (OSError, ValueError) as exc:
            self._warn_unusable(exc)
            return False
        return True

    def _write_at(self, engine: str, digest: str, blob: bytes) -> None:
        tmp = f".{digest[:16]}.{secrets.token_hex(6)}.tmp"
        with _walk_down(self.root, self._location(engine, digest), create=True) as d:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600, dir_fd=d)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(blob)
                    f.flush()
                    os.fsync(f.fileno())
                # atomic: readers see the old entry or the new one, never a mix; a symlink planted at
                # the entry's name is replaced, not followed
                os.replace(tmp, f"{digest}.tbp", src_dir_fd=d, dst_dir_fd=d)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=d)
                raise

    def _write_by_path(self, engine: str, digest: str, blob: bytes) -> None:
        path = self.path(engine, digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{digest[:16]}.{secrets.token_hex(6)}.tmp")
        try:
            with open(tmp, "xb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _warn_unusable(self, exc: Exception) -> None:
        if not self._warned_unwritable:
            self._warned_unwritable = True
            warnings.warn(
                f"torchburn cache: cannot write under {self.root} ({exc}); programs are kept in memory only. "
                "Set TORCHBURN_CACHE_DIR to a writable folder.",
                stacklevel=3,
            )

    def _discard(self, engine: str, digest: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            if not _SAFE_FDS:
                self.path(engine, digest).unlink()
                return
            with _walk_down(self.root, self._location(engine, digest), create=False) as d:
                st = os.stat(f"{digest}.tbp", dir_fd=d, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    os.unlink(f"{digest}.tbp", dir_fd=d)

    def _walk(self, layout: str) -> Iterator[tuple[int, str, str]]:
        """(folder descriptor, engine, shard) for every real ``layout/<engine>/<aa>`` folder."""
        try:
            with _walk_down(self.root, [layout], create=False) as base:
                for engine in _subdirs(base):
                    try:
                        engine_fd = _sub_fd(base, engine, create=False)
                    except OSError:
                        continue
                    try:
                        for shard in _subdirs(engine_fd):
                            try:
                                shard_fd = _sub_fd(engine_fd, shard, create=False)
                            except OSError:
                                continue
                            try:
                                yield shard_fd, engine, shard
                            finally:
                                os.close(shard_fd)
                    finally:
                        os.close(engine_fd)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError:  # the layout folder itself is a symlink (ELOOP) or unreadable: nothing of ours
            return

    def entries(self) -> list[Path]:
        """Every entry file of this layout (regular files only; symlinks are not entries)."""
        return [path for path, _ in self.entry_sizes()]

    def entry_sizes(self) -> list[tuple[Path, int]]:
        """(path, bytes) of every entry file of this layout, sizes read without following links."""
        if not _SAFE_FDS:
            if not self.base.is_dir() or self.base.is_symlink():
                return []
            return [
                (p, p.lstat().st_size)
                for p in self.base.glob("*/*/*.tbp")
                if p.is_file() and not any(q.is_symlink() for q in (p, p.parent, p.parent.parent))
            ]
        found = []
        for fd, engine, shard in self._walk(LAYOUT):
            folder = self.base / engine / shard
            found += [(folder / name, size) for name, size in _files(fd, _ENTRY)]
        return found

    def clear(self) -> int:
        """Delete TorchBurn's entries (and stray temporaries, and entries of older layouts) and nothing
        else: symlinks, foreign files and anything outside the cache dir are left alone. Returns how
        many entries were deleted."""
        removed = 0
        if not _SAFE_FDS:
            for p in self.entries():
                p.unlink(missing_ok=True)
                removed += 1
            return removed
        for layout in (LAYOUT, *OLD_LAYOUTS):
            shards: list[tuple[str, str]] = []
            for fd, engine, shard in self._walk(layout):
                for pattern in (_ENTRY, _TEMP):
                    for name, _size in _files(fd, pattern):
                        with contextlib.suppress(OSError):
                            os.unlink(name, dir_fd=fd)
                            removed += pattern is _ENTRY
                shards.append((engine, shard))
            self._remove_empty(layout, shards)
        return removed

    def _remove_empty(self, layout: str, shards: list[tuple[str, str]]) -> None:
        """rmdir the shard, engine and layout folders left empty (rmdir never follows a symlink)."""
        with contextlib.suppress(OSError), _walk_down(self.root, [layout], create=False) as base:
            for engine, shard in shards:
                with contextlib.suppress(OSError):
                    engine_fd = _sub_fd(base, engine, create=False)
                    try:
                        with contextlib.suppress(OSError):
                            os.rmdir(shard, dir_fd=engine_fd)
                    finally:
                        os.close(engine_fd)
            for engine in {e for e, _ in shards}:
                with contextlib.suppress(OSError):
                    os.rmdir(engine, dir_fd=base)
        with contextlib.suppress(OSError), _dir_fd(self.root) as top:
            os.rmdir(layout, dir_fd=top)


class _NotAnEntry(OSError):
    """A file at an entry's place that TorchBurn did not write (wrong kind or size)."""


def _verify(blob: bytes, engine: str, digest: str, key: bytes) -> bytes | str:
    """The payload if the entry is whole, belongs to this key and was written with this user's secret;
    else a description of the problem."""
    if not blob.startswith(MAGIC):
        return "bad magic"
    start = len(MAGIC) + _HEADER.size
    if len(blob) < start:
        return "truncated header"
    (hlen,) = _HEADER.unpack_from(blob, len(MAGIC))
    if hlen > MAX_HEADER or len(blob) < start + hlen:
        return "truncated header"
    try:
        header = json.loads(blob[start : start + hlen])
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return "unreadable header"
    if not isinstance(header, dict) or header.get("key") != digest or header.get("engine") != engine:
        return "header does not match the key"
    payload = blob[start + hlen :]
    if len(payload) != header.get("length"):
        return f"payload is {len(payload)} bytes, header says {header.get('length')}"
    mac = header.get("mac")
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(key, engine, digest, payload)):
        return "not written with this user's cache key (another user's, a copied or an edited entry)"
    return payload
