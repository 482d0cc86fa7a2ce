"""GPU benchmark: the native engine's table plus mm 4096³, on the wgpu engine, next to PyTorch CUDA eager
on the same GPU, in one run: ``python -m torchburn_wgpu.bench [--rows a,b] [--json PATH] [--markdown]``.

Per row it reports four times, medians of repeated calls:
- ``cuda``: PyTorch eager with module and inputs on the CUDA device (CUDA events), the reference;
- ``cuda from cpu``: the same module called as the wgpu engine is, CPU tensors in and out (each call
  copies its inputs to the device and its output back; wall clock): PyTorch has no wgpu device, so
  every call of a wgpu-compiled model crosses the bus both ways, and this is CUDA eager doing the same;
- ``wgpu``: the compiled model called as users call it, CPU tensors in and out: uploads of changed
  inputs, one submission, the readback of the outputs;
- ``wgpu gpu``: the region's kernels alone, uploads and readback excluded (``timing.gpu_seconds``:
  repeated in one submission, so each dispatch waits behind a barrier, as in a model).
Where the adapter has timestamp queries, the bandwidth rows also show a region run alone, timed by the
GPU's clock at the start and end of its pass (``timing.pass_seconds``): no barrier before it, but the
pass's own start and drain inside (on an H200 this gave GELU at 1M elements less than the chain did).
The derived lines compare mm 4096³ with cuBLAS (TF32 off) and GELU/softmax with the copy bandwidth
(a 1 GiB CUDA device copy), and show what the engine's own copy kernel moves at the same size, timed
the same way: below a few megabytes the fixed cost of a dispatch after a barrier, not the memory,
decides that figure, for a plain copy as for GELU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from torchburn.bench import ROWS, Row, _function, _gelu, _mm, _softmax

from .device import gpu
from .timing import gpu_seconds, pass_seconds, recording_plans

GPU_ROWS = [r for r in ROWS if r.kind == "throughput"] + [
    Row("mm4096", "matmul 4096x4096 @ 4096x4096", _function(_mm, (4096, 4096), (4096, 4096)), tol=5e-2),
    # the CPU table's GELU and softmax fit an H200's 50 MB L2; these do not
    Row("gelu16m", "GELU (erf) 4096x4096", _function(_gelu, (4096, 4096))),
    Row("softmax16m", "softmax 4096x4096, dim=-1", _function(_softmax, (4096, 4096))),
]


def _wall(fn: Callable[[], Any], min_time: float, min_runs: int = 5) -> float:
    """Median seconds of ``fn()`` over at least ``min_time`` seconds and ``min_runs`` runs."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cuda_time(fn: Callable[[], Any], min_time: float) -> float:
    """Median seconds of ``fn()`` on the CUDA device, by CUDA events."""
    fn()
    torch.cuda.synchronize()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 10 or time.perf_counter() - start < min_time:
        begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _on_cuda(fn: Any, inputs: Sequence[torch.Tensor]) -> tuple[Any, list[torch.Tensor]]:
    if isinstance(fn, nn.Module):
        fn = fn.to("cuda")
    return fn, [x.to("cuda") for x in inputs]


def copy_bandwidth() -> float:
    """Bytes per second (read + write) of a 1 GiB device-to-device copy, best of 5."""
    src = torch.ones(2**28, device="cuda")
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


def engine_copy_seconds(elements: int) -> float:
    """GPU time of the engine's copy kernel (``x.clone()`` of a dense float32 vector), timed like a
    row's kernels: the reference for what one dispatch moving these bytes can reach."""
    compiled = torch.compile(
        lambda x: x.clone(), backend="torchburn", options={"engine": "wgpu", "fallback": "error"}, dynamic=False
    )
    x = torch.randn(elements)
    compiled(x)
    with recording_plans() as plans:
        compiled(x)
    if len(plans) != 1:
        raise RuntimeError(f"the copy reference ran {len(plans)} GPU programs, not one")
    return gpu_seconds(plans[0], 20)


def run_row(row: Row, min_time: float) -> dict[str, Any]:
    torch.manual_seed(0)
    fn, inputs = row.build()
    result: dict[str, Any] = {"row": row.name, "description": row.description}
    with torch.no_grad():
        expected = fn(*inputs)
        cuda_fn, cuda_inputs = _on_cuda(fn, inputs)
        result["cuda_s"] = _cuda_time(lambda: cuda_fn(*cuda_inputs), min_time)
        result["cuda_from_cpu_s"] = _wall(lambda: cuda_fn(*[x.to("cuda") for x in inputs]).cpu(), min_time)
        if isinstance(fn, nn.Module):
            fn = fn.to("cpu")
        # PyTorch's fused MultiheadAttention fast path is an eager-only shortcut that Dynamo may refuse
        # to trace: the compiled model takes the plain path (CUDA eager above keeps its fast path)
        fast_path = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            compiled = torch.compile(fn, backend="torchburn", options={"engine": "wgpu", "fallback": "error"})
            got = compiled(*inputs)
            error = (got - expected).abs().max().item()
            scale = expected.abs().max().item() or 1.0
            result["max_error"] = error
            result["ok"] = error <= row.tol * max(scale, 1.0)
            result["wgpu_s"] = _wall(lambda: compiled(*inputs), min_time)
            with recording_plans() as plans:
                compiled(*inputs)
        finally:
            torch.backends.mha.set_fastpath_enabled(fast_path)
        if not plans:
            raise RuntimeError(f"row {row.name}: no GPU program ran (the model was not compiled)")
        result["regions"] = len(plans)
        result["wgpu_gpu_s"] = sum(gpu_seconds(plan, 20) for plan in plans)
        by_clock = [pass_seconds(plan) for plan in plans]
        if all(t is not None for t in by_clock):
            result["wgpu_pass_s"] = sum(t for t in by_clock if t is not None)
    return result


