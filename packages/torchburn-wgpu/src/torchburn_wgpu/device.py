"""Which GPU the engine runs on: the adapter choice, the device, and what the adapter allows.

``TORCHBURN_WGPU_BACKEND`` (vulkan, metal, dx12, gl) restricts the choice to one graphics API; otherwise
wgpu picks, preferring a high-performance (discrete) adapter. Finding no adapter is not an error here:
the engine reports itself unavailable with the reason, and compiling with it fails with that reason.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass
from typing import Any

BACKENDS = {"vulkan": "Vulkan", "metal": "Metal", "dx12": "D3D12", "gl": "OpenGL"}


class DeviceUnavailable(RuntimeError):
    """No adapter could be had (no driver, no GPU, or not the backend asked for)."""


class DeviceLost(RuntimeError):
    """The GPU device was lost (driver reset, GPU removed); results of the call are not available."""


def requested_backend() -> str | None:
    """The backend named by ``TORCHBURN_WGPU_BACKEND``, or None for wgpu's own choice."""
    raw = os.environ.get("TORCHBURN_WGPU_BACKEND", "").strip().lower()
    if not raw:
        return None
    if raw not in BACKENDS:
        allowed = ", ".join(BACKENDS)
        raise ValueError(f"TORCHBURN_WGPU_BACKEND must be one of {allowed}; got {raw!r}")
    return raw


@dataclass
class Gpu:
    """An open device with what the kernels need to know about it."""

    adapter: Any
    device: Any
    name: str
    backend: str
    f16: bool  # the adapter has `shader-f16`
    f64: bool  # and `shader-f64` (a native wgpu feature: Vulkan and DX12 adapters may have it)
    # row folds run on subgroup operations: the adapter has `subgroup` and lays subgroups out in
    # order of local index (the probe below), and TORCHBURN_WGPU_SUBGROUPS is not 0
    subgroups: bool
    timestamps: bool  # the adapter can write GPU timestamps at a compute pass's start and end (benchmarks)
    max_binding_bytes: int  # the largest storage buffer one binding may cover
    max_buffer_bytes: int
    max_storage_buffers: int  # per shader stage
    lost: str | None = None  # why the device was lost, once it was

    def check_alive(self) -> None:
        if self.lost is not None:
            raise DeviceLost(f"the GPU device ({self.name}) was lost: {self.lost}")


_gpu: Gpu | None = None
_failure: str | None = None
_lock = threading.Lock()


def _pick_adapter(wgpu: Any, backend: str | None) -> Any:
    if backend is None:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise DeviceUnavailable("wgpu found no GPU adapter (is a Vulkan, Metal or DX12 driver installed?)")
        return adapter
    wanted = BACKENDS[backend]
    adapters = [a for a in wgpu.gpu.enumerate_adapters_sync() if a.info.get("backend_type") == wanted]
    if not adapters:
        raise DeviceUnavailable(f"TORCHBURN_WGPU_BACKEND={backend}, but wgpu found no {wanted} adapter")
    # discrete before integrated before software, as high-performance preference would
    rank = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
    return min(adapters, key=lambda a: rank.get(a.info.get("adapter_type", ""), 4))


def _load_triton_first() -> None:
    """Mesa's software Vulkan (lavapipe) brings its own LLVM into the process; triton, which
    ``torch.compile`` imports later, then crashes loading its bundled one. Loaded first, both work."""
    if importlib.util.find_spec("triton") is not None:
        try:
            import triton  # noqa: F401
        except Exception:  # a broken triton is torch.compile's problem, not the GPU engine's
            pass


SUBGROUPS_ENV = "TORCHBURN_WGPU_SUBGROUPS"

