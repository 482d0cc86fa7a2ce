"""The program cache: memory LRU first, then the disk store, then the engine compiles.

``torchburn.cache_info()`` reports its counters and ``torchburn.clear_cache()`` empties it.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

from ..errors import CacheCorruptionWarning
from .key import GraphKey, graph_key
from .secret import key_path
from .store import DiskStore, MemoryCache

if TYPE_CHECKING:
    from ..engines.base import Engine, Program, Region
    from ..options import CompileOptions

__all__ = ["GraphKey", "graph_key", "program_for", "cache_info", "clear_cache", "cache_dir"]

log = logging.getLogger("torchburn.cache")

LOWERED_SUFFIX = ".lowered"  # the warm-start cache's entries sit under "<engine>.lowered"


def cache_dir() -> Path:
    """``TORCHBURN_CACHE_DIR`` if set, else the user cache dir (e.g. ``~/.cache/torchburn``)."""
    env = os.environ.get("TORCHBURN_CACHE_DIR", "").strip()
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("torchburn"))


@dataclass
class _Stats:
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    compiles: int = 0
    disk_writes: int = 0
    corrupt_entries: int = 0
    lowered_hits: int = 0  # Dynamo graphs compiled from stored ATen graphs (warm start)
    lowered_misses: int = 0
    lowered_writes: int = 0


_memory = MemoryCache(int(os.environ.get("TORCHBURN_CACHE_ENTRIES", "512") or 512))
_stats = _Stats()
_lock = threading.Lock()


def _bump(field: str) -> None:
    with _lock:
        setattr(_stats, field, getattr(_stats, field) + 1)


def program_for(engine: Engine, region: Region, options: CompileOptions) -> Program:
    """The compiled program of a region, from cache when its key was seen before."""
    key = graph_key(region.graph_module, region.inputs, engine, options)
    region.key = key
    if options.verbose:
        log.info("region %s\n%s", key.digest[:16], key.describe())
    if options.cache == "off":
        _bump("compiles")
        return engine.compile(region)
    program: Program | None = _memory.get(key.digest)
    if program is not None:
        _bump("memory_hits")
        return program
    disk = _disk_store() if options.cache == "on" else None
    if disk is not None:
        payload = disk.read(engine.name, key.digest)
        if disk.corrupt_seen:
            _bump("corrupt_entries")
        if payload is not None:
            try:
                program = engine.load(region, payload)
            except Exception as exc:  # a payload that does not load is a miss, whatever the engine raised
                _bump("corrupt_entries")
                warnings.warn(
                    f"torchburn cache: engine {engine.name!r} rejected stored program {key.digest[:16]} ({exc}); "
                    "it will be rebuilt",
                    CacheCorruptionWarning,
                    stacklevel=2,
                )
            else:
                _bump("disk_hits")
                _memory.put(key.digest, program)
                return program
    _bump("misses")
    program = engine.compile(region)
    _bump("compiles")
    _memory.put(key.digest, program)
    if disk is not None:
        payload = engine.serialize(program)
        if payload is not None and disk.write(engine.name, key.digest, payload):
            _bump("disk_writes")
    return program


_warned_key_inside = False


def _disk_store() -> DiskStore | None:
    """The disk store, or None (with one warning) where the cache dir would hold the secret that
    authenticates its own entries: anyone who can read the cache dir could then forge them."""
    global _warned_key_inside
    root = cache_dir()
    try:
        inside = key_path().resolve().is_relative_to(root.resolve())
    except OSError:
        inside = False
    if inside:
        if not _warned_key_inside:
            _warned_key_inside = True
            warnings.warn(
                f"torchburn cache: the cache dir {root} contains the cache key {key_path()}; programs are kept "
                "in memory only. Point TORCHBURN_CACHE_DIR elsewhere.",
                stacklevel=3,
            )
        return None
    return DiskStore(root)


def cache_info() -> dict[str, Any]:
    """Counters of this process and the size of the disk store."""
    disk = DiskStore(cache_dir())
    files = disk.entry_sizes()
    lowered = [f for f in files if f[0].parent.parent.name.endswith(LOWERED_SUFFIX)]
    with _lock:
        info: dict[str, Any] = dict(_stats.__dict__)
    info.update(
        memory_entries=len(_memory),
        memory_max_entries=_memory.max_entries,
        disk_dir=str(disk.base),
        disk_entries=len(files) - len(lowered),  # engine programs
        disk_lowered_entries=len(lowered),  # lowered graphs of the warm-start cache
        disk_bytes=sum(size for _, size in files),
    )
    return info


def clear_cache(disk: bool = True) -> None:
    """Forget compiled programs (and, unless ``disk=False``, delete TorchBurn's on-disk entries)."""
    global _stats
    _memory.clear()
    with _lock:
        _stats = _Stats()
    if disk:
        DiskStore(cache_dir()).clear()
