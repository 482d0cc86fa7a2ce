//! Row products of regrouped matrices ([`super::interleaved`]) against one or several tokens: a
//! decode step, or a batch of them.
//!
//! Each register lane is one row, so a group's sixteen row sums build up side by side and nothing is
//! reduced across lanes. Per group and block the weights are decoded once (nibbles split, or int8
//! widened to int16) and then meet every token of the pass: per token, one integer product per four
//! elements (`vpdpbusd`; `vpmaddubsw` summed in int16 without VNNI, at most 16 · 15 · 127 per lane),
//! one conversion, and one or two multiply-adds for sixteen rows.
//!
//! Sums: every (row, block) product is exact in int32 and rounds once when scaled; each token's
//! lane takes the same operations in the same order whatever the other tokens of the pass, so a
//! batch gives every token the values a step alone gives it, bit for bit.
//!
//! Activations: the 4-bit types take int8 per block of 32 (`x ≈ dx · q`, with `dx · Σ q` for the
//! offset), Q8_0 takes int16 per block, as its row kernels do.

use std::arch::x86_64::*;
use std::ops::Range;

use super::acts::Acts;
use super::interleaved::{fetch_block_ahead, quant_bytes, Interleaved, LANES};
use super::GgmlType;

/// Tokens one pass over the weights takes (their accumulators stay in registers).
const PASS: usize = 8;

/// Runs `$pass(group, tokens, values)` for every group covering `rows` and every pass of up to
/// [`PASS`] tokens, and copies the rows asked for into `out`. A macro, not a function taking a
/// closure: the kernels must inline under the calling function's instruction sets.
macro_rules! each_group {
    ($m:expr, $rows:expr, $acts:expr, $out:expr, |$group:ident, $chunk:ident, $values:ident| $pass:expr) => {{
        let (m, rows, acts, out): (&Interleaved, Range<usize>, &[Acts], &mut [f32]) =
            ($m, $rows, $acts, $out);
        let len = rows.len();
        let mut $values = [[0f32; LANES]; PASS]; // [token of the pass, lane]
        // a group's passes one after the other, so that after the first they read it from L1
        for g in Interleaved::groups_of(&rows) {
            let $group = m.group(g).as_ptr();
            for (p, $chunk) in acts.chunks(PASS).enumerate() {
                $pass;
                let (lo, hi) = (
                    (g * LANES).max(rows.start),
                    (g * LANES + LANES).min(rows.end),
                );
                for (t, lanes) in $values.iter().enumerate().take($chunk.len()) {
                    let dst = &mut out[(p * PASS + t) * len + lo - rows.start..][..hi - lo];
                    dst.copy_from_slice(&lanes[lo - g * LANES..hi - g * LANES]);
                }
            }
        }
    }};
}

/// Whether the kernels at the running level take `kind` regrouped: the 4-bit types from AVX2 up,
/// Q8_0 with AVX-512 (its sixteen widened chunks need AVX-512's thirty-two registers).
pub fn takes(kind: GgmlType) -> bool {
    match kind {
        GgmlType::Q4_0 | GgmlType::Q4_1 => crate::isa::avx2(),
        GgmlType::Q8_0 => crate::isa::avx512(),
        _ => false,
    }
}

/// Rows `rows` of `m` times each token of `acts` (in the form `m`'s type takes):
/// `out[t · rows.len() + i]` is row `rows.start + i` times token `t`, on the best kernel the running
/// level and CPU have.
pub fn rows_tokens(m: &Interleaved, rows: Range<usize>, acts: &[Acts], out: &mut [f32]) {
    assert!(rows.end <= m.n, "rows out of range");
    assert_eq!(out.len(), acts.len() * rows.len(), "output length");
    assert!(
        takes(m.kind),
        "{} is not regrouped at this level",
        m.kind.name()
    );
    let elements = if m.kind == GgmlType::Q8_0 {
        |a: &Acts| a.q16.len()
    } else {
        |a: &Acts| a.q.len()
    };
    assert!(
        acts.iter()
            .all(|a| elements(a) == m.k && a.d.len() == m.blocks()),
        "activations in the weights' form and width"
    );
    // SAFETY: the level guarantees each kernel's features (AVX-512 includes AVX2, FMA and F16C;
    // VNNI checked), and the activations' lengths are checked above
    unsafe {
        if crate::isa::avx512() && super::vnni() {
            rows_tokens_zmm_vnni(m, rows, acts, out)
        } else if crate::isa::avx512() {
            rows_tokens_zmm(m, rows, acts, out)
        } else {
            rows_tokens_ymm(m, rows, acts, out)
        }
    }
}

