"""A compiled region on the GPU: plans per input layout, then one command submission per call.

Per call: inputs whose tensor changed since its last upload are written (a parameter is the same
tensor at the same version every call, so it is uploaded once and stays resident); every kernel is
recorded into one compute pass; the region's outputs are copied into one staging buffer in the same
submission, which is then mapped once. Intermediates live in buffers the plan shares between values
whose lifetimes do not overlap.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from torchburn.cpp_helpers import assert_size_stride
from torchburn.planning import PlanContext, PlannedRegion, signature

from .device import DeviceLost, Gpu
from .kernels import Launch, PipelineCache
from .lowering import TABLE  # noqa: F401  (importing the lowerings fills the table)
from .planner import MAX_BINDINGS, Lazy, PlanError, Planner
from .values import WORD, contiguous, element_bytes, numel, padded

Result = TypeVar("Result")

_pipeline_caches: dict[int, PipelineCache] = {}

# a region keeps the plans of this many input signatures, dropping the least recently used beyond that:
# each plan holds GPU buffers for every input (weights included) and intermediate, so inputs of ever new
# sizes (dynamic shapes) would otherwise fill the GPU's memory. A dropped signature is planned again,
# and its weights uploaded again, if it comes back
PLANS_KEPT = 8
# while a ``recording_plans()`` block runs: the plans run in it (benchmarks time their kernels)
_RECORDING: list[Plan] | None = None


def recent_regions() -> list[CompiledRegion]:
    """The regions compiled most recently in this process (newest last), for inspection and tests."""
    return CompiledRegion.recent_regions()


def pipelines(gpu: Gpu) -> PipelineCache:
    cache = _pipeline_caches.get(id(gpu.device))
    if cache is None:
        cache = _pipeline_caches[id(gpu.device)] = PipelineCache(gpu.device)
    return cache


def _laid_out_as(args: Sequence[Any], key: tuple[Any, ...]) -> bool:
    """Whether ``args`` have the signature ``key`` (see ``signature``), checked without building one."""
    if len(args) != len(key):
        return False
    for a, k in zip(args, key, strict=True):
        if isinstance(a, torch.Tensor):
            if not isinstance(k, tuple) or a.dtype is not k[2]:
                return False
            try:
                assert_size_stride(a, k[0], k[1])
            except AssertionError:
                return False
        elif isinstance(k, tuple) or a != k:
            return False
    return True


@dataclass
class OutputSpec:
    slot: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]  # what the graph says the output's strides are
    staging_offset: int  # bytes into the staging buffer


def plan_context(gpu: Gpu) -> PlanContext:
    """What planning may depend on of the device: its binding limit and optional features."""
    features = {
        name
        for name, present in (("subgroups", gpu.subgroups), ("shader-f16", gpu.f16), ("shader-f64", gpu.f64))
        if present
    }
    return PlanContext(limits={MAX_BINDINGS: gpu.max_storage_buffers}, features=frozenset(features))


def plan_region(gm: torch.fx.GraphModule, args: Sequence[Any], context: PlanContext) -> tuple[Planner, list[Any]]:
    """Walk the graph once with these concrete inputs; returns the planner and the output values."""
    planner = Planner(gm, args, context)
    return planner, planner.walk()


class Plan:
    """Buffers, bind groups and the staging area for one input signature."""

    def __init__(self, gpu: Gpu, gm: torch.fx.GraphModule, args: Sequence[Any]) -> None:
        import wgpu

        self.gpu = gpu
        planner, outputs = plan_region(gm, args, plan_context(gpu))
        # every output ends up dense in a buffer of its own, so it can be copied out as a block
        self.outputs: list[OutputSpec] = []
        staging = 0
        out_slots: set[int] = set()
        for value in outputs:
            v = planner.dense(value)
            if v.slot in out_slots or planner.slots[v.slot].input_index is not None:
                v = planner.materialize(Lazy(planner.lazy(v, v.shape), v.dtype, v.shape))
            out_slots.add(v.slot)
            self.outputs.append(OutputSpec(v.slot, v.dtype, v.shape, contiguous(v.shape), staging))
            staging += padded(v.numel * element_bytes(v.dtype))
        self.launches = [launch for launch in planner.launches if not _empty(launch)]
        self.slot_info = planner.slots
        self.error_slot = planner.error_slot
        if self.error_slot is not None:
            out_slots.add(self.error_slot)
            self.error_offset = staging
            staging += WORD
        self.input_slots: dict[int, int] = {
            s.input_index: i for i, s in enumerate(planner.slots) if s.input_index is not None
        }
        storage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        self.buffers = self._allocate(out_slots, storage)
        cache = pipelines(gpu)
        self.passes: list[tuple[Any, Any, tuple[int, int, int]]] = []
        for launch in self.launches:
            pipeline = cache.get(launch.source)
            param_buffer = gpu.device.create_buffer_with_data(
                data=launch.params.tobytes(), usage=wgpu.BufferUsage.STORAGE
            )
            entries = [{"binding": 0, "resource": {"buffer": param_buffer}}]
            entries += [{"binding": k + 1, "resource": {"buffer": self.buffers[s]}} for k, s in enumerate(launch.slots)]
            group = gpu.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
            self.passes.append((pipeline, group, launch.groups))
        # the same dispatches as raw handles, for recording without wgpu's per-call Python layers once
        # a run through them has validated the sequence (see _submit_raw)
        self.raw_passes = [(p._internal, g._internal, n) for p, g, n in self.passes]
        self.validated = False
        # the next call's command buffer, recorded during this call's GPU work (see run)
        self._recorded: list[Any] = [None]
        weakref.finalize(self, _release_recorded, self._recorded)
        self.staging_bytes = max(staging, 4)
        # a word to read back when only waiting for the queue (benchmarks)
        self.staging_probe = gpu.device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)
        self.staging = gpu.device.create_buffer(
            size=self.staging_bytes, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        )
        # the readback copies into the staging buffer: (source, offset there, bytes)
        self.copies: list[tuple[Any, int, int]] = [
            (self.buffers[out.slot], out.staging_offset, padded(numel(out.shape) * element_bytes(out.dtype)))
            for out in self.outputs
        ]
        if self.error_slot is not None:
            self.copies.append((self.buffers[self.error_slot], self.error_offset, WORD))
        # per input: the tensor last uploaded (weakly) and its version, to skip unchanged re-uploads
        self.uploaded: dict[int, tuple[weakref.ref[torch.Tensor], int, int]] = {}
        self.uploads = 0

    def _allocate(self, keep: set[int], usage: Any) -> dict[int, Any]:
        """One buffer per input slot; intermediates share buffers when their lifetimes do not overlap."""
        last_use: dict[int, int] = {}
        first_def: dict[int, int] = {}
        for step, launch in enumerate(self.launches):
            for s in launch.slots[: launch.writes]:
                first_def.setdefault(s, step)
            for s in launch.slots:
                last_use[s] = step
        buffers: dict[int, Any] = {}
        free: list[tuple[int, Any]] = []  # (bytes, buffer) released by values that died
        releases: dict[int, list[int]] = {}
        for s, step in last_use.items():
            if s not in keep and self.slot_info[s].input_index is None:
                releases.setdefault(step, []).append(s)
        device = self.gpu.device

        def new(nbytes: int) -> Any:
            if nbytes > self.gpu.max_binding_bytes:
                raise PlanError(
                    f"a tensor of {nbytes} bytes exceeds the adapter's largest storage binding "
                    f"({self.gpu.max_binding_bytes} bytes)"
                )
            return device.create_buffer(size=nbytes, usage=usage)

        def size(s: int) -> int:
            return padded(self.slot_info[s].numel * element_bytes(self.slot_info[s].dtype))

        for s, slot in enumerate(self.slot_info):
            if slot.input_index is not None or s == self.error_slot:
                buffers[s] = new(size(s))
        for step, launch in enumerate(self.launches):
            for read in launch.slots[launch.writes :]:
                # a value with zero elements, whose own (empty) launch was dropped, still needs a
                # buffer to bind: a reduction over it (a sum, a product) reads nothing from it
                if read not in buffers:
                    buffers[read] = new(size(read))
            for written in launch.slots[: launch.writes]:
                if written in buffers:
                    continue
                need = size(written)
                fits = [i for i, (size, _) in enumerate(free) if size >= need and written not in keep]
                if fits:
                    best = min(fits, key=lambda i: free[i][0])
                    buffers[written] = free.pop(best)[1]
                else:
                    buffers[written] = new(need)
            for s in releases.get(step, []):
                if s in buffers and first_def.get(s, -1) <= step:
                    free.append((int(buffers[s].size), buffers[s]))
        for s in keep:  # an output never written by a kernel (zero elements) still needs a buffer
            if s not in buffers:
                buffers[s] = new(size(s))
        return buffers

    def run(self, args: Sequence[Any]) -> tuple[torch.Tensor, ...]:

        gpu = self.gpu
        gpu.check_alive()
        if _RECORDING is not None and self not in _RECORDING:
            _RECORDING.append(self)
        queue = gpu.device.queue
        for index, slot in self.input_slots.items():
            t: torch.Tensor = args[index]
            version, address = _version(t), t.data_ptr()
            seen = self.uploaded.get(index)
            if seen is not None and seen[0]() is t and seen[1] == version >= 0 and seen[2] == address:
                continue  # the same tensor, unchanged: its buffer already holds it
            if t.numel():
                queue.write_buffer(self.buffers[slot], 0, _host_bytes(t))
            self.uploaded[index] = (weakref.ref(t), version, address)
            self.uploads += 1
        if self.error_slot is not None:
            queue.write_buffer(self.buffers[self.error_slot], 0, b"\0\0\0\0")
        try:
            if self.validated and raw_library() is not None:
                commands = self._recorded[0] or _record_raw(gpu, self.raw_passes, self.copies, self.staging)
                self._recorded[0] = None
                _submit_raw(gpu, commands)
                # the next call runs the same dispatches over the same buffers: record its commands
                # now, while the GPU works through these, instead of before its own submission
                self._recorded[0] = _record_raw(gpu, self.raw_passes, self.copies, self.staging)
                # and allocate the outputs, their pages faulted in, while it still works
                targets = [_fresh_output(out) for out in self.outputs]
                outs, failed = _read_raw(
                    gpu, self.staging, self.staging_bytes, lambda mapped: self._outputs_from(mapped, targets)
                )
            else:
                encoder = gpu.device.create_command_encoder()
                if self.passes:
                    compute = encoder.begin_compute_pass()
                    for pipeline, group, groups in self.passes:
                        compute.set_pipeline(pipeline)
                        compute.set_bind_group(0, group)
                        compute.dispatch_workgroups(*groups)
                    compute.end()
                for source, offset, nbytes in self.copies:
                    encoder.copy_buffer_to_buffer(source, 0, self.staging, offset, nbytes)
                queue.submit([encoder.finish()])
                # wgpu-py submits an empty command buffer before every read mapping, for buffers that
                # no submission has touched (wgpu-native issue 305); this one was just written by ours
                self.staging.map_sync(_staging_read_mode())
                try:
                    outs, failed = self._outputs_from(self.staging.read_mapped(copy=False))
                finally:
                    self.staging.unmap()
        except Exception as exc:
            if gpu.lost is not None:
                raise DeviceLost(f"the GPU device ({gpu.name}) was lost: {gpu.lost}") from exc
            raise
        if failed:
            raise IndexError("index out of range in a gather, scatter or embedding run on the GPU")
        self.validated = True
        return outs

    def _outputs_from(
        self, mapped: Any, targets: Sequence[torch.Tensor | None] | None = None
    ) -> tuple[tuple[torch.Tensor, ...], bool]:
        """The outputs copied out of the mapped staging memory (a buffer-protocol object, valid until
        it is unmapped), into ``targets`` where given (see ``_fresh_output``), and whether the kernels
        flagged an out-of-range index."""
        if isinstance(mapped, memoryview) and mapped.readonly:
            mapped = bytearray(mapped)  # wgpu-py's own mapping (first call only): torch wants writable bytes
        staged = torch.frombuffer(mapped, dtype=torch.uint8, count=self.staging_bytes)
        failed = self.error_slot is not None and bool(staged[self.error_offset : self.error_offset + WORD].any())
        if targets is None:
            targets = [None] * len(self.outputs)
        return tuple(_output(staged, out, into) for out, into in zip(self.outputs, targets, strict=True)), failed


@functools.cache
def _staging_read_mode() -> Any:
    """The read mapping without wgpu-py's extra empty submission: its own ``READ_NOSYNC`` mode where
    this wgpu-py has it (checked in its source), else the plain one."""
    import inspect

    import wgpu

    try:
        from wgpu.backends.wgpu_native import _api

        if "READ_NOSYNC" in inspect.getsource(_api.GPUBuffer.map_async):
            return "READ_NOSYNC"
    except (ImportError, OSError, TypeError):
        pass
    return wgpu.MapMode.READ


@functools.cache
def raw_library() -> Any:
    """wgpu-native's C functions as cffi exposes them, or None where this wgpu has another layout.

    Recording a region's dispatches through wgpu's Python API costs about 10 µs per call (each call
    goes through an error-capturing proxy); a 26-kernel transformer layer spent a millisecond per run
    there, twice its GPU time. The raw calls take well under a microsecond. They skip wgpu's own error
    capture, so they are used only after the same sequence ran once through the checked API."""
    try:
        from wgpu.backends.wgpu_native import _api

        lib, ffi = _api.lib, _api.ffi
        for name in (
            "wgpuDeviceCreateCommandEncoder",
            "wgpuCommandEncoderBeginComputePass",
            "wgpuComputePassEncoderSetPipeline",
            "wgpuComputePassEncoderSetBindGroup",
            "wgpuComputePassEncoderDispatchWorkgroups",
            "wgpuComputePassEncoderEnd",
            "wgpuComputePassEncoderRelease",
            "wgpuCommandEncoderCopyBufferToBuffer",
            "wgpuCommandEncoderFinish",
            "wgpuCommandEncoderRelease",
            "wgpuQueueSubmit",
            "wgpuCommandBufferRelease",
            "wgpuBufferMapAsync",
            "wgpuDevicePoll",
            "wgpuBufferGetMappedRange",
            "wgpuBufferUnmap",
        ):
            getattr(lib, name)
        return lib, ffi
    except (ImportError, AttributeError):
        return None


def _record_raw(
    gpu: Gpu, passes: list[tuple[Any, Any, tuple[int, int, int]]], copies: list[tuple[Any, int, int]], staging: Any
) -> Any:
    """A command buffer with a region's dispatches and readback copies, recorded through wgpu-native's
    C calls: through wgpu-py's objects the encoder, pass, copies, finish and submit cost about 0.25 ms
    a run on an H200 host, half of a transformer layer's GPU time. The descriptors are empty (no
    labels), which the C API takes as null. The caller owns the returned handle (see `_submit_raw`)."""
    lib, ffi = raw_library()
    encoder = lib.wgpuDeviceCreateCommandEncoder(gpu.device._internal, ffi.NULL)
    try:
        if passes:
            compute = lib.wgpuCommandEncoderBeginComputePass(encoder, ffi.NULL)
            no_offsets = ffi.NULL
            for pipeline, group, (x, y, z) in passes:
                lib.wgpuComputePassEncoderSetPipeline(compute, pipeline)
                lib.wgpuComputePassEncoderSetBindGroup(compute, 0, group, 0, no_offsets)
                lib.wgpuComputePassEncoderDispatchWorkgroups(compute, x, y, z)
            lib.wgpuComputePassEncoderEnd(compute)
            lib.wgpuComputePassEncoderRelease(compute)
        target = staging._internal
        for source, offset, nbytes in copies:
            lib.wgpuCommandEncoderCopyBufferToBuffer(encoder, source._internal, 0, target, offset, nbytes)
        return lib.wgpuCommandEncoderFinish(encoder, ffi.NULL)
    finally:
        lib.wgpuCommandEncoderRelease(encoder)


def _submit_raw(gpu: Gpu, commands: Any) -> None:
    """Submits a command buffer from `_record_raw` and releases it."""
    lib, ffi = raw_library()
    try:
        lib.wgpuQueueSubmit(gpu.device.queue._internal, 1, ffi.new("WGPUCommandBuffer[1]", [commands]))
    finally:
        lib.wgpuCommandBufferRelease(commands)


def _release_recorded(cell: list[Any]) -> None:
    """Releases a plan's command buffer recorded ahead that no call submitted."""
    raw = raw_library()
    if cell[0] is not None and raw is not None:
        raw[0].wgpuCommandBufferRelease(cell[0])
        cell[0] = None


