"""``torchburn.LLM``: a loaded model plus what turns text into tokens and back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .architectures import Architecture
from .config import ModelConfig
from .errors import ContextLengthError
from .loader import load_folder, load_gguf
from .model import Transformer
from .tokenizer import from_folder as tokenizer_from_folder

QUANTS = ("fp32",)


class LLM:
    """A decoder-only language model ready to run on the CPU."""

    def __init__(self, arch: Architecture, cfg: ModelConfig, model: Transformer, tokenizer: Any = None) -> None:
        self.architecture, self.config, self.model, self.tokenizer = arch, cfg, model, tokenizer

    @classmethod
    def from_pretrained(cls, path: str | Path, quant: str = "fp32", device: str = "cpu") -> LLM:
        """Load a local Hugging Face checkpoint folder (weights memory-mapped, checked strictly)."""
        if quant not in QUANTS:
            raise ValueError(f"quant={quant!r} is not available; choose one of {', '.join(QUANTS)}")
        if device not in ("cpu", "auto"):
            raise ValueError(f"device={device!r} is not available; the LLM runtime runs on 'cpu' (or 'auto')")
        path = Path(path)
        if path.suffix == ".gguf":
            arch, cfg, model, tokenizer = load_gguf(path)
            return cls(arch, cfg, model, tokenizer)
        arch, cfg, model = load_folder(path)
        return cls(arch, cfg, model, tokenizer_from_folder(path))

    @torch.no_grad()
    def generate_ids(self, prompt: Sequence[int], max_new_tokens: int = 32) -> list[int]:
        """Greedy continuation of the token ids ``prompt``: the new ids only, stopping at EOS."""
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        need = len(prompt) + max_new_tokens
        if need > self.config.max_position:
            raise ContextLengthError(
                f"{len(prompt)} prompt tokens + {max_new_tokens} new ones exceed the model's context of "
                f"{self.config.max_position} positions"
            )
        cache = self.model.new_cache(need)
        logits = self.model.forward(torch.tensor(list(prompt)), cache)
        out: list[int] = []
        for _ in range(max_new_tokens):
            token = int(logits[-1].argmax())
            out.append(token)
            if token in self.config.eos_token_ids or len(out) == max_new_tokens:
                break
            logits = self.model.forward(torch.tensor([token]), cache)
        return out
