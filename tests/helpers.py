"""Helpers shared by the tests (importable as ``helpers``: tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torchburn

# a JSON schema the servers' structured-output tests ask for: a city and its country, short strings
CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run a fresh interpreter (a new process: nothing in memory carries over) and fail loudly on error."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"subprocess failed:\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
    return proc


def program_entries(cache_dir: Path) -> list[Path]:
    """The engine-program entries of a cache dir (not the warm-start cache's lowered graphs)."""
    from torchburn.cache import LOWERED_SUFFIX
    from torchburn.cache.store import DiskStore

    return [e for e in DiskStore(cache_dir).entries() if not e.parent.parent.name.endswith(LOWERED_SUFFIX)]


def strict_compile(engine: str) -> Callable[..., Any]:
    """``compile(fn, **kwargs)``: torch.compile on ``engine`` with fallback="error"."""
    import torch

    def compile_(fn: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
        options = {"engine": engine, "fallback": "error"}
        return torch.compile(fn, backend="torchburn", options=options, **kwargs)

    return compile_


def assert_engine_ran(engine: str, min_nodes: int = 1) -> None:
    """``engine`` ran at least ``min_nodes`` graph nodes and none fell back (with the coverage table
    in the message when not)."""
    ran, fell = engine_counts(engine)
    report = torchburn.format_coverage()
    assert fell == 0, f"{fell} node(s) fell back to eager:\n{report}"
    assert ran >= min_nodes, f"engine {engine!r} ran {ran} node(s), expected >= {min_nodes}:\n{report}"


def engine_counts(engine: str) -> tuple[int, int]:
    """(nodes run by the engine, nodes fallen back) summed over ops."""
    ops = torchburn.coverage().get(engine, {})
    return sum(r["engine"] for r in ops.values()), sum(r["fallback"] for r in ops.values())


def save_tiny_llama(folder: Path, *, seed: int, layers: int, max_positions: int) -> None:
    """A random Llama checkpoint (vocab 64, hidden 32, 4 heads over 2 KV heads) as safetensors in ``folder``."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)


def seeded_randn(*shape: int, seed: int = 1234) -> Any:
    """Standard normal values of ``shape`` from their own generator: the same on every run."""
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def calibrate_batchnorm(model: Any, *shape: int) -> None:
    """Set BatchNorm running stats from one batch of noise, so eval-mode activations stay O(1).

    With default stats (mean 0, var 1) and random weights, deep CNN outputs shrink towards 0 (mobilenet_v3's
    to ~1e-9), where an absolute tolerance would accept anything.
    """
    import torch
    from torch import nn

    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # cumulative average: after one batch, the running stats are that batch's
    model.train()
    with torch.no_grad():
        model(seeded_randn(*shape, seed=7))
    model.eval()


# Llama 3.1's rotary scaling with a short original context, so that most of a tiny model's rates
# are rescaled
LLAMA3_ROPE_SCALING: dict[str, Any] = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
# YaRN as Qwen2.5 documents it for long contexts, with an original context of 32 so that the blend
# spans a tiny model's heads
YARN_ROPE_PARAMETERS: dict[str, Any] = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32,
}
