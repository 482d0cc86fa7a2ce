"""f32 products of at least 2^26 multiply-adds read B packed by MKL once per version of B, when B is
a region input (``kernels/gemm_packed.rs``), their bias, residual and activation included.

The packed copy is remade whenever B is another tensor, has new storage or was changed in place.
Where PyTorch has no MKL (or ``TORCHBURN_BLAS=own``) nothing is packed and the same values come out.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

Compile = Callable[..., Callable[..., Any]]
Ran = Callable[..., None]
Regions = Callable[[], list[Any]]


@pytest.fixture
def recent_regions(engine_name: str) -> Regions:
    """The native engine's regions compiled most recently (native-only API)."""
    if engine_name == "reference":
        pytest.skip("native-only API")
    from torchburn_native.program import recent_regions as regions

    return regions


def _packed_copies(region: Any) -> list[torch.Tensor]:
    """The packed copies the region holds now."""
    return [copy for spec, copy in region.derived_copies() if spec.packed_rows]


def _expect_packing() -> bool:
    import torchburn_native
    from torchburn_native import _native

    return torchburn_native.gemm_backend() == "mkl" and _native.packed_b_bytes(1, 1, 1, 1, 1) > 0


def _close(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    # against f64: the packed and the plain product sum in different orders, both f32-accurate
    want = (a.double() @ b.double()).float()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-3)


