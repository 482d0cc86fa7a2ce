//! Row products of the 32-element GGUF types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) against several tokens at
//! once: a batch of decode steps.
//!
//! A one-token product of these types is bound by its instructions, not by memory: per block and
//! row it decodes the weights (scale, offset, nibbles) and then does one integer product and one
//! multiply-add. Here each block of a row is decoded once for all the tokens. With AVX-512 a register
//! holds the block twice, and each of its 256-bit halves meets one token of a pair
//! ([`PairedGroup`]), so one integer product, one conversion and one multiply-add serve two tokens;
//! the offsets' sums run for sixteen tokens in one register. With AVX2 the tokens take turns on the
//! decoded block. What is left per token (the integer product, its conversion, the scale, the
//! multiply-add) is most of a one-token product still: on the AVX-512 VNNI machine this was written
//! on, four tokens cost about 2.4 times one token's product for Q4_1 and 1.7 times for Q8_0.
//!
//! Every (row, token) goes through the operations of [`super::dot_avx2`]'s row kernel for that token
//! alone, lane for lane and in the same order (the same exact integer sums per lane, each block's
//! `d · dx` rounded as one f32 product, one fused multiply-add per block into eight lanes, the same
//! horizontal sum, the offsets added as a product and a sum per block): the results are bit for bit
//! the one-token kernel's.

use std::arch::x86_64::*;
use std::ops::Range;

use super::acts::{Acts, PairedGroup, TokenActs};
use super::dot_avx2::{
    dot32, fifth_bits, halves_ptr, hsum, nibbles16, LEGACY_BYTES, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
};
use super::{GgmlMatrix, GgmlType};
use crate::kernels::prefetch;

/// Whether these kernels take `kind`.
pub fn takes(kind: GgmlType) -> bool {
    matches!(
        kind,
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1
    )
}

/// Rows `rows` of `m` against every token of `acts`: `out[t · rows.len() + i]` is row
/// `rows.start + i` times token `t`, on AVX-512 registers (two tokens per register).
///
/// # Safety
/// The CPU must have AVX-512 F, BW, DQ and VL with AVX2, FMA and F16C; `m`'s type must be one
/// [`takes`] accepts, `acts` in its form with its tokens paired, and `out` `tokens · rows.len()` long.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")]
pub unsafe fn rows_tokens_zmm(
    m: &GgmlMatrix,
    rows: Range<usize>,
    acts: &TokenActs,
    out: &mut [f32],
) {
    zmm_on::<false>(m, rows, acts, out)
}

/// [`rows_tokens_zmm`] with VNNI's `vpdpbusd` for the int8 products.
///
/// # Safety
/// As [`rows_tokens_zmm`], and the CPU must have AVX-512 VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
pub unsafe fn rows_tokens_zmm_vnni(
    m: &GgmlMatrix,
    rows: Range<usize>,
    acts: &TokenActs,
    out: &mut [f32],
) {
    zmm_on::<true>(m, rows, acts, out)
}

/// Rows `rows` of `m` against every token of `acts` on AVX2 registers, eight tokens per pass over a
/// row's blocks (their accumulators fill half the registers).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `m`'s type must be one [`takes`] accepts, `acts` in its
/// form, and `out` `tokens · rows.len()` long.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows_tokens_ymm(
    m: &GgmlMatrix,
    rows: Range<usize>,
    acts: &TokenActs,
    out: &mut [f32],
) {
    match m.kind {
        GgmlType::Q8_0 => ymm_type::<Q8_0>(m, rows, acts, out),
        GgmlType::Q4_0 => ymm_type::<Q4_0>(m, rows, acts, out),
        GgmlType::Q4_1 => ymm_type::<Q4_1>(m, rows, acts, out),
        GgmlType::Q5_0 => ymm_type::<Q5_0>(m, rows, acts, out),
        GgmlType::Q5_1 => ymm_type::<Q5_1>(m, rows, acts, out),
        other => unreachable!("{} is not a 32-element type", other.name()),
    }
}