# the status each raw read mapping ended with, by request number (see `_read_raw`)
_MAP_STATUS: dict[int, int] = {}
# how long a readback polls without blocking before it sleeps in the driver's wait
SPIN_SECONDS = 0.002
_MAP_REQUESTS = itertools.count(1)


@functools.cache
def _map_callback() -> Any:
    """One C callback for every raw read mapping: it records the mapping's status under the request
    number passed as its first user pointer."""
    _, ffi = raw_library()

    @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")  # type: ignore[untyped-decorator]
    def mapped(status: int, _message: Any, request: Any, _unused: Any) -> None:
        _MAP_STATUS[int(ffi.cast("intptr_t", request))] = int(status)

    return mapped


def _read_raw(gpu: Gpu, staging: Any, nbytes: int, consume: Callable[[Any], Result]) -> Result:
    """``consume`` run on the staging buffer's first ``nbytes`` (a buffer-protocol object that it must
    copy what it keeps out of) once the queue has drained, through
    wgpu-native's C calls on this thread: the mapping is requested, then this thread polls the
    device until the work is done and the mapping reported. wgpu-py's ``map_sync`` hands the wait to
    its polling thread and back (about 0.2 ms a run on an H200 host even with an idle queue)."""
    lib, ffi = raw_library()
    request = next(_MAP_REQUESTS)
    info = ffi.new("WGPUBufferMapCallbackInfo *")
    info.mode = lib.WGPUCallbackMode_AllowProcessEvents
    info.callback = _map_callback()
    info.userdata1 = ffi.cast("void *", request)
    handle = staging._internal
    lib.wgpuBufferMapAsync(handle, lib.WGPUMapMode_Read, 0, nbytes, info[0])
    device = gpu.device._internal
    try:
        # spin first, then block: a thread that sleeps in the driver's wait wakes up tens of
        # microseconds late onto a cold core, a cost that a short region pays on every call (on an
        # H200 host, spinning took the MLP from 202-344 to 174-175 µs a call and the encoder layer
        # from 661-765 to 553-704); a long one stops burning the core after SPIN_SECONDS
        deadline = time.perf_counter() + SPIN_SECONDS
        while request not in _MAP_STATUS and time.perf_counter() < deadline:
            lib.wgpuDevicePoll(device, False, ffi.NULL)
        while request not in _MAP_STATUS:
            # blocks until the queue is idle; the callback may also run on wgpu-py's polling thread
            lib.wgpuDevicePoll(device, True, ffi.NULL)
            gpu.check_alive()
        status = _MAP_STATUS.pop(request)
    finally:
        _MAP_STATUS.pop(request, None)
    if status != lib.WGPUMapAsyncStatus_Success:
        raise RuntimeError(f"reading back the results failed (wgpu map status {status})")
    try:
        return consume(ffi.buffer(lib.wgpuBufferGetMappedRange(handle, 0, nbytes), nbytes))
    finally:
        lib.wgpuBufferUnmap(handle)


