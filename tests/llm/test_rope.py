"""The rotary table against the direct computation: every row a position asks for, across growth."""

from __future__ import annotations

import torch

from torchburn_llm.rope import RotaryTable, cos_sin


def test_table_rows_equal_the_direct_tables_as_it_grows() -> None:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 64, 2).float() / 64))
    table = RotaryTable(inv_freq)
    for start, count in [(0, 1), (5, 3), (200, 100), (299, 1), (1000, 7), (3, 2)]:
        cos, sin = table.rows(start, count)
        want_cos, want_sin = cos_sin(inv_freq, torch.arange(start, start + count))
        assert cos.is_contiguous() and sin.is_contiguous()
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin), (start, count)
    assert table.cos.shape[0] >= 1007
