"""The execution model: strict results against eager, resident parameters, fusion, buffer reuse,
only outputs read back, and layouts (views, non-contiguous inputs, zero sizes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import torchburn
from torchburn_wgpu import program
from torchburn_wgpu.device import gpu
from torchburn_wgpu.program import recent_regions


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 256)).eval()


def test_the_mlp_example_runs_whole_on_the_gpu(
    gpu_compile: Callable[..., Any], assert_gpu_ran: Callable[..., None]
) -> None:
    model = _mlp()
    x = torch.randn(32, 512)
    with torch.no_grad():
        got = gpu_compile(model)(x)
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    assert_gpu_ran(3)


def test_parameters_upload_once_and_again_only_when_changed(gpu_compile: Callable[..., Any]) -> None:
    model = _mlp()
    x = torch.randn(8, 512)
    with torch.no_grad():
        fast = gpu_compile(model)
        fast(x)
        (plan,) = recent_regions()[-1].plans.values()
        first = plan.uploads  # every input once: 4 parameters and x
        assert first == 5
        fast(x)
        assert plan.uploads == first  # nothing changed: nothing uploaded
        x2 = torch.randn(8, 512)
        torch.testing.assert_close(fast(x2), model(x2), rtol=1e-4, atol=1e-4)
        assert plan.uploads == first + 1  # only the new activation
        model[0].weight.mul_(2)  # in place: the version counter moves
        torch.testing.assert_close(fast(x2), model(x2), rtol=1e-4, atol=1e-4)
        assert plan.uploads == first + 2


def test_each_call_submits_the_commands_recorded_during_the_last(gpu_compile: Callable[..., Any]) -> None:
    """From the third call on, a call submits a command buffer recorded while the GPU ran the previous
    one; inputs written between the calls (new tensors, in-place changes, new weights) still count."""
    model = _mlp()
    with torch.no_grad():
        fast = gpu_compile(model)
        xs = [torch.randn(8, 512) for _ in range(4)]
        torch.testing.assert_close(fast(xs[0]), model(xs[0]), rtol=1e-4, atol=1e-4)
        (plan,) = recent_regions()[-1].plans.values()
        for step, x in enumerate(xs[1:] * 2):
            if step == 3:
                x.mul_(-1.5)  # in place, after an earlier call uploaded it
            if step == 4:
                model[2].weight.add_(0.25)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
            assert plan._recorded[0] is not None  # the next call's commands, ready before it comes


def test_an_elementwise_chain_is_one_kernel(
    gpu_compile: Callable[..., Any], assert_gpu_ran: Callable[..., None]
) -> None:
    def chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid((x * y + 1.0).exp() - y) * 0.5

    x, y = torch.randn(300, 7), torch.randn(7)
    torch.testing.assert_close(gpu_compile(chain)(x, y), chain(x, y), rtol=1e-5, atol=1e-6)
    (plan,) = recent_regions()[-1].plans.values()
    assert [launch.family for launch in plan.launches] == ["elementwise"]
    assert_gpu_ran(5)


def test_a_reshape_between_elementwise_ops_keeps_them_one_kernel(gpu_compile: Callable[..., Any]) -> None:
    torch.manual_seed(0)
    ffn = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)).eval()

    def block(x: torch.Tensor) -> torch.Tensor:
        # the second Linear splits k; its sum and bias are reshaped to [4, 32, 64] and meet the residual
        return ffn(x) + x

    def chain(x: torch.Tensor) -> torch.Tensor:
        return (torch.sin(x) * 2).reshape(6, 5, 7).unsqueeze(0).squeeze(0).exp() + 1

    x = torch.randn(4, 32, 64)
    with torch.no_grad():
        torch.testing.assert_close(gpu_compile(block)(x), block(x), rtol=1e-4, atol=1e-5)
    (plan,) = recent_regions()[-1].plans.values()
    assert [launch.family for launch in plan.launches] == ["matmul", "elementwise", "matmul", "elementwise"]
    y = torch.randn(30, 7)
    torch.testing.assert_close(gpu_compile(chain)(y), chain(y), rtol=1e-5, atol=1e-5)
    (plan,) = recent_regions()[-1].plans.values()
    assert [launch.family for launch in plan.launches] == ["elementwise"]


def test_intermediates_share_buffers(gpu_compile: Callable[..., Any]) -> None:
    torch.manual_seed(1)
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(6)]).eval()
    x = torch.randn(16, 64)
    with torch.no_grad():
        torch.testing.assert_close(gpu_compile(layers)(x), layers(x), rtol=1e-4, atol=1e-5)
    (plan,) = recent_regions()[-1].plans.values()
    intermediates = {s for launch in plan.launches for s in launch.slots[: launch.writes]}
    buffers = {id(plan.buffers[s]) for s in intermediates}
    assert len(intermediates) >= 12 and len(buffers) <= 4, (len(intermediates), len(buffers))


def test_views_and_non_contiguous_inputs(gpu_compile: Callable[..., Any], assert_gpu_ran: Callable[..., None]) -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a.t() @ b[:, 1::2], (a.permute(1, 0)[2:, :] * 3).sum(0)

    a = torch.randn(9, 6)
    b = torch.randn(12, 9).t()  # non-contiguous input
    assert not b.is_contiguous()
    for got, want in zip(gpu_compile(f)(a, b), f(a, b), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert_gpu_ran(4)


def test_zero_sizes_and_special_values(gpu_compile: Callable[..., Any], assert_gpu_ran: Callable[..., None]) -> None:
    def f(x: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.relu(x) * 2, x.amax(-1), torch.softmax(x, -1), e + 1, e.sum(0)

    x = torch.tensor([[float("nan"), 1.0, 2.0], [float("inf"), -1.0, 0.0], [float("-inf"), 3.0, -3.0]])
    e = torch.empty(0, 4)
    for got, want in zip(gpu_compile(f)(x, e), f(x, e), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True)
    assert_gpu_ran(5)


def test_a_tensor_beyond_the_adapters_binding_limit_is_refused_clearly(
    gpu_compile: Callable[..., Any], monkeypatch: Any
) -> None:
    import pytest

    import torchburn
    from torchburn_wgpu.device import gpu

    monkeypatch.setattr(gpu(), "max_binding_bytes", 4096)  # as if the adapter allowed 4 KiB per binding
    small, large = torch.randn(32, 32), torch.randn(64, 64)  # 4 KiB fits, 16 KiB does not
    torch.testing.assert_close(gpu_compile(lambda x: x * 2)(small), small * 2)
    with pytest.raises(torchburn.FallbackError, match=r"16384 bytes exceeds the adapter's largest storage binding"):
        gpu_compile(lambda x: x * 3)(large)


def test_a_lost_device_is_reported_not_waited_on(gpu_compile: Callable[..., Any], monkeypatch: Any) -> None:
    import pytest

    from torchburn_wgpu.device import DeviceLost, gpu

    f = gpu_compile(lambda x: x + 1)
    x = torch.randn(8)
    torch.testing.assert_close(f(x), x + 1)
    # what the device's `lost` callback records when the driver resets or the GPU goes away
    monkeypatch.setattr(gpu(), "lost", "the driver reset the device")
    # strict: reported at once as the engine's failure, carrying the device's message
    with pytest.raises(
        torchburn.FallbackError, match=rf"{DeviceLost.__name__}: .*was lost: the driver reset the device"
    ):
        f(x)
    # by default the program goes on in PyTorch eager, warned
    torch._dynamo.reset()
    g = torch.compile(lambda x: x + 1, backend="torchburn", options={"engine": "wgpu"})
    with pytest.warns(torchburn.TorchBurnFallbackWarning, match="was lost"):
        torch.testing.assert_close(g(x), x + 1)


@pytest.mark.parametrize("ahead", [True, False], ids=["paged_in_ahead", "paged_in_by_the_copy"])
@pytest.mark.parametrize("spin", [True, False], ids=["spinning_wait", "blocking_wait"])
def test_outputs_read_back_alike_however_they_are_paged_in_and_waited_for(
    gpu_compile: Callable[..., Any], assert_gpu_ran: Callable[..., None], monkeypatch: Any, ahead: bool, spin: bool
) -> None:
    """Float outputs up to PREFAULT_MAX_BYTES are allocated (and paged in) while the GPU runs, larger
    ones by the copy; integer and bool outputs are converted from 32-bit words either way; the wait
    spins before it blocks, or blocks at once. Every combination reads back the same values."""
    import torchburn_wgpu.program as program

    monkeypatch.setattr(program, "PREFAULT_MAX_BYTES", program.PREFAULT_MAX_BYTES if ahead else 0)
    monkeypatch.setattr(program, "SPIN_SECONDS", program.SPIN_SECONDS if spin else 0.0)
    made: list[bool] = []
    fresh = program._fresh_output

    def counting(out: Any) -> torch.Tensor | None:
        tensor = fresh(out)
        made.append(tensor is not None)
        return tensor

    monkeypatch.setattr(program, "_fresh_output", counting)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (x * 2 + 1, x.argmax(dim=1), x > 0.5)

    x = torch.randn(300, 257)
    fast = gpu_compile(fn)
    for _ in range(3):  # the first call through wgpu-py's API, the later ones through the raw path
        for got, want in zip(fast(x), fn(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert_gpu_ran(3)
    assert made and any(made) is ahead  # only the float output is ever paged in ahead


def _biased_gelu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x * 1.5 + b)


# (name, function, inputs, whether its kernel moves four elements per load and store)
VECTOR_CASES: list[tuple[str, Callable[..., Any], Callable[[], tuple[torch.Tensor, ...]], bool]] = [
    ("row_bias", _biased_gelu, lambda: (torch.randn(64, 32), torch.randn(32)), True),
    ("scalar_tensor", lambda x, s: x * s - 1, lambda: (torch.randn(1000), torch.tensor(0.25)), True),
    ("bool_out", lambda x, y: (x > y) & (x > 0), lambda: (torch.randn(12, 8), torch.randn(8)), True),
    ("int_out", lambda i, j: i * 3 - j, lambda: (torch.randint(-50, 50, (16, 4)), torch.randint(-9, 9, (4,))), True),
    ("index_in_expr", lambda x: x + torch.arange(x.numel()).view_as(x), lambda: (torch.randn(8, 16),), True),
    ("odd_numel", _biased_gelu, lambda: (torch.randn(63, 5), torch.randn(5)), False),
    ("run_not_whole_vectors", _biased_gelu, lambda: (torch.randn(64, 6), torch.randn(6)), False),
    ("unaligned_slice", lambda x: torch.sigmoid(x[1:]), lambda: (torch.randn(261),), False),
    ("transposed", lambda x: torch.tanh(x.t()) + 1, lambda: (torch.randn(16, 8),), False),
    ("column_broadcast", lambda x, c: x - c, lambda: (torch.randn(16, 8), torch.randn(16, 1)), False),
    ("buffer_as_vector_and_scalar", lambda x: x / x[0, 0], lambda: (torch.randn(8, 8) + 3,), False),
    ("half", lambda x: x * 2 + 1, lambda: (torch.randn(32, 8).half(),), False),
]


@pytest.mark.parametrize(("fn", "make", "vector"), [c[1:] for c in VECTOR_CASES], ids=[c[0] for c in VECTOR_CASES])
def test_elementwise_kernels_move_vec4_where_layouts_allow_and_scalars_elsewhere(
    gpu_compile: Callable[..., Any],
    assert_gpu_ran: Callable[..., None],
    fn: Callable[..., Any],
    make: Callable[[], tuple[torch.Tensor, ...]],
    vector: bool,
) -> None:
    """The vec4 path needs every operand aligned to four elements and read either in the output's
    order, as a repeated run of whole vectors (a bias), or as one scalar; the others take the
    scalar path. Both give eager's values."""
    torch.manual_seed(0)
    inputs = make()
    if any(x.dtype == torch.float16 for x in inputs) and not gpu().f16:
        pytest.skip("this adapter has no shader-f16 (float16 nodes are then declared unsupported)")
    torch.testing.assert_close(gpu_compile(fn)(*inputs), fn(*inputs), rtol=1e-5, atol=1e-5)
    assert_gpu_ran(1)
    (plan,) = recent_regions()[-1].plans.values()
    kernels = [launch.source for launch in plan.launches if launch.family == "elementwise"]
    assert kernels
    assert all(("array<vec4<" in source) == vector for source in kernels), kernels[0][-600:]


