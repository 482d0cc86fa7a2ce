"""What one server takes on: request size, prompt and answer lengths, requests in flight, sequences
decoded together. Every limit is checked before any work starts, and a request over one gets an
OpenAI-style error naming it (413 for the body, 400 for lengths, 429 for load)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20  # a request's JSON body
    max_prompt_tokens: int | None = None  # None: the model's context less one generated token
    max_tokens: int = 2048  # tokens one request may generate (the default when it names none)
    max_requests: int = 64  # requests in flight (decoding, waiting to, embedding); more get 429
    max_batch: int = 16  # sequences decoded together in one step; the rest wait their turn
    max_stop: int = 16  # stop strings per request
    max_embedding_inputs: int = 256  # inputs per embeddings request
    prefix_cache_bytes: int = 512 << 20  # KV caches of finished requests kept for their prompts' prefixes

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_tokens", "max_requests", "max_batch", "max_stop", "max_embedding_inputs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be at least 1, got {self.max_prompt_tokens}")
        if self.prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be >= 0, got {self.prefix_cache_bytes}")
