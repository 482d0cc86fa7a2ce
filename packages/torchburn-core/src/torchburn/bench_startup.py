"""First call of a compiled model in a fresh process: ``python -m torchburn.bench_startup``.

What a user waits for after starting a program: from ``torch.compile(model)(x)`` (plus the backward
for training workloads) to its result, in a new Python process each time, imports done. Contenders:

- ``dynamo``: ``backend="eager"``, Dynamo alone (the floor every backend pays);
- ``aot_eager``: Dynamo plus AOTAutograd, no code generation;
- ``inductor_warm``: Inductor with its FX-graph and AOTAutograd caches primed by an earlier process;
- ``torchburn_cold``: TorchBurn with an empty cache dir;
- ``torchburn_warm``: TorchBurn with the cache dir an earlier process filled (the warm-start cache).

Each contender runs ``--repeat`` times, interleaved, and the table gives medians and the ratio to
``dynamo``. JSON goes to ``bench-results/startup-*.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CONTENDERS = ("dynamo", "aot_eager", "inductor_warm", "torchburn_cold", "torchburn_warm")
WORKLOADS = {
    "resnet18_nograd": "ResNet-18 1x3x224x224, eval, under torch.no_grad()",
    "resnet18_grad": "ResNet-18 1x3x224x224, eval, grad enabled (forward only)",
    "resnet18_train": "ResNet-18 8x3x64x64, train mode, forward + backward",
}


def _child(workload: str, backend: str, engine: str, threads: int) -> dict[str, Any]:
    """Runs in the fresh process: build the model, time the first compiled call."""
    import contextlib
    import importlib

    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model: torch.nn.Module = importlib.import_module("torchvision.models").resnet18()
    train = workload == "resnet18_train"
    model.train(train)
    x = torch.randn(8, 3, 64, 64) if train else torch.randn(1, 3, 224, 224)
    options: dict[str, Any] | None = {"engine": engine, "fallback": "error"} if backend == "torchburn" else None
    grad = contextlib.nullcontext() if workload != "resnet18_nograd" else torch.no_grad()
    start = time.perf_counter()
    with grad:
        out = torch.compile(model, backend=backend, options=options)(x)
        if train:
            out.sum().backward()
    elapsed = time.perf_counter() - start
    result: dict[str, Any] = {"seconds": elapsed}
    if backend == "torchburn":
        import torchburn

        info = torchburn.cache_info()
        result["lowered_hits"] = info["lowered_hits"]
    return result


def _run(workload: str, contender: str, engine: str, threads: int, cache: Path, inductor_cache: Path) -> dict[str, Any]:
    backend = {"dynamo": "eager", "aot_eager": "aot_eager", "inductor_warm": "inductor"}.get(contender, "torchburn")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(inductor_cache))
    if contender == "torchburn_cold":
        env["TORCHBURN_CACHE_DIR"] = tempfile.mkdtemp(prefix="tb-startup-cold-")
    else:
        env["TORCHBURN_CACHE_DIR"] = str(cache)
    code = (
        "import json, sys; from torchburn.bench_startup import _child; "
        f"print('RESULT' + json.dumps(_child({workload!r}, {backend!r}, {engine!r}, {threads})))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or "RESULT" not in done.stdout:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {"error": tail[0][:300]}
    result: dict[str, Any] = json.loads(done.stdout.split("RESULT", 1)[1])
    return result


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m torchburn.bench_startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="native", help="TorchBurn engine (default: native)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads in each process")
    parser.add_argument("--repeat", type=int, default=3, help="processes per contender and workload (default 3)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {','.join(WORKLOADS)}")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma-separated: {','.join(CONTENDERS)}")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--json", type=Path, default=None, help="result file (default bench-results/startup-*.json)")
    args = parser.parse_args(argv)
    for name, allowed in (("workloads", WORKLOADS), ("contenders", CONTENDERS)):
        chosen = [w for w in getattr(args, name).split(",") if w]
        unknown = [w for w in chosen if w not in allowed]
        if unknown or not chosen:
            parser.error(f"unknown {name} {','.join(unknown) or '(none)'}; choose from {','.join(allowed)}")
        setattr(args, name, chosen)
    if args.repeat < 1 or args.threads < 1:
        parser.error("--repeat and --threads must be at least 1")
    return args


def _table(rows: list[dict[str, Any]], contenders: Sequence[str], markdown: bool) -> str:
    header = ["workload", *contenders, *(f"{c} / dynamo" for c in contenders if c != "dynamo")]
    lines = []
    for row in rows:
        medians = row["median_s"]
        base = medians.get("dynamo")
        cells = [row["workload"]]
        cells += [
            f"{medians[c]:.2f} s" if medians.get(c) is not None else row["errors"].get(c, "n/a") for c in contenders
        ]
        cells += [
            f"{medians[c] / base:.2f}x" if base and medians.get(c) is not None else "n/a"
            for c in contenders
            if c != "dynamo"
        ]
        lines.append(cells)
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(out + ["| " + " | ".join(cells) + " |" for cells in lines])
    widths = [max(len(str(r[i])) for r in [header, *lines]) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *lines])


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    from . import __version__
    from .engines.discovery import resolve_engine

    engine = resolve_engine(args.engine)
    started = datetime.datetime.now()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tb-startup-") as scratch:
        for workload in args.workloads:
            cache, inductor_cache = Path(scratch, workload, "torchburn"), Path(scratch, workload, "inductor")
            print(f"{workload}: priming the warm caches", file=sys.stderr, flush=True)
            if "torchburn_warm" in args.contenders:
                _run(workload, "torchburn_warm", args.engine, args.threads, cache, inductor_cache)
            if "inductor_warm" in args.contenders:
                _run(workload, "inductor_warm", args.engine, args.threads, cache, inductor_cache)
            samples: dict[str, list[float]] = {c: [] for c in args.contenders}
            errors: dict[str, str] = {}
            for i in range(args.repeat):
                for contender in args.contenders:
                    result = _run(workload, contender, args.engine, args.threads, cache, inductor_cache)
                    if "error" in result:
                        errors[contender] = result["error"]
                        continue
                    if contender == "torchburn_warm" and result.get("lowered_hits", 0) < 1:
                        errors[contender] = "the warm process did not hit the warm-start cache"
                        continue
                    samples[contender].append(result["seconds"])
                    print(
                        f"  [{i + 1}/{args.repeat}] {contender}: {result['seconds']:.2f} s", file=sys.stderr, flush=True
                    )
            medians = {c: statistics.median(s) if s else None for c, s in samples.items()}
            rows.append({"workload": workload, "samples_s": samples, "median_s": medians, "errors": errors})
    meta = {
        "timestamp": started.isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "python": platform.python_version(),
        "torchburn": __version__,
        "engine": engine.name,
        "engine_device": engine.availability().device_name,
        "repeat": args.repeat,
        "workloads": {w: WORKLOADS[w] for w in args.workloads},
    }
    path = args.json or Path("bench-results") / f"startup-{engine.name}-{started:%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(_table(rows, args.contenders, args.markdown))
    print(
        f"median seconds of the first compiled call in a fresh process ({args.repeat} processes each), "
        f"engine {engine.name} on {meta['engine_device']}, {args.threads} threads"
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
