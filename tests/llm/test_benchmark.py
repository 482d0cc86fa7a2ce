"""The benchmark's bookkeeping: medians over repeated runs."""

from __future__ import annotations

import pytest

from torchburn_llm.benchmark import Speed, median


def test_median_takes_each_figure_separately() -> None:
    runs = [
        Speed("x", 128, 64, prefill_tok_s=300.0, decode_tok_s=90.0, ttft_ms=400.0),
        Speed("x", 128, 64, prefill_tok_s=100.0, decode_tok_s=150.0, ttft_ms=900.0),
        Speed("x", 128, 64, prefill_tok_s=200.0, decode_tok_s=120.0, ttft_ms=500.0),
    ]
    assert median(runs) == Speed("x", 128, 64, 200.0, 120.0, 500.0)
    # an even count averages the middle two
    assert median(runs[:2]).decode_tok_s == 120.0
    with pytest.raises(ValueError, match="no runs"):
        median([])
