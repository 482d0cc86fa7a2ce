"""Type stub of the compiled module ``torchburn_native._native``.

Private to the package: code outside it uses the public modules, such as ``torchburn_native.transformer``
(the typed, checked API over ``QMatrix``, ``Decoder`` and ``matmul_many`` below, which take raw addresses).
"""

from collections.abc import Callable
from typing import Any

__version__: str

class Program:
    """A compiled region's program; ``run`` takes data pointers and releases the GIL while running."""

    def __init__(self, plan_json: str, in_bytes: list[int], out_bytes: list[int]) -> None: ...
    def run(self, inputs: list[int], outputs: list[int]) -> None: ...
    def set_profiling(self, on: bool) -> None:
        """Switch per-instruction timing on (clearing earlier times) or off."""
    def profile(self) -> list[tuple[int, int]]:
        """Per instruction, in plan order: (nanoseconds, runs) since profiling was switched on."""
    @property
    def n_inputs(self) -> int: ...
    @property
    def n_outputs(self) -> int: ...

class FastCall:
    """A region's per-call path for one all-tensor signature: checks, allocates outputs and runs in one
    call; returns None (running nothing) when an argument's dtype, size or stride differs."""

    def __init__(
        self,
        program: Program,
        args: list[tuple[tuple[int, ...], tuple[int, ...], Any]],
        outs: list[tuple[tuple[int, ...], tuple[int, ...], Any]],
        extra: list[int],
        keep: object,
        assert_size_stride: Callable[..., None],
        empty_strided: Callable[..., Any],
    ) -> None: ...
    def __call__(self, *args: Any) -> tuple[Any, ...] | None: ...

class QMatrix:
    """A weight matrix [n, k] quantized for the LLM runtime: kind "int8" (per row), "int8-blocks",
    "int4" (blocks of 32) or "bf16"."""

    @staticmethod
    def quantize(ptr: int, n: int, k: int, kind: str) -> QMatrix: ...
    @staticmethod
    def from_q4_1(ptr: int, n: int, k: int) -> QMatrix:
        """int4 weights kept as they are from GGUF Q4_1 blocks (n·k/32 blocks of 20 bytes at ``ptr``)."""
    @property
    def shape(self) -> tuple[int, int]: ...
    @property
    def kind(self) -> str: ...
    @property
    def nbytes(self) -> int: ...