/// [`rows_tokens`] on AVX-512 registers with VNNI's `vpdpbusd` and `vpdpwssd`.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, DQ, VL and VNNI with AVX2, FMA and F16C; every token of `acts`
/// in `m`'s form and `k` wide, `out` `acts.len() · rows.len()` long.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
pub unsafe fn rows_tokens_zmm_vnni(
    m: &Interleaved,
    rows: Range<usize>,
    acts: &[Acts],
    out: &mut [f32],
) {
    each_group!(m, rows, acts, out, |group, chunk, values| zmm_pass::<true>(
        m.kind,
        group,
        m.blocks(),
        chunk,
        &mut values
    ))
}

/// [`rows_tokens`] on AVX-512 registers without VNNI.
///
/// # Safety
/// As [`rows_tokens_zmm_vnni`], without VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")]
pub unsafe fn rows_tokens_zmm(m: &Interleaved, rows: Range<usize>, acts: &[Acts], out: &mut [f32]) {
    each_group!(
        m,
        rows,
        acts,
        out,
        |group, chunk, values| zmm_pass::<false>(m.kind, group, m.blocks(), chunk, &mut values)
    )
}

/// [`rows_tokens`] on AVX2 registers (the 4-bit types), eight rows to a register.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `m` of a 4-bit type, the rest as [`rows_tokens_zmm_vnni`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows_tokens_ymm(m: &Interleaved, rows: Range<usize>, acts: &[Acts], out: &mut [f32]) {
    assert!(
        m.kind != GgmlType::Q8_0,
        "Q8_0 is regrouped for AVX-512 only"
    );
    let offset = m.kind == GgmlType::Q4_1;
    let blocks = m.blocks();
    macro_rules! pass {
        ($group:ident, $chunk:ident, $values:ident; $($n:literal)*) => {
            match (offset, $chunk.len()) {
                $((false, $n) => ymm_group4::<false, $n>($group, blocks, $chunk, &mut $values),
                  (true, $n) => ymm_group4::<true, $n>($group, blocks, $chunk, &mut $values),)*
                (_, other) => unreachable!("{other} tokens in a pass"),
            }
        };
    }
    each_group!(
        m,
        rows,
        acts,
        out,
        |group, chunk, values| pass!(group, chunk, values; 1 2 3 4 5 6 7 8)
    )
}

/// One group against up to [`PASS`] tokens on AVX-512, by type and number of tokens.
#[inline(always)]
unsafe fn zmm_pass<const VNNI: bool>(
    kind: GgmlType,
    group: *const u8,
    blocks: usize,
    tokens: &[Acts],
    values: &mut [[f32; LANES]; PASS],
) {
    macro_rules! pass {
        ($($n:literal)*) => {
            match (kind, tokens.len()) {
                $((GgmlType::Q4_0, $n) => zmm_group4::<false, VNNI, $n>(group, blocks, tokens, values),
                  (GgmlType::Q4_1, $n) => zmm_group4::<true, VNNI, $n>(group, blocks, tokens, values),
                  (GgmlType::Q8_0, $n) => zmm_group8::<VNNI, $n>(group, blocks, tokens, values),)*
                (kind, count) => unreachable!("{} with {count} tokens", kind.name()),
            }
        };
    }
    pass!(1 2 3 4 5 6 7 8)
}

/// The four activation integers `4j..4j + 4` of block `b` (int8 form) in every lane.
#[inline(always)]
unsafe fn four_x8(x: *const i8, b: usize, j: usize) -> __m512i {
    _mm512_set1_epi32((x.add(32 * b + 4 * j) as *const i32).read_unaligned())
}

/// A group's three regions (see [`super::interleaved`]): integers, scales, and Q4_1's offsets (for the
/// other types, where that region would start).
#[inline(always)]
unsafe fn regions(group: *const u8, blocks: usize, kind: GgmlType) -> [*const u8; 3] {
    let scales = group.add(blocks * quant_bytes(kind));
    [group, scales, scales.add(blocks * 2 * LANES)]
}

