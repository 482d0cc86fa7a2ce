"""The Python ⇄ Rust crossing: no copies, the GIL released while Rust works, one foreign call per region.

Two tests read the native package's debugging API (``torchburn_native.debug_last_call()`` and
``debug_stats()``) and skip on the reference engine, which has no such API; the GIL test runs on any engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

Compile = Callable[..., Callable[..., Any]]
Ran = Callable[..., None]


def _native_api(engine_name: str) -> Any:
    if engine_name == "reference":
        pytest.skip("native-only API")
    import torchburn_native

    return torchburn_native


def _fused(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * 2 + y).relu()  # x * 2 is exact, so any evaluation order matches eager bit for bit


def test_inputs_and_output_cross_without_copies(
    engine_name: str, compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    native = _native_api(engine_name)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, generator=g)
    base = torch.randn(6, 8, generator=g)
    y = base[1:, ::2]  # (5, 4): storage offset 8, strides (8, 2)
    assert not y.is_contiguous() and y.storage_offset() > 0 and y.data_ptr() != base.data_ptr()
    fast = compile_engine(_fused)
    with torch.no_grad():
        out = fast(x, y)
        last = native.debug_last_call()
    torch.testing.assert_close(out, _fused(x, y), rtol=0, atol=0)
    assert set(last) >= {"inputs", "outputs"}, last
    assert x.data_ptr() in last["inputs"], f"x was copied before Rust read it: {last}"
    assert y.data_ptr() in last["inputs"], f"the strided view y was copied (made contiguous?): {last}"
    assert last["inputs"].index(x.data_ptr()) < last["inputs"].index(y.data_ptr()), "inputs not in region order"
    assert out.data_ptr() in last["outputs"], f"Rust wrote elsewhere and the result was copied: {last}"
    assert_engine_ran(3)  # mul, add, relu: one region


def test_gil_is_released_during_a_long_call(compile_engine: Compile, assert_engine_ran: Ran) -> None:
    """While one compiled call runs ~30 chained 512x512 matmuls, the main thread keeps running Python.

    The main thread counts loop iterations in time bins while a worker thread is inside the call. If the
    engine held the GIL in Rust, the main thread would be frozen for the whole call: the middle of the call
    would have no iterations at all. Up to three attempts absorb scheduling noise on a busy machine (a held
    GIL fails all three)."""
    steps = 30

    def chain(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        for _ in range(steps):
            a = a @ w
        return a

    g = torch.Generator().manual_seed(0)
    w, _ = torch.linalg.qr(torch.randn(512, 512, generator=g))  # orthogonal: the chain neither blows up nor dies
    a = torch.randn(512, 512, generator=g)
    fast = compile_engine(chain)
    with torch.no_grad():
        torch.testing.assert_close(fast(a, w), chain(a, w), rtol=1e-3, atol=1e-3)  # compile, warm up, check
    assert_engine_ran(steps)

    def attempt() -> tuple[bool, str]:
        span: dict[str, float] = {}
        result: list[torch.Tensor] = []

        def worker() -> None:
            with torch.no_grad():
                span["start"] = time.perf_counter()
                result.append(fast(a, w))
                span["end"] = time.perf_counter()

        stamps: list[float] = []
        thread = threading.Thread(target=worker)
        thread.start()
        while thread.is_alive():  # pure-Python work: it needs the GIL for every iteration
            stamps.append(time.perf_counter())
        thread.join()
        assert result, "the compiled call failed in the worker thread"
        start, end = span["start"], span["end"]
        duration = end - start
        bins = 20
        hit = [False] * bins
        for t in stamps:
            if start <= t < end:
                hit[min(int((t - start) / duration * bins), bins - 1)] = True
        middle = hit[bins // 4 : bins - bins // 4]  # the call's Python entry and exit are not in here
        in_middle = sum(1 for t in stamps if start + duration / 4 <= t < end - duration / 4)
        detail = f"call {duration * 1e3:.0f} ms; bins with progress {''.join('x' if h else '.' for h in hit)}"
        # a held GIL leaves the middle half empty; a released one shows progress (2 bins: busy cores share)
        return sum(middle) >= 2 and in_middle >= 50, detail

    details = []
    for _ in range(3):
        ok, detail = attempt()
        if ok:
            return
        details.append(detail)
    pytest.fail(
        "the main thread made (almost) no progress while the compiled call ran: GIL held?\n" + "\n".join(details)
    )


def test_one_foreign_call_per_region(engine_name: str, compile_engine: Compile, assert_engine_ran: Ran) -> None:
    native = _native_api(engine_name)

    def five_ops(x: torch.Tensor) -> torch.Tensor:
        return ((x + 1) * 3 - x).abs().neg()  # add, mul, sub, abs, neg: one region

    x = torch.randn(16, 33, generator=torch.Generator().manual_seed(0))
    fast = compile_engine(five_ops)
    with torch.no_grad():
        fast(x)  # compiles (may run the program once while doing so)
        before = native.debug_stats()["runs"]
        outs = [fast(x + i) for i in range(7)]
        after = native.debug_stats()["runs"]
    assert after - before == 7, f"7 calls of a one-region program made {after - before} program runs"
    for i, out in enumerate(outs):
        torch.testing.assert_close(out, five_ops(x + i), rtol=1e-5, atol=1e-5)
    assert_engine_ran(5)


def test_region_replans_when_strides_or_dtype_change_under_the_same_shape(engine_name: str) -> None:
    """A region reuses its last plan only while every argument keeps size, stride and dtype: a
    transposed or differently typed argument of the same shape must get its own plan, not be read
    through the old one."""
    if engine_name == "reference":
        pytest.skip("native-only API")
    from torchburn_native.program import CompiledRegion

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x * 2 + y).relu(),)

    from torch.fx.experimental.proxy_tensor import make_fx

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 6, generator=g), torch.randn(6, 6, generator=g)
    region = CompiledRegion(make_fx(f)(x, y))  # an ATen graph, as the backend hands over
    for a, b in [
        (x, y),
        (x, y),  # same layout: the cached plan
        (x.t(), y),  # same shape and dtype, other strides
        (x, y.t().contiguous().t()),
        (x.double(), y.double()),  # same strides, other dtype
        (x, y),  # back to the first layout
    ]:
        (got,) = region(a, b)
        torch.testing.assert_close(got, f(a, b)[0], rtol=0, atol=0)
    assert len(region._plans) == 4


def test_region_keeps_a_bounded_number_of_plans_least_recently_used_first(engine_name: str) -> None:
    """Inputs of ever new sizes must not grow a region's plans without end (each kept plan pins memory):
    beyond ``PLANS_KEPT`` signatures the least recently used plan goes, a size used again stays, and a
    dropped size is planned again and still computes eager's values."""
    if engine_name == "reference":
        pytest.skip("native-only API")
    from torch.fx.experimental.proxy_tensor import make_fx
    from torchburn_native.program import PLANS_KEPT, CompiledRegion, signature

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x * 2 + y).relu(),)

    g = torch.Generator().manual_seed(2)
    region = CompiledRegion(make_fx(f)(torch.randn(3, 5, generator=g), torch.randn(5, generator=g)))

    def call(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = torch.randn(rows, 5, generator=g), torch.randn(5, generator=g)
        (got,) = region(x, y)
        torch.testing.assert_close(got, f(x, y)[0], rtol=0, atol=0)
        return x, y

    seen = {1: signature(call(1))}
    kept = region._plans[seen[1]]
    for rows in range(2, PLANS_KEPT + 9):
        seen[rows] = signature(call(rows))
        call(1)  # used again after every new size: the oldest plan is never this one
        assert len(region._plans) <= PLANS_KEPT
    assert len(region._plans) == PLANS_KEPT
    assert region._plans.get(seen[1]) is kept, "a plan in use was dropped"
    assert seen[PLANS_KEPT + 8] in region._plans
    assert seen[2] not in region._plans and seen[8] not in region._plans  # the least recently used went
    assert signature(call(2)) in region._plans  # planned again, with eager's values


def test_threads_calling_with_more_sizes_than_plans_kept_all_get_eager_values(engine_name: str) -> None:
    """Plans dropped while other threads still run them (more sizes than ``PLANS_KEPT``, four threads
    at once): every call still computes eager's values, and the bound holds."""
    if engine_name == "reference":
        pytest.skip("native-only API")
    from torch.fx.experimental.proxy_tensor import make_fx
    from torchburn_native.program import PLANS_KEPT, CompiledRegion

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return ((x @ w).relu() * 2,)

    w = torch.randn(24, 16)
    region = CompiledRegion(make_fx(f)(torch.randn(3, 24), w))
    sizes = list(range(1, PLANS_KEPT + 9))
    failures: list[BaseException] = []

    def worker(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        try:
            for i in range(3 * len(sizes)):
                x = torch.randn(sizes[(seed * 7 + i) % len(sizes)], 24, generator=g)
                (got,) = region(x, w)
                torch.testing.assert_close(got, f(x, w)[0], rtol=1e-5, atol=1e-5)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert len(region._plans) <= PLANS_KEPT
