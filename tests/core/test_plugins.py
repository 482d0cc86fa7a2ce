"""Engine discovery through pluggy entry points, listing, and selection."""

from __future__ import annotations

import importlib.metadata
import inspect
import sys
from pathlib import Path

import pytest
import torch
import torchburn_tiny_engine as tiny

import torchburn
from torchburn import hookspecs, plugins
from torchburn.engines import discovery

README = Path(__file__).resolve().parents[2] / "README.md"


def test_third_party_plugin_is_found_through_its_entry_point() -> None:
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group="torchburn")}
    assert eps["tiny"].value == "torchburn_tiny_engine"
    assert eps["tiny"].dist is not None and eps["tiny"].dist.name == "torchburn-tiny-engine"
    rows = {e.name: e for e in torchburn.list_engines()}
    assert rows["tiny"].aliases == ("tiny-engine",)
    assert rows["tiny"].distribution == "torchburn-tiny-engine"
    assert rows["reference"].distribution == "torchburn-core"  # built-ins use the same entry points
    assert all(e.available for e in rows.values())


def test_plugin_engine_is_used_by_name_and_alias() -> None:
    x = torch.randn(10)
    for name in ("tiny", "tiny-engine"):
        tiny.KERNEL_CALLS.clear()
        torch._dynamo.reset()
        fast = torch.compile(
            lambda t: torch.relu(t * t), backend="torchburn", options={"engine": name, "fallback": "error"}
        )
        torch.testing.assert_close(fast(x), torch.relu(x * x))
        assert tiny.KERNEL_CALLS == {"aten.mul.Tensor": 1, "aten.relu.default": 1}


def test_selection_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_ENGINE", "tiny-engine")
    assert torchburn.active_engine() == "tiny"
    monkeypatch.delenv("TORCHBURN_ENGINE")
    monkeypatch.setenv("TORCHBURN_DEVICE", "cpu")
    # tiny is a partial engine, so it is never chosen by device; the best complete CPU engine is
    assert torchburn.active_engine() != "tiny"
    monkeypatch.setenv("TORCHBURN_DEVICE", "gpu")
    if not any(e.device == "gpu" and e.available for e in torchburn.list_engines()):
        with pytest.raises(torchburn.EngineUnavailableError, match="no available engine runs on gpu"):
            torchburn.active_engine()


def test_env_engine_drives_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_ENGINE", "tiny")
    tiny.KERNEL_CALLS.clear()
    fast = torch.compile(lambda t: t + t, backend="torchburn", options={"fallback": "error"})
    x = torch.randn(5)
    torch.testing.assert_close(fast(x), x + x)
    assert tiny.KERNEL_CALLS == {"aten.add.Tensor": 1}


class _NoDevice(torchburn.Engine):
    name = "nodevice"
    device = "gpu"
    version = "1.0"
    ops = torchburn.OpRegistry("nodevice")

    def availability(self) -> torchburn.Availability:
        return torchburn.Availability(False, "no adapter found (test)")

    def compile(self, region: torchburn.Region):  # type: ignore[no-untyped-def]
        raise AssertionError("must not be called")


class _NoDevicePlugin:
    @torchburn.hookimpl
    def register_engines(self, register):  # type: ignore[no-untyped-def]
        register(_NoDevice())


def test_unavailable_engine_is_listed_with_reason_and_fails_clearly() -> None:
    host = plugins.plugin_host()
    host.manager.register(_NoDevicePlugin(), name="nodevice-test")
    discovery.forget_engines()
    try:
        row = {e.name: e for e in torchburn.list_engines()}["nodevice"]
        assert not row.available and row.reason == "no adapter found (test)"
        assert "unavailable: no adapter found (test)" in str(row)
        fast = torch.compile(lambda t: t + 1, backend="torchburn", options={"engine": "nodevice"})
        with pytest.raises(Exception, match="engine 'nodevice' is installed but unavailable here: no adapter found"):
            fast(torch.ones(2))
    finally:
        host.manager.unregister(name="nodevice-test")
        discovery.forget_engines()


def test_broken_plugin_is_reported_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    good = list(importlib.metadata.entry_points(group="torchburn"))
    broken = importlib.metadata.EntryPoint("broken", "torchburn_no_such_module_xyz", "torchburn")
    monkeypatch.setattr(plugins.importlib.metadata, "entry_points", lambda group: [*good, broken])
    plugins.reload_plugins()
    try:
        rows = {e.name: e for e in torchburn.list_engines()}
        assert rows["reference"].available
        assert not rows["broken"].available
        assert "plugin failed to load: ModuleNotFoundError" in (rows["broken"].reason or "")
    finally:
        monkeypatch.undo()
        plugins.reload_plugins()


def test_every_hook_is_documented() -> None:
    hooks = [n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if hasattr(f, "torchburn_spec")]
    assert set(hooks) == {"register_engines", "register_models", "register_commands"}
    readme = README.read_text()
    for name in hooks:
        assert getattr(hookspecs, name).__doc__, f"hook {name} has no docstring"
        assert f"`{name}" in readme, f"hook {name} is not documented in README.md"


def test_core_does_not_import_engine_packages() -> None:
    sources = Path(torchburn.__file__).parent.rglob("*.py")
    for path in sources:
        text = path.read_text()
        for pkg in ("torchburn_native", "torchburn_wgpu", "torchburn_tiny_engine"):
            assert f"import {pkg}" not in text, f"{path} imports {pkg}"
    assert "torchburn" in sys.modules
