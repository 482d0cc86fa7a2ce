//! Q4_0, Q4_1 and Q8_0 matrices regrouped sixteen rows to a unit, one row to each 32-bit lane of a
//! register, for the x86 decode kernels (`dot_interleaved`).
//!
//! Stored as the file has them, a row's block is one row's integers: a product reduces them to one
//! lane and converts, scales and accumulates per row and block, which makes a decode step bound by
//! instructions, and a batch of steps pays most of that again for every token. Regrouped, one 64-byte
//! load holds four integers of each of sixteen rows, a `vpdpbusd` against four activations broadcast
//! to every lane adds them into sixteen row sums at once, and the scale, the conversion and the
//! multiply-add are one instruction each for sixteen rows. The weights are decoded once per group and
//! block for every token of a batch.
//!
//! A group of sixteen rows is one contiguous stretch of `stride` bytes (a whole number of cache
//! lines), per block `b`:
//! - the integers at `b · quant_bytes`: for the 4-bit types four 64-byte chunks, chunk `c` holding
//!   in lane `i` the stored bytes `4c..4c + 4` of row `i`'s block (elements `4c..4c + 4` in the low
//!   nibbles, `16 + 4c..` in the high ones); for Q8_0 sixteen 32-byte chunks, chunk `c` holding in
//!   lane `i` the bytes `2c, 2c + 1` of row `i`'s block (a pair per 32-bit lane once widened to i16);
//! - after all the integers, the sixteen rows' f16 scales of each block (32 bytes a block);
//! - for Q4_1 after those, the sixteen rows' f16 offsets of each block.
//!
//! Rows past the matrix's last (the last group's padding) are zeros. The bytes are the file's, moved:
//! a row regathered from a group is byte for byte the stored row (the tests hold it to that), and
//! [`Interleaved::dequantize_rows`] decodes rows to the stored rows' values bit for bit.

use std::ops::Range;

use half::f16;
use torchburn_native_macros::isa_versions;

use super::blocks::GgmlType;
use crate::kernels::prefetch;
use crate::threads::{self, SendPtr};

/// Rows per group: one per 32-bit lane of an AVX-512 register.
pub const LANES: usize = 16;
/// Elements per block of the types regrouped.
const BLOCK: usize = 32;

/// One cache line, so that groups start on line boundaries.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A matrix `[n, k]` of Q4_0, Q4_1 or Q8_0 regrouped as the module describes.
pub struct Interleaved {
    pub kind: GgmlType,
    pub n: usize,
    pub k: usize,
    /// bytes per group
    stride: usize,
    lines: Vec<Line>,
}