def test_a_large_product_reads_b_packed_and_sees_every_change_of_b(
    recent_regions: Regions, compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    torch.manual_seed(0)
    a = torch.randn(512, 1024)  # 512·1024·1024 = 2^29 multiply-adds: large enough to pack
    b = torch.randn(1024, 768)
    fast = compile_engine(lambda a, b: a @ b)
    _close(fast(a, b), a, b)
    region = recent_regions()[-1]
    copies = _packed_copies(region)
    assert len(copies) == (1 if _expect_packing() else 0)

    _close(fast(a, b), a, b)
    assert all(x is y for x, y in zip(copies, _packed_copies(region), strict=True)), "an unchanged B was repacked"

    b.mul_(-0.5)  # in place: the version counter moves
    _close(fast(a, b), a, b)
    b.data = torch.randn(1024, 768)  # new storage, same tensor object
    _close(fast(a, b), a, b)
    b = torch.randn(1024, 768)  # another tensor altogether
    _close(fast(a, b), a, b)
    a = torch.randn(512, 1024)  # A is read as it lies on every call
    _close(fast(a, b), a, b)
    assert_engine_ran()


def _operands(layout: str) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(A, B, whether B is packed) for each layout."""
    if layout == "transposed-a":
        return torch.randn(1024, 600).t(), torch.randn(1024, 640), True
    if layout == "row-strided-b":  # a row stride wider than the rows
        return torch.randn(600, 1024), torch.randn(1024, 700)[:, 3:643], True
    if layout == "broadcast-b":  # one row read for all k: CBLAS cannot take a zero stride
        return torch.randn(512, 1024), torch.randn(1, 768).expand(1024, 768), False
    if layout == "transposed-b":  # a column-major B with few columns
        return torch.randn(32768, 128), torch.randn(64, 128).t(), True
    # a Linear's weight as it reads it (``w.t()``): packed from the column-major layout
    return torch.randn(600, 1024), torch.randn(640, 1024).t(), True


@pytest.mark.parametrize(
    "layout", ["transposed-a", "row-strided-b", "transposed-b", "large-transposed-b", "broadcast-b"]
)
def test_packed_b_from_strided_operands(
    recent_regions: Regions, compile_engine: Compile, assert_engine_ran: Ran, layout: str
) -> None:
    torch.manual_seed(1)
    a, b, packed = _operands(layout)
    fast = compile_engine(lambda a, b: a @ b)
    _close(fast(a, b), a, b)
    assert len(_packed_copies(recent_regions()[-1])) == (1 if packed and _expect_packing() else 0)
    assert_engine_ran()


def test_fused_bias_residual_and_activation_run_around_a_packed_product(
    recent_regions: Regions, compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    """A bias with an activation, and a residual, fused into products that read one packed B."""
    torch.manual_seed(2)
    a, a2, b = torch.randn(512, 1024), torch.randn(512, 1024), torch.randn(1024, 768)
    bias, res = torch.randn(768), torch.randn(512, 768)
    fast = compile_engine(lambda a, a2, b, bias, res: (torch.relu(torch.addmm(bias, a, b)), a2 @ b + res))
    got_act, got_res = fast(a, a2, b, bias, res)
    want_act = torch.relu(a.double() @ b.double() + bias.double()).float()
    torch.testing.assert_close(got_act, want_act, rtol=1e-4, atol=2e-3)
    torch.testing.assert_close(got_res, (a2.double() @ b.double() + res.double()).float(), rtol=1e-4, atol=2e-3)
    region = recent_regions()[-1]
    plan = json.loads(next(iter(region._plans.values()))[1].plan_json)
    fused = [
        (i["bias"] is not None, i["residual"] is not None, i["act"]) for i in plan["instrs"] if i["kind"] == "matmul"
    ]
    assert sorted(fused, key=str) == sorted([(True, False, "relu"), (False, True, None)], key=str)
    # one copy: both products have 512 rows of A, so they read the same packed B
    assert len(_packed_copies(region)) == (1 if _expect_packing() else 0)
    assert_engine_ran()


def test_a_linear_layer_reads_its_weight_packed_and_sees_weight_changes(
    recent_regions: Regions, compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    """``nn.Linear`` + ReLU at 128x512 -> 1024 (2^26 multiply-adds): its weight, read as ``w.t()``, is
    packed; changing the weight in place, through ``.data`` or by a new Parameter is seen."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU()).eval()
    x = torch.randn(128, 512)
    fast = compile_engine(model)

    def check() -> None:
        with torch.no_grad():
            want = torch.relu(x.double() @ model[0].weight.double().t() + model[0].bias.double()).float()
            torch.testing.assert_close(fast(x), want, rtol=1e-4, atol=1e-3)

    check()
    assert len(_packed_copies(recent_regions()[-1])) == (1 if _expect_packing() else 0)
    with torch.no_grad():
        model[0].weight.mul_(-2.0)
    check()
    model[0].weight.data = torch.randn(1024, 512)
    check()
    model[0].weight = nn.Parameter(torch.randn(1024, 512))
    check()
    assert_engine_ran()


def test_small_and_f64_products_are_not_packed(
    recent_regions: Regions, compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    torch.manual_seed(3)
    for a, b in [
        (torch.randn(256, 256), torch.randn(256, 256)),  # 2^24 multiply-adds: split across threads
        (torch.randn(32, 512), torch.randn(512, 1024)),  # 2^24, a Linear at batch 32
        (torch.randn(512, 1024, dtype=torch.float64), torch.randn(1024, 768, dtype=torch.float64)),
    ]:
        fast = compile_engine(lambda a, b: a @ b)
        torch.testing.assert_close(fast(a, b), a @ b, rtol=1e-5, atol=1e-4)
        assert _packed_copies(recent_regions()[-1]) == []
    assert_engine_ran()


def test_threads_sharing_one_compiled_product_while_b_changes(
    recent_regions: Regions, compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    """Four threads call one compiled product, each alternating its own B with a shared one, so the
    packed copy is replaced while other threads run on the one before."""
    torch.manual_seed(4)
    a_s = [torch.randn(512, 1024) for _ in range(4)]
    b_s = [torch.randn(1024, 768) for _ in range(4)]
    shared = torch.randn(1024, 768)
    want = {(i, j): (a.double() @ b.double()).float() for i, a in enumerate(a_s) for j, b in ((0, b_s[i]), (1, shared))}
    fast = compile_engine(lambda a, b: a @ b)
    fast(a_s[0], shared)
    assert len(_packed_copies(recent_regions()[-1])) == (1 if _expect_packing() else 0)
    failures: list[str] = []

    def work(i: int) -> None:
        for r in range(6):
            b = shared if r % 2 else b_s[i]
            got = fast(a_s[i], b)
            if not torch.allclose(got, want[i, r % 2], rtol=1e-4, atol=2e-3):
                failures.append(f"thread {i}, call {r}: max error {(got - want[i, r % 2]).abs().max().item()}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert_engine_ran()


def test_plans_for_other_sizes_share_copies_and_keep_memory_bounded(
    recent_regions: Regions, compile_engine: Compile, assert_engine_ran: Ran
) -> None:
    """Inputs of many sizes (``dynamic=True``: one region, a plan per size): a row-major weight copy is
    shared by every size; packed copies, made per size, stay within ``DERIVED_PLANS_KEPT`` plans'
    worth however many sizes come."""
    from torchburn_native.program import DERIVED_PLANS_KEPT

    torch.manual_seed(6)
    small = nn.Linear(256, 512).eval()  # 8-16 rows: below the packing threshold, a row-major copy
    large = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()).eval()  # 64+ rows: packed per size
    fast_small = torch.compile(small, backend="torchburn", dynamic=True, options={"fallback": "error"})
    fast_large = torch.compile(large, backend="torchburn", dynamic=True, options={"fallback": "error"})
    with torch.no_grad():
        held = []
        for rows in (8, 12, 16):
            x = torch.randn(rows, 256)
            torch.testing.assert_close(fast_small(x), small(x), rtol=1e-4, atol=1e-4)
            held.append([copy for _, copy in recent_regions()[-1].derived_copies()])
        assert len(held[0]) == 1 and all(h[0] is held[0][0] for h in held), "each size made its own copy"

        for rows in range(64, 64 + 2 * (DERIVED_PLANS_KEPT + 4), 2):
            x = torch.randn(rows, 1024)
            want = torch.relu(x.double() @ large[0].weight.double().t() + large[0].bias.double()).float()
            torch.testing.assert_close(fast_large(x), want, rtol=1e-4, atol=1e-3)
            assert len(recent_regions()[-1].derived_copies()) <= DERIVED_PLANS_KEPT
        assert len(_packed_copies(recent_regions()[-1])) == (DERIVED_PLANS_KEPT if _expect_packing() else 0)
    assert_engine_ran()
