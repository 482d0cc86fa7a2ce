"""Finding engines by name, listing them, and choosing the default one.

Selection order (see README "Engine selection"): ``options["engine"]``, then ``TORCHBURN_ENGINE``, then
``TORCHBURN_DEVICE`` (cpu / gpu / auto), then ``native``; if the preferred default is missing TorchBurn
uses the best available complete engine and says so once.
"""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass

from ..errors import EngineNotFoundError, EngineUnavailableError, OptionsError
from ..install_hint import install_hint
from ..options import DEVICES, env_choice
from ..plugins import plugin_host
from .base import Availability, Engine

DEFAULT_ENGINE = "native"

# Engines TorchBurn ships as separate packages: a request for one that is missing says what to install.
_INSTALL_HINTS = {
    "native": install_hint() + "; it installs torchburn-native",
    "native_cpu": install_hint() + "; it installs torchburn-native",
    "wgpu": install_hint("wgpu"),
    "burn-wgpu": install_hint("wgpu"),
}


@dataclass(frozen=True)
class EngineInfo:
    """One row of ``torchburn.list_engines()``."""

    name: str
    aliases: tuple[str, ...]
    device: str
    version: str
    available: bool
    reason: str | None  # why it is unavailable
    distribution: str  # the package that registered it
    device_name: str | None = None  # e.g. the GPU adapter it would use

    def __str__(self) -> str:
        state = "available" if self.available else f"unavailable: {self.reason}"
        where = f" on {self.device_name}" if self.device_name else ""
        alias = f" (alias {', '.join(self.aliases)})" if self.aliases else ""
        return f"{self.name}{alias} {self.version} [{self.device}{where}] from {self.distribution}: {state}"


_lock = threading.Lock()
_engines: dict[str, tuple[Engine, str]] | None = None
_availability: dict[str, Availability] = {}
_warned_default = False


def forget_engines() -> None:
    global _engines
    with _lock:
        _engines = None
        _availability.clear()


def _collect() -> dict[str, tuple[Engine, str]]:
    host = plugin_host()
    found: dict[str, tuple[Engine, str]] = {}
    # Each plugin's hook is called on its own (not through manager.hook) so every engine can be traced
    # back to the package that registered it, for list_engines() and duplicate-name errors.
    for plugin_name, plugin in host.manager.list_name_plugin():
        hook = getattr(plugin, "register_engines", None)
        if hook is None:
            continue
        dist = host.distributions.get(plugin_name, plugin_name)
        registered: list[Engine] = []
        hook(register=registered.append)
        for engine in registered:
            if not isinstance(engine, Engine):
                raise TypeError(f"plugin {plugin_name!r} registered {engine!r}, which is not a torchburn.Engine")
            for name in (engine.name, *engine.aliases):
                if name in found:
                    raise EngineNotFoundError(f"engine name {name!r} is registered twice ({found[name][1]} and {dist})")
                found[name] = (engine, dist)
    return found


def _registry() -> dict[str, tuple[Engine, str]]:
    global _engines
    with _lock:
        if _engines is None:
            _engines = _collect()
        return _engines


def _canonical() -> dict[str, tuple[Engine, str]]:
    return {e.name: (e, d) for e, d in _registry().values()}


def availability(engine: Engine) -> Availability:
    """Availability, probed once per process (probing a GPU can take a second)."""
    cached = _availability.get(engine.name)
    if cached is None:
        try:
            cached = engine.availability()
        except Exception as exc:  # a probe that crashes means "not here", with the crash as the reason
            cached = Availability(False, f"availability probe failed: {type(exc).__name__}: {exc}")
        _availability[engine.name] = cached
    return cached


def list_engines() -> list[EngineInfo]:
    """Every engine found through entry points, plus plugins that failed to load (as unavailable)."""
    rows = []
    for engine, dist in sorted(_canonical().values(), key=lambda ed: (-ed[0].priority, ed[0].name)):
        avail = availability(engine)
        rows.append(
            EngineInfo(
                engine.name,
                tuple(engine.aliases),
                engine.device,
                engine.version,
                avail.available,
                avail.reason,
                dist,
                avail.device_name,
            )
        )
    for broken in plugin_host().broken:
        rows.append(
            EngineInfo(broken.name, (), "?", "?", False, f"plugin failed to load: {broken.error}", broken.distribution)
        )
    return rows


def _allowed_names() -> str:
    names = sorted(_registry())
    return ", ".join(map(repr, names)) or "(none installed)"


def get_engine(name: str) -> Engine:
    """The engine registered under ``name`` or an alias, available or not."""
    found = _registry().get(name)
    if found is None:
        hint = _INSTALL_HINTS.get(name)
        if hint:
            raise EngineNotFoundError(f"engine {name!r} is not installed; to get it: {hint}")
        raise EngineNotFoundError(f"unknown engine {name!r}; installed engines: {_allowed_names()}")
    return found[0]


def resolve_engine(name: str | None = None) -> Engine:
    """The engine to compile with: ``name`` if given, else ``active_engine()``; it must be available."""
    engine = get_engine(name if name is not None else active_engine())
    avail = availability(engine)
    if not avail.available:
        raise EngineUnavailableError(f"engine {engine.name!r} is installed but unavailable here: {avail.reason}")
    return engine


def _best(device: str) -> Engine | None:
    candidates = [
        e
        for e, _ in _canonical().values()
        if not e.partial_opset and (device == "auto" or e.device == device) and availability(e).available
    ]

    # "auto" prefers a GPU engine when one can run on a real GPU, then the highest priority
    def rank(e: Engine) -> tuple[bool, bool, int]:
        real = not availability(e).emulated
        return (real, e.device == "gpu" and real if device == "auto" else False, e.priority)

    candidates.sort(key=rank, reverse=True)
    return candidates[0] if candidates else None


def active_engine() -> str:
    """Name of the engine used when ``options["engine"]`` is not given."""
    global _warned_default
    requested = os.environ.get("TORCHBURN_ENGINE", "").strip()
    if requested:
        if requested not in _registry():
            hint = _INSTALL_HINTS.get(requested)
            raise OptionsError(
                f"TORCHBURN_ENGINE={requested!r} is not an installed engine"
                + (f" (to get it: {hint})" if hint else "")
                + f"; allowed: {_allowed_names()}"
            )
        return _registry()[requested][0].name
    device = env_choice("TORCHBURN_DEVICE", DEVICES)
    if device is not None:
        best = _best(device)
        if best is None:
            raise EngineUnavailableError(
                f"TORCHBURN_DEVICE={device!r} but no available engine runs on {device}; "
                f"engines: {'; '.join(map(str, list_engines()))}"
            )
        return best.name
    if DEFAULT_ENGINE in _registry() and availability(_registry()[DEFAULT_ENGINE][0]).available:
        return DEFAULT_ENGINE
    best = _best("cpu") or _best("auto")
    if best is None:
        raise EngineUnavailableError(f"no available engine; engines: {'; '.join(map(str, list_engines()))}")
    if not _warned_default:
        _warned_default = True
        warnings.warn(
            f"torchburn: the default engine {DEFAULT_ENGINE!r} is not installed or unavailable; "
            f"using {best.name!r}. Install it with: {_INSTALL_HINTS[DEFAULT_ENGINE]}",
            stacklevel=2,
        )
    return best.name
