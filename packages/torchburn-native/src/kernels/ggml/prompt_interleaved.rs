//! Prompt products of regrouped matrices ([`super::interleaved`]) in f32, straight from the groups.
//!
//! A prompt's products take f32 activations and the weights' exact values (`qprefill`'s tiles): each
//! (row, token) sums its products by fused multiply-adds in order of k, from zero. For regrouped
//! matrices the tiles would first gather every row back out of its group, which costs more than the
//! products themselves for prompts of a few dozen tokens. Here a register lane is a row, as in the
//! decode kernels: a slice of a group's weights is decoded once, per element k one vector of its
//! sixteen rows (the integer, exact as a float; times the block's scale; the Q4_1 offset added, each
//! rounded once, as the row decoder does), into a buffer in L1; then each pass of up to sixteen
//! tokens (the prompt split into passes of even widths, see [`pass_widths`]) runs over the buffer, one fused multiply-add per element and token with the token's
//! element broadcast, its sums carried from one slice to the next through the output as stored.
//! Each (row, token) therefore takes the tiles' operations in the tiles' order, and a prompt gives
//! the same bits here as on the tiles, at every length and level.
//!
//! 4-bit integers become floats without a conversion: the nibble OR'd into the bits of 2^23 reads
//! as 2^23 + q, and subtracting 2^23 (plus Q4_0's 8) leaves q (or q - 8), exactly.

use std::arch::x86_64::*;
use std::ops::Range;

use super::interleaved::{fetch_block_ahead, quant_bytes, Interleaved, LANES};
use super::GgmlType;
use crate::threads::{self, SendPtr};

/// Elements per block of the regrouped types.
const BLOCK: usize = 32;
/// Elements of k decoded at a time: sixteen rows of them take 16 KiB, and sixteen tokens' stretch of
/// them as much again, so both stay in L1 however long the rows.
const K_SLICE: usize = 256;
/// 2^23: a float whose last mantissa bits are an integer below it.
const MAGIC: f32 = 8_388_608.0;

/// Whether the prompt kernels at the running level take regrouped `kind`: where the decode kernels
/// regroup it (the 4-bit types from AVX2 up, Q8_0 with AVX-512).
pub fn takes(kind: GgmlType) -> bool {
    super::dot_interleaved::takes(kind)
}

/// `outs[i][t·n_i + r] = Σ_k x[t·k + kk] · W_i[r, kk]` for every regrouped matrix `ms[i]` (one
/// width `k`) and token `t < tokens`; the groups of all the matrices share one parallel job.
pub fn matmul_many(ms: &[&Interleaved], x: &[f32], tokens: usize, outs: &mut [&mut [f32]]) {
    assert_eq!(ms.len(), outs.len(), "one output per matrix");
    let k = ms.first().map_or(0, |m| m.k);
    assert!(
        ms.iter().all(|m| m.k == k),
        "the matrices must share their width"
    );
    assert!(ms.iter().all(|m| takes(m.kind)), "regrouped at this level");
    assert_eq!(x.len(), tokens * k, "input length");
    for (m, out) in ms.iter().zip(outs.iter()) {
        assert_eq!(out.len(), tokens * m.n, "output length");
    }
    // the groups of every matrix, numbered one after another: matrix i has firsts[i]..firsts[i + 1]
    let mut firsts = vec![0];
    for m in ms {
        firsts.push(firsts[firsts.len() - 1] + m.n.div_ceil(LANES));
    }
    let ptrs: Vec<SendPtr<f32>> = outs.iter_mut().map(|o| SendPtr(o.as_mut_ptr())).collect();
    threads::par_ranges(firsts[ms.len()], 1, |lo, hi| {
        let mut decoded = vec![0f32; K_SLICE * LANES];
        for g in lo..hi {
            let i = firsts.partition_point(|&f| f <= g) - 1;
            let (m, g) = (ms[i], g - firsts[i]);
            let out = ptrs[i].get();
            // SAFETY: this task alone writes the group's columns of every token's row of `outs[i]`,
            // `tokens · n` long as checked above; the level has the kernels' features (checked)
            unsafe { group_product(m, g, x, tokens, out.add(g * LANES), m.n, &mut decoded) }
        }
    });
}

