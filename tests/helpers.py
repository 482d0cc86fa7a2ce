"""Helpers shared by the tests (importable as ``helpers``: tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torchburn


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
