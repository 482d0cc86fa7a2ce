//! AVX2 row products over GGUF blocks. Every quantized type is brought to 32 unsigned bytes per
//! step (its integers plus a bias the activation sums take back out), multiplied with 32 int8
//! activations by `vpmaddubsw` (pairs into i16: at most 63 · 127 · 2, no saturation) and
//! `vpmaddwd` (pairs into i32, by one or by the sub-block's integer scale), so each sub-block's
//! sum is exact and only one f32 multiply-add per block (per super-block for the K-quants) rounds.
//! On CPUs with AVX-512 VNNI the same code runs with `vpdpbusd` (both steps in one instruction;
//! the same exact sums).
//!
//! A call covers a range of rows, so the type is dispatched once per range; the 32-element types
//! run four rows per step, each activation block loaded once for all four. Each row keeps its own
//! accumulator over its blocks in order, so a row's result does not depend on the rows beside it.

use std::arch::x86_64::*;
use std::ops::Range;

use super::acts::Acts;
use super::blocks::{iq4xs_scale, GgmlType, IQ4_VALUES, QK_K};
use super::GgmlMatrix;
use crate::kernels::prefetch;

/// The f16 at `p`, converted by F16C (callers run with it enabled).
#[inline(always)]
unsafe fn half_ptr(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The two f16 at `p` (four bytes the caller has), converted by F16C. Loaded as one 32-bit value
/// (`vmovd`, which clears the rest of the register): each f16 alone compiles to an insert
/// (`vpinsrw`) into whatever register the compiler picks, and a loop then waits on that register's
/// last use; in the Q4_1 row kernel that chained the blocks into one long dependency (about 15% of
/// a product's time).
#[inline(always)]
pub(super) unsafe fn halves_ptr(p: *const u8) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The f16 at byte `at` of `b`.
#[inline(always)]
unsafe fn half_at(b: &[u8], at: usize) -> f32 {
    half_ptr(b.as_ptr().add(at))
}

/// Eight i32 lanes of `Σ w · x` over 32 unsigned `w` and signed `x`, each pair of i16 products
/// multiplied by `scale` (i16 lanes).
#[inline(always)]
pub(super) unsafe fn dot32(w: __m256i, x: __m256i, scale: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), scale)
}

/// Eight i32 lanes of `Σ w · x` over 32 unsigned `w` and signed `x` (four products per lane):
/// `vpdpbusd` with VNNI, else [`dot32`] by ones (the same sums).
#[inline(always)]
unsafe fn dot32_plain<const VNNI: bool>(w: __m256i, x: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
    } else {
        dot32(w, x, _mm256_set1_epi16(1))
    }
}

#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// 16 bytes of nibbles as 32 bytes: the low nibbles first, then the high ones. The 16 bytes are
/// loaded into both halves at once, and one variable shift moves only the upper half's.
#[inline(always)]
pub(super) unsafe fn nibbles16(p: *const u8) -> __m256i {
    let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
    let shifted = _mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4));
    _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F))
}

/// The IQ4 values ([`IQ4_VALUES`]) in each 128-bit half, for `vpshufb` to look indices up in.
#[inline(always)]
unsafe fn iq4_table() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4_VALUES.as_ptr() as *const __m128i))
}