/// Group `g`'s rows times every token: `out[t·ld + i]` for lanes `i` that are rows of `m`;
/// `decoded` (`K_SLICE · 16` long) holds a slice of the group's decoded weights meanwhile.
///
/// # Safety
/// `out` valid for those writes; `m` regrouped at the running level; `x` `tokens · k` long.
unsafe fn group_product(
    m: &Interleaved,
    g: usize,
    x: &[f32],
    tokens: usize,
    out: *mut f32,
    ld: usize,
    decoded: &mut [f32],
) {
    assert_eq!(decoded.len(), K_SLICE * LANES, "a slice of decoded weights");
    let lanes = LANES.min(m.n - g * LANES);
    if crate::isa::avx512() {
        group_zmm(m, g, x, tokens, out, ld, lanes, decoded)
    } else {
        group_ymm(m, g, x, tokens, out, ld, lanes, decoded)
    }
}

/// Most tokens a pass takes on AVX-512: their sums in sixteen registers, and their stretch of a slice
/// (16 KiB) in L1 beside the decoded weights (16 KiB).
const ZMM_PASS: usize = 16;
/// On AVX2: twelve sums, the weights and a broadcast in its sixteen registers.
const YMM_PASS: usize = 12;

/// `(first token, width)` of the passes over `tokens` tokens: as few as `max` allows, of widths as
/// even as they can be. Each token's sums are a chain of dependent multiply-adds, so a pass of one or
/// two tokens waits on their latency and takes about as long as a pass of eight: nine tokens as one
/// pass of nine cost little more than eight, and as eight and one nearly twice as much.
fn pass_widths(tokens: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = tokens.div_ceil(max);
    let (base, extra) = (
        tokens.checked_div(count).unwrap_or(0),
        tokens.checked_rem(count).unwrap_or(0),
    );
    (0..count).scan(0, move |next, i| {
        let (first, width) = (*next, base + usize::from(i < extra));
        *next += width;
        Some((first, width))
    })
}