/// Whether `kind` can be regrouped.
pub fn takes(kind: GgmlType) -> bool {
    matches!(kind, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// Bytes of one block's integers for sixteen rows.
pub fn quant_bytes(kind: GgmlType) -> usize {
    if kind == GgmlType::Q8_0 {
        LANES * BLOCK
    } else {
        LANES * BLOCK / 2
    }
}

/// Prefetches what block `b` of the group at `group` (`blocks` blocks a row) will read, some way
/// ahead (see [`prefetch::WEIGHTS_DISTANCE_BYTES`]: the memory's latency, not the instructions, bounds
/// a product otherwise): the block's integer lines and, every other block (two blocks' sixteen f16 to
/// a line), the scales' line and Q4_1's offsets' line.
#[inline(always)]
pub fn fetch_block_ahead(kind: GgmlType, group: *const u8, blocks: usize, b: usize) {
    let bytes = quant_bytes(kind);
    prefetch::weights_ahead(group.wrapping_add(b * bytes), bytes / prefetch::LINE_BYTES);
    if b.is_multiple_of(2) {
        let scales = group.wrapping_add(blocks * bytes + b * 2 * LANES);
        prefetch::weights_ahead(scales, 1);
        if kind == GgmlType::Q4_1 {
            prefetch::weights_ahead(scales.wrapping_add(blocks * 2 * LANES), 1);
        }
    }
}

/// Where the integers start in a stored block (after its f16 scale, and offset for Q4_1).
fn head_bytes(kind: GgmlType) -> usize {
    if kind == GgmlType::Q4_1 {
        4
    } else {
        2
    }
}

/// Bytes of each integer chunk a lane holds: four nibble bytes, or a pair of int8.
fn lane_bytes(kind: GgmlType) -> usize {
    if kind == GgmlType::Q8_0 {
        2
    } else {
        4
    }
}

impl Interleaved {
    /// `n` rows of `k` elements of `kind`, row `r`'s stored bytes given by `row(r)`.
    pub fn pack<'a>(
        kind: GgmlType,
        n: usize,
        k: usize,
        row: impl Fn(usize) -> &'a [u8] + Sync,
    ) -> Interleaved {
        assert!(takes(kind), "{} is not regrouped", kind.name());
        assert!(k.is_multiple_of(BLOCK), "rows of whole blocks");
        let blocks = k / BLOCK;
        let halves = if kind == GgmlType::Q4_1 { 2 } else { 1 };
        let stride = (blocks * (quant_bytes(kind) + halves * LANES * 2)).next_multiple_of(64);
        let groups = n.div_ceil(LANES);
        let mut lines = vec![Line([0; 64]); groups * stride / 64];
        let base = SendPtr(lines.as_mut_ptr() as *mut u8);
        threads::parallel_for(groups, |g| {
            // SAFETY: group g's `stride` bytes are this task's alone
            let group =
                unsafe { std::slice::from_raw_parts_mut(base.get().add(g * stride), stride) };
            for i in 0..LANES.min(n - g * LANES) {
                scatter_row(kind, blocks, row(g * LANES + i), i, group);
            }
        });
        Interleaved {
            kind,
            n,
            k,
            stride,
            lines,
        }
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.k / BLOCK
    }

    /// Bytes the regrouped matrix takes.
    pub fn nbytes(&self) -> usize {
        self.lines.len() * 64
    }

    /// Group `g`'s bytes (rows `16g..16g + 16`), starting on a cache line.
    pub fn group(&self, g: usize) -> &[u8] {
        let all = self.lines.as_ptr() as *const u8;
        assert!(g * LANES < self.n, "group {g} past the rows");
        // SAFETY: `lines` holds whole groups of `stride` bytes
        unsafe { std::slice::from_raw_parts(all.add(g * self.stride), self.stride) }
    }

    /// The groups covering `rows`.
    pub fn groups_of(rows: &Range<usize>) -> Range<usize> {
        rows.start / LANES..rows.end.div_ceil(LANES)
    }
}

impl Interleaved {
    /// Rows `rows` as f32, `[rows.len(), k]` into `out`: the values the stored rows' decoder
    /// (`dequant::dequantize_row_fast`) gives, bit for bit (the same multiply and subtract).
    pub fn dequantize_rows(&self, rows: Range<usize>, out: &mut [f32]) {
        assert!(rows.end <= self.n, "rows out of range");
        assert_eq!(out.len(), rows.len() * self.k, "output length");
        let mut at = 0;
        for g in Interleaved::groups_of(&rows) {
            let lo = (g * LANES).max(rows.start) - g * LANES;
            let hi = (g * LANES + LANES).min(rows.end) - g * LANES;
            let len = (hi - lo) * self.k;
            let group = self.group(g);
            dequantize_lanes(
                self.kind,
                self.blocks(),
                group,
                lo..hi,
                &mut out[at..at + len],
            );
            at += len;
        }
    }
}

/// Lanes `lanes` of `group` as f32 rows into `out`.
#[isa_versions]
fn dequantize_lanes(
    kind: GgmlType,
    blocks: usize,
    group: &[u8],
    lanes: Range<usize>,
    out: &mut [f32],
) {
    let quant = quant_bytes(kind);
    let scales = &group[blocks * quant..];
    let half = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    for (i, row) in lanes.zip(out.chunks_exact_mut(blocks * BLOCK)) {
        for (b, o) in row.chunks_exact_mut(BLOCK).enumerate() {
            let d = half(scales, b * 2 * LANES + 2 * i);
            let q = &group[b * quant..(b + 1) * quant];
            if kind == GgmlType::Q8_0 {
                for (c, pair) in o.chunks_exact_mut(2).enumerate() {
                    let at = c * LANES * 2 + 2 * i;
                    pair[0] = d * (q[at] as i8) as f32;
                    pair[1] = d * (q[at + 1] as i8) as f32;
                }
                continue;
            }
            // the stored block's sixteen nibble bytes, then its decoder's arithmetic:
            // w = d·q - min (Q4_0 stores q + 8, min 0; Q4_1 an offset m, min = -m)
            let mut bytes = [0u8; 16];
            for (c, four) in bytes.chunks_exact_mut(4).enumerate() {
                four.copy_from_slice(&q[c * LANES * 4 + 4 * i..][..4]);
            }
            let (offset, min) = if kind == GgmlType::Q4_0 {
                (8.0, 0.0)
            } else {
                (0.0, -half(scales, (blocks + b) * 2 * LANES + 2 * i))
            };
            let (lo, hi) = o.split_at_mut(16);
            for ((l, h), &byte) in lo.iter_mut().zip(hi).zip(&bytes) {
                *l = d * ((byte & 0x0F) as f32 - offset) - min;
                *h = d * ((byte >> 4) as f32 - offset) - min;
            }
        }
    }
}

/// Stored row `row` into lane `i` of `group` (see the module's layout).
fn scatter_row(kind: GgmlType, blocks: usize, row: &[u8], i: usize, group: &mut [u8]) {
    let bb = kind.block_bytes();
    assert_eq!(row.len(), blocks * bb, "a row's bytes");
    let (quant, lane) = (quant_bytes(kind), lane_bytes(kind));
    let scales = blocks * quant;
    for (b, block) in row.chunks_exact(bb).enumerate() {
        let half = scales + b * 2 * LANES + 2 * i;
        group[half..half + 2].copy_from_slice(&block[..2]);
        if kind == GgmlType::Q4_1 {
            let offset = half + blocks * 2 * LANES;
            group[offset..offset + 2].copy_from_slice(&block[2..4]);
        }
        for (c, chunk) in block[head_bytes(kind)..].chunks_exact(lane).enumerate() {
            let at = b * quant + c * LANES * lane + i * lane;
            group[at..at + lane].copy_from_slice(chunk);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Interleaved {
        /// Row `r` as the file stores it (its blocks one after another) into `out`.
        pub fn stored_row_into(&self, r: usize, out: &mut [u8]) {
            let (kind, blocks) = (self.kind, self.blocks());
            let bb = kind.block_bytes();
            assert!(r < self.n, "row {r} past the rows");
            assert_eq!(out.len(), blocks * bb, "a row's bytes");
            let group = self.group(r / LANES);
            let i = r % LANES;
            let (quant, lane) = (quant_bytes(kind), lane_bytes(kind));
            let scales = blocks * quant;
            for (b, block) in out.chunks_exact_mut(bb).enumerate() {
                let half = scales + b * 2 * LANES + 2 * i;
                block[..2].copy_from_slice(&group[half..half + 2]);
                if kind == GgmlType::Q4_1 {
                    let offset = half + blocks * 2 * LANES;
                    block[2..4].copy_from_slice(&group[offset..offset + 2]);
                }
                let ints = &mut block[head_bytes(kind)..];
                for (c, chunk) in ints.chunks_exact_mut(lane).enumerate() {
                    let at = b * quant + c * LANES * lane + i * lane;
                    chunk.copy_from_slice(&group[at..at + lane]);
                }
            }
        }
    }

    #[test]
    fn rows_come_back_byte_for_byte() {
        for kind in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let (n, k) = (37, 96); // three groups, the last of five rows
            let bytes: Vec<u8> = (0..n * kind.row_bytes(k))
                .map(|i| (i * 7 % 251) as u8)
                .collect();
            let len = kind.row_bytes(k);
            let m = Interleaved::pack(kind, n, k, |r| &bytes[r * len..(r + 1) * len]);
            assert_eq!(m.nbytes() % 64, 0);
            let mut back = vec![0u8; len];
            for r in 0..n {
                m.stored_row_into(r, &mut back);
                assert_eq!(
                    back,
                    &bytes[r * len..(r + 1) * len],
                    "{} row {r}",
                    kind.name()
                );
            }
            // the padding rows are zeros
            let last = m.group(2);
            let lane = lane_bytes(kind);
            for c in 0..quant_bytes(kind) / (LANES * lane) {
                let at = c * LANES * lane;
                assert!(last[at + 5 * lane..at + LANES * lane]
                    .iter()
                    .all(|&v| v == 0));
            }
        }
    }

    #[test]
    fn a_lane_holds_the_elements_its_chunk_says() {
        // Q4_1, one block: chunk c, lane i = stored integer bytes 4c..4c+4 of row i
        let kind = GgmlType::Q4_1;
        let rows: Vec<Vec<u8>> = (0..LANES)
            .map(|r| (0..20).map(|j| (r * 20 + j) as u8).collect())
            .collect();
        let m = Interleaved::pack(kind, LANES, 32, |r| &rows[r]);
        let g = m.group(0);
        for c in 0..4 {
            for i in 0..LANES {
                assert_eq!(&g[64 * c + 4 * i..][..4], &rows[i][4 + 4 * c..][..4]);
            }
        }
        // then the scales, then the offsets, sixteen f16 each
        assert_eq!(&g[256 + 2 * 3..][..2], &rows[3][..2]);
        assert_eq!(&g[256 + 32 + 2 * 3..][..2], &rows[3][2..4]);
    }
}