/// 32 IQ4 values (`indices`, one per byte) and 32 int8 activations as the unsigned-times-signed
/// operands of `vpmaddubsw` / `vpdpbusd`: the values are signed, so their magnitudes meet the
/// activations with the values' signs moved onto them (exact: at most 2 · 127 · 127 a pair).
#[inline(always)]
unsafe fn iq4_operands(indices: __m256i, x: __m256i) -> (__m256i, __m256i) {
    let w = _mm256_shuffle_epi8(iq4_table(), indices);
    (_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
}

/// `vpmaddubsw`'s i16 pairs of 32 IQ4 values against 32 int8 activations ([`iq4_operands`]).
#[inline(always)]
unsafe fn iq4_pairs(indices: __m256i, x: __m256i) -> __m256i {
    let (w, x) = iq4_operands(indices, x);
    _mm256_maddubs_epi16(w, x)
}

/// Eight i32 lanes of `Σ w · x` over 32 IQ4 values (`indices`) and int8 activations
/// ([`iq4_operands`] through [`dot32_plain`]).
#[inline(always)]
unsafe fn iq4_dot32<const VNNI: bool>(indices: __m256i, x: __m256i) -> __m256i {
    let (w, x) = iq4_operands(indices, x);
    dot32_plain::<VNNI>(w, x)
}

/// 0x10 in byte i where bit i of `bits` is set.
#[inline(always)]
pub(super) unsafe fn fifth_bits(bits: u32) -> __m256i {
    // byte i takes byte i / 8 of `bits`, then tests its bit i % 8
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// `nibbles` with 16 added in byte i where bit i of `bits` is set (the fifth bits of Q5_0 and Q5_1).
/// The VNNI copy runs with AVX-512 BW and VL, whose byte-masked add takes the bits as a mask register:
/// one instruction where [`fifth_bits`] spreads them with five.
#[inline(always)]
unsafe fn with_fifth_bits<const VNNI: bool>(nibbles: __m256i, bits: u32) -> __m256i {
    if VNNI {
        _mm256_mask_add_epi8(nibbles, bits, nibbles, _mm256_set1_epi8(0x10))
    } else {
        _mm256_or_si256(nibbles, fifth_bits(bits))
    }
}

/// Rows `rows` of `m` times one activation row, into `out` (one value per row).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `a` must be the activations in the form `m`'s type takes,
/// and `out` as long as `rows`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows_dot(m: &GgmlMatrix, rows: Range<usize>, a: &Acts, out: &mut [f32]) {
    rows_dot_on::<false>(m, rows, a, out)
}

/// [`rows_dot`] with AVX-512 VNNI's `vpdpbusd` on 256-bit lanes.
///
/// # Safety
/// As [`rows_dot`], and the CPU must have AVX-512 F, BW, VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn rows_dot_vnni(m: &GgmlMatrix, rows: Range<usize>, a: &Acts, out: &mut [f32]) {
    rows_dot_on::<true>(m, rows, a, out)
}

#[inline(always)]
unsafe fn rows_dot_on<const VNNI: bool>(
    m: &GgmlMatrix,
    rows: Range<usize>,
    a: &Acts,
    out: &mut [f32],
) {
    // a plain loop per type (no closure between the kernel and this function, so the kernels
    // inline here, under this function's instruction sets)
    macro_rules! each_row {
        ($row:ident => $dot:expr) => {
            for (o, r) in out.iter_mut().zip(rows) {
                let $row = m.row(r);
                *o = $dot;
            }
        };
    }
    match m.kind {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            each_row!(row => float_dot(m.kind, row, &a.f))
        }
        // the K-quants one row at a time: four rows' scales, sums and accumulators spill registers
        // (measured slower than one)
        GgmlType::Q4K => each_row!(row => q45k_dot::<false>(row, a)),
        GgmlType::Q5K => each_row!(row => q45k_dot::<true>(row, a)),
        GgmlType::Q6K => each_row!(row => q6k_dot(row, a)),
        // no vector kernel for these yet: the portable decoder, still reading the rows as stored
        GgmlType::Q2K | GgmlType::Q3K => each_row!(row => super::dot::row_dot(m.kind, row, a)),
        GgmlType::IQ4XS => each_row!(row => iq4xs_dot(row, a)),
        GgmlType::IQ4NL => legacy_rows::<IQ4_NL, VNNI>(m, rows, a, out),
        GgmlType::Q8_0 => legacy_rows::<Q8_0, VNNI>(m, rows, a, out),
        GgmlType::Q4_0 => legacy_rows::<Q4_0, VNNI>(m, rows, a, out),
        GgmlType::Q4_1 => legacy_rows::<Q4_1, VNNI>(m, rows, a, out),
        GgmlType::Q5_0 => legacy_rows::<Q5_0, VNNI>(m, rows, a, out),
        GgmlType::Q5_1 => legacy_rows::<Q5_1, VNNI>(m, rows, a, out),
    }
}

