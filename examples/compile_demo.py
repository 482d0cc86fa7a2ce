"""Compile a small MLP and a CNN block with TorchBurn, check them against eager, show what ran where."""

from __future__ import annotations

import time
import warnings

import torch
from torch import nn

import torchburn


def _median_ms(fn, x, repeat=20):  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    warnings.simplefilter("default")
    print("engines:")
    for info in torchburn.list_engines():
        print("  ", info)
    engine = torchburn.active_engine()
    print(f"default engine: {engine}\n")

    torch.manual_seed(0)
    models = {
        "MLP 512-1024-256, batch 32": (
            nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 256)),
            torch.randn(32, 512),
        ),
        "conv-bn-relu-pool block, 2x3x32x32": (
            nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2)),
            torch.randn(2, 3, 32, 32),
        ),
    }
    with torch.no_grad():
        for name, (model, x) in models.items():
            model.eval()
            t0 = time.perf_counter()
            fast = torch.compile(model, backend="torchburn", options={"fallback": "error"})
            out = fast(x)
            cold = time.perf_counter() - t0
            err = (out - model(x)).abs().max().item()
            print(
                f"{name}: max |torchburn - eager| = {err:.2e}; first call {cold:.2f} s; "
                f"eager {_median_ms(model, x):.3f} ms, torchburn {_median_ms(fast, x):.3f} ms (median)"
            )
    print("\ncoverage (nodes run by the engine / fallen back to eager):")
    print(torchburn.format_coverage())
    info = torchburn.cache_info()
    print(f"\ngraph cache: {info['compiles']} compiled, {info['disk_hits']} from disk, at {info['disk_dir']}")


if __name__ == "__main__":
    main()