def _empty(launch: Launch) -> bool:
    return launch.groups[0] * launch.groups[1] * launch.groups[2] == 0


def _version(t: torch.Tensor) -> int:
    try:
        return int(t._version)
    except RuntimeError:
        return -1  # inference tensors have no version counter: upload every call


I32_MIN, I32_MAX = -(2**31), 2**31 - 1


def _host_bytes(t: torch.Tensor) -> memoryview:
    data = t.detach().contiguous()
    if data.dtype == torch.bool:
        data = data.to(torch.int32)  # bools are stored as one 32-bit word each
    elif data.dtype == torch.int64:
        if data.numel() and (int(data.min()) < I32_MIN or int(data.max()) > I32_MAX):
            raise ValueError(
                "the wgpu engine stores int64 tensors as 32-bit integers (WGSL has no 64-bit ones); "
                f"this input holds values in [{int(data.min())}, {int(data.max())}], outside "
                f"[{I32_MIN}, {I32_MAX}]"
            )
        data = data.to(torch.int32)
    raw = data.numpy().data.cast("B")
    if len(raw) % WORD:  # writes go in whole words (an odd number of float16 values)
        return memoryview(bytes(raw) + bytes(WORD - len(raw) % WORD))
    return raw


# a page of host memory: the stride at which `_fresh_output` touches a new tensor
PAGE_BYTES = 4096
# outputs up to this size are paged in ahead (see `_fresh_output`)
PREFAULT_MAX_BYTES = 4 << 20


