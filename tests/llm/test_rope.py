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


def test_longrope_rows_switch_to_the_long_rates_past_the_original_length() -> None:
    short = 1.0 / (2.0 * 10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    long = short / 4.0
    table = RotaryTable(short, scale=1.25, long=(long, 64))
    for (start, count), rates in [((0, 64), short), ((60, 5), long), ((63, 1), short), ((64, 1), long)]:
        cos, sin = table.rows(start, count)
        want_cos, want_sin = cos_sin(rates, torch.arange(start, start + count), 1.25)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin), (start, count)
    # the scale multiplies the plain tables
    plain_cos, _ = cos_sin(short, torch.arange(3))
    torch.testing.assert_close(table.rows(0, 3)[0], plain_cos * 1.25)


def test_rows_at_positions_equal_each_position_alone() -> None:
    # one step of several sequences: each row is what that position's own step reads, on either side
    # of longrope's switch and past what the table has grown to
    short = 1.0 / (2.0 * 10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    for table in (RotaryTable(short), RotaryTable(short, scale=1.25, long=(short / 4.0, 64))):
        positions = [70, 3, 63, 64, 0, 400, 63]
        cos, sin = table.rows_at(positions)
        assert cos.shape == sin.shape == (len(positions), 16) and cos.is_contiguous()
        for i, p in enumerate(positions):
            want_cos, want_sin = table.rows(p, 1)
            assert torch.equal(cos[i], want_cos[0]) and torch.equal(sin[i], want_sin[0]), p
