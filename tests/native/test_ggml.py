"""GGUF tensor types computed in as stored (``torchburn_native.ggml``), against ``gguf``'s own
dequantizers: the format's ground truth.

Blocks of the types ``gguf`` quantizes itself (float types, ``Q8_0``, ``Q4_0``, ``Q4_1``, ``Q5_0``,
``Q5_1``) come from its quantizer; K-quant and IQ4 blocks are random bytes with finite f16 factors (every
such block is well formed). Products of a few tokens (decode) are checked against the dequantized weights
times the activations quantized as the kernels quantize them (int8 per block of 32, or of 256 for the
K-quants, int16 per block of 32 for ``Q8_0``), in f64: that isolates the kernels, whose integer sums
are exact, from the activation rounding. From 8 tokens on (a prompt) products take the activations
as they are, against rows dequantized once. CI runs this module at every ``TORCHBURN_ISA`` level the
machine has.
"""

from __future__ import annotations

import gc
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants
from torchburn_native import ggml

QUANTIZED_BY_GGUF = ["BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
K_QUANTS = ["Q4_K", "Q5_K", "Q6_K"]  # with integer prompt tiles
PORTABLE_K_QUANTS = ["Q2_K", "Q3_K"]  # through the portable decoder
SUPER_BLOCKS = [*K_QUANTS, *PORTABLE_K_QUANTS, "IQ4_XS"]  # with int8 activations per 256 in decode
# where each K-quant and IQ4 block keeps its f16 factors
K_HALVES = {
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,), "IQ4_NL": (0,), "IQ4_XS": (0,)
}  # fmt: skip