# rows held to the copy bandwidth, with the elements each reads and writes once
BANDWIDTH_ROWS = {"gelu": 2**20, "softmax": 2**22, "gelu16m": 2**24, "softmax16m": 2**24}


def derived(results: list[dict[str, Any]], bandwidth: float, copy_s: dict[int, float] | None = None) -> list[str]:
    """The target lines; ``copy_s`` maps an element count to the engine's copy kernel time there."""
    copy_s = copy_s or {}
    by_name = {r["row"]: r for r in results}
    lines = [f"copy bandwidth (CUDA, 1 GiB device copy): {bandwidth / 1e9:.0f} GB/s"]
    if "mm4096" in by_name:
        r = by_name["mm4096"]
        flops = 2 * 4096**3
        ours, cublas = flops / r["wgpu_gpu_s"], flops / r["cuda_s"]
        lines.append(
            f"mm 4096³: wgpu kernels {ours / 1e12:.1f} TFLOP/s, cuBLAS fp32 {cublas / 1e12:.1f} TFLOP/s "
            f"-> {100 * ours / cublas:.0f}% (target 50%)"
        )
    for name, elements in BANDWIDTH_ROWS.items():
        if name in by_name:
            moved = 2 * elements * 4 / by_name[name]["wgpu_gpu_s"]  # one read and one write per element
            line = (
                f"{name}: wgpu kernels move {moved / 1e9:.0f} GB/s = {100 * moved / bandwidth:.0f}% of copy "
                "bandwidth (target 50%)"
            )
            if "wgpu_pass_s" in by_name[name]:
                alone = 2 * elements * 4 / by_name[name]["wgpu_pass_s"]
                share = 100 * alone / bandwidth
                line += f"; run alone, by GPU timestamps around its pass: {alone / 1e9:.0f} GB/s = {share:.0f}%"
            if elements in copy_s:
                copied = 2 * elements * 4 / copy_s[elements]
                line += (
                    f"; the engine's copy kernel at this size moves {copied / 1e9:.0f} GB/s = "
                    f"{100 * copied / bandwidth:.0f}%"
                )
            lines.append(line)
    for name in ("resnet18", "encoder"):
        if name in by_name:
            r = by_name[name]
            lines.append(
                f"{name}: wgpu kernels {r['wgpu_gpu_s'] / r['cuda_s']:.2f}x CUDA eager's time, called from the "
                f"CPU {r['wgpu_s'] / r['cuda_s']:.2f}x (target within 3x); called from the CPU against CUDA "
                f"eager also called with CPU tensors: {r['wgpu_s'] / r['cuda_from_cpu_s']:.2f}x"
            )
    return lines


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| row | CUDA eager ms | CUDA eager ms (CPU tensors) | wgpu ms (CPU tensors) | wgpu kernels ms "
        "| kernels / eager | max error |"
    )
    lines = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        lines.append(
            f"| {r['row']} | {r['cuda_s'] * 1e3:.3f} | {r['cuda_from_cpu_s'] * 1e3:.3f} | {r['wgpu_s'] * 1e3:.3f} "
            f"| {r['wgpu_gpu_s'] * 1e3:.3f} "
            f"| {r['wgpu_gpu_s'] / r['cuda_s']:.2f}x | {r['max_error']:.1e}{'' if r['ok'] else ' (!)'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchburn_wgpu.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", help="comma-separated row names (default: all)")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds per measurement (default 0.5)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("the reference is PyTorch CUDA eager on the same GPU: this machine has no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 against fp32
    torch.backends.cudnn.allow_tf32 = False
    rows = GPU_ROWS
    if args.rows:
        wanted = args.rows.split(",")
        unknown = sorted(set(wanted) - {r.name for r in GPU_ROWS})
        if unknown:
            parser.error(f"unknown rows {unknown}; rows: {', '.join(r.name for r in GPU_ROWS)}")
        rows = [r for r in GPU_ROWS if r.name in wanted]
    device = gpu()
    info = device.adapter.info
    print(
        f"adapter: {device.name}; driver: {info.get('description', '?')}; CUDA device: {torch.cuda.get_device_name()}"
    )
    results = []
    for row in rows:
        result = run_row(row, args.min_time)
        results.append(result)
        print(
            f"{row.name}: cuda {result['cuda_s'] * 1e3:.3f} ms (from CPU tensors "
            f"{result['cuda_from_cpu_s'] * 1e3:.3f} ms), wgpu {result['wgpu_s'] * 1e3:.3f} ms, "
            f"kernels {result['wgpu_gpu_s'] * 1e3:.3f} ms, error {result['max_error']:.1e}",
            flush=True,
        )
    bandwidth = copy_bandwidth()
    ran = {r["row"] for r in results}
    copy_s = {n: engine_copy_seconds(n) for n in sorted({n for row, n in BANDWIDTH_ROWS.items() if row in ran})}
    print()
    print(table(results))
    print()
    for line in derived(results, bandwidth, copy_s):
        print(line)
    if args.json:
        import wgpu

        meta = {
            "adapter": device.name,
            "driver": info.get("description"),
            "cuda": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "wgpu": wgpu.__version__,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            report = {"meta": meta, "copy_bandwidth": bandwidth, "engine_copy_s": copy_s, "results": results}
            json.dump(report, f, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