/// Eight weights from element `i` of a float-typed row, as f32 (a function, not a closure: a
/// closure is compiled without its caller's instruction sets, and this must inline under them).
#[inline(always)]
unsafe fn float8(kind: GgmlType, row: &[u8], i: usize) -> __m256 {
    match kind {
        GgmlType::F32 => _mm256_loadu_ps(row.as_ptr().add(4 * i) as *const f32),
        GgmlType::F16 => {
            _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(2 * i) as *const __m128i))
        }
        _ => {
            let h = _mm_loadu_si128(row.as_ptr().add(2 * i) as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

#[inline(always)]
unsafe fn float_dot(kind: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= k {
        acc0 = _mm256_fmadd_ps(
            float8(kind, row, i),
            _mm256_loadu_ps(x.as_ptr().add(i)),
            acc0,
        );
        acc1 = _mm256_fmadd_ps(
            float8(kind, row, i + 8),
            _mm256_loadu_ps(x.as_ptr().add(i + 8)),
            acc1,
        );
        i += 16;
    }
    if i + 8 <= k {
        acc0 = _mm256_fmadd_ps(
            float8(kind, row, i),
            _mm256_loadu_ps(x.as_ptr().add(i)),
            acc0,
        );
        i += 8;
    }
    let mut sum = hsum(_mm256_add_ps(acc0, acc1));
    if i < k {
        // the last few, through the portable code
        let bytes = row.len() / k;
        let tail = super::acts::quantize(super::acts::ActForm::F32, &x[i..]);
        sum += super::dot::row_dot(kind, &row[i * bytes..], &tail);
    }
    sum
}

// the 32-element types, as const parameters of `legacy_dot`
pub(super) const Q8_0: u8 = 0;
pub(super) const Q4_0: u8 = 1;
pub(super) const Q4_1: u8 = 2;
pub(super) const Q5_0: u8 = 3;
pub(super) const Q5_1: u8 = 4;
pub(super) const IQ4_NL: u8 = 5;

/// One block of a 32-element type against activation block `x` (int8, or int16 for Q8_0 at
/// `x16`): the exact integer sums (eight lanes), the block's scale `d`, and its offset or bias per
/// unit of the activation sum (`dsum` takes it to `c · dx · Σ x`).
#[inline(always)]
unsafe fn legacy_block<const T: u8, const VNNI: bool>(
    block: *const u8,
    x: __m256i,
    x16: *const __m256i,
) -> (__m256i, f32, f32) {
    // the scale, and the offset where the type has one (the next f16), read together: see
    // `halves_ptr` (the types without one measured faster with the single load)
    let (d, second) = if T == Q4_1 || T == Q5_1 {
        halves_ptr(block)
    } else {
        (half_ptr(block), 0.0)
    };
    if T == Q8_0 {
        // int16 activations: both halves widened, products summed in pairs
        let w = _mm256_loadu_si256(block.add(2) as *const __m256i);
        let w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
        let w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(w));
        let isum = _mm256_add_epi32(
            _mm256_madd_epi16(w0, _mm256_loadu_si256(x16)),
            _mm256_madd_epi16(w1, _mm256_loadu_si256(x16.add(1))),
        );
        return (isum, d, 0.0);
    }
    if T == IQ4_NL {
        return (iq4_dot32::<VNNI>(nibbles16(block.add(2)), x), d, 0.0);
    }
    let (w, fix) = match T {
        Q4_0 => (nibbles16(block.add(2)), -8.0 * d),
        Q4_1 => (nibbles16(block.add(4)), second),
        Q5_0 => {
            let high = (block.add(2) as *const u32).read_unaligned();
            (
                with_fifth_bits::<VNNI>(nibbles16(block.add(6)), high),
                -16.0 * d,
            )
        }
        _ => {
            let high = (block.add(4) as *const u32).read_unaligned();
            (
                with_fifth_bits::<VNNI>(nibbles16(block.add(8)), high),
                second,
            )
        }
    };
    (dot32_plain::<VNNI>(w, x), d, fix)
}

/// Bytes of one block of each 32-element type.
pub(super) const LEGACY_BYTES: [usize; 6] = [34, 18, 20, 22, 24, 18];

/// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 rows `rows` of `m`: four rows per step (their accumulator chains
/// overlap and share the activation loads), then the rest one by one in the same order per row.
#[inline(always)]
unsafe fn legacy_rows<const T: u8, const VNNI: bool>(
    m: &GgmlMatrix,
    rows: Range<usize>,
    a: &Acts,
    out: &mut [f32],
) {
    let mut r = rows.start;
    let mut o = 0;
    while r + 4 <= rows.end {
        let ps = [0, 1, 2, 3].map(|i| m.row(r + i).as_ptr());
        out[o..o + 4].copy_from_slice(&legacy_group::<T, VNNI, 4>(ps, m.k / 32, a));
        r += 4;
        o += 4;
    }
    while r < rows.end {
        out[o] = legacy_group::<T, VNNI, 1>([m.row(r).as_ptr()], m.k / 32, a)[0];
        r += 1;
        o += 1;
    }
}

/// `R` rows of `blocks` blocks each against the activations: one accumulator per row, its blocks
/// added in order (so a row's result is the same in a group of four and alone).
#[inline(always)]
unsafe fn legacy_group<const T: u8, const VNNI: bool, const R: usize>(
    ps: [*const u8; R],
    blocks: usize,
    a: &Acts,
) -> [f32; R] {
    let bytes = LEGACY_BYTES[T as usize];
    let mut acc = [_mm256_setzero_ps(); R];
    let mut fix = [0f32; R];
    for b in 0..blocks {
        // one prefetch per cache line of each row (see `prefetch_block`): where a block starts
        // within its first bytes
        if (b * bytes) % prefetch::LINE_BYTES < bytes {
            for p in ps {
                prefetch::weights_ahead(p.wrapping_add(b * bytes), 1);
            }
        }
        let dx = *a.d.get_unchecked(b);
        let dsum = *a.dsum.get_unchecked(b);
        let (x, x16) = if T == Q8_0 {
            (
                _mm256_setzero_si256(),
                a.q16.as_ptr().add(32 * b) as *const __m256i,
            )
        } else {
            (
                _mm256_loadu_si256(a.q.as_ptr().add(32 * b) as *const __m256i),
                std::ptr::null(),
            )
        };
        for j in 0..R {
            let (isum, d, c) = legacy_block::<T, VNNI>(ps[j].add(b * bytes), x, x16);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dx), acc[j]);
            fix[j] += c * dsum;
        }
    }
    let mut out = [0f32; R];
    for j in 0..R {
        out[j] = hsum(acc[j]) + fix[j];
    }
    out
}

