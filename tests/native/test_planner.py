"""What the native engine's planner promises: fusion, epilogues, buffer reuse, threads, ISA, op table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import torchburn_native
from torchburn_native.program import recent_regions

import torchburn

STRICT = {"engine": "native", "fallback": "error"}


def _compile_and_check(fn, *args, rtol=1e-5, atol=1e-5):  # type: ignore[no-untyped-def]
    torchburn.reset_coverage()
    compiled = torch.compile(fn, backend="torchburn", options=STRICT)
    with torch.no_grad():
        got = compiled(*args)
        want = fn(*args)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    ran = sum(row["engine"] for row in torchburn.coverage()["native"].values())
    assert ran > 0
    return recent_regions()[-1].describe()[-1]


def test_elementwise_chain_is_one_sweep() -> None:
    x, y = torch.randn(1000, 257), torch.randn(257)
    plan = _compile_and_check(lambda a, b: ((a * 1.5 + b).relu() - 0.25).sigmoid() * b, x, y)
    assert plan["instructions"] == ["elementwise"]


@pytest.mark.parametrize(("act", "name"), [(torch.relu, "relu"), (F.gelu, "gelu"), (torch.tanh, "tanh")])
def test_bias_and_activation_fused_into_gemm(act, name) -> None:  # type: ignore[no-untyped-def]
    lin = torch.nn.Linear(64, 96)
    plan = _compile_and_check(lambda t: act(lin(t)), torch.randn(33, 64), rtol=1e-4, atol=1e-5)
    assert plan["instructions"] == ["matmul"]
    assert plan["activations"] == [name]


@pytest.mark.parametrize("bias_shape", [(160,), (1, 160), (130, 1), (130, 160)], ids=["row", "row2d", "column", "full"])
@pytest.mark.parametrize("size", ["small", "parallel"])
def test_gemm_bias_of_every_broadcast_with_beta_alpha_and_relu(bias_shape: tuple[int, ...], size: str) -> None:
    """The bias is added per block of the output, with the activation after the block's product
    (row and full biases, contiguous along the row) or written before it (a column bias): every
    broadcast of it must land on the right elements, with beta, on the serial path and when the
    product is split over threads."""
    k = 8 if size == "small" else 200
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(130, k, generator=g), torch.randn(k, 160, generator=g)
    bias = torch.randn(bias_shape, generator=g)
    plan = _compile_and_check(
        lambda x, y, c: torch.addmm(c, x, y, beta=0.5, alpha=2.0).relu(), a, b, bias, rtol=1e-4, atol=1e-4
    )
    assert plan["instructions"] == ["matmul"]
    assert plan["activations"] == ["relu"]


def test_attention_reads_a_fused_projection_in_place_and_writes_the_next_ones_layout() -> None:
    """In an encoder layer q, k and v are strided slices of one [b, t, 3, h, d] product and the
    attention output goes on as [b, t, h·d]: attention reads and writes those layouts in place, so
    no copy sits between the three products."""
    torch.manual_seed(3)
    layer = torch.nn.TransformerEncoderLayer(96, 4, dim_feedforward=128, batch_first=True).eval()
    plan = _compile_and_check(layer, torch.randn(3, 50, 96), rtol=1e-4, atol=1e-4)
    assert plan["instructions"][:3] == ["matmul", "sdpa", "matmul"], plan["instructions"]


def test_attention_after_multihead_attentions_own_copies() -> None:
    # nn.MultiheadAttention called directly makes q, k and v contiguous itself (sequence-first here)
    torch.manual_seed(4)
    mha = torch.nn.MultiheadAttention(96, 4).eval()
    x = torch.randn(50, 3, 96)
    plan = _compile_and_check(lambda t: mha(t, t, t, need_weights=False)[0], x, rtol=1e-4, atol=1e-5)
    assert "sdpa" in plan["instructions"]


def _conv_instrs() -> list[dict]:  # type: ignore[type-arg]
    region = recent_regions()[-1]
    _, planned = next(iter(region._plans.values()))
    return [i for i in json.loads(planned.plan_json)["instrs"] if i["kind"] == "conv2d"]


@pytest.mark.parametrize(
    ("c_in", "c_out", "size", "kernel", "batch"),
    [(32, 48, (20, 17), 3, 2), (16, 8, (13, 24), 5, 1), (24, 24, (12, 12), 3, 3)],
)
def test_same_convolutions_run_as_shifted_gemms(
    c_in: int, c_out: int, size: tuple[int, int], kernel: int, batch: int
) -> None:
    torch.manual_seed(c_in + kernel)
    conv = torch.nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2).eval()
    x = torch.randn(batch, c_in, *size)
    _compile_and_check(conv, x, rtol=1e-4, atol=1e-4)
    (instr,) = _conv_instrs()
    assert instr["weight_taps"]["shape"] == [kernel * kernel, c_out, c_in]


def test_shifted_convolution_follows_a_weight_changed_in_place() -> None:
    torch.manual_seed(5)
    conv = torch.nn.Conv2d(16, 16, 3, padding=1).eval()
    x = torch.randn(1, 16, 14, 14)
    compiled = torch.compile(conv, backend="torchburn", options=STRICT)
    with torch.no_grad():
        compiled(x)
        conv.weight.mul_(-0.5)  # the tap-major copy must be made again
        torch.testing.assert_close(compiled(x), conv(x), rtol=1e-4, atol=1e-4)
    assert _conv_instrs()[0]["weight_taps"] is not None


@pytest.mark.parametrize(
    ("stride", "padding", "size", "groups"),
    [(2, 1, 28, 1), (1, 0, 28, 1), (1, 1, 7, 1), (1, 1, 28, 2)],
    ids=["strided", "valid", "small-plane", "grouped"],
)
def test_other_convolutions_keep_im2col(stride: int, padding: int, size: int, groups: int) -> None:
    torch.manual_seed(6)
    conv = torch.nn.Conv2d(32, 32, 3, stride=stride, padding=padding, groups=groups).eval()
    _compile_and_check(conv, torch.randn(1, 32, size, size), rtol=1e-4, atol=1e-4)
    assert _conv_instrs()[0]["weight_taps"] is None


def test_memory_plan_reuses_intermediate_buffers() -> None:
    w = [torch.randn(128, 128) / 10 for _ in range(6)]

    def chain(x: torch.Tensor) -> torch.Tensor:
        for m in w:
            x = torch.softmax(x @ m, dim=-1) * 4
        return x

    plan = _compile_and_check(chain, torch.randn(64, 128), rtol=1e-4, atol=1e-6)
    assert plan["instructions"].count("matmul") == 6
    # twelve intermediates live one or two at a time: the arena holds far fewer than all of them
    assert plan["arena_bytes"] * 3 <= plan["intermediate_bytes"]


def _threads_in_subprocess(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "import torch, torchburn_native; torch.set_num_threads(2); print(torchburn_native.num_threads())"
    full = {k: v for k, v in os.environ.items() if k != "TORCHBURN_NUM_THREADS"} | env
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_thread_count_from_env_or_torch() -> None:
    assert _threads_in_subprocess({"TORCHBURN_NUM_THREADS": "1"}).stdout.strip() == "1"
    assert _threads_in_subprocess({}).stdout.strip() == "2"
    bad = _threads_in_subprocess({"TORCHBURN_NUM_THREADS": "lots"})
    assert bad.returncode != 0
    assert "TORCHBURN_NUM_THREADS must be a positive integer, got 'lots'" in bad.stderr


_GEMM_LAYOUTS = """
import torch, torchburn, torchburn_native
torch.manual_seed(0)
a, b = torch.randn(67, 45, dtype=torch.float64), torch.randn(45, 31, dtype=torch.float64)
cases = [
    (lambda x, y: x @ y, a.float(), b.float()),                                # row-major
    (lambda x, y: x.t() @ y.t(), a.t().contiguous().float(), b.t().contiguous().float()),  # column-major
    (lambda x, y: x[3:40:2, 5:] @ y[5:, ::3], a.float(), b.float()),          # strided slices
    (lambda x, y: torch.relu(x @ y + 1.5), a, b),                              # f64 with an epilogue
    (lambda x, y: x[:1] @ y, a.float(), b.float()),                            # one row
]
# products of 2**28 multiply-adds and more run on MKL's own threading when it is the backend
big_a, big_b = torch.randn(640, 512, dtype=torch.float64), torch.randn(512, 1024, dtype=torch.float64)
big = [
    (lambda x, y: x @ y, big_a.float(), big_b.float()),
    (lambda x, y: x.t() @ y.t(), big_a.t().contiguous().float(), big_b.t().contiguous().float()),
    (lambda x, y: x[:, 1:] @ y[1:], big_a.float(), big_b.float()),
    (lambda x, y: x @ y, big_a, big_b),
]
worst = [0.0, 0.0]
for group, batch in enumerate((cases, big)):
    for fn, x, y in batch:
        got = torch.compile(fn, backend="torchburn", options={"engine": "native", "fallback": "error"})(x, y)
        want = fn(x.double(), y.double())
        worst[group] = max(worst[group], float((got.double() - want).abs().max()))