#[inline(always)]
unsafe fn zmm_on<const VNNI: bool>(
    m: &GgmlMatrix,
    rows: Range<usize>,
    acts: &TokenActs,
    out: &mut [f32],
) {
    match m.kind {
        GgmlType::Q8_0 => zmm_type::<Q8_0, VNNI>(m, rows, acts, out),
        GgmlType::Q4_0 => zmm_type::<Q4_0, VNNI>(m, rows, acts, out),
        GgmlType::Q4_1 => zmm_type::<Q4_1, VNNI>(m, rows, acts, out),
        GgmlType::Q5_0 => zmm_type::<Q5_0, VNNI>(m, rows, acts, out),
        GgmlType::Q5_1 => zmm_type::<Q5_1, VNNI>(m, rows, acts, out),
        other => unreachable!("{} is not a 32-element type", other.name()),
    }
}

/// One type's rows, group by group of tokens, with the pass for the group's number of pairs.
#[inline(always)]
unsafe fn zmm_type<const T: u8, const VNNI: bool>(
    m: &GgmlMatrix,
    rows: Range<usize>,
    acts: &TokenActs,
    out: &mut [f32],
) {
    let len = rows.len();
    let blocks = m.k / 32;
    let mut values = [0f32; 16];
    for g in &acts.groups {
        for r in rows.clone() {
            let row = m.row(r).as_ptr();
            // a macro, not a closure: the kernel must inline under this function's features
            macro_rules! pass {
                ($($p:literal)*) => {
                    match g.pairs() {
                        $($p => zmm_row::<T, VNNI, $p>(row, blocks, g, &mut values),)*
                        other => unreachable!("{other} pairs in a group"),
                    }
                };
            }
            pass!(1 2 3 4 5 6 7 8);
            for (t, &v) in values.iter().enumerate().take(g.count) {
                out[(g.first + t) * len + r - rows.start] = v;
            }
        }
    }
}

/// One row against `P` pairs of tokens: `out[t]` for token `t` of the group.
#[inline(always)]
unsafe fn zmm_row<const T: u8, const VNNI: bool, const P: usize>(
    row: *const u8,
    blocks: usize,
    g: &PairedGroup,
    out: &mut [f32; 16],
) {
    let bytes = LEGACY_BYTES[T as usize];
    let (xq, xq16, dx, dsum) = (g.q.as_ptr(), g.q16.as_ptr(), g.d.as_ptr(), g.dsum.as_ptr());
    // the upper 128 bits of each half take the high nibbles (elements 16..32)
    let shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); P];
    let mut fix = _mm512_setzero_ps(); // lane t: token t's offset sum
    for b in 0..blocks {
        let block = row.add(b * bytes);
        if (b * bytes) % prefetch::LINE_BYTES < bytes {
            prefetch::weights_ahead(block, 1); // once per line, as the one-token kernel
        }
        // the scale, and the offset where the type has one (see `halves_ptr`)
        let (d, second) = halves_ptr(block);
        let dv = _mm512_set1_ps(d);
        if T == Q8_0 {
            // both halves of the block's int16 weights, each in both halves of a register
            let w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(block.add(2) as *const __m256i));
            let w0 = _mm512_shuffle_i64x2::<0b01_00_01_00>(w, w);
            let w1 = _mm512_shuffle_i64x2::<0b11_10_11_10>(w, w);
            for (p, a) in acc.iter_mut().enumerate() {
                let x = xq16.add((b * P + p) * 64);
                let isum = _mm512_add_epi32(
                    _mm512_madd_epi16(w0, _mm512_loadu_si512(x as *const __m512i)),
                    _mm512_madd_epi16(w1, _mm512_loadu_si512(x.add(32) as *const __m512i)),
                );
                let scale = _mm512_mul_ps(dv, _mm512_loadu_ps(dx.add((b * P + p) * 16)));
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, *a);
            }
            // no offset: the one-token kernel's `+= 0 · dsum` leaves its +0.0 as it is
            continue;
        }
        // the block's 32 unsigned values, in element order, in both halves; and its offset per
        // unit of the activation sum
        let (nib_at, c) = match T {
            Q4_0 => (2, -8.0 * d),
            Q4_1 => (4, second),
            Q5_0 => (6, -16.0 * d),
            _ => (8, second),
        };
        let raw = _mm512_broadcast_i32x4(_mm_loadu_si128(block.add(nib_at) as *const __m128i));
        let mut w = _mm512_and_si512(_mm512_srlv_epi64(raw, shift), low);
        if T == Q5_0 || T == Q5_1 {
            let high = (block.add(nib_at - 4) as *const u32).read_unaligned();
            w = _mm512_or_si512(w, _mm512_broadcast_i64x4(fifth_bits(high)));
        }
        let sums = _mm512_loadu_ps(dsum.add(16 * b));
        fix = _mm512_add_ps(fix, _mm512_mul_ps(_mm512_set1_ps(c), sums));
        for (p, a) in acc.iter_mut().enumerate() {
            let x = _mm512_loadu_si512(xq.add((b * P + p) * 64) as *const __m512i);
            let isum = if VNNI {
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x)
            } else {
                _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1))
            };
            let scale = _mm512_mul_ps(dv, _mm512_loadu_ps(dx.add((b * P + p) * 16)));
            *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, *a);
        }
    }
    let mut fixes = [0f32; 16];
    _mm512_storeu_ps(fixes.as_mut_ptr(), fix);
    for (p, a) in acc.iter().enumerate() {
        let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a)));
        out[2 * p] = hsum(_mm512_castps512_ps256(*a)) + fixes[2 * p];
        out[2 * p + 1] = hsum(high) + fixes[2 * p + 1];
    }
}