/// The eight 6-bit scales (bytes 0..8) and mins (bytes 8..16) of a Q4_K / Q5_K super-block, from
/// its 12 packed bytes at `packed`, unpacked four at a time in 32-bit words (what
/// [`super::blocks::k_scale_min`] gives one by one).
#[inline(always)]
unsafe fn k_scales(packed: *const u8) -> __m128i {
    let word = |i: usize| (packed.add(4 * i) as *const u32).read_unaligned();
    let (w0, w1, w2) = (word(0), word(1), word(2));
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    // sub-blocks 0..4 keep the low six bits of bytes 0..4 (scales) and 4..8 (mins); sub-blocks
    // 4..8 take a nibble of bytes 8..12 and the top two bits of those bytes
    let scales_hi = (w2 & LOW4) | (((w0 >> 6) & TOP2) << 4);
    let mins_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & TOP2) << 4);
    _mm_setr_epi32(
        (w0 & LOW6) as i32,
        scales_hi as i32,
        (w1 & LOW6) as i32,
        mins_hi as i32,
    )
}

/// The i16 in lane `j` (of eight) of each 128-bit half of `v`, in all of that half's lanes.
#[inline(always)]
unsafe fn spread_i16(v: __m256i, j: i32) -> __m256i {
    _mm256_shuffle_epi8(v, _mm256_set1_epi16((((2 * j + 1) << 8) | (2 * j)) as i16))
}