def _blocks(kind: str, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(stored bytes [n, row bytes] as uint8, gguf's dequantization of them [n, k])."""
    rng = np.random.default_rng(seed)
    qtype = GGMLQuantizationType[kind]
    if kind == "F32":
        raw = rng.standard_normal((n, k), dtype=np.float32).view(np.uint8)
    elif kind == "F16":
        raw = rng.standard_normal((n, k)).astype(np.float16).view(np.uint8)
    elif kind in QUANTIZED_BY_GGUF:
        raw = quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    else:
        elements, nbytes = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (n, k // elements, nbytes), dtype=np.uint8)
        for at in K_HALVES[kind]:
            factor = rng.uniform(0.001, 0.05, (n, k // elements)) * rng.choice([-1, 1], (n, k // elements))
            raw[:, :, at : at + 2] = factor.astype(np.float16)[..., None].view(np.uint8)
        raw = raw.reshape(n, -1)
    raw = np.ascontiguousarray(raw.reshape(n, -1))
    return raw, np.asarray(quants.dequantize(raw, qtype), dtype=np.float32).reshape(n, k)


def _matrix(kind: str, n: int, k: int, seed: int = 0) -> tuple[ggml.GgmlMatrix, np.ndarray]:
    raw, dense = _blocks(kind, n, k, seed)
    return ggml.lend(kind, torch.from_numpy(raw).reshape(-1), n, k), dense


PREFILL_TOKENS = 8  # from this many tokens on, products take f32 activations


def _as_kernels_see(kind: str, x: np.ndarray, integer_prompts: bool) -> np.ndarray:
    """``x`` [T, k] as the products read it: integers per block (f32 arithmetic, halves away from zero).
    A prompt (``PREFILL_TOKENS`` or more) multiplies f32 activations, except on integer prompt tiles
    (``integer_prompts``: the K-quants', and IQ4's with VNNI), whose activations are int8 per block of 32."""
    prompt = x.shape[0] >= PREFILL_TOKENS
    if kind in ("F32", "F16", "BF16") or (prompt and not integer_prompts):
        return x.astype(np.float64)
    block = 256 if kind in SUPER_BLOCKS and not prompt else 32
    top = np.float32(32767 if kind == "Q8_0" else 127)
    xb = x.astype(np.float32).reshape(x.shape[0], -1, block)
    scale = (np.abs(xb).max(axis=-1, keepdims=True) / top).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(scale > 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    v = (xb * inv).astype(np.float32)
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + np.float32(0.5)), -top, top)
    return (q.astype(np.float64) * scale.astype(np.float64)).reshape(x.shape)


@pytest.mark.parametrize("kind", ggml.TYPES)
def test_dequantize_matches_gguf(kind: str) -> None:
    m, dense = _matrix(kind, 5, 512)
    assert m.shape == (5, 512) and m.kind == kind
    got = ggml.dequantize(m).numpy()
    np.testing.assert_allclose(got, dense, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ggml.dequantize(m, slice(2, 4)).numpy(), dense[2:4], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ggml.TYPES)
@pytest.mark.parametrize("tokens", [1, 3, 17])
def test_matmul_matches_dequantized_product(kind: str, tokens: int) -> None:
    n, k = 40, 768
    m, dense = _matrix(kind, n, k, seed=tokens)
    x = torch.randn(tokens, k)
    got = ggml.matmul(m, x).numpy().astype(np.float64)
    if kind in K_QUANTS:
        assert m.integer_prompts  # on every CPU
    seen = _as_kernels_see(kind, x.numpy(), m.integer_prompts)
    want = seen @ dense.astype(np.float64).T
    size = np.abs(seen) @ np.abs(dense.astype(np.float64)).T
    assert np.all(np.abs(got - want) <= 2e-6 * size + 1e-9), float(np.max(np.abs(got - want) / (size + 1e-30)))
    # and close to the unquantized product: int8 activations lose about one part in 250 per block
    exact = x.numpy().astype(np.float64) @ dense.astype(np.float64).T
    assert np.all(np.abs(got - exact) <= 0.02 * size + 1e-6)


def test_matmul_keeps_leading_dims() -> None:
    m, _ = _matrix("Q4_K", 8, 256)
    x = torch.randn(2, 3, 256)
    out = ggml.matmul(m, x)
    assert out.shape == (2, 3, 8)
    np.testing.assert_allclose(out.reshape(6, 8).numpy(), ggml.matmul(m, x.reshape(6, 256)).numpy())


def test_weights_are_read_in_place_and_held() -> None:
    raw, dense = _blocks("Q6_K", 4, 256)
    data = torch.from_numpy(raw).reshape(-1)
    m = ggml.lend("Q6_K", data, 4, 256)
    assert m.nbytes == raw.nbytes  # the stored size: no f32 copy
    x = torch.randn(1, 256)
    before = ggml.matmul(m, x)
    del data, raw
    gc.collect()
    np.testing.assert_array_equal(ggml.matmul(m, x).numpy(), before.numpy())
    np.testing.assert_allclose(ggml.dequantize(m).numpy(), dense, rtol=1e-6)


def test_bad_inputs_are_refused_with_what_is_allowed() -> None:
    raw, _ = _blocks("Q8_0", 2, 64)
    data = torch.from_numpy(raw).reshape(-1)
    with pytest.raises(ValueError, match="supported: F32, F16, BF16, Q8_0"):
        ggml.lend("IQ2_XXS", data, 2, 64)
    with pytest.raises(ValueError, match="takes 136 bytes, got 68"):
        ggml.lend("Q8_0", data[:68], 2, 64)
    with pytest.raises(ValueError, match="whole blocks of 256"):
        ggml.lend("Q4_K", torch.zeros(144, dtype=torch.uint8), 1, 128)
    with pytest.raises(ValueError, match="uint8"):
        ggml.lend("Q8_0", data.float(), 2, 64)
    m = ggml.lend("Q8_0", data, 2, 64)
    with pytest.raises(ValueError, match=r"inputs \[\.\.\., 64\]"):
        ggml.matmul(m, torch.randn(3, 32))
    assert ggml.row_bytes("Q4_K", 512) == 288
    with pytest.raises(ValueError, match="whole blocks"):
        ggml.row_bytes("Q6_K", 100)


@pytest.mark.parametrize("kind", ggml.TYPES)
def test_regrouped_where_the_level_has_kernels(kind: str) -> None:
    # Q4_0 and Q4_1 from AVX2 up, Q8_0 with AVX-512 (x86 only); and the product still matches
    from torchburn_native import _native

    level = _native.isa()
    want = (kind in ("Q4_0", "Q4_1") and level in ("avx2", "avx512")) or (kind == "Q8_0" and level == "avx512")
    m, dense = _matrix(kind, 20, 256)
    assert m.regrouped == want
    np.testing.assert_allclose(ggml.dequantize(m).numpy(), dense, rtol=1e-6, atol=1e-7)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident memory read from /proc (Linux)")
def test_a_file_mapped_matrix_holds_its_weights_once(tmp_path: Path) -> None:
    # a regrouped matrix copies its weights; lent from a read-only file map it hands the map's pages
    # back, so the process holds them once (and the file still reads as written)
    def resident_bytes() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

    n, k = 16384, 4096  # Q4_0: 36 MiB
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, (n, k // 32, 18), dtype=np.uint8)
    raw[:, :, 0:2] = rng.uniform(0.001, 0.05, (n, k // 32)).astype(np.float16)[..., None].view(np.uint8)
    raw = raw.reshape(n, -1)
    path = tmp_path / "weights.bin"
    raw.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    with warnings.catch_warnings():
        # the map is read-only, and so is every use the matrix makes of it
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        data = torch.from_numpy(mapped)
    before = resident_bytes()
    m = ggml.lend("Q4_0", data, n, k, file_mapped=True)
    grown = resident_bytes() - before
    assert grown < 1.4 * raw.nbytes, (grown, raw.nbytes, m.regrouped)
    rows = slice(n - 5, n)
    want = quants.dequantize(raw[rows], GGMLQuantizationType.Q4_0).reshape(5, k)
    np.testing.assert_allclose(ggml.dequantize(m, rows).numpy(), want, rtol=1e-6, atol=1e-7)
    assert np.array_equal(np.asarray(mapped[: 1 << 20]), raw.reshape(-1)[: 1 << 20])
    del m, data, mapped
    gc.collect()
