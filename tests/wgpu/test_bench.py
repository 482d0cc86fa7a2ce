"""The GPU benchmark's arithmetic and its copy reference (the CUDA side needs a CUDA device and is
exercised on one, by hand; these parts run anywhere the engine does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from torchburn_wgpu.bench import derived, engine_copy_seconds
from torchburn_wgpu.program import recent_regions


def test_the_copy_reference_times_one_vec4_copy_kernel(gpu_compile: Callable[..., Any]) -> None:
    seconds = engine_copy_seconds(4096)
    assert 0 < seconds < 1
    (plan,) = recent_regions()[-1].plans.values()
    (launch,) = plan.launches
    assert launch.family == "elementwise" and "array<vec4<f32>>" in launch.source


def test_bandwidth_lines_compare_rows_and_the_same_size_copy_with_the_copy_bandwidth() -> None:
    moved = 2 * 2**20 * 4  # GELU at 1M elements reads and writes each once
    results = [{"row": "gelu", "wgpu_gpu_s": moved / 1e12}]  # 1,000 GB/s
    lines = derived(results, bandwidth=4e12, copy_s={2**20: moved / 2e12})
    (line,) = [line for line in lines if line.startswith("gelu:")]
    assert "1000 GB/s = 25% of copy bandwidth" in line
    assert "copy kernel at this size moves 2000 GB/s = 50%" in line
    assert "copy kernel" not in next(x for x in derived(results, bandwidth=4e12) if x.startswith("gelu:"))
    results[0]["wgpu_pass_s"] = moved / 3e12
    (line,) = [line for line in derived(results, bandwidth=4e12) if line.startswith("gelu:")]
    assert "run alone, by GPU timestamps around its pass: 3000 GB/s = 75%" in line


@pytest.mark.parametrize("factor", [0.5, 3.0])
def test_model_rows_are_reported_against_cuda_eager(factor: float) -> None:
    r = {"row": "encoder", "cuda_s": 1e-3, "cuda_from_cpu_s": 2e-3, "wgpu_s": factor * 1e-3, "wgpu_gpu_s": 1e-3}
    (line,) = [line for line in derived([r], bandwidth=4e12) if line.startswith("encoder:")]
    assert f"called from the CPU {factor:.2f}x" in line
    assert f"also called with CPU tensors: {factor / 2:.2f}x" in line