/// The 4-bit type with (`OFFSET`) or without a stored offset.
const fn kind4<const OFFSET: bool>() -> GgmlType {
    if OFFSET {
        GgmlType::Q4_1
    } else {
        GgmlType::Q4_0
    }
}

/// Each token's per-block activation scale `dx` and `dx · Σ q`, read once per block by the kernels.
struct TokenScales<const N: usize> {
    dx: [*const f32; N],
    dsum: [*const f32; N],
}

impl<const N: usize> TokenScales<N> {
    fn of(tokens: &[Acts]) -> TokenScales<N> {
        TokenScales {
            dx: std::array::from_fn(|t| tokens[t].d.as_ptr()),
            dsum: std::array::from_fn(|t| tokens[t].dsum.as_ptr()),
        }
    }
}

/// Each token's sixteen row sums into its row of `values`.
#[inline(always)]
unsafe fn store_zmm<const N: usize>(acc: [__m512; N], values: &mut [[f32; LANES]; PASS]) {
    for (a, v) in acc.iter().zip(values.iter_mut()) {
        _mm512_storeu_ps(v.as_mut_ptr(), *a);
    }
}

/// Sixteen rows of a 4-bit type (`OFFSET`: Q4_1's stored offset, else Q4_0's `-8 · d`) against `N`
/// tokens: `values[t][i]` is row `i` times token `t`.
#[inline(always)]
unsafe fn zmm_group4<const OFFSET: bool, const VNNI: bool, const N: usize>(
    group: *const u8,
    blocks: usize,
    tokens: &[Acts],
    values: &mut [[f32; LANES]; PASS],
) {
    let [quants, scales, offsets] = regions(group, blocks, GgmlType::Q4_0);
    let x: [*const i8; N] = std::array::from_fn(|t| tokens[t].q.as_ptr());
    let TokenScales { dx, dsum } = TokenScales::<N>::of(tokens);
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..blocks {
        let d = _mm512_cvtph_ps(_mm256_load_si256(scales.add(b * 32) as *const __m256i));
        let c = if OFFSET {
            _mm512_cvtph_ps(_mm256_load_si256(offsets.add(b * 32) as *const __m256i))
        } else {
            _mm512_mul_ps(d, _mm512_set1_ps(-8.0))
        };
        fetch_block_ahead(kind4::<OFFSET>(), group, blocks, b);
        // w[j]: elements 4j..4j+4 of each row (j < 4 low nibbles, then 16 + 4(j - 4).. high)
        let mut w = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            let raw = _mm512_load_si512(quants.add(b * 256 + 64 * j) as *const __m512i);
            w[j] = _mm512_and_si512(raw, low);
            w[4 + j] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low);
        }
        for t in 0..N {
            let isum = if VNNI {
                // two chains, so consecutive products do not wait on each other
                let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for j in 0..4 {
                    s0 = _mm512_dpbusd_epi32(s0, w[j], four_x8(x[t], b, j));
                    s1 = _mm512_dpbusd_epi32(s1, w[4 + j], four_x8(x[t], b, 4 + j));
                }
                _mm512_add_epi32(s0, s1)
            } else {
                // int16 lanes: each a sum of 16 products of at most 15 · 127
                let mut s = _mm512_maddubs_epi16(w[0], four_x8(x[t], b, 0));
                for (j, &wj) in w.iter().enumerate().skip(1) {
                    s = _mm512_add_epi16(s, _mm512_maddubs_epi16(wj, four_x8(x[t], b, j)));
                }
                _mm512_madd_epi16(s, _mm512_set1_epi16(1))
            };
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(*dx[t].add(b)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[t]);
            acc[t] = _mm512_fmadd_ps(c, _mm512_set1_ps(*dsum[t].add(b)), acc[t]);
        }
    }
    store_zmm(acc, values);
}