/// `$body` with `$W` a constant equal to `$width`, one of the literals listed.
macro_rules! with_width {
    ($width:expr, |$W:ident| $body:expr; $($n:literal)*) => {
        match $width {
            $($n => {
                const $W: usize = $n;
                $body
            })*
            other => unreachable!("a pass of {other} tokens"),
        }
    };
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn group_zmm(
    m: &Interleaved,
    g: usize,
    x: &[f32],
    tokens: usize,
    out: *mut f32,
    ld: usize,
    lanes: usize,
    decoded: &mut [f32],
) {
    let mask = ((1u32 << lanes) - 1) as __mmask16;
    let (group, k) = (m.group(g).as_ptr(), m.k);
    for k0 in (0..k).step_by(K_SLICE) {
        let len = K_SLICE.min(k - k0);
        let w = decoded.as_mut_ptr();
        decode_zmm(m.kind, group, m.blocks(), k0 / BLOCK..(k0 + len) / BLOCK, w);
        let slice = Slice {
            w,
            len,
            x: x.as_ptr().add(k0),
            k,
            first: k0 == 0,
        };
        for (t0, width) in pass_widths(tokens, ZMM_PASS) {
            let out = out.add(t0 * ld);
            with_width!(width, |W| zmm_pass::<W>(&slice, t0, out, ld, mask);
                        1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
        }
    }
}

/// A decoded slice of a group: `len` elements from `x`'s columns on, rows of `x` `k` apart; `first`
/// when the sums start here (else they continue from the output).
struct Slice {
    w: *const f32,
    len: usize,
    x: *const f32,
    k: usize,
    first: bool,
}

/// Blocks `bs` of a group's weights (of `blocks`), element after element, sixteen lanes each, into
/// `w` (`bs.len() · 32 · 16`).
#[inline(always)]
unsafe fn decode_zmm(
    kind: GgmlType,
    group: *const u8,
    blocks: usize,
    bs: Range<usize>,
    w: *mut f32,
) {
    let scales = group.add(blocks * quant_bytes(kind));
    let nibble = _mm512_set1_epi32(0x0F);
    let magic = _mm512_set1_epi32(MAGIC.to_bits() as i32);
    let unbias = _mm512_set1_ps(if kind == GgmlType::Q4_0 {
        MAGIC + 8.0
    } else {
        MAGIC
    });
    // macros, not closures: a closure does not take its function's instruction sets, and its
    // intrinsics would become calls
    macro_rules! half {
        ($at:expr) => {
            _mm512_cvtph_ps(_mm256_loadu_si256(scales.add($at) as *const __m256i))
        };
    }
    for b in bs.clone() {
        let d = half!(b * 2 * LANES);
        let wb = w.add((b - bs.start) * BLOCK * LANES);
        let q = group.add(b * quant_bytes(kind));
        fetch_block_ahead(kind, group, blocks, b);
        if kind == GgmlType::Q8_0 {
            // chunk c: elements 2c and 2c + 1 of each row, an i16 pair per lane once widened
            for c in 0..BLOCK / 2 {
                let v = _mm512_cvtepi16_epi32(_mm256_loadu_si256(q.add(c * 32) as *const __m256i));
                let even = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(v));
                let odd = _mm512_srai_epi32::<8>(v);
                let (w_even, w_odd) = (wb.add(2 * c * LANES), wb.add((2 * c + 1) * LANES));
                _mm512_storeu_ps(w_even, _mm512_mul_ps(d, _mm512_cvtepi32_ps(even)));
                _mm512_storeu_ps(w_odd, _mm512_mul_ps(d, _mm512_cvtepi32_ps(odd)));
            }
            continue;
        }
        // chunk c: stored bytes 4c..4c + 4 of each row's block, elements 4c + j in the low nibbles
        // and 16 + 4c + j in the high ones
        let offset = if kind == GgmlType::Q4_1 {
            half!((blocks + b) * 2 * LANES)
        } else {
            _mm512_setzero_ps() // unused
        };
        // (bits & 0xF) | 2^23's bits, read as a float, less the bias: the nibble (less 8); times
        // the scale, plus the Q4_1 offset
        macro_rules! store {
            ($bits:expr, $e:expr) => {{
                let q = _mm512_ternarylogic_epi32::<0xEA>($bits, nibble, magic);
                let v = _mm512_mul_ps(d, _mm512_sub_ps(_mm512_castsi512_ps(q), unbias));
                let v = if kind == GgmlType::Q4_1 {
                    _mm512_add_ps(v, offset)
                } else {
                    v
                };
                _mm512_storeu_ps(wb.add($e * LANES), v);
            }};
        }
        for high in [false, true] {
            for c in 0..4 {
                let v = _mm512_loadu_si512(q.add(64 * c) as *const __m512i);
                let v = if high { _mm512_srli_epi32::<4>(v) } else { v };
                let e = usize::from(high) * 16 + 4 * c;
                store!(v, e);
                store!(_mm512_srli_epi32::<8>(v), e + 1);
                store!(_mm512_srli_epi32::<16>(v), e + 2);
                store!(_mm512_srli_epi32::<24>(v), e + 3);
            }
        }
    }
}

/// Tokens `t0..t0 + T` against a decoded slice, into `out` (token rows `ld` apart).
#[inline(always)]
unsafe fn zmm_pass<const T: usize>(
    s: &Slice,
    t0: usize,
    out: *mut f32,
    ld: usize,
    mask: __mmask16,
) {
    // [token] × sixteen rows: the sums so far, exactly as stored (a loop, not `array::from_fn`: its
    // closure would not take this function's instruction sets)
    let mut acc = [_mm512_setzero_ps(); T];
    if !s.first {
        for (t, a) in acc.iter_mut().enumerate() {
            *a = _mm512_maskz_loadu_ps(mask, out.add(t * ld));
        }
    }
    let x = s.x.add(t0 * s.k);
    for kk in 0..s.len {
        let wv = _mm512_loadu_ps(s.w.add(kk * LANES));
        for (t, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(wv, _mm512_set1_ps(*x.add(t * s.k + kk)), *a);
        }
    }
    for (t, a) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(out.add(t * ld), mask, *a);
    }
}

