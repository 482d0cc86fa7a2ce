"""llama.cpp, through ``llama-cpp-python``, as the peer the LLM benchmark and accuracy commands measure
against: the same GGUF file, the same number of threads, the same machine and run.

A benchmark-only extra (``pip install 'torchburn-llm[llama-cpp]'`` builds llama.cpp from source in a few
minutes; ``CMAKE_ARGS`` picks its instruction sets, e.g. ``-DGGML_NATIVE=OFF -DGGML_AVX2=ON
-DGGML_FMA=ON -DGGML_F16C=ON`` for an AVX2-only build). Nothing else in the package imports it.

Timing goes through the binding's low-level calls (``eval`` of the prompt as one batch, then one token per
call, greedy on the last logits), so each figure is llama.cpp's own work plus a few microseconds of Python
per token, as ours is.
"""

from __future__ import annotations

import ctypes
import importlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .benchmark import Speed
from .errors import PeerUnavailableError

INSTALL = (
    "comparisons with llama.cpp need llama-cpp-python: pip install 'torchburn-llm[llama-cpp]' "
    "(it builds llama.cpp from source, a few minutes)"
)


def _module() -> Any:
    try:
        return importlib.import_module("llama_cpp")  # untyped, and absent where the extra is not installed
    except ImportError as exc:
        raise PeerUnavailableError(INSTALL) from exc


def system_info() -> str:
    """The instruction sets this llama.cpp build runs (its own report), and its version."""
    lib = _module()
    report = str(lib.llama_print_system_info().decode()).strip(" |")
    return f"llama-cpp-python {lib.__version__}: {report}"


def load(path: Path, threads: int, context: int, all_logits: bool = False) -> Any:
    """``path`` (a .gguf file) in llama.cpp on ``threads`` threads, with room for ``context`` tokens;
    ``all_logits`` keeps every evaluated position's logits (teacher forcing)."""
    if path.suffix != ".gguf":
        raise ValueError(f"llama.cpp reads .gguf files; {path} is not one")
    lib = _module()
    return lib.Llama(
        model_path=str(path),
        n_ctx=context,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=all_logits,
        verbose=False,
    )


def _last_logits(llm: Any) -> np.ndarray:
    """The logits of the last evaluated position, [vocab] (a view of llama.cpp's buffer)."""
    lib = _module()
    pointer = lib.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(llm.n_vocab(),))


def measure(llm: Any, name: str, ids: list[int], new_tokens: int) -> Speed:
    """Prefill of ``ids`` as one call (time to first token: through the first greedy pick), then
    ``new_tokens - 1`` greedy decode steps."""
    llm.reset()
    llm.eval(ids[:8])  # warm up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    token = int(_last_logits(llm).argmax())
    t1 = time.perf_counter()
    for _ in range(new_tokens - 1):
        llm.eval([token])
        token = int(_last_logits(llm).argmax())
    t2 = time.perf_counter()
    return Speed(name, len(ids), new_tokens, len(ids) / (t1 - t0), (new_tokens - 1) / (t2 - t1), (t1 - t0) * 1e3)


def teacher_forced_logits(path: Path, ids: list[int], threads: int, chunk: int = 256) -> torch.Tensor:
    """llama.cpp's logits [T, vocab] at every position of ``ids`` (each from its prefix), evaluated
    ``chunk`` tokens per call as the accuracy command feeds ours."""
    llm = load(path, threads, len(ids) + 1, all_logits=True)
    for start in range(0, len(ids), chunk):
        llm.eval(ids[start : start + chunk])
    return torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))