/// One type's rows on AVX2, eight tokens at a time.
#[inline(always)]
unsafe fn ymm_type<const T: u8>(
    m: &GgmlMatrix,
    rows: Range<usize>,
    acts: &TokenActs,
    out: &mut [f32],
) {
    let len = rows.len();
    let blocks = m.k / 32;
    let mut values = [0f32; 8];
    for (c, chunk) in acts.rows.chunks(8).enumerate() {
        for r in rows.clone() {
            let row = m.row(r).as_ptr();
            macro_rules! pass {
                ($($n:literal)*) => {
                    match chunk.len() {
                        $($n => ymm_row::<T, $n>(row, blocks, chunk, &mut values),)*
                        other => unreachable!("{other} tokens in a chunk"),
                    }
                };
            }
            pass!(1 2 3 4 5 6 7 8);
            for (t, &v) in values.iter().enumerate().take(chunk.len()) {
                out[(8 * c + t) * len + r - rows.start] = v;
            }
        }
    }
}

/// One row against `N` tokens: each decoded block meets every token in turn.
#[inline(always)]
unsafe fn ymm_row<const T: u8, const N: usize>(
    row: *const u8,
    blocks: usize,
    acts: &[Acts],
    out: &mut [f32; 8],
) {
    let bytes = LEGACY_BYTES[T as usize];
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut fix = [0f32; N];
    for b in 0..blocks {
        let block = row.add(b * bytes);
        if (b * bytes) % prefetch::LINE_BYTES < bytes {
            prefetch::weights_ahead(block, 1);
        }
        let (d, second) = halves_ptr(block);
        if T == Q8_0 {
            let w = _mm256_loadu_si256(block.add(2) as *const __m256i);
            let w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
            let w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(w));
            for (t, a) in acc.iter_mut().enumerate() {
                let x16 = acts[t].q16.as_ptr().add(32 * b) as *const __m256i;
                let isum = _mm256_add_epi32(
                    _mm256_madd_epi16(w0, _mm256_loadu_si256(x16)),
                    _mm256_madd_epi16(w1, _mm256_loadu_si256(x16.add(1))),
                );
                let dx = *acts[t].d.get_unchecked(b);
                *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dx), *a);
            }
            // no offset: the one-token kernel's `+= 0 · dsum` leaves its +0.0 as it is
            continue;
        }
        let (w, c) = match T {
            Q4_0 => (nibbles16(block.add(2)), -8.0 * d),
            Q4_1 => (nibbles16(block.add(4)), second),
            Q5_0 => {
                let high = (block.add(2) as *const u32).read_unaligned();
                (
                    _mm256_or_si256(nibbles16(block.add(6)), fifth_bits(high)),
                    -16.0 * d,
                )
            }
            _ => {
                let high = (block.add(4) as *const u32).read_unaligned();
                (
                    _mm256_or_si256(nibbles16(block.add(8)), fifth_bits(high)),
                    second,
                )
            }
        };
        for (t, a) in acc.iter_mut().enumerate() {
            let x = _mm256_loadu_si256(acts[t].q.as_ptr().add(32 * b) as *const __m256i);
            let dx = *acts[t].d.get_unchecked(b);
            let isum = dot32(w, x, ones);
            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dx), *a);
            fix[t] += c * *acts[t].dsum.get_unchecked(b);
        }
    }
    for t in 0..N {
        out[t] = hsum(acc[t]) + fix[t];
    }
}