/// The 4-bit types on AVX2: each half of the group (eight rows) decoded and run on its own, up to
/// [`YMM_PASS`] tokens a pass.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn group_ymm(
    m: &Interleaved,
    g: usize,
    x: &[f32],
    tokens: usize,
    out: *mut f32,
    ld: usize,
    lanes: usize,
    decoded: &mut [f32],
) {
    assert!(
        m.kind != GgmlType::Q8_0,
        "Q8_0 is regrouped only for AVX-512"
    );
    let (group, k) = (m.group(g).as_ptr(), m.k);
    for h in 0..lanes.div_ceil(8) {
        let rows = (lanes - 8 * h).min(8);
        let out = out.add(8 * h);
        for k0 in (0..k).step_by(K_SLICE) {
            let len = K_SLICE.min(k - k0);
            let w = decoded.as_mut_ptr();
            decode_ymm(
                m.kind,
                group,
                h,
                m.blocks(),
                k0 / BLOCK..(k0 + len) / BLOCK,
                w,
            );
            let slice = Slice {
                w,
                len,
                x: x.as_ptr().add(k0),
                k,
                first: k0 == 0,
            };
            for (t0, width) in pass_widths(tokens, YMM_PASS) {
                let out = out.add(t0 * ld);
                with_width!(width, |W| ymm_pass::<W>(&slice, t0, out, ld, rows);
                            1 2 3 4 5 6 7 8 9 10 11 12);
            }
        }
    }
}

/// Blocks `bs` of half `h` of a 4-bit group's weights, element after element, eight lanes each, into
/// `w`.
#[inline(always)]
unsafe fn decode_ymm(
    kind: GgmlType,
    group: *const u8,
    h: usize,
    blocks: usize,
    bs: Range<usize>,
    w: *mut f32,
) {
    let scales = group.add(blocks * quant_bytes(kind) + 16 * h);
    let nibble = _mm256_set1_epi32(0x0F);
    let magic = _mm256_set1_epi32(MAGIC.to_bits() as i32);
    let unbias = _mm256_set1_ps(if kind == GgmlType::Q4_0 {
        MAGIC + 8.0
    } else {
        MAGIC
    });
    macro_rules! half {
        ($at:expr) => {
            _mm256_cvtph_ps(_mm_loadu_si128(scales.add($at) as *const __m128i))
        };
    }
    for b in bs.clone() {
        let d = half!(b * 2 * LANES);
        if h == 0 {
            fetch_block_ahead(kind, group, blocks, b);
        }
        let offset = if kind == GgmlType::Q4_1 {
            half!((blocks + b) * 2 * LANES)
        } else {
            _mm256_setzero_ps() // unused
        };
        let wb = w.add((b - bs.start) * BLOCK * 8);
        let q = group.add(b * quant_bytes(kind) + 32 * h);
        // as `decode_zmm`'s, with an AND and an OR for the ternary logic
        macro_rules! store {
            ($bits:expr, $e:expr) => {{
                let q = _mm256_or_si256(_mm256_and_si256($bits, nibble), magic);
                let v = _mm256_mul_ps(d, _mm256_sub_ps(_mm256_castsi256_ps(q), unbias));
                let v = if kind == GgmlType::Q4_1 {
                    _mm256_add_ps(v, offset)
                } else {
                    v
                };
                _mm256_storeu_ps(wb.add($e * 8), v);
            }};
        }
        for high in [false, true] {
            for c in 0..4 {
                let v = _mm256_loadu_si256(q.add(64 * c) as *const __m256i);
                let v = if high { _mm256_srli_epi32::<4>(v) } else { v };
                let e = usize::from(high) * 16 + 4 * c;
                store!(v, e);
                store!(_mm256_srli_epi32::<8>(v), e + 1);
                store!(_mm256_srli_epi32::<16>(v), e + 2);
                store!(_mm256_srli_epi32::<24>(v), e + 3);
            }
        }
    }
}

