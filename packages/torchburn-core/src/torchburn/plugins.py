"""Discovery of TorchBurn plugins through the ``torchburn`` entry-point group.

Core never imports an engine package by name: the built-in ``reference`` engine and every third-party
engine arrive the same way. A plugin that fails to import is recorded (and shown by
``torchburn.list_engines()``) instead of breaking every other engine.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass

import pluggy

from . import hookspecs

ENTRY_POINT_GROUP = "torchburn"


@dataclass(frozen=True)
class BrokenPlugin:
    """An entry point whose module could not be loaded."""

    name: str
    distribution: str
    error: str


@dataclass
class PluginHost:
    manager: pluggy.PluginManager
    broken: list[BrokenPlugin]
    # plugin module -> distribution name, so engines can say which package they came from
    distributions: dict[str, str]


def _load() -> PluginHost:
    manager = pluggy.PluginManager(ENTRY_POINT_GROUP)
    manager.add_hookspecs(hookspecs)
    broken: list[BrokenPlugin] = []
    distributions: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        if manager.get_plugin(ep.name) is not None:
            continue  # the same distribution seen twice on sys.path
        try:
            plugin = ep.load()
            manager.register(plugin, name=ep.name)
        except Exception as exc:  # a broken third-party plugin must not take the others down
            broken.append(BrokenPlugin(ep.name, dist, f"{type(exc).__name__}: {exc}"))
            continue
        distributions[ep.name] = dist
    return PluginHost(manager, broken, distributions)


@functools.cache
def plugin_host() -> PluginHost:
    """The process-wide plugin host, loaded on first use."""
    return _load()


def reload_plugins() -> None:
    """Forget loaded plugins so the next lookup scans entry points again (tests, notebooks)."""
    plugin_host.cache_clear()
    from .engines import discovery

    discovery.forget_engines()