def _fresh_output(out: OutputSpec) -> torch.Tensor | None:
    """A float output's tensor, allocated while the GPU runs, with one byte per page written so that
    the kernel maps its pages now rather than during the copy out of staging memory (a fresh megabyte
    is 256 page faults). Only up to PREFAULT_MAX_BYTES: this thread takes the faults one by one,
    while the copy into a fresh tensor takes them on all of PyTorch's threads (64 MB paged in here
    took mm 4096³ from 14 to 37-40 ms a call on an H200 host). Integer and bool outputs, staged as
    32-bit words, are converted instead."""
    if out.dtype in (torch.bool, torch.int64, torch.int32):
        return None
    if numel(out.shape) * element_bytes(out.dtype) > PREFAULT_MAX_BYTES:
        return None
    result = torch.empty(out.shape, dtype=out.dtype)
    result.view(-1).view(torch.uint8)[::PAGE_BYTES].zero_()
    return result


def _output(staged: torch.Tensor, out: OutputSpec, into: torch.Tensor | None = None) -> torch.Tensor:
    """One output copied out of the mapped staging bytes straight into ``into`` or a fresh tensor.
    The copy is PyTorch's, which splits a large one over its threads: one thread reads mapped memory
    at about 10 GB/s, a megabyte in 0.1 ms on an H200 host."""
    n = numel(out.shape)
    words = staged[out.staging_offset : out.staging_offset + n * element_bytes(out.dtype)]
    if out.dtype in (torch.bool, torch.int64, torch.int32):  # stored as 32-bit words
        stored = torch.empty(n, dtype=torch.int32)
        stored.view(torch.uint8).copy_(words)
        return stored.to(out.dtype).reshape(out.shape)
    result = torch.empty(out.shape, dtype=out.dtype) if into is None else into
    result.view(-1).view(torch.uint8).copy_(words)
    return result


