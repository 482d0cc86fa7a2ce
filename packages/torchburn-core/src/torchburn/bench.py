"""Benchmark: PyTorch eager vs ``torch.compile`` with Inductor vs TorchBurn, on CPU, in one process.

    python -m torchburn.bench --engine reference --quick --rows mm256,gelu,overhead,cold_mlp

Every row runs its three contenders back to back (samples interleaved round-robin, so drift hits all
alike) under ``torch.no_grad()``, float32, with ``--threads`` intra-op threads, and reports the median
time per call. Cold rows time one first call after ``torch._dynamo.reset()`` with empty caches. The
table goes to stdout, progress to stderr, and everything measured to a JSON file.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

from ._version import __version__
from .errors import TorchBurnError, TorchBurnFallbackWarning
from .telemetry import coverage, reset_coverage

CONTENDERS = ("eager", "inductor", "torchburn")
MIN_SAMPLES = 5
WARMUP_CALLS = 3
SAMPLE_NS = 2_000_000  # a call faster than this is timed in batches of calls that take about this long
QUICK_MIN_TIME = 0.2

Fn = Callable[..., Any]
Inputs = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Row:
    """One benchmark row: ``build()`` makes the function or module (in eval mode) and its inputs."""

    name: str
    description: str
    build: Callable[[], tuple[Fn, Inputs]]
    kind: str = "throughput"  # "throughput", "cold" (first call including compilation) or "overhead"
    tol: float = 1e-3  # rtol and atol of the one check against eager


# --- the rows ------------------------------------------------------------------------------------


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)  # approximate="none": the exact erf form


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def _chain5(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((x * 1.5 + y).relu() - 0.25) * y


def _three_ops(x: torch.Tensor) -> torch.Tensor:
    return (x + 1).relu() * 2


def _cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, dim=-1)


def _var_mean(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.var_mean(x, dim=-1)


def _sort(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.sort(x, dim=-1)


def _topk(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.topk(x, 16, dim=-1)


def _distinct(*shape: int) -> torch.Tensor:
    """An input without repeated values for the sorting rows: with ties the positions a sort reports
    are its own choice (eager's sort is not stable), and float32 normals repeat within 1,024 draws."""
    n = math.prod(shape)
    return torch.randperm(n).reshape(shape).float().div_(n)


def _upsample(x: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)


class _TrainingStep(nn.Module):
    """Forward and backward of a ResNet-18 with batch norm in training mode, without an optimizer step
    (every call sees the same parameters): the loss and the first convolution's gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.model = _resnet18().train()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch.enable_grad():  # the bench runs under no_grad
            for p in self.model.parameters():
                p.grad = None
            loss = self.model(x).logsumexp(-1).mean()
            loss.backward()
        first: nn.Conv2d = self.model.get_submodule("conv1")  # type: ignore[assignment]
        return loss.detach(), first.weight.grad


def _layer_norm() -> nn.Module:
    norm = nn.LayerNorm(1024)
    with torch.no_grad():  # non-trivial affine parameters, so a wrong weight or bias shows
        norm.weight.normal_()
        norm.bias.normal_()
    return norm


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 256))


def _resnet18() -> nn.Module:
    try:
        models = importlib.import_module("torchvision.models")
    except ImportError as exc:
        raise RuntimeError(f"the resnet18 rows need torchvision (pip install torchvision): {exc}") from exc
    model: nn.Module = models.resnet18(weights=None)
    return model


def _function(fn: Fn, *shapes: tuple[int, ...]) -> Callable[[], tuple[Fn, Inputs]]:
    return lambda: (fn, tuple(torch.randn(*shape) for shape in shapes))


def _module(make: Callable[[], nn.Module], *shapes: tuple[int, ...]) -> Callable[[], tuple[Fn, Inputs]]:
    return lambda: (make().eval(), tuple(torch.randn(*shape) for shape in shapes))


ROWS = [
    Row("mm1024", "matmul 1024x1024 @ 1024x1024", _function(_mm, (1024, 1024), (1024, 1024))),
    Row("mm256", "matmul 256x256 @ 256x256", _function(_mm, (256, 256), (256, 256))),
    Row("gelu", "GELU (erf) 1024x1024", _function(_gelu, (1024, 1024))),
    Row("softmax", "softmax 2048x2048, dim=-1", _function(_softmax, (2048, 2048))),
    Row("sdpa", "SDPA B=4 H=8 T=128 D=64", _function(_sdpa, (4, 8, 128, 64), (4, 8, 128, 64), (4, 8, 128, 64))),
    Row(
        "linear_relu",
        "Linear+ReLU 128x512 -> 1024",
        _module(lambda: nn.Sequential(nn.Linear(512, 1024), nn.ReLU()), (128, 512)),
    ),
    Row("mlp", "MLP 512-1024-256, batch 32", _module(_mlp, (32, 512))),
    Row("layer_norm", "LayerNorm 4096x1024, affine", _module(_layer_norm, (4096, 1024))),
    Row("chain5", "5-op elementwise chain, 4M elems", _function(_chain5, (4 * 1024 * 1024,), (4 * 1024 * 1024,))),
    Row("resnet18", "ResNet-18, 1x3x224x224", _module(_resnet18, (1, 3, 224, 224)), tol=1e-2),
    Row(
        "encoder",
        "TransformerEncoderLayer 512/8, 4x128",
        _module(lambda: nn.TransformerEncoderLayer(d_model=512, nhead=8, batch_first=True), (4, 128, 512)),
        tol=2e-3,
    ),
    Row("sort", "sort 4096x1024, dim=-1", lambda: (_sort, (_distinct(4096, 1024),))),
    Row("topk", "top-16 of 4096x1024, dim=-1", lambda: (_topk, (_distinct(4096, 1024),))),
    Row("cumsum", "cumsum 4096x1024, dim=-1", _function(_cumsum, (4096, 1024))),
    Row("var_mean", "var_mean 4096x1024, dim=-1", _function(_var_mean, (4096, 1024))),
    Row("upsample", "bilinear upsample x2, 1x64x128x128", _function(_upsample, (1, 64, 128, 128))),
    Row(
        "conv3d",
        "Conv3d 16 -> 32, 3x3x3, 1x16x16x32x32",
        _module(lambda: nn.Conv3d(16, 32, 3, padding=1), (1, 16, 16, 32, 32)),
    ),
    Row(
        "cnn_train",
        "ResNet-18 training step (forward + backward), 8x3x64x64",
        lambda: (_TrainingStep(), (torch.randn(8, 3, 64, 64),)),
        tol=1e-2,
    ),
    Row("cold_mlp", "first call incl. compile: MLP", _module(_mlp, (32, 512)), kind="cold"),
    Row("cold_resnet18", "first call incl. compile: ResNet-18", _module(_resnet18, (1, 3, 224, 224)), "cold", 1e-2),
    Row("overhead", "per-call overhead: 3 ops, 1000 elems", _function(_three_ops, (1000,)), kind="overhead"),
]


# --- measuring -----------------------------------------------------------------------------------


def _compile(contender: str, fn: Fn, engine: str, cold: bool = False) -> Fn:
    if contender == "eager":
        return fn
    if contender == "inductor":
        return torch.compile(fn, backend="inductor")
    options: dict[str, Any] = {"engine": engine}
    if cold:
        options["cache"] = "off"
    return torch.compile(fn, backend="torchburn", options=options)


def _fresh_inductor_cache() -> contextlib.AbstractContextManager[None]:
    """A fresh temporary Inductor cache dir, so FX-graph and AOT caches cannot hit."""
    utils = importlib.import_module("torch._inductor.utils")
    make = getattr(utils, "fresh_cache", None) or utils.fresh_inductor_cache
    context: contextlib.AbstractContextManager[None] = make()
    return context


def _page_faults() -> int:
    """Page faults this process has taken so far (minor and major; 0 where the OS does not say)."""
    if resource is None:
        return 0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return int(usage.ru_minflt + usage.ru_majflt)


def measure(calls: dict[str, Callable[[], object]], min_time: float) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Per-call times in ms of each call, and its page faults per call: warm up, then sample
    round-robin until each has ``min_time`` seconds of samples and at least ``MIN_SAMPLES``. A fast call
    is timed in a batch of calls and divided.

    Page faults are counted because they decide some rows: a call whose output lands on memory the
    allocator has just handed back to the OS pays a fault per 4 KiB page on first touch, which can
    double an elementwise kernel's time, and which contender pays it depends on the heap's state.
    """
    batch: dict[str, int] = {}
    for name, call in calls.items():
        best, count, until = math.inf, 0, time.perf_counter() + 0.1 * min_time
        while count < WARMUP_CALLS or time.perf_counter() < until:
            start = time.perf_counter_ns()
            call()
            best = min(best, time.perf_counter_ns() - start)
            count += 1
        batch[name] = max(1, math.ceil(SAMPLE_NS / max(best, 1)))

    samples: dict[str, list[float]] = {name: [] for name in calls}
    spent: dict[str, int] = dict.fromkeys(calls, 0)
    faults: dict[str, int] = dict.fromkeys(calls, 0)

    def wanted(name: str) -> bool:
        return spent[name] < min_time * 1e9 or len(samples[name]) < MIN_SAMPLES

    while any(wanted(name) for name in calls):
        for name, call in calls.items():
            if not wanted(name):
                continue
            faults_before = _page_faults()
            start = time.perf_counter_ns()
            for _ in range(batch[name]):
                call()
            elapsed = time.perf_counter_ns() - start
            faults[name] += _page_faults() - faults_before
            spent[name] += elapsed
            samples[name].append(elapsed / batch[name] / 1e6)
    per_call = {name: faults[name] / (len(samples[name]) * batch[name]) for name in calls}
    return samples, per_call


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 2000 else text[:2000] + " ..."


def _mismatch(out: Any, expected: Any, tol: float) -> str | None:
    try:
        torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
    except AssertionError as exc:
        return str(exc).strip()
    return None


def _fallback_ops() -> dict[str, int]:
    return {op: n["fallback"] for ops in coverage().values() for op, n in ops.items() if n["fallback"]}


def _throughput_row(row: Row, contenders: Sequence[str], engine: str, min_time: float) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {c: {} for c in contenders}
    torch._dynamo.reset()
    torch.manual_seed(0)
    try:
        fn, inputs = row.build()
    except Exception as exc:
        return {c: {"error": _error(exc)} for c in contenders}
    expected: Any = None
    calls: dict[str, Callable[[], object]] = {}
    for contender in contenders:
        entry = results[contender]
        reset_coverage()
        try:
            compiled = _compile(contender, fn, engine)
            start = time.perf_counter_ns()
            out = compiled(*inputs)
            entry["first_call_ms"] = (time.perf_counter_ns() - start) / 1e6
        except Exception as exc:
            entry["error"] = _error(exc)
            continue
        if contender == "eager":
            expected = out
        elif expected is not None:
            entry["mismatch"] = _mismatch(out, expected, row.tol)
        if contender == "torchburn":
            entry["fallback_ops"] = _fallback_ops()
        calls[contender] = functools.partial(compiled, *inputs)
    samples, faults = measure(calls, min_time)
    for contender, times in samples.items():
        results[contender]["samples_ms"] = times
        results[contender]["page_faults_per_call"] = faults[contender]
    return results


def _cold_row(row: Row, contenders: Sequence[str], engine: str) -> dict[str, dict[str, Any]]:
    """One first call per contender: fresh Dynamo state, fresh model, no program or Inductor cache."""
    results: dict[str, dict[str, Any]] = {c: {} for c in contenders}
    expected: Any = None
    for contender in contenders:
        entry = results[contender]
        torch._dynamo.reset()
        reset_coverage()
        torch.manual_seed(0)
        try:
            fn, inputs = row.build()
            fresh = _fresh_inductor_cache() if contender == "inductor" else contextlib.nullcontext()
            with fresh:
                start = time.perf_counter_ns()
                out = _compile(contender, fn, engine, cold=True)(*inputs)
                elapsed = (time.perf_counter_ns() - start) / 1e6
        except Exception as exc:
            entry["error"] = _error(exc)
            continue
        entry["samples_ms"] = [elapsed]
        if contender == "eager":
            expected = out
        elif expected is not None:
            entry["mismatch"] = _mismatch(out, expected, row.tol)
        if contender == "torchburn":
            entry["fallback_ops"] = _fallback_ops()
    torch._dynamo.reset()
    return results


def _prime(contenders: Sequence[str], engine: str) -> None:
    """Compile a tiny graph once with each compiler, so cold rows do not pay one-time imports and probes."""
    for contender in contenders:
        if contender == "eager":
            continue
        torch._dynamo.reset()
        fresh = _fresh_inductor_cache() if contender == "inductor" else contextlib.nullcontext()
        with contextlib.suppress(Exception), fresh:
            _compile(contender, _three_ops, engine, cold=True)(torch.randn(8))
    torch._dynamo.reset()


def _summarize(results: dict[str, dict[str, Any]]) -> None:
    for entry in results.values():
        times = entry.get("samples_ms")
        if times:
            entry.update(median_ms=statistics.median(times), min_ms=min(times), max_ms=max(times), n=len(times))


def _median(result: dict[str, Any], contender: str) -> float | None:
    entry = result["contenders"].get(contender, {})
    value = entry.get("median_ms")
    # a wrong result earns no speed-up: its cell says MISMATCH and it stays out of the geometric mean
    return None if "error" in entry or entry.get("mismatch") or value is None else float(value)


def _speedups(result: dict[str, Any]) -> dict[str, float | None]:
    mine = _median(result, "torchburn")
    out: dict[str, float | None] = {}
    for other in ("eager", "inductor"):
        theirs = _median(result, other)
        out[f"vs_{other}"] = theirs / mine if theirs is not None and mine else None
    return out


def _geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


# --- reporting -----------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def _cell(result: dict[str, Any], contender: str) -> str:
    entry = result["contenders"].get(contender)
    if entry is None:
        return "-"
    if "error" in entry:
        return "error"
    if entry.get("median_ms") is None:
        return "-"
    return _ms(entry["median_ms"]) + (" MISMATCH" if entry.get("mismatch") else "")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_table(results: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    """Rows x (eager, inductor, torchburn ms, torchburn speed-ups) as aligned text or a Markdown table."""
    header = ["row", "what", "eager ms", "inductor ms", "torchburn ms", "vs eager", "vs inductor"]
    lines = [
        [
            r["name"],
            r["description"],
            *(_cell(r, c) for c in CONTENDERS),
            _ratio(r["speedup"]["vs_eager"]),
            _ratio(r["speedup"]["vs_inductor"]),
        ]
        for r in results
    ]
    if markdown:
        out = ["| " + " | ".join(header) + " |", "| --- | --- | " + " | ".join(["---:"] * 5) + " |"]
        out += ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]

    def fmt(line: list[str]) -> str:
        left = [f"{line[i]:<{widths[i]}}" for i in range(2)]
        right = [f"{line[i]:>{widths[i]}}" for i in range(2, len(line))]
        return "  ".join(left + right).rstrip()

    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *(fmt(line) for line in lines)])


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _load(meta: dict[str, Any]) -> str:
    load = meta["loadavg_at_start"]
    return "?" if load is None else f"{load[0]:.2f}"