/// The exact sum of the eight i32 lanes of `v`.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// `acc + Σ p · scale` in i32 lanes over pairs of i16 lanes. VNNI's `vpdpwssd` would fuse the
/// two, but its five-cycle accumulation chains the sub-blocks: the separate multiply-add and add
/// measured faster in these loops on the AVX-512 VNNI machine.
#[inline(always)]
unsafe fn add_scaled(acc: __m256i, p: __m256i, scale: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale))
}

/// Prefetches the lines a super-block [`prefetch::DISTANCE_BYTES`] ahead of `block` will take. A
/// row product of a model too large for the caches reads its weights from memory once each, in order;
/// the hardware streamer alone stops at each 4 KiB page and keeps too few lines in flight.
#[inline(always)]
fn prefetch_block(block: &[u8]) {
    let mut at = 0;
    while at < block.len() {
        prefetch::weights_ahead(block.as_ptr().wrapping_add(at), 1);
        at += prefetch::LINE_BYTES;
    }
}

/// IQ4_XS: super-blocks of 256 in eight sub-blocks of 32 IQ4 values, each with a 6-bit scale
/// (less 32). Each sub-block's pairs ([`iq4_pairs`]) take its integer scale in one 16-bit
/// multiply-add, so the super-block's sum is exact in i32 (at most 8 · 32 · 127 · 127 · 32) and
/// rounds once, in one multiply-add per super-block.
#[inline(always)]
unsafe fn iq4xs_dot(row: &[u8], a: &Acts) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, block) in row.chunks_exact(136).enumerate() {
        prefetch_block(block);
        let p = block.as_ptr();
        let xq = a.q.as_ptr().add(QK_K * b);
        let mut isum = _mm256_setzero_si256();
        for s in 0..8 {
            let scale = iq4xs_scale(block, s) as i16;
            let x = _mm256_loadu_si256(xq.add(32 * s) as *const __m256i);
            let pairs = iq4_pairs(nibbles16(p.add(8 + 16 * s)), x);
            isum = add_scaled(isum, pairs, _mm256_set1_epi16(scale));
        }
        let scale = half_ptr(p) * *a.d.get_unchecked(b);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(scale), acc);
    }
    hsum(acc)
}

/// Q4_K and Q5_K: super-blocks of 256 in eight sub-blocks of 32 with 6-bit scales and mins. The
/// sub-blocks' exact sums (times their integer scales) add up per super-block, then one multiply-add
/// per super-block. Each 32 products go through `vpmaddubsw` (pairs, exact in i16: at most
/// 2 · 31 · 127) and then one 16-bit multiply-add by the sub-block's scale; the mins' term is one
/// multiply-add of the duplicated mins with the activations' 16-element sums.
#[inline(always)]
unsafe fn q45k_dot<const FIVE: bool>(row: &[u8], a: &Acts) -> f32 {
    let bytes = if FIVE { 176 } else { 144 };
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    for (b, block) in row.chunks_exact(bytes).enumerate() {
        prefetch_block(block);
        let dx = *a.d.get_unchecked(b);
        let xq = a.q.as_ptr().add(QK_K * b);
        let packed = k_scales(block.as_ptr().add(4));
        // lanes 2j and 2j + 1: min j, against sums 2j and 2j + 1 (sub-block j's halves)
        let mins16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(packed, packed));
        let sums = _mm256_loadu_si256(a.sums16_i16.as_ptr().add(16 * b) as *const __m256i);
        let msum = hsum_i32(_mm256_madd_epi16(mins16, sums));
        mins += half_at(block, 2) * dx * msum as f32;
        // the eight scales as i16, in both halves
        let scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(packed));
        let nib = block.as_ptr().add(if FIVE { 48 } else { 16 });
        let high = if FIVE {
            _mm256_loadu_si256(block.as_ptr().add(16) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        // two chains, one per sub-block of each pair, so consecutive accumulations do not wait
        let (mut isum0, mut isum1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for c in 0..4 {
            let x0 = _mm256_loadu_si256(xq.add(64 * c) as *const __m256i);
            let x1 = _mm256_loadu_si256(xq.add(64 * c + 32) as *const __m256i);
            let n = _mm256_loadu_si256(nib.add(32 * c) as *const __m256i);
            let mut w0 = _mm256_and_si256(n, low);
            let mut w1 = _mm256_and_si256(_mm256_srli_epi16::<4>(n), low);
            if FIVE {
                let (bit0, bit1) = (
                    _mm256_set1_epi8(1 << (2 * c)),
                    _mm256_set1_epi8(2 << (2 * c)),
                );
                let sixteen = _mm256_set1_epi8(0x10);
                let h0 = _mm256_cmpeq_epi8(_mm256_and_si256(high, bit0), bit0);
                let h1 = _mm256_cmpeq_epi8(_mm256_and_si256(high, bit1), bit1);
                w0 = _mm256_or_si256(w0, _mm256_and_si256(h0, sixteen));
                w1 = _mm256_or_si256(w1, _mm256_and_si256(h1, sixteen));
            }
            let (p0, p1) = (_mm256_maddubs_epi16(w0, x0), _mm256_maddubs_epi16(w1, x1));
            let c = c as i32;
            isum0 = add_scaled(isum0, p0, spread_i16(scales, 2 * c));
            isum1 = add_scaled(isum1, p1, spread_i16(scales, 2 * c + 1));
        }
        let isum = _mm256_add_epi32(isum0, isum1);
        let d = half_at(block, 0);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dx), acc);
    }
    hsum(acc) - mins
}