# each invocation of one 256-wide workgroup writes its subgroup lane and the subgroup size
_SUBGROUP_PROBE = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) lane: u32,
        @builtin(subgroup_size) lanes: u32) {
    out[2u * lid] = lane;
    out[2u * lid + 1u] = lanes;
}
"""


def _subgroups_wanted() -> bool:
    value = os.environ.get(SUBGROUPS_ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{SUBGROUPS_ENV}={value!r}: use 1 (subgroup operations where usable, the default) or 0")
    return value == "1"


def _subgroups_in_order(wgpu: Any, device: Any) -> bool:
    """Whether subgroups of a 256-wide workgroup are runs of consecutive local indices of one
    power-of-two size, as ``row_tree_subgroup.wgsl`` assumes (so on every adapter seen, but no
    specification promises it)."""
    import numpy as np

    try:
        module = device.create_shader_module(code=_SUBGROUP_PROBE)
        pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        buffer = device.create_buffer(size=256 * 8, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        group = device.create_bind_group(
            layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buffer}}]
        )
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(1)
        compute.end()
        device.queue.submit([encoder.finish()])
        words = np.frombuffer(device.queue.read_buffer(buffer), dtype=np.uint32).reshape(256, 2)
    except Exception:  # any failure means: use the workgroup-memory tree
        return False
    lanes = int(words[0, 1])
    if lanes < 1 or lanes > 256 or lanes & (lanes - 1) or not (words[:, 1] == lanes).all():
        return False
    return bool((words[:, 0] == np.arange(256) % lanes).all())


def _open() -> Gpu:
    _load_triton_first()
    try:
        import wgpu
    except ImportError as exc:  # pragma: no cover - wgpu is a dependency of this package
        raise DeviceUnavailable(f"the wgpu package is not importable: {exc}") from exc
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # Mesa warns on every call without it
    adapter = _pick_adapter(wgpu, requested_backend())
    limits = adapter.limits
    features = set(adapter.features)
    wanted_features = [f for f in ("shader-f16", "shader-f64", "subgroup", "timestamp-query") if f in features]
    # ask for what the adapter has, not WebGPU's portable defaults (8 storage buffers, 128 MiB bindings)
    required = {
        key: limits[key]
        for key in (
            "max-storage-buffers-per-shader-stage",
            "max-storage-buffer-binding-size",
            "max-buffer-size",
            "max-compute-workgroup-storage-size",
            "max-compute-invocations-per-workgroup",
            "max-compute-workgroup-size-x",
            "max-compute-workgroup-size-y",
            "max-compute-workgroups-per-dimension",
        )
        if key in limits
    }
    device = adapter.request_device_sync(required_features=wanted_features, required_limits=required)
    info = adapter.info
    gpu = Gpu(
        adapter=adapter,
        device=device,
        name=f"{info.get('device', '?')} ({info.get('adapter_type', '?')}) via {info.get('backend_type', '?')}",
        backend=str(info.get("backend_type", "?")),
        f16="shader-f16" in wanted_features,
        f64="shader-f64" in wanted_features,
        subgroups="subgroup" in wanted_features and _subgroups_wanted() and _subgroups_in_order(wgpu, device),
        timestamps="timestamp-query" in wanted_features,
        max_binding_bytes=int(limits["max-storage-buffer-binding-size"]),
        max_buffer_bytes=int(limits["max-buffer-size"]),
        max_storage_buffers=int(limits["max-storage-buffers-per-shader-stage"]),
    )
    _watch_loss(gpu)
    return gpu


def _watch_loss(gpu: Gpu) -> None:
    """Record a device loss so that later calls raise ``DeviceLost`` instead of hanging."""
    lost = getattr(gpu.device, "lost", None)
    then = getattr(lost, "then", None)
    if callable(then):

        def note(info: Any) -> None:
            gpu.lost = str(getattr(info, "message", info)) or "no reason given"

        then(note)


def gpu() -> Gpu:
    """The process's GPU, opened on first use; raises ``DeviceUnavailable`` with the reason if none."""
    global _gpu, _failure
    with _lock:
        if _gpu is None:
            if _failure is not None:
                raise DeviceUnavailable(_failure)
            try:
                _gpu = _open()
            except DeviceUnavailable as exc:
                _failure = str(exc)
                raise
            except Exception as exc:  # driver errors come as many types; all mean "no GPU here"
                _failure = f"opening a wgpu device failed: {type(exc).__name__}: {exc}"
                raise DeviceUnavailable(_failure) from exc
        _gpu.check_alive()
        return _gpu


def reset_for_tests() -> None:
    """Forget the opened device and any failure (tests change ``TORCHBURN_WGPU_BACKEND``)."""
    global _gpu, _failure
    with _lock:
        _gpu, _failure = None, None