class GgmlMatrix:
    """A weight matrix [n, k] in one of GGUF's tensor types ("F32", "F16", "BF16", "Q8_0", "Q4_0",
    "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"), read in place from
    bytes an owner lends."""

    @staticmethod
    def lend(
        kind: str,
        ptr: int,
        nbytes: int,
        n: int,
        k: int,
        owner: object,
        order: list[int] | None = None,
        file_mapped: bool = False,
    ) -> GgmlMatrix:
        """``nbytes`` bytes at ``ptr`` that ``owner`` keeps readable and unchanged (the matrix holds it);
        with ``order``, row r is read from stored row ``order[r]``. ``file_mapped``: the bytes are a view
        of a read-only file mapping, whose pages are handed back once the weights are regrouped."""
    @staticmethod
    def block_size(kind: str) -> tuple[int, int]:
        """(elements, bytes) of one block of ``kind``."""
    @property
    def shape(self) -> tuple[int, int]: ...
    @property
    def kind(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def regrouped(self) -> bool:
        """Whether the weights were regrouped sixteen rows to a register for this CPU's kernels (Q4_0,
        Q4_1 from AVX2 up, Q8_0 with AVX-512)."""
    @property
    def integer_prompts(self) -> bool:
        """Whether prompts (8 tokens or more) multiply these weights in integers at the running level,
        with the tokens quantized to int8 per block of 32 (the K-quants; IQ4_NL and IQ4_XS with AVX-512
        VNNI); else they take the tokens as f32."""
    def dequantize_into(self, start: int, count: int, out: int) -> None: ...
    def matmul_into(self, x: int, tokens: int, out: int) -> None: ...

# a projection: (QMatrix, GgmlMatrix or (address, n, k) of a row-major f32 matrix, bias address or 0)
Projection = tuple[QMatrix | GgmlMatrix | tuple[int, int, int], int]

class Decoder:
    """A decoder-only transformer stack's forward pass in one call: a decode step (one token) or a
    prompt's prefill (many), from the embedding to the logits, appending to the KV cache.

    Holds addresses of f32 tensors (embedding, norms, f32 weights, biases): its owner keeps them alive
    and unchanged."""

    def __init__(
        self,
        dims: tuple[int, int, int, int, int, float, int | None],
        # rotary width, attention scale, attention and final logit caps, embedding scale, activation
        switches: tuple[int, float, float | None, float | None, float, str],
        embed: int | GgmlMatrix,
        norm: int,
        head: Projection,
        # norms (attention, MLP, q, k), q k v o gate up down, post-norms (attention, MLP), windowed,
        # rotary table (0, 1)
        layers: list[
            tuple[
                int,
                int,
                int,
                int,
                Projection,
                Projection,
                Projection,
                Projection,
                Projection,
                Projection,
                Projection,
                int,
                int,
                bool,
                int,
            ]
        ],
    ) -> None: ...
    def step(
        self,
        token: int,
        pos: int,
        keys: int,
        values: int,
        capacity: int,
        cos: int,
        sin: int,
        logits: int,
        local_cos: int = 0,
        local_sin: int = 0,
    ) -> None: ...
    def step_batch(
        self,
        tokens: list[int],
        positions: list[int],
        keys: list[int],
        values: list[int],
        capacities: list[int],
        cos: int,
        sin: int,
        logits: int,
        local_cos: int = 0,
        local_sin: int = 0,
    ) -> None:
        """One token of each of several sequences, each over its own KV cache: ``cos`` / ``sin`` are
        [B, rotary width] f32 (row b for sequence b) and ``logits`` [B, vocab] f32."""
    def prefill(
        self,
        tokens: list[int],
        start: int,
        keys: int,
        values: int,
        capacity: int,
        cos: int,
        sin: int,
        logits: int,
        all_logits: bool,
        local_cos: int = 0,
        local_sin: int = 0,
    ) -> None: ...
    def prefill_batch(
        self,
        prompts: list[list[int]],
        starts: list[int],
        keys: list[int],
        values: list[int],
        capacities: list[int],
        cos: int,
        sin: int,
        logits: int,
        local_cos: int = 0,
        local_sin: int = 0,
    ) -> None:
        """Several sequences' prompts in one pass, each over its own KV cache: ``cos`` / ``sin`` are
        [ΣT, rotary width] f32 (each prompt's rows after the previous one's) and ``logits`` [P, vocab]
        f32 (each prompt's last token)."""
    @property
    def num_layers(self) -> int: ...

def matmul_many(mats: list[QMatrix], x: int, rows: int, outs: list[int]) -> None:
    """``outs[i][rows, n_i] = x[rows, k] @ W_i.T`` for matrices of one width: the tokens are read once for
    all of them. Buffers are addresses of contiguous f32 tensors."""

PROMPT_KERNEL_MIN_TOKENS: int
"""Rows from which prompt projections take the prompt kernels (f32 tiles) instead of the decode
step's (activations quantized per row)."""

def init_threads(n: int) -> int: ...
def num_threads() -> int: ...
def share_openmp(addr: int) -> None: ...
def thread_pool() -> str: ...
def share_host_blas(sgemm: int, dgemm: int, set_local_threads: int) -> None: ...
def gemm_backend() -> str: ...
def share_host_packing(get_size: int, pack: int, compute: int) -> None: ...
def packed_b_bytes(m: int, n: int, k: int, rs: int, cs: int) -> int: ...
def pack_gemm_b(m: int, n: int, k: int, src: int, rs: int, cs: int, dest: int, dest_bytes: int) -> None: ...
def isa() -> str: ...
def isa_status() -> dict[str, Any]: ...
def set_gelu_positive_infinity_nan(nan: bool) -> None: ...
def debug_last_call() -> dict[str, list[int]]: ...
def debug_stats() -> dict[str, int]: ...