/// Q6_K: super-blocks of 256 in sixteen sub-blocks of 16 with int8 scales, values 6-bit minus 32.
/// The scales are widened to i16 once per super-block; each group of 32 products takes its two
/// sub-blocks' scales from them by a byte shuffle.
#[inline(always)]
unsafe fn q6k_dot(row: &[u8], a: &Acts) -> f32 {
    let low = _mm256_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    let mut bias = 0f32;
    for (b, block) in row.chunks_exact(210).enumerate() {
        prefetch_block(block);
        let dx = *a.d.get_unchecked(b);
        let xq = a.q.as_ptr().add(QK_K * b);
        let d = half_at(block, 208);
        // the sixteen scales as i16: sub-blocks 0..8 in the low half, 8..16 in the high one
        let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(block.as_ptr().add(192) as *const __m128i));
        let sums = _mm256_loadu_si256(a.sums16_i16.as_ptr().add(16 * b) as *const __m256i);
        let bsum = hsum_i32(_mm256_madd_epi16(sc, sums));
        bias += 32.0 * d * dx * bsum as f32;
        let mut isum = [_mm256_setzero_si256(); 2];
        for (half, isum) in isum.iter_mut().enumerate() {
            // this half's eight scales in both 128-bit halves
            let scales = if half == 0 {
                _mm256_permute2x128_si256::<0x00>(sc, sc)
            } else {
                _mm256_permute2x128_si256::<0x11>(sc, sc)
            };
            let qh = _mm256_loadu_si256(block.as_ptr().add(128 + 32 * half) as *const __m256i);
            for g in 0..4 {
                let x = _mm256_loadu_si256(xq.add(128 * half + 32 * g) as *const __m256i);
                let ql = block.as_ptr().add(64 * half + 32 * (g % 2));
                let l = _mm256_loadu_si256(ql as *const __m256i);
                let nib = if g < 2 {
                    _mm256_and_si256(l, low)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l), low)
                };
                let hb = match g {
                    0 => qh,
                    1 => _mm256_srli_epi16::<2>(qh),
                    2 => _mm256_srli_epi16::<4>(qh),
                    _ => _mm256_srli_epi16::<6>(qh),
                };
                let w = _mm256_or_si256(nib, _mm256_slli_epi16::<4>(_mm256_and_si256(hb, three)));
                // the group's two sub-blocks of 16: scale 2g in the low half, 2g + 1 in the high
                let j = 2 * g as i32;
                let pick = |j: i32| _mm_set1_epi16((((2 * j + 1) << 8) | (2 * j)) as i16);
                let scale = _mm256_shuffle_epi8(scales, _mm256_set_m128i(pick(j + 1), pick(j)));
                *isum = add_scaled(*isum, _mm256_maddubs_epi16(w, x), scale);
            }
        }
        let isum = _mm256_add_epi32(isum[0], isum[1]);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dx), acc);
    }
    hsum(acc) - bias
}
