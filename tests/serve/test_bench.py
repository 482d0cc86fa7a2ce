"""``torchburn bench-serve``'s clients against a running server: every streamed answer counted whole."""

from __future__ import annotations

import asyncio

from serve_process import ServerProcess
from torchburn_serve import bench


def test_a_round_counts_every_client_s_full_answer(server: ServerProcess) -> None:
    r = asyncio.run(bench._round(server.url, "torchburn", 3, 2, 8))
    # six stories of at least 8 tokens each, none cut off by the others running beside them
    assert (r.requests, r.tokens, r.short) == (6, 48, 0)
    assert len(r.ttft) == 6 and all(0 < t < r.seconds for t in r.ttft)
    assert r.percentile(0.5) <= r.percentile(0.95)


def test_a_round_with_cut_off_answers_says_so() -> None:
    r = bench.Round("peer", 4, 8, 64, 2.0, [0.1] * 8, short=7)
    assert bench.short_note(r) == "7 of 8 peer answers ended before max_tokens"
