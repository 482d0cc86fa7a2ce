"""PyTorch's OpInfo samples (float32, two per op) through every shipped engine, strict, against eager.

No sample may give a different value or let an exception escape; the share that runs on the engine
may only grow (the floors are the last measured shares, rounded down; ``nox -s opinfo`` prints the
per-op table).
"""

from __future__ import annotations

import pytest
from opinfo.sweep import report, sweep

import torchburn

# the least share of float32 samples each engine must run natively and correctly
FLOORS = {"native": 0.71, "wgpu": 0.55}
ENGINES = [e.name for e in torchburn.list_engines() if e.available and e.name in FLOORS]


@pytest.mark.parametrize("engine", ENGINES)
def test_opinfo_samples_run_or_fall_back_never_wrong(engine: str) -> None:
    result = sweep(engine)
    print(report(result))
    wrong = [r for r in result.results if r.outcome in ("mismatch", "error")]
    assert not wrong, "\n".join(f"{r.op}[{r.index}] {r.outcome}: {r.detail}" for r in wrong)
    assert result.pass_rate >= FLOORS[engine], result.summary()