/// [`zmm_pass`] on a decoded slice of a half group: `rows` of the eight lanes loaded and stored.
#[inline(always)]
unsafe fn ymm_pass<const T: usize>(s: &Slice, t0: usize, out: *mut f32, ld: usize, rows: usize) {
    let mut lanes = [0f32; 8];
    // [token] × eight rows: the sums so far, exactly as stored
    let mut acc = [_mm256_setzero_ps(); T];
    if !s.first {
        for (t, a) in acc.iter_mut().enumerate() {
            if rows == 8 {
                *a = _mm256_loadu_ps(out.add(t * ld));
            } else {
                std::ptr::copy_nonoverlapping(out.add(t * ld), lanes.as_mut_ptr(), rows);
                *a = _mm256_loadu_ps(lanes.as_ptr());
            }
        }
    }
    let x = s.x.add(t0 * s.k);
    for kk in 0..s.len {
        let wv = _mm256_loadu_ps(s.w.add(kk * 8));
        for (t, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(wv, _mm256_set1_ps(*x.add(t * s.k + kk)), *a);
        }
    }
    for (t, a) in acc.iter().enumerate() {
        if rows == 8 {
            _mm256_storeu_ps(out.add(t * ld), *a);
        } else {
            _mm256_storeu_ps(lanes.as_mut_ptr(), *a);
            std::ptr::copy_nonoverlapping(lanes.as_ptr(), out.add(t * ld), rows);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::ggml::tests::matrix;
    use crate::kernels::qprefill::matmul_on;
    use crate::kernels::testing::centered;

    /// Tokens on each side of the widest pass at both levels (12, 16), and prompts split into two and
    /// three passes of even widths.
    const TOKENS: [usize; 14] = [1, 2, 3, 7, 8, 9, 11, 12, 13, 16, 17, 25, 31, 45];

    #[test]
    fn passes_cover_the_tokens_in_even_widths() {
        let plan = |tokens, max| pass_widths(tokens, max).collect::<Vec<_>>();
        assert_eq!(plan(0, 16), vec![]);
        assert_eq!(plan(9, 16), vec![(0, 9)]);
        assert_eq!(plan(16, 16), vec![(0, 16)]);
        assert_eq!(plan(17, 16), vec![(0, 9), (9, 8)]);
        assert_eq!(plan(45, 16), vec![(0, 15), (15, 15), (30, 15)]);
        assert_eq!(plan(25, 12), vec![(0, 9), (9, 8), (17, 8)]);
    }

    #[test]
    fn prompts_equal_the_tiles_on_the_stored_rows_bit_for_bit() {
        // 37 rows: two whole groups and one of five lanes, read in a shuffled order
        let n = 37;
        let order: Vec<u32> = (0..n as u32).map(|r| (r * 7 + 3) % n as u32).collect();
        for kind in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            if !takes(kind) {
                continue;
            }
            // one slice, several with a short last one
            for k in [64, 320, 608] {
                let rows = || matrix(kind, n, k, 5).with_row_order(order.clone()).unwrap();
                let (stored, regrouped) = (rows(), rows().interleaved_for_this_cpu());
                assert!(regrouped.is_interleaved());
                let x = centered(45 * k, 9);
                for tokens in TOKENS {
                    let x = &x[..tokens * k];
                    // the tiles' portable loop on rows as the file stores them: the ground truth
                    let mut want = vec![0f32; tokens * n];
                    matmul_on(&stored, x, tokens, &mut want, false);
                    let packed = regrouped.interleaved().unwrap();
                    let mut got = vec![f32::NAN; tokens * n];
                    matmul_many(&[packed], x, tokens, &mut [&mut got[..]]);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{} k={k}, {tokens} tokens",
                        kind.name()
                    );
                    // and through the prompt path, which routes regrouped matrices here
                    let mut routed = vec![f32::NAN; tokens * n];
                    matmul_on(&regrouped, x, tokens, &mut routed, true);
                    assert_eq!(
                        bits(&routed),
                        bits(&want),
                        "{} routed, {tokens} tokens",
                        kind.name()
                    );
                    // and the AVX2 kernel, where the CPU runs it, for the 4-bit types
                    if kind != GgmlType::Q8_0 && crate::isa::avx2() {
                        let mut ymm = vec![f32::NAN; tokens * n];
                        let mut decoded = vec![0f32; K_SLICE * LANES];
                        for g in 0..n.div_ceil(LANES) {
                            let lanes = LANES.min(n - g * LANES);
                            // SAFETY: AVX2 checked; the group's columns of `ymm` exist
                            unsafe {
                                group_ymm(
                                    packed,
                                    g,
                                    x,
                                    tokens,
                                    ymm.as_mut_ptr().add(g * LANES),
                                    n,
                                    lanes,
                                    &mut decoded,
                                )
                            };
                        }
                        assert_eq!(
                            bits(&ymm),
                            bits(&want),
                            "{} on AVX2, {tokens} tokens",
                            kind.name()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn several_matrices_share_one_job_and_keep_their_own_results() {
        let k = 96;
        let kind = GgmlType::Q4_1;
        if !takes(kind) {
            return;
        }
        let ms: Vec<_> = [(40, 1), (13, 2), (17, 3)]
            .iter()
            .map(|&(n, seed)| matrix(kind, n, k, seed).interleaved_for_this_cpu())
            .collect();
        let tokens = 11;
        let x = centered(tokens * k, 4);
        let packed: Vec<&Interleaved> = ms.iter().map(|m| m.interleaved().unwrap()).collect();
        let mut together: Vec<Vec<f32>> = ms.iter().map(|m| vec![0f32; tokens * m.n]).collect();
        let mut outs: Vec<&mut [f32]> = together.iter_mut().map(|o| &mut o[..]).collect();
        matmul_many(&packed, &x, tokens, &mut outs);
        for (m, got) in ms.iter().zip(&together) {
            let mut alone = vec![0f32; tokens * m.n];
            matmul_on(m, &x, tokens, &mut alone, false);
            assert_eq!(got, &alone, "n = {}", m.n);
        }
    }

    #[test]
    fn a_mixed_projection_sends_each_matrix_to_its_own_kernel() {
        // regrouped 4-bit, Q8_0 (regrouped only on AVX-512), a K-quant and rows as stored, side by
        // side in one call as q, k and v are: each gets the bits it gets alone
        let k = 256;
        let ms = [
            matrix(GgmlType::Q4_1, 24, k, 1).interleaved_for_this_cpu(),
            matrix(GgmlType::Q8_0, 19, k, 2).interleaved_for_this_cpu(),
            matrix(GgmlType::Q4K, 8, k, 3),
            matrix(GgmlType::Q5_0, 5, k, 4),
        ];
        let tokens = 13;
        let x = centered(tokens * k, 6);
        let sources: Vec<&dyn crate::kernels::qprefill::RowSource> = ms
            .iter()
            .map(|m| m as &dyn crate::kernels::qprefill::RowSource)
            .collect();
        let mut together: Vec<Vec<f32>> = ms.iter().map(|m| vec![f32::NAN; tokens * m.n]).collect();
        let mut outs: Vec<&mut [f32]> = together.iter_mut().map(|o| &mut o[..]).collect();
        crate::kernels::qprefill::matmul_sources(&sources, &x, tokens, &mut outs);
        for (m, got) in ms.iter().zip(&together) {
            let mut alone = vec![0f32; tokens * m.n];
            matmul_on(m, &x, tokens, &mut alone, true);
            assert_eq!(got, &alone, "{}", m.kind.name());
        }
    }
}
