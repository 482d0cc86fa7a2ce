//! Blocks of weight rows for products of a few tokens on the decode kernels (a batch of decode steps,
//! a prompt shorter than [`super::qprefill::MIN_TOKENS`]).
//!
//! A decode kernel reads each row of the weights once per token. With several tokens, a task that ran
//! every token over its whole range of rows would read that range from memory once per token (the
//! output projection's share of a task is megabytes). Instead each task walks its range in blocks of
//! rows small enough to stay in L1/L2 and runs every token over a block before moving on: the weights
//! come from memory once per product, whatever the number of tokens. Each row's value is the same as
//! a one-token product gives (the same kernel per row), so only the order of the work changes.

use std::ops::Range;

use crate::threads;

/// Bytes of weights per block: about L1's size (48 KiB on recent x86 cores, 32 KiB on older ones)
/// with room for the tokens' activations, and far inside L2.
pub const BLOCK_BYTES: usize = 16 << 10;

/// Rows the kernels compute together: sixteen for the regrouped GGUF matrices (a group, see
/// [`crate::kernels::ggml::interleaved`]), four for the row kernels; blocks and tasks are made of
/// whole groups so that none is split (and computed twice).
pub const ROW_GROUP: usize = 16;

/// Rows per block for rows of `row_bytes`: whole [`ROW_GROUP`]s, at least one.
pub fn block_rows(row_bytes: usize) -> usize {
    (BLOCK_BYTES / row_bytes.max(1) / ROW_GROUP * ROW_GROUP).max(ROW_GROUP)
}

/// `rows` in consecutive blocks of [`block_rows`] (the last may be short); all of `rows` at once
/// for a single token, which reads each row once however the range is cut.
pub fn row_blocks(
    rows: Range<usize>,
    row_bytes: usize,
    tokens: usize,
) -> impl Iterator<Item = Range<usize>> {
    let step = if tokens <= 1 {
        rows.len().max(1)
    } else {
        block_rows(row_bytes)
    };
    let end = rows.end;
    rows.step_by(step).map(move |lo| lo..(lo + step).min(end))
}

/// `out[t·n + r]` for `tokens` tokens and the `n` rows of a matrix with rows of `row_bytes`: rows
/// split between threads, each task walking its share in [`row_blocks`] and `rows_into(rows, got)`
/// filling `got` `[tokens, rows.len()]` for one block, which is then copied into place.
pub fn par_rows_tokens(
    n: usize,
    row_bytes: usize,
    tokens: usize,
    out: &mut [f32],
    rows_into: impl Fn(Range<usize>, &mut [f32]) + Sync,
) {
    assert_eq!(out.len(), tokens * n, "output length");
    let out_ptr = threads::SendPtr(out.as_mut_ptr());
    threads::par_steps(n, ROW_GROUP, |lo, hi| {
        let mut block = Vec::new(); // [tokens, rows of the block]
        for sub in row_blocks(lo..hi, row_bytes, tokens) {
            let len = sub.len();
            block.resize(tokens * len, 0f32);
            let got = &mut block[..tokens * len];
            rows_into(sub.clone(), got);
            for (t, values) in got.chunks_exact(len).enumerate() {
                // SAFETY: rows lo..hi of every token's output belong to this task alone
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        values.as_ptr(),
                        out_ptr.get().add(t * n + sub.start),
                        len,
                    )
                };
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_rows_in_order_in_whole_groups() {
        // 360-byte rows (Q4_1 of 576): 32 rows a block
        let blocks: Vec<_> = row_blocks(16..110, 360, 3).collect();
        assert_eq!(blocks, vec![16..48, 48..80, 80..110]);
        // rows larger than a block still go a group at a time
        assert_eq!(block_rows(1 << 20), ROW_GROUP);
        assert_eq!(row_blocks(3..5, 1 << 20, 2).collect::<Vec<_>>(), vec![3..5]);
        // one token: the whole range
        assert_eq!(
            row_blocks(0..1000, 360, 1).collect::<Vec<_>>(),
            vec![0..1000]
        );
        assert_eq!(row_blocks(7..7, 360, 4).count(), 0);
    }
}
