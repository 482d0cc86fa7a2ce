"""Aggregate decode speed of ``Transformer.decode_batch`` for a few batch sizes on the embedded model.

Each of B sequences gets its own prompt and KV cache; then ``steps`` calls each decode one greedy token
of every sequence. The time is the ``decode_batch`` calls' (picking the tokens is left out). The batch
sizes take turns in rounds of ``steps / 8`` calls (this machine's speed drifts over seconds, which
would favour whichever size ran in a fast stretch), and each size's time is the sum of its rounds.
Prints tokens/s over all sequences (``B · steps / time``), the speed-up over the first size, and the
fastest round's rate.

``python examples/batch_decode_bench.py [steps] [B ...]`` (defaults: 200 steps, B = 1 2 4 8 16);
``TORCHBURN_ISA`` caps the instruction set as everywhere else.
"""

from __future__ import annotations

import sys
import time

import torch

from torchburn_llm import LLM
from torchburn_llm.model import KVCache, Transformer

ROUNDS = 8


class Batch:
    """B sequences being decoded together."""

    def __init__(self, llm: LLM, size: int, steps: int) -> None:
        self.model: Transformer = llm.model
        prompts = [llm.encode(f"Story number {i}: once upon a time in a land far away,") for i in range(size)]
        self.caches: list[KVCache] = [self.model.new_cache(len(p) + steps + 8) for p in prompts]
        self.tokens = [
            int(self.model.forward(torch.tensor(p), c, last_only=True)[-1].argmax())
            for p, c in zip(prompts, self.caches, strict=True)
        ]
        self.seconds = 0.0
        self.best = 0.0  # tokens/s of the fastest round

    def run(self, steps: int) -> None:
        spent = 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            logits = self.model.decode_batch(self.tokens, self.caches)
            spent += time.perf_counter() - t0
            # greedy, outside the timing: torch's argmax over a vocabulary of 49152 takes 0.1 ms a
            # row, which is sampling's cost, not the decoder's
            self.tokens = logits.argmax(-1).tolist()
        self.seconds += spent
        self.best = max(self.best, len(self.tokens) * steps / spent)


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    sizes = [int(b) for b in sys.argv[2:]] or [1, 2, 4, 8, 16]
    llm = LLM.from_pretrained()
    import torchburn_native

    print(f"quant {llm.model.quant}, ISA {torchburn_native.isa()}, {torch.get_num_threads()} threads, {steps} steps")
    batches = {b: Batch(llm, b, steps + 2) for b in sizes}
    for batch in batches.values():
        batch.run(2)  # warm up: threads, caches
        batch.seconds, batch.best = 0.0, 0.0
    per_round = steps // ROUNDS
    for _ in range(ROUNDS):
        for batch in batches.values():
            batch.run(per_round)
    base = None
    print("| B | tokens/s | vs B=1 | best round tokens/s |\n| ---: | ---: | ---: | ---: |")
    for b, batch in batches.items():
        speed = b * per_round * ROUNDS / batch.seconds
        base = base or speed
        print(f"| {b} | {speed:.1f} | {speed / base:.2f}x | {batch.best:.1f} |")


if __name__ == "__main__":
    main()
