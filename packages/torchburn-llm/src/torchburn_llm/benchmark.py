"""Prefill and decode speed of a model, next to ``transformers`` eager on the same machine and run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .llm import LLM
from .sampling import SamplingParams

PROMPT = (
    "The history of the printing press begins in the fifteenth century, when movable type changed how "
    "books were made, how ideas travelled across Europe, and who could afford to read them. "
)


@dataclass(frozen=True)
class Speed:
    name: str
    prompt_tokens: int
    new_tokens: int
    prefill_tok_s: float
    decode_tok_s: float
    ttft_ms: float

    def row(self) -> str:
        return (
            f"| {self.name} | {self.prompt_tokens} | {self.prefill_tok_s:.1f} | {self.ttft_ms:.1f} "
            f"| {self.new_tokens} | {self.decode_tok_s:.1f} |"
        )


def median(runs: list[Speed]) -> Speed:
    """Each figure's median over repeated runs of one contender (this machine is shared and noisy)."""
    if not runs:
        raise ValueError("no runs to take the median of")

    def mid(values: list[float]) -> float:
        ordered = sorted(values)
        n = len(ordered)
        return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2

    first = runs[0]
    return Speed(
        first.name,
        first.prompt_tokens,
        first.new_tokens,
        mid([r.prefill_tok_s for r in runs]),
        mid([r.decode_tok_s for r in runs]),
        mid([r.ttft_ms for r in runs]),
    )


HEADER = (
    "| runtime | prompt tokens | prefill tok/s | first token ms | new tokens | decode tok/s |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: |"
)


def prompt_ids(llm: LLM, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids += llm.encode(PROMPT)
    return ids[:n]


def measure_ours(llm: LLM, name: str, ids: list[int], new_tokens: int) -> Speed:
    llm._session = None
    list(llm.generate_tokens(ids[:8], 2, SamplingParams()))  # warm up
    llm._session = None
    params = SamplingParams()
    t0 = time.perf_counter()
    tokens = llm.generate_tokens(ids, new_tokens, params)
    first = next(tokens, None)
    t1 = time.perf_counter()
    rest = sum(1 for _ in tokens)
    t2 = time.perf_counter()
    got = rest + (first is not None)
    return Speed(name, len(ids), got, len(ids) / (t1 - t0), rest / (t2 - t1) if rest else 0.0, (t1 - t0) * 1e3)


def measure_transformers(model: Any, name: str, ids: list[int], new_tokens: int) -> Speed:
    x = torch.tensor([ids])
    with torch.no_grad():
        model(x[:, :8])  # warm up
        t0 = time.perf_counter()
        # only the last position's logits, as transformers' own generate() asks for them
        out = model(x, use_cache=True, logits_to_keep=1)
        t1 = time.perf_counter()
        past, token = out.past_key_values, out.logits[0, -1].argmax().view(1, 1)
        for _ in range(new_tokens - 1):
            out = model(token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[0, -1].argmax().view(1, 1)
        t2 = time.perf_counter()
    return Speed(name, len(ids), new_tokens, len(ids) / (t1 - t0), (new_tokens - 1) / (t2 - t1), (t1 - t0) * 1e3)


def copy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second a tensor copy moves (read + write), best of ``repeats``: the memory ceiling."""
    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


def ceiling_line(llm: LLM, decode_tok_s: float) -> str:
    """Decode speed against the memory-bandwidth bound: every token reads all weights once."""
    per_token = llm.model.weight_bytes
    bandwidth = copy_bandwidth()
    ceiling = bandwidth / per_token
    return (
        f"weights read per token {per_token / 1e6:.0f} MB; copy bandwidth {bandwidth / 1e9:.1f} GB/s -> "
        f"ceiling {ceiling:.0f} tok/s; decode is at {100 * decode_tok_s / ceiling:.0f}% of it"
    )


def _status_kb(field: str) -> int | None:
    """A size field of /proc/self/status (Linux), in bytes; None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def resident_bytes() -> int | None:
    """The process's resident memory now (mapped file pages it has touched included)."""
    return _status_kb("VmRSS")


def peak_resident_bytes() -> int | None:
    """The process's peak resident memory so far."""
    return _status_kb("VmHWM")


def memory_line(before: int | None, llm: LLM, path: Path, kv_bytes: int) -> str | None:
    """Peak resident memory over the process before loading, against the file and the KV cache."""
    peak = peak_resident_bytes()
    if before is None or peak is None:
        return None
    size = path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.glob("*.safetensors"))
    grown = peak - before
    return (
        f"memory: peak resident {grown / 1e6:.0f} MB over the process before loading; weights file "
        f"{size / 1e6:.0f} MB, KV cache {kv_bytes / 1e6:.0f} MB, the rest {(grown - size - kv_bytes) / 1e6:+.0f} MB"
    )


def load_transformers(path: Path) -> Any:
    import transformers

    auto: Any = transformers.AutoModelForCausalLM
    if path.suffix == ".gguf":
        model = auto.from_pretrained(path.parent, gguf_file=path.name)
    else:
        model = auto.from_pretrained(path)
    return model.eval()
