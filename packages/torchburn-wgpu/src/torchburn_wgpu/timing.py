"""Timing a compiled region's GPU work, for the benchmarks (``bench.py``) and their tests: kept beside
the runtime, which only offers one hook (``program._RECORDING``, set by :func:`recording_plans`)."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator

from . import program
from .device import Gpu
from .program import Plan, raw_library


@contextlib.contextmanager
def recording_plans() -> Iterator[list[Plan]]:
    """Collects, into the list it yields, each plan run inside the block (once each)."""
    ran: list[Plan] = []
    program._RECORDING = ran
    try:
        yield ran
    finally:
        program._RECORDING = None


def gpu_seconds(plan: Plan, repeats: int) -> float:
    """GPU time of one run of ``plan``'s kernels, uploads and readback excluded: its dispatches
    recorded ``repeats`` times into one submission, timed to completion, less one run's submission
    (the difference cancels the submit and wait latency), divided by ``repeats - 1``."""

    def submit(times: int) -> float:
        device = plan.gpu.device
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        for _ in range(times):
            for pipeline, group, groups in plan.passes:
                compute.set_pipeline(pipeline)
                compute.set_bind_group(0, group)
                compute.dispatch_workgroups(*groups)
        compute.end()
        t0 = time.perf_counter()
        device.queue.submit([encoder.finish()])
        device.queue.read_buffer(plan.staging_probe)  # returns once the queue has drained
        return time.perf_counter() - t0

    submit(1)  # warm
    one = min(submit(1) for _ in range(3))
    many = min(submit(repeats) for _ in range(3))
    estimate = max(many - one, 1e-7) / (repeats - 1)
    if estimate * repeats < 0.01:  # small kernels: repeat until the difference dwarfs submit jitter
        repeats = min(int(0.01 / estimate) + 1, 5000)
        many = min(submit(repeats) for _ in range(3))
    return max(many - one, 0.0) / (repeats - 1)


def pass_seconds(plan: Plan, runs: int = 50) -> float | None:
    """GPU time of one run of ``plan``'s kernels by the adapter's own clock: timestamps written at the
    start and end of its compute pass, each run submitted alone; the median of ``runs``. Unlike
    ``gpu_seconds`` no barrier waits before the kernels, but the span holds the pass's own start and
    drain. None where the adapter has no timestamp queries."""
    import numpy as np
    import wgpu

    gpu = plan.gpu
    if not gpu.timestamps:
        return None
    device = gpu.device
    queries = device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
    resolved = device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    writes = {"query_set": queries, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
    nanoseconds = _timestamp_period(gpu)
    samples = []
    for _ in range(runs + 1):  # the first warms the pipelines and caches
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass(timestamp_writes=writes)
        for pipeline, group, groups in plan.passes:
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*groups)
        compute.end()
        encoder.resolve_query_set(queries, 0, 2, resolved, 0)
        device.queue.submit([encoder.finish()])
        start, end = (int(t) for t in np.frombuffer(device.queue.read_buffer(resolved), dtype=np.uint64))
        samples.append((end - start) * nanoseconds * 1e-9)
    return statistics.median(samples[1:])


def _timestamp_period(gpu: Gpu) -> float:
    """Nanoseconds per timestamp tick: wgpu-native resolves raw ticks, whose length the queue reports."""
    raw = raw_library()
    if raw is None or not hasattr(raw[0], "wgpuQueueGetTimestampPeriod"):
        return 1.0
    return float(raw[0].wgpuQueueGetTimestampPeriod(gpu.device.queue._internal))