/// Sixteen rows of Q8_0 against `N` tokens in the int16 form: each chunk widened once to an int16
/// pair per lane, then `vpdpwssd` (or `vpmaddwd` and an add) with each token's pair.
#[inline(always)]
unsafe fn zmm_group8<const VNNI: bool, const N: usize>(
    group: *const u8,
    blocks: usize,
    tokens: &[Acts],
    values: &mut [[f32; LANES]; PASS],
) {
    let [quants, scales, _] = regions(group, blocks, GgmlType::Q8_0);
    let x: [*const i16; N] = std::array::from_fn(|t| tokens[t].q16.as_ptr());
    let dx = TokenScales::<N>::of(tokens).dx;
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..blocks {
        let d = _mm512_cvtph_ps(_mm256_load_si256(scales.add(b * 32) as *const __m256i));
        let q = quants.add(b * 512);
        fetch_block_ahead(GgmlType::Q8_0, group, blocks, b);
        // w[c]: elements 2c, 2c + 1 of each row as int16
        let w: [__m512i; 16] = std::array::from_fn(|c| {
            _mm512_cvtepi8_epi16(_mm256_load_si256(q.add(32 * c) as *const __m256i))
        });
        for t in 0..N {
            let pairs = x[t].add(32 * b) as *const i32;
            let pair = |c: usize| _mm512_set1_epi32(pairs.add(c).read_unaligned());
            let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for c in (0..16).step_by(2) {
                if VNNI {
                    s0 = _mm512_dpwssd_epi32(s0, w[c], pair(c));
                    s1 = _mm512_dpwssd_epi32(s1, w[c + 1], pair(c + 1));
                } else {
                    s0 = _mm512_add_epi32(s0, _mm512_madd_epi16(w[c], pair(c)));
                    s1 = _mm512_add_epi32(s1, _mm512_madd_epi16(w[c + 1], pair(c + 1)));
                }
            }
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(*dx[t].add(b)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale, acc[t]);
        }
    }
    store_zmm(acc, values);
}

/// Sixteen rows of a 4-bit type against `N` tokens on AVX2: each half of the group (eight rows, a
/// register) in turn, as [`zmm_group4`] without VNNI does for all sixteen.
#[inline(always)]
unsafe fn ymm_group4<const OFFSET: bool, const N: usize>(
    group: *const u8,
    blocks: usize,
    tokens: &[Acts],
    values: &mut [[f32; LANES]; PASS],
) {
    let [quants, scales, offsets] = regions(group, blocks, GgmlType::Q4_0);
    let x: [*const i8; N] = std::array::from_fn(|t| tokens[t].q.as_ptr());
    let TokenScales { dx, dsum } = TokenScales::<N>::of(tokens);
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let four = |x: *const i8, b: usize, j: usize| {
        _mm256_set1_epi32((x.add(32 * b + 4 * j) as *const i32).read_unaligned())
    };
    let mut acc = [[_mm256_setzero_ps(); N]; 2]; // [half, token]
    for b in 0..blocks {
        for (h, acc) in acc.iter_mut().enumerate() {
            let at = b * 32 + 16 * h;
            let d = _mm256_cvtph_ps(_mm_load_si128(scales.add(at) as *const __m128i));
            let c = if OFFSET {
                _mm256_cvtph_ps(_mm_load_si128(offsets.add(at) as *const __m128i))
            } else {
                _mm256_mul_ps(d, _mm256_set1_ps(-8.0))
            };
            if h == 0 {
                fetch_block_ahead(kind4::<OFFSET>(), group, blocks, b);
            }
            let mut w = [_mm256_setzero_si256(); 8];
            for j in 0..4 {
                let raw =
                    _mm256_load_si256(quants.add(b * 256 + 64 * j + 32 * h) as *const __m256i);
                w[j] = _mm256_and_si256(raw, low);
                w[4 + j] = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low);
            }
            for t in 0..N {
                let mut s = _mm256_maddubs_epi16(w[0], four(x[t], b, 0));
                for (j, &wj) in w.iter().enumerate().skip(1) {
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(wj, four(x[t], b, j)));
                }
                let isum = _mm256_madd_epi16(s, ones);
                let scale = _mm256_mul_ps(d, _mm256_set1_ps(*dx[t].add(b)));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[t]);
                acc[t] = _mm256_fmadd_ps(c, _mm256_set1_ps(*dsum[t].add(b)), acc[t]);
            }
        }
    }
    for (h, acc) in acc.iter().enumerate() {
        for (t, &a) in acc.iter().enumerate() {
            _mm256_storeu_ps(values[t][8 * h..].as_mut_ptr(), a);
        }
    }
}