def test_kernel_time_by_gpu_timestamps_is_within_the_submissions_wall_time(gpu_compile: Callable[..., Any]) -> None:
    """``pass_seconds`` reads the adapter's clock in nanoseconds: one run of a region's kernels takes
    more than nothing and less than the wall time of submitting and waiting for it."""
    import time

    from torchburn_wgpu.timing import pass_seconds, recording_plans

    chain = gpu_compile(lambda x: torch.nn.functional.gelu(x * 2) + 1)
    x = torch.randn(1 << 18)
    chain(x)
    with recording_plans() as plans:
        chain(x)
    (plan,) = plans
    if not plan.gpu.timestamps:
        assert pass_seconds(plan) is None
        return
    by_clock = pass_seconds(plan, runs=5)
    started = time.perf_counter()
    torch.testing.assert_close(chain(x), torch.nn.functional.gelu(x * 2) + 1)
    wall = time.perf_counter() - started
    assert by_clock is not None and 0 < by_clock < wall, (by_clock, wall)


def test_a_region_called_with_another_layout_plans_again_and_back(gpu_compile: Callable[..., Any]) -> None:
    """A call whose arguments match the last call's layouts reuses its plan without building a
    signature; one that does not (here a transposed input of the same shape) gets its own plan, and
    the first layout its first plan again."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    x = torch.randn(8, 8)
    gpu_compile(f)(x)
    region = recent_regions()[-1]
    xt = torch.randn(8, 8).t()
    for arg in (x, xt, xt, x):
        (got,) = region(arg)
        torch.testing.assert_close(got, f(arg))
    assert len(region.plans) == 2
    assert region.plan([x]) is region.plans[program.signature([x])]


def test_a_region_keeps_a_bounded_number_of_plans_least_recently_used_first(gpu_compile: Callable[..., Any]) -> None:
    """Each plan holds GPU buffers, so inputs of ever new sizes must not add plans without end: beyond
    ``PLANS_KEPT`` signatures the least recently used plan goes, a size used again keeps its plan, and
    a dropped size is planned again and still computes eager's values."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    gpu_compile(f)(torch.randn(3, 5))
    region = recent_regions()[-1]

    def call(rows: int) -> tuple[Any, ...]:
        x = torch.randn(rows, 5)
        (got,) = region(x)
        torch.testing.assert_close(got, f(x))
        return program.signature([x])

    seen = {1: call(1)}
    kept = region.plans[seen[1]]
    for rows in range(2, program.PLANS_KEPT + 5):
        seen[rows] = call(rows)
        call(1)  # used again after every new size: never the least recently used
        assert len(region.plans) <= program.PLANS_KEPT
    assert len(region.plans) == program.PLANS_KEPT
    assert region.plans.get(seen[1]) is kept, "a plan in use was dropped"
    assert seen[program.PLANS_KEPT + 4] in region.plans
    assert seen[2] not in region.plans and seen[4] not in region.plans
    assert call(2) in region.plans  # planned again, with eager's values


def test_reductions_over_values_with_no_elements(gpu_compile: Callable[..., Any]) -> None:
    # the zero-element product is never computed (its launch is empty) but the sum still binds it
    a, b = torch.randn(3, 0), torch.randn(3, 0)
    out = gpu_compile(lambda a, b: ((a * b).sum(-1), torch.linalg.det(a[:0, :0])))(a, b)
    torch.testing.assert_close(out, ((a * b).sum(-1), torch.tensor(1.0)))


def test_a_fused_expression_over_more_buffers_than_a_kernel_binds_is_split(gpu_compile: Callable[..., Any]) -> None:
    xs = [torch.randn(7) for _ in range(gpu().max_storage_buffers + 8)]  # one fused kernel would read all

    def total(*xs: torch.Tensor) -> torch.Tensor:
        out = xs[0]
        for k, x in enumerate(xs[1:]):
            out = out * x + k  # each partial result is used once: one expression over every input
        return out

    torch.testing.assert_close(gpu_compile(total)(*xs), total(*xs))