# from this many page faults per call a row's times say more about the heap than about the kernels
NOTED_FAULTS_PER_CALL = 8


def _notes(results: Sequence[dict[str, Any]]) -> Iterator[str]:
    for r in results:
        faults = {c: e["page_faults_per_call"] for c, e in r["contenders"].items() if "page_faults_per_call" in e}
        if any(n >= NOTED_FAULTS_PER_CALL for n in faults.values()):
            counts = ", ".join(f"{c} {n:.0f}" for c, n in faults.items())
            yield f"page faults per call in {r['name']}: {counts} (output memory the allocator had returned to the OS)"
        for contender, entry in r["contenders"].items():
            if "error" in entry:
                yield f"ERROR {r['name']} / {contender}: {entry['error'].splitlines()[0][:300]}"
            if entry.get("mismatch"):
                yield f"MISMATCH {r['name']} / {contender} vs eager: {' '.join(entry['mismatch'].split())[:300]}"
            if entry.get("fallback_ops"):
                ops = ", ".join(f"{op} x{n}" for op, n in sorted(entry["fallback_ops"].items()))
                yield f"fallback {r['name']} / {contender}: ran in eager: {ops}"


# --- command line --------------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    names = [row.name for row in ROWS]
    parser = argparse.ArgumentParser(
        prog="python -m torchburn.bench", description="Eager vs Inductor vs TorchBurn on CPU, float32."
    )
    parser.add_argument("--engine", default="native", help="TorchBurn engine (default: native)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch.set_num_threads(N)")
    parser.add_argument("--min-time", type=float, default=None, help="seconds per contender per row (default 1.0)")
    parser.add_argument("--quick", action="store_true", help=f"--min-time {QUICK_MIN_TIME} unless given")
    parser.add_argument("--rows", default=",".join(names), help=f"comma-separated subset of: {','.join(names)}")
    parser.add_argument("--skip-inductor", action="store_true", help="leave out torch.compile(backend='inductor')")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--json", type=Path, default=None, help="result file (default bench-results/bench-*.json)")
    args = parser.parse_args(argv)
    args.rows = [name.strip() for name in args.rows.split(",") if name.strip()]
    unknown = [name for name in args.rows if name not in names]
    if unknown or not args.rows:
        parser.error(f"unknown row(s) {','.join(unknown) or '(none given)'}; choose from {','.join(names)}")
    if args.min_time is None:
        args.min_time = QUICK_MIN_TIME if args.quick else 1.0
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    from .engines.discovery import resolve_engine

    try:
        engine = resolve_engine(args.engine)
    except TorchBurnError as exc:
        print(f"torchburn.bench: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    contenders = [c for c in CONTENDERS if not (args.skip_inductor and c == "inductor")]
    rows = [row for row in ROWS if row.name in args.rows]
    started = datetime.datetime.now()
    meta = {
        "timestamp": started.isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,  # other work skews timings
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchburn": __version__,
        "engine": engine.name,
        "engine_version": engine.version,
        # the engine's own account of where it runs (the native engine names its ISA level here)
        "engine_device": engine.availability().device_name,
        "min_time_s": args.min_time,
        "dtype": "float32",
        "contenders": contenders,
    }

    results: list[dict[str, Any]] = []
    primed = False
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", TorchBurnFallbackWarning)  # the notes under the table list fallbacks
        for i, row in enumerate(rows, 1):
            print(f"[{i}/{len(rows)}] {row.name}: {row.description}", file=sys.stderr, flush=True)
            if row.kind == "cold":
                if not primed:
                    _prime(contenders, args.engine)
                    primed = True
                per_contender = _cold_row(row, contenders, args.engine)
            else:
                per_contender = _throughput_row(row, contenders, args.engine, args.min_time)
            _summarize(per_contender)
            result = {"name": row.name, "description": row.description, "kind": row.kind, "tol": row.tol}
            result["contenders"] = per_contender
            result["speedup"] = _speedups(result)
            results.append(result)

    throughput = [r for r in results if r["kind"] == "throughput"]
    geomean = {
        key: _geomean([r["speedup"][key] for r in throughput if r["speedup"][key] is not None])
        for key in ("vs_eager", "vs_inductor")
    }
    counted = {key: sum(r["speedup"][key] is not None for r in throughput) for key in geomean}

    path = args.json or Path("bench-results") / f"bench-{engine.name}-{started:%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "geomean": geomean, "rows": results}, indent=1) + "\n")

    print(format_table(results, markdown=args.markdown))
    print()
    for note in _notes(results):
        print(note)
    means = ", ".join(
        f"{_ratio(geomean[key])} {key.replace('_', ' ')} ({counted[key]} rows)" for key in ("vs_eager", "vs_inductor")
    )
    print(f"torchburn geometric-mean speed-up over throughput rows: {means}")
    print(
        f"machine: {meta['cpu']}, {meta['cores']} cores, {args.threads} threads, load {_load(meta)}; "
        f"torch {torch.__version__}, torchburn {__version__}, engine {engine.name} {engine.version} "
        f"on {meta['engine_device']}; "
        f"median ms per call, min time {args.min_time:g} s per contender per row"
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