print(torchburn_native.gemm_backend(), *worst)
"""


def _gemm_in_subprocess(blas: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TORCHBURN_BLAS"}
    if blas is not None:
        env["TORCHBURN_BLAS"] = blas
    return subprocess.run([sys.executable, "-c", _GEMM_LAYOUTS], env=env, capture_output=True, text=True, timeout=300)


def test_gemm_runs_on_pytorchs_mkl_or_the_crate_with_the_same_results() -> None:
    from torchburn_native.engine import host_blas_matches_isa

    # under a lower TORCHBURN_ISA the products stay off MKL, which would run its widest kernels
    has_mkl = sys.platform.startswith("linux") and torch.backends.mkl.is_available() and host_blas_matches_isa()
    for blas, backend in [(None, "mkl" if has_mkl else "gemm-crate"), ("own", "gemm-crate")]:
        out = _gemm_in_subprocess(blas)
        assert out.returncode == 0, out.stderr
        name, worst, worst_big = out.stdout.split()
        assert name == backend
        assert float(worst) < 1e-4  # f32 sums of 45 products of unit normals, against f64
        assert float(worst_big) < 1e-3  # of 512 products
    bad = _gemm_in_subprocess("openblas")
    assert bad.returncode != 0
    assert "TORCHBURN_BLAS must be one of torch, own, got 'openblas'" in bad.stderr


def test_isa_is_reported_and_in_engine_listing() -> None:
    isa = torchburn_native.isa()
    status = torchburn_native.isa_status()
    assert isa == status["level"] in status["supported"]
    assert status["detected"] == status["supported"][-1]
    assert set(status["supported"]) <= {"baseline", "avx2", "avx512", "neon"}
    (row,) = [r for r in torchburn.list_engines() if r.name == "native"]
    assert row.available and f"ISA {isa}" in (row.device_name or "")


_ISA_PROBE = """
import warnings
warnings.simplefilter("always")
import torch, torchburn_native
fn = torch.compile(lambda x: torch.nn.functional.gelu(x) @ x.t(), backend="torchburn", options={"fallback": "error"})
x = torch.randn(33, 20)
torch.testing.assert_close(fn(x), torch.nn.functional.gelu(x) @ x.t(), rtol=1e-4, atol=1e-4)
print(torchburn_native.isa())
"""


def _isa_probe(requested: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHBURN_ISA": requested}
    return subprocess.run([sys.executable, "-c", _ISA_PROBE], env=env, capture_output=True, text=True, timeout=300)


def test_torchburn_isa_caps_the_level_and_a_bad_request_is_warned_about() -> None:
    status = torchburn_native.isa_status()
    lowest = status["supported"][0]
    capped = _isa_probe(lowest.upper())
    assert capped.returncode == 0, capped.stderr
    assert capped.stdout.split() == [lowest]
    for bad, why in [("avx1024", "is not an instruction-set level"), ("neon" if lowest != "neon" else "avx2", "")]:
        out = _isa_probe(bad)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [status["detected"]]
        assert f"TORCHBURN_ISA={bad!r}" in out.stderr.replace('"', "'") and why in out.stderr


def test_op_table_comes_from_the_registry() -> None:
    rows = torchburn.engine_ops("native")
    ops = {r["op"] for r in rows}
    for needed in [
        "aten.addmm.default",
        "aten.convolution.default",
        "aten._softmax.default",
        "aten.native_layer_norm.default",
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten.max_pool2d_with_indices.default",
        "aten.embedding.default",
        "aten.gather.default",
        "aten.cat.default",
        "aten.gelu.default",
        "aten.where.self",
    ]:
        assert needed in ops
    text = torchburn.format_engine_ops("native")
    assert f"{len(rows)} ops:" in text
    assert len(text.splitlines()) == len(rows) + 3


def test_profile_times_every_instruction_of_the_runs_since_it_was_switched_on() -> None:
    lin = torch.nn.Linear(64, 96)
    norm = torch.nn.LayerNorm(96)
    x = torch.randn(33, 64)
    compiled = torch.compile(lambda t: norm(lin(t)) + t.sum(), backend="torchburn", options=STRICT)
    with torch.no_grad():
        compiled(x)
        region = recent_regions()[-1]
        compiled(x)  # not timed
        region.set_profiling(True)
        for _ in range(5):
            got = compiled(x)
        region.set_profiling(False)
        compiled(x)  # not timed either
        torch.testing.assert_close(got, norm(lin(x)) + x.sum(), rtol=1e-5, atol=1e-5)
    (table,) = region.profile()
    assert [row["kind"] for row in table] == region.describe()[0]["instructions"]
    assert all(row["runs"] == 5 for row in table)
    assert all(row["total_us"] > 0 and row["mean_us"] == pytest.approx(row["total_us"] / 5) for row in table)
    region.set_profiling(True)  # switching on again starts from zero
    assert all(row["runs"] == 0 and row["total_us"] == 0 for row in region.profile()[0])


@pytest.mark.parametrize("bias", [True, False], ids=["linear", "mm"])
@pytest.mark.parametrize("shape", [(48, 64), (3, 16, 64)], ids=["2d", "3d"])
def test_residual_add_folded_into_the_gemm(bias: bool, shape: tuple[int, ...]) -> None:
    """``r + linear(x)`` (either operand order, a relu after it) runs as one matmul that starts from
    the residual, on the serial path and split over threads."""
    g = torch.Generator().manual_seed(5)
    for k in (64, 512):
        lin = torch.nn.Linear(k, 96, bias=bias)
        x = torch.randn(*shape[:-1], k, generator=g)
        r = torch.randn(*shape[:-1], 96, generator=g)
        plan = _compile_and_check(lambda t, s, m=lin: s + m(t), x, r, rtol=1e-4, atol=1e-4)
        assert plan["instructions"] == ["matmul"]
        plan = _compile_and_check(lambda t, s, m=lin: (m(t) + s).relu(), x, r, rtol=1e-4, atol=1e-4)
        assert plan["instructions"] == ["matmul"]
        assert plan["activations"] == ["relu"]


def test_residual_and_epilogue_not_folded_when_the_product_is_read_elsewhere() -> None:
    """A product that another op also reads must stay as it is: folding the residual (or an
    activation) into it would change what that op sees, through a view as much as directly."""
    lin = torch.nn.Linear(64, 96)
    x, r = torch.randn(2, 24, 64), torch.randn(48, 96)

    def direct(t, s):  # type: ignore[no-untyped-def]
        y = lin(t)
        return y + s.view(2, 24, 96), y * 2

    def through_view(t, s):  # type: ignore[no-untyped-def]
        y = lin(t)
        return y.view(48, 96) + s, y.view(48, 96).relu(), y.sum()

    for fn in (direct, through_view):
        plan = _compile_and_check(fn, x, r, rtol=1e-4, atol=1e-4)
        assert plan["instructions"][0] == "matmul"
        assert len(plan["instructions"]) > 1


def _conv_bn(c_in: int, c_out: int, stride: int = 1) -> torch.nn.Sequential:
    g = torch.Generator().manual_seed(c_in * 100 + c_out)
    conv = torch.nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
    bn = torch.nn.BatchNorm2d(c_out)
    with torch.no_grad():  # statistics and affine parameters far from the identity
        bn.running_mean.normal_(generator=g)
        bn.running_var.uniform_(0.5, 2.0, generator=g)
        bn.weight.normal_(generator=g)
        bn.bias.normal_(generator=g)
    return torch.nn.Sequential(conv, bn).eval()


@pytest.mark.parametrize("size", [8, 20], ids=["im2col", "shifted"])
def test_batch_norm_residual_and_relu_folded_into_the_convolution(size: int) -> None:
    """A ResNet block, conv-bn-relu then conv-bn plus a (downsampled) identity then relu, runs as its
    convolutions alone: each applies its norm, the residual and the relu to its tiles as it writes
    them. 20-wide planes take the shifted-GEMM path, 8-wide ones im2col."""
    first, second, down = _conv_bn(16, 32), _conv_bn(32, 32), _conv_bn(16, 32)

    def block(x):  # type: ignore[no-untyped-def]
        return torch.relu(second(torch.relu(first(x))) + down(x))

    plan = _compile_and_check(block, torch.randn(2, 16, size, size), rtol=1e-4, atol=1e-4)
    assert plan["instructions"] == ["conv2d", "conv2d", "conv2d"]


def test_convolution_read_elsewhere_keeps_its_own_output() -> None:
    """A convolution whose output another op also reads keeps it as it is; the norm and relu run
    as their own sweep."""
    block = _conv_bn(8, 16)

    def fn(x):  # type: ignore[no-untyped-def]
        y = block[0](x)
        return torch.relu(block[1](y)), y.sum()

    plan = _compile_and_check(fn, torch.randn(1, 8, 10, 10), rtol=1e-4, atol=1e-4)
    assert plan["instructions"][0] == "conv2d"
    assert "elementwise" in plan["instructions"]


def test_batch_norm_with_statistics_computed_after_the_convolution_stays_a_sweep() -> None:
    """Statistics the graph computes after the convolution (here from its input) cannot be read by
    the convolution's epilogue: the norm stays a sweep of its own, and the result is right."""
    conv = torch.nn.Conv2d(4, 6, 3, padding=1, bias=False).eval()

    def fn(x, w, b):  # type: ignore[no-untyped-def]
        y = conv(x)
        mean = x.mean() * torch.ones(6)  # made after the convolution in the graph's order
        var = (x * x).mean() * torch.ones(6) + 0.5
        return torch.relu(F.batch_norm(y, mean, var, w, b, training=False))

    plan = _compile_and_check(fn, torch.randn(1, 4, 9, 9), torch.randn(6), torch.randn(6), rtol=1e-4, atol=1e-4)
    assert plan["instructions"][0] == "conv2d"
    assert "elementwise" in plan["instructions"][1:]
