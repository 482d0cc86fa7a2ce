"""Run PyTorch's own OpInfo samples through the TorchBurn backend, strictly, and sort each sample into
pass / fallback / mismatch / error.

    python tests/opinfo/sweep.py --engine native [--samples 2] [--ops add,sum] [--json out.json]

For every OpInfo op that supports float32 on CPU, the first ``--samples`` sample inputs are called
eagerly and through ``torch.compile(backend="torchburn", options={"engine": E, "fallback": "error"})``:

- **pass**: the engine ran every node of the graph and the result matches eager;
- **fallback**: the engine declined a node (``FallbackError``; the reason is kept);
- **mismatch**: the compiled result differs from eager;
- **error**: any other exception escaped from the compiled call (a bug: the user would see it);
- **skipped**: not a question for the engine: eager itself raises, the op is random or returns
  uninitialised memory, or Dynamo hands the backend no graph (nothing to run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch._dynamo
from torch.utils import _pytree as pytree

import torchburn

# ops whose values are random or uninitialised: nothing to compare
UNCOMPARABLE = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform", "empty", "exponential")
UNCOMPARABLE_NAMES = {"cauchy", "geometric", "log_normal", "poisson", "nn.functional.rrelu", "new_empty_strided"}
RTOL = ATOL = 1e-4


@dataclass
class SampleResult:
    op: str
    index: int
    outcome: str  # pass | fallback | mismatch | error | skipped
    detail: str = ""


@dataclass
class Sweep:
    engine: str
    samples_per_op: int
    results: list[SampleResult] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> Counter[str]:
        return Counter(r.outcome for r in self.results)

    @property
    def considered(self) -> int:
        """Samples that are a question for the engine (everything but skipped)."""
        return sum(1 for r in self.results if r.outcome != "skipped")

    @property
    def pass_rate(self) -> float:
        return self.counts()["pass"] / max(self.considered, 1)

    def by_op(self) -> dict[str, Counter[str]]:
        table: dict[str, Counter[str]] = {}
        for r in self.results:
            table.setdefault(r.op, Counter())[r.outcome] += 1
        return table

    def summary(self) -> str:
        c = self.counts()
        return (
            f"{self.engine}: {c['pass']} of {self.considered} float32 samples pass ({100 * self.pass_rate:.1f}%), "
            f"{c['fallback']} fall back, {c['mismatch']} mismatch, {c['error']} errors "
            f"({c['skipped']} skipped; {len(self.by_op())} ops, {self.seconds:.0f} s)"
        )


def _uncomparable(name: str) -> bool:
    return name in UNCOMPARABLE_NAMES or any(word in name for word in UNCOMPARABLE)


def float32_ops(names: set[str] | None = None) -> Iterator[Any]:
    """The OpInfo entries that support float32 on CPU (those named, if given)."""
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        if names is not None and op.name not in names and f"{op.name}.{op.variant_test_name}" not in names:
            continue
        if torch.float32 in op.supported_dtypes("cpu"):
            yield op


def _op_name(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _as_call(op: Any, sample: Any) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """The sample as ``fn(*tensors)``: its tensors become graph inputs, everything else stays constant."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i] for i in positions]

    def fn(*given: torch.Tensor) -> Any:
        filled = list(leaves)
        for i, t in zip(positions, given, strict=True):
            filled[i] = t
        x, args, kwargs = pytree.tree_unflatten(filled, spec)
        return op.op(x, *args, **kwargs)

    return fn, tensors


def _clones(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]


def _engine_counts(engine: str) -> tuple[int, int]:
    rows = torchburn.coverage().get(engine, {})
    return sum(r["engine"] for r in rows.values()), sum(r["fallback"] for r in rows.values())


def _fallback_reason(e: BaseException) -> str:
    """The declined ops of a FallbackError (its indented lines), without the advice around them."""
    lines = [line.strip() for line in str(e).splitlines() if line.startswith("  ")]
    return "; ".join(lines)[:300] or str(e).splitlines()[0][:300]


def run_sample(engine: str, op: Any, index: int, sample: Any) -> SampleResult:
    name = _op_name(op)
    fn, tensors = _as_call(op, sample)
    try:
        expected = fn(*_clones(tensors))
    except Exception as e:  # eager refuses the sample: not a question for the engine
        return SampleResult(name, index, "skipped", f"eager raises {type(e).__name__}")
    torch._dynamo.reset()
    torchburn.reset_coverage()
    compiled = torch.compile(fn, backend="torchburn", options={"engine": engine, "fallback": "error"})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = compiled(*_clones(tensors))
    except torchburn.FallbackError as e:
        return SampleResult(name, index, "fallback", _fallback_reason(e))
    except Exception as e:
        cause: BaseException = e
        while cause.__cause__ is not None and not isinstance(cause, torchburn.FallbackError):
            cause = cause.__cause__
        if isinstance(cause, torchburn.FallbackError):
            return SampleResult(name, index, "fallback", _fallback_reason(cause))
        return SampleResult(
            name, index, "error", f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        )
    ran, fell = _engine_counts(engine)
    if ran == 0 and fell == 0:
        return SampleResult(name, index, "skipped", "no graph reached the backend")
    try:
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
    except Exception as e:
        return SampleResult(name, index, "mismatch", str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
    if fell:
        return SampleResult(name, index, "fallback", "counted fallback")
    return SampleResult(name, index, "pass")


def sweep(engine: str, samples_per_op: int = 2, names: set[str] | None = None, progress: bool = False) -> Sweep:
    result = Sweep(engine, samples_per_op)
    start = time.perf_counter()
    ops = list(float32_ops(names))
    for k, op in enumerate(ops):
        name = _op_name(op)
        if progress:
            print(f"[{k + 1}/{len(ops)}] {name}", file=sys.stderr, flush=True)
        torch.manual_seed(zlib.crc32(name.encode()))  # the same sample values on every run
        try:
            samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:samples_per_op]
        except Exception as e:
            result.results.append(SampleResult(name, 0, "skipped", f"no samples: {type(e).__name__}"))
            continue
        for index, sample in enumerate(samples):
            if _uncomparable(op.name):
                result.results.append(SampleResult(name, index, "skipped", "random or uninitialised values"))
                continue
            result.results.append(run_sample(engine, op, index, sample))
    result.seconds = time.perf_counter() - start
    return result


def report(result: Sweep, verbose: bool = False) -> str:
    lines = [f"{'op':40} pass fallback mismatch error skipped  reason"]
    for name, c in sorted(result.by_op().items()):
        if not verbose and c["pass"] + c["skipped"] == sum(c.values()):
            continue
        reasons = {r.detail for r in result.results if r.op == name and r.outcome in ("fallback", "mismatch", "error")}
        lines.append(
            f"{name:40} {c['pass']:4} {c['fallback']:8} {c['mismatch']:8} {c['error']:5} {c['skipped']:7}  "
            + "; ".join(sorted(reasons))[:200]
        )
    lines.append(result.summary())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="native")
    parser.add_argument("--samples", type=int, default=2, help="samples per op (default 2)")
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: all)")
    parser.add_argument("--json", help="write every sample's outcome here")
    parser.add_argument("--all", action="store_true", help="list ops that pass too")
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args(argv)
    names = set(args.ops.split(",")) if args.ops else None
    result = sweep(args.engine, args.samples, names, progress=args.progress)
    print(report(result, verbose=args.all))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**asdict(result), "summary": result.summary()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
