"""Where compiled programs are kept: an in-memory LRU and a verified on-disk store.

Disk entries are ``MAGIC | u32 header length | JSON header | payload``; the header names the key, the
engine and the payload's length and BLAKE3. Writers write a private temporary file and ``os.replace``
it into place, so concurrent processes never see half an entry; readers verify everything and treat a
bad entry as a miss (with a warning) rather than trusting it. Nothing is ever unpickled.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import threading
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import blake3

from ..errors import CacheCorruptionWarning

MAGIC = b"TBURNC1\n"
LAYOUT = "v1"  # subfolder of the cache dir that TorchBurn owns; clear_cache only ever deletes inside it
_HEADER = struct.Struct("<I")
MAX_HEADER = 1 << 16


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


class DiskStore:
    """Verified program payloads under ``root/v1/<engine>/<aa>/<digest>.tbp``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.corrupt_seen = 0  # entries found bad by read() on this store
        self._warned_unwritable = False

    @property
    def base(self) -> Path:
        return self.root / LAYOUT

    def path(self, engine: str, digest: str) -> Path:
        return self.base / engine / digest[:2] / f"{digest}.tbp"

    def read(self, engine: str, digest: str) -> bytes | None:
        """The verified payload, None when absent; a corrupt entry warns, is removed, and reads as None."""
        path = self.path(engine, digest)
        try:
            blob = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            warnings.warn(f"torchburn cache: cannot read {path}: {exc}", CacheCorruptionWarning, stacklevel=2)
            return None
        problem = _verify(blob, engine, digest)
        if isinstance(problem, bytes):
            return problem
        self.corrupt_seen += 1
        warnings.warn(
            f"torchburn cache: ignoring corrupted entry {path} ({problem}); it will be rebuilt",
            CacheCorruptionWarning,
            stacklevel=2,
        )
        self._discard(path)
        return None

    def write(self, engine: str, digest: str, payload: bytes) -> bool:
        header = json.dumps(
            {"key": digest, "engine": engine, "length": len(payload), "blake3": blake3.blake3(payload).hexdigest()},
            sort_keys=True,
        ).encode()
        path = self.path(engine, digest)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{digest[:16]}.", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(MAGIC + _HEADER.pack(len(header)) + header + payload)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)  # atomic: readers see the old entry or the new one, never a mix
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            if not self._warned_unwritable:
                self._warned_unwritable = True
                warnings.warn(
                    f"torchburn cache: cannot write under {self.root} ({exc}); programs are kept in memory only. "
                    "Set TORCHBURN_CACHE_DIR to a writable folder.",
                    stacklevel=2,
                )
            return False
        return True

    def _discard(self, path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass

    def entries(self) -> list[Path]:
        if not self.base.is_dir():
            return []
        return [p for p in self.base.glob("*/*/*.tbp") if p.is_file()]

    def clear(self) -> int:
        """Delete TorchBurn's entries (and stray temporaries) and nothing else; returns how many."""
        removed = 0
        if not self.base.is_dir():
            return 0
        for pattern in ("*/*/*.tbp", "*/*/.*.tmp"):
            for p in self.base.glob(pattern):
                self._discard(p)
                removed += pattern.endswith(".tbp")
        for d in sorted(self.base.glob("*/*"), reverse=True) + sorted(self.base.glob("*")):
            if d.is_dir():
                try:
                    d.rmdir()
                except OSError:
                    pass
        return removed


def _verify(blob: bytes, engine: str, digest: str) -> bytes | str:
    """The payload if the entry is whole and belongs to this key, else a description of the problem."""
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
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "unreadable header"
    if not isinstance(header, dict) or header.get("key") != digest or header.get("engine") != engine:
        return "header does not match the key"
    payload = blob[start + hlen :]
    if len(payload) != header.get("length"):
        return f"payload is {len(payload)} bytes, header says {header.get('length')}"
    if blake3.blake3(payload).hexdigest() != header.get("blake3"):
        return "checksum mismatch"
    return payload
