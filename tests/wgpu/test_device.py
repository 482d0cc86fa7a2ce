"""Adapter choice and what happens without one: a reason in list_engines, a clear compile error."""

from __future__ import annotations

import json

from helpers import run_python

REPORT = """
    import json, torchburn
    row = [r for r in torchburn.list_engines() if r.name == "wgpu"][0]
    print(json.dumps({"available": row.available, "reason": row.reason, "device": row.device_name}))
"""


def _report(backend: str) -> dict[str, object]:
    proc = run_python(REPORT, env={"TORCHBURN_WGPU_BACKEND": backend})
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_a_bad_backend_name_is_reported_with_the_allowed_values() -> None:
    row = _report("cuda")
    assert row["available"] is False
    assert "TORCHBURN_WGPU_BACKEND must be one of vulkan, metal, dx12, gl; got 'cuda'" in str(row["reason"])


def test_a_backend_with_no_adapter_makes_the_engine_unavailable_not_a_crash() -> None:
    row = _report("metal")  # no Metal on Linux
    assert row["available"] is False
    assert "no Metal adapter" in str(row["reason"])


def test_compiling_on_an_unavailable_engine_fails_with_its_reason() -> None:
    code = """
        import torch, torchburn
        f = torch.compile(lambda x: x + 1, backend="torchburn", options={"engine": "wgpu"})
        try:
            f(torch.ones(3))
        except Exception as exc:
            print("ERROR", type(exc).__name__, exc)
        else:
            print("NO ERROR")
    """
    out = run_python(code, env={"TORCHBURN_WGPU_BACKEND": "metal"}).stdout
    assert "ERROR" in out and "no Metal adapter" in out, out


def test_the_vulkan_backend_names_its_adapter(gpu_compile: object) -> None:
    row = _report("vulkan")
    assert row["available"] is True, row
    assert "via Vulkan" in str(row["device"])


def test_auto_picks_the_gpu_engine_only_on_a_real_gpu(gpu_compile: object, monkeypatch: object) -> None:
    import pytest

    import torchburn
    from torchburn.engines.discovery import availability

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setenv("TORCHBURN_DEVICE", "auto")
    software = availability(torchburn.get_engine("wgpu")).emulated
    # lavapipe (CI) is a CPU pretending to be a GPU: the native engine is faster there
    assert torchburn.active_engine() == ("native" if software else "wgpu")
    monkeypatch.setenv("TORCHBURN_DEVICE", "gpu")  # asked for by name, a software GPU still serves
    assert torchburn.active_engine() == "wgpu"
