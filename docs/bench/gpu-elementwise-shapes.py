"""Elementwise kernel shapes against the cost of a dispatch: GELU, x + 1 and a plain copy over 1M and
4M float32 elements, written by hand in several shapes (four scalars or one to four vec4 per thread,
workgroups of 64 to 512, sizes read from a parameter buffer or written into the shader).

Timed as ``torchburn_wgpu.program.gpu_seconds`` times a region: N dispatches in one compute pass
(wgpu puts a barrier between storage writes), the submission's wall time to drain, less one
dispatch's, over N - 1. Needs a CUDA build of PyTorch to warm the clocks and for the eager line.
``python docs/bench/gpu-elementwise-shapes.py`` (the log of a run is beside this file).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
import torch
import wgpu

from torchburn_wgpu import shaders
from torchburn_wgpu.device import gpu

COPY_BANDWIDTH = 4.04e12  # bytes/s, a 1 GiB CUDA device copy on the H200 this was run on
OPS = {  # scalar form, vec4 form
    "gelu": (
        "tb_gelu_erf({x})",
        "vec4<f32>(tb_gelu_erf({x}.x), tb_gelu_erf({x}.y), tb_gelu_erf({x}.z), tb_gelu_erf({x}.w))",
    ),
    "add1": ("({x} + 1.0)", "({x} + vec4<f32>(1.0))"),
    "copy": ("{x}", "{x}"),
}
# op, vec4, values per thread, workgroup size, sizes written into the shader
SHAPES = [
    ("gelu", False, 4, 256, False),  # the engine's scalar path
    ("gelu", False, 4, 256, True),
    ("gelu", True, 1, 256, False),
    ("gelu", True, 1, 256, True),
    ("gelu", True, 2, 256, True),
    ("gelu", True, 4, 256, True),
    ("gelu", True, 1, 128, True),
    ("gelu", True, 1, 64, True),
    ("gelu", True, 2, 128, True),
    ("gelu", True, 1, 512, True),
    ("add1", False, 4, 256, False),
    ("add1", True, 1, 256, True),
    ("add1", True, 1, 128, True),
    ("copy", True, 1, 256, True),
    ("copy", True, 2, 128, True),
]


def source(op: str, vec: bool, per: int, wg: int, baked: bool, items: int) -> str:
    t = "vec4<f32>" if vec else "f32"
    expr = OPS[op][1 if vec else 0]
    lines = [shaders._text("math")]
    if not baked:
        lines.append("@group(0) @binding(0) var<storage, read> params: array<u32>;")
    lines += [
        f"@group(0) @binding(1) var<storage, read_write> out: array<{t}>;",
        f"@group(0) @binding(2) var<storage, read> in0: array<{t}>;",
        f"@compute @workgroup_size({wg})",
        "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {",
        f"    let t = gid.x + gid.y * groups.x * {wg}u;",
        f"    let n = {f'{items}u' if baked else 'params[0]'};",
        "    if (t >= n) { return; }",
        f"    let width = groups.x * groups.y * {wg}u;",
    ]
    lines += [f"    let i{c} = min(t + {c}u * width, n - 1u);\n    let v{c} = in0[i{c}];" for c in range(per)]
    lines += [f"    let r{c} = " + expr.format(x=f"v{c}") + ";" for c in range(per)]
    lines += [f"    if (t + {c}u * width < n) {{ out[i{c}] = r{c}; }}" for c in range(per)]
    return "\n".join([*lines, "}"])


def timed(device: Any, pipeline: Any, group: Any, groups: tuple[int, int, int], repeats: int) -> tuple[float, float]:
    probe = device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)

    def submit(times: int) -> float:
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        for _ in range(times):
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*groups)
        compute.end()
        t0 = time.perf_counter()
        device.queue.submit([encoder.finish()])
        device.queue.read_buffer(probe)
        return time.perf_counter() - t0

    submit(1)
    submit(repeats)
    estimates = []
    for _ in range(7):
        one = min(submit(1) for _ in range(3))
        estimates.append((submit(repeats) - one) / (repeats - 1))
    return min(estimates), statistics.median(estimates)


def case(device: Any, op: str, n: int, vec: bool, per: int, wg: int, baked: bool) -> None:
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
    xs = torch.randn(n)
    x = device.create_buffer_with_data(data=xs.numpy().tobytes(), usage=usage)
    y = device.create_buffer(size=n * 4, usage=usage)
    items = n // 4 if vec else n
    module = device.create_shader_module(code=source(op, vec, per, wg, baked, items))
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    entries = [{"binding": 1, "resource": {"buffer": y}}, {"binding": 2, "resource": {"buffer": x}}]
    if not baked:
        words = np.array([items], dtype=np.uint32).tobytes()
        entries.insert(
            0, {"binding": 0, "resource": {"buffer": device.create_buffer_with_data(data=words, usage=usage)}}
        )
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
    groups = (-(-items // per // wg), 1, 1)
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    compute.dispatch_workgroups(*groups)
    compute.end()
    device.queue.submit([encoder.finish()])
    got = np.frombuffer(device.queue.read_buffer(y), dtype=np.float32)
    want = {"gelu": torch.nn.functional.gelu(xs), "add1": xs + 1, "copy": xs}[op].numpy()
    error = float(np.abs(got - want).max())
    best, median = timed(device, pipeline, group, groups, max(200, int(0.01 / (n * 8 / 3.5e12 + 3e-6))))
    moved = n * 8
    print(
        f"{op:5s} n={n:>9d} vec4={int(vec)} per={per} wg={wg:3d} baked={int(baked)} groups={groups[0]:6d}: "
        f"min {best * 1e6:6.2f} us ({moved / best / COPY_BANDWIDTH * 100:4.1f}%)  "
        f"median {median * 1e6:6.2f} us ({moved / median / COPY_BANDWIDTH * 100:4.1f}%)  err {error:.1e}",
        flush=True,
    )


def main() -> None:
    g = gpu()
    print("adapter:", g.name, g.backend, flush=True)
    warm = torch.randn(2**26, device="cuda")
    for _ in range(50):
        warm.mul_(1.0)
    torch.cuda.synchronize()
    for n in (2**20, 2**22):
        for shape in SHAPES + SHAPES[:6]:  # the first six again, for the run-to-run spread
            case(g.device, shape[0], n, *shape[1:])
    for n in (2**20, 2**22):  # CUDA eager's GELU, launched back to back from Python
        x, y = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
        times = []
        for _ in range(7):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(2000):
                torch.ops.aten.gelu.out(x, out=y)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 2000 * 1e-3)
        m = statistics.median(times)
        print(f"CUDA eager gelu n={n}: median {m * 1e6:.2f} us back to back ({n * 8 / m / COPY_BANDWIDTH * 100:.1f}%)")


if __name__ == "__main__":
    main()