class CompiledRegion(PlannedRegion["Plan"]):
    """What core calls: a plan per input signature, built on first sight, run under a lock."""

    plans_kept = PLANS_KEPT

    def __init__(self, gpu: Gpu, gm: torch.fx.GraphModule, out_strides: Sequence[Any]) -> None:
        super().__init__(gm)
        self.gpu = gpu
        self.out_strides = list(out_strides)
        # the signature and plan of the last call: most calls repeat it, and checking each argument
        # against it in C++ is a quarter of the cost of building and hashing a signature (about 40 µs
        # for a ResNet-18's hundred parameters)
        self._last: tuple[tuple[Any, ...], Plan] | None = None
        self._lock = threading.Lock()

    def make_plan(self, args: Sequence[Any]) -> Plan:
        return Plan(self.gpu, self.graph_module, args)

    def plan(self, args: Sequence[Any]) -> Plan:
        last = self._last
        if last is not None and _laid_out_as(args, last[0]):
            return last[1]
        key = signature(args)
        plan = self.plan_for(args, key)
        self._last = (key, plan)
        return plan

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        with self._lock:
            outs = self.plan(args).run(args)
        fixed = []
        for t, stride in zip(outs, self.out_strides, strict=True):
            if (
                stride is not None
                and all(isinstance(s, int) for s in stride)
                and t.stride() != tuple(stride)
                and _own_memory_per_element(t.shape, stride)
            ):
                strided = torch.empty_strided(t.shape, stride, dtype=t.dtype)
                strided.copy_(t)
                t = strided
            fixed.append(t)
        return tuple(fixed)


def _own_memory_per_element(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether ``stride`` gives every element its own memory location. An output that PyTorch made as a
    view sharing locations (``expand``) cannot be written: it is handed back dense instead."""
    extent = 1
    for size, step in sorted((d for d in zip(shape, stride, strict=True) if d[0] > 1), key=lambda d: d[1]):
        if step < extent:
            return False
        extent = step * size
    return True
