//! Attention of a decode step: each new token's query heads over its sequence's cached keys and
//! values, softmax(cap(q·K · scale)) · V.
//!
//! The query heads that share a KV head (grouped-query attention) run together ([`attend_heads`]):
//! each block of cached keys and each value row is read once for all of them, where one head at a
//! time read the whole cache once per query head. On AVX-512 the scores come sixteen keys at a time,
//! their sixteen-lane sums reduced together by a transposing halving tree; each score is the sum
//! `dot16` makes, in its order, so a head gets the same bits alone or in its group, in a step or a
//! batch of steps.

use torchburn_native_macros::isa_versions;

use super::decoder::{dot16, soft_cap, Dims};
use crate::kernels::lanes::{max16, sum16};
use crate::kernels::math::exp_f32;
use crate::kernels::prefetch::row_ahead;

/// Heads × cached positions below which a step's attention stays on the calling thread.
pub(super) const PARALLEL_ATTENTION_MIN: usize = 512;

/// How many cache rows ahead of the one being read the attention loops prefetch (2 KiB for heads of
/// 64 floats).
const ROWS_AHEAD: usize = 8;

/// How attention scores are made from `q·k`: scaled, then capped if the family caps them.
#[derive(Clone, Copy)]
pub(crate) struct Scoring {
    pub scale: f32,
    pub softcap: Option<f32>,
}

impl Scoring {
    pub(crate) fn of(d: &Dims) -> Scoring {
        Scoring {
            scale: d.attn_scale,
            softcap: d.attn_softcap,
        }
    }
}

/// One query over `n` cached keys/values (`n × D` each): softmax(cap(q·K · scale)) · V into `out`.
pub(super) fn attend(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scoring: &Scoring,
    scores: &mut [f32],
    out: &mut [f32],
) {
    attend_heads(q, q.len(), keys, values, scoring, scores, out)
}

/// The query heads `qs` `[G, hd]` that share one KV head, over its `n` cached keys and values
/// (`n × hd` each): each head's softmax(cap(q·K · scale)) · V into its row of `out` `[G, hd]`.
/// `scores` `[G, n]` is working room.
#[isa_versions]
pub(super) fn attend_heads(
    qs: &[f32],
    hd: usize,
    keys: &[f32],
    values: &[f32],
    scoring: &Scoring,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let g = qs.len() / hd;
    let n = keys.len() / hd;
    assert!(
        g > 0 && qs.len() == g * hd && out.len() == g * hd,
        "{g} heads of {hd}"
    );
    assert!(
        keys.len() == n * hd && values.len() == n * hd,
        "{n} rows of {hd}"
    );
    assert_eq!(scores.len(), g * n, "room for {g} heads' scores");
    if n == 0 {
        out.fill(0.0);
        return;
    }
    let simd = avx512_rows(hd);
    // the first rows, which the loops' own prefetches (some rows ahead) do not ask for
    let first = ROWS_AHEAD.min(n) * hd * 4;
    row_ahead(keys.as_ptr(), first);
    row_ahead(values.as_ptr(), first);
    if simd {
        // SAFETY: `avx512_rows` checked the CPU; the lengths are checked above
        #[cfg(target_arch = "x86_64")]
        unsafe {
            scores_avx512(qs, keys, hd, scoring.scale, scores)
        };
    } else {
        for (q, row) in qs.chunks_exact(hd).zip(scores.chunks_exact_mut(n)) {
            for (s, k) in row.iter_mut().zip(keys.chunks_exact(hd)) {
                *s = dot16(q, k) * scoring.scale;
            }
        }
    }
    for row in scores.chunks_exact_mut(n) {
        if let Some(cap) = scoring.softcap {
            soft_cap(row, cap);
        }
        let max = max16(row);
        // exp in a loop of its own, so that it vectorizes; the sum after it
        for s in row.iter_mut() {
            *s = exp_f32(*s - max);
        }
        let total = sum16(row);
        for s in row.iter_mut() {
            *s /= total;
        }
    }
    if simd {
        // SAFETY: as above
        #[cfg(target_arch = "x86_64")]
        unsafe {
            weighted_values_avx512(scores, values, hd, out)
        };
    } else {
        for (probs, o) in scores.chunks_exact(n).zip(out.chunks_exact_mut(hd)) {
            o.fill(0.0);
            for (&p, v) in probs.iter().zip(values.chunks_exact(hd)) {
                for (o, &x) in o.iter_mut().zip(v) {
                    *o += p * x;
                }
            }
        }
    }
}

/// Whether attention rows of `hd` floats take the AVX-512 loops below (same results as the portable
/// ones, which the compiler vectorizes poorly).
fn avx512_rows(hd: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        hd.is_multiple_of(16) && crate::isa::avx512()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = hd;
        false
    }
}

/// `scores[h, j] = (qs[h] · keys[j]) · scale` for `hd` a multiple of 16, in `dot16`'s order (sixteen
/// lanes, separate multiply and add, then the halving tree `a[i] + a[i + 8]`, `+ 4`,
/// `(a[0] + a[2]) + (a[1] + a[3])`). Sixteen keys at a time: their sixteen lane sums are reduced
/// together, each step of the tree one add for several keys after a shuffle, where one key alone
/// spends a reduction as long as its products.
///
/// # Safety
/// The CPU must have AVX-512F; `qs` whole rows of `hd`, `keys` `n` rows of `hd`, `scores` a row of `n`
/// per query.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scores_avx512(qs: &[f32], keys: &[f32], hd: usize, scale: f32, scores: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = keys.len() / hd;
    let whole = n / 16 * 16;
    let kp = keys.as_ptr();
    // where lane i of the tree's last step holds key 4 · (i % 4) + i / 4
    let order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    let vscale = _mm512_set1_ps(scale);
    for (h, (q, row)) in qs
        .chunks_exact(hd)
        .zip(scores.chunks_exact_mut(n))
        .enumerate()
    {
        let q = q.as_ptr();
        for j0 in (0..whole).step_by(16) {
            let mut acc = [_mm512_setzero_ps(); 16];
            for c in (0..hd).step_by(16) {
                let qc = _mm512_loadu_ps(q.add(c));
                for (i, a) in acc.iter_mut().enumerate() {
                    if h == 0 && c == 0 {
                        // the first head brings the keys in for the group (the others find them in
                        // L1); a step's cache rows are cold, and short for the L2 streamer
                        row_ahead(kp.wrapping_add((j0 + i + ROWS_AHEAD) * hd), hd * 4);
                        // a row: hd f32
                    }
                    let k = _mm512_loadu_ps(kp.add((j0 + i) * hd + c));
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(qc, k));
                }
            }
            // a[i] + a[i + 8]: two keys to a register, eight lanes each
            let mut a8 = [_mm512_setzero_ps(); 8];
            for (p, v) in a8.iter_mut().enumerate() {
                let (x, y) = (acc[2 * p], acc[2 * p + 1]);
                let lo = _mm512_shuffle_f32x4::<0x44>(x, y);
                let hi = _mm512_shuffle_f32x4::<0xEE>(x, y);
                *v = _mm512_add_ps(lo, hi);
            }
            // + 4: four keys to a register, four lanes each
            let mut a4 = [_mm512_setzero_ps(); 4];
            for (p, v) in a4.iter_mut().enumerate() {
                let (x, y) = (a8[2 * p], a8[2 * p + 1]);
                let lo = _mm512_shuffle_f32x4::<0x88>(x, y);
                let hi = _mm512_shuffle_f32x4::<0xDD>(x, y);
                *v = _mm512_add_ps(lo, hi);
            }
            // a[0] + a[2] and a[1] + a[3] side by side, eight keys to a register
            let mut a2 = [_mm512_setzero_ps(); 2];
            for (p, v) in a2.iter_mut().enumerate() {
                let (x, y) = (a4[2 * p], a4[2 * p + 1]);
                let lo = _mm512_shuffle_ps::<0x44>(x, y);
                let hi = _mm512_shuffle_ps::<0xEE>(x, y);
                *v = _mm512_add_ps(lo, hi);
            }
            let sums = _mm512_add_ps(
                _mm512_shuffle_ps::<0x88>(a2[0], a2[1]),
                _mm512_shuffle_ps::<0xDD>(a2[0], a2[1]),
            );
            let sums = _mm512_permutexvar_ps(order, sums);
            _mm512_storeu_ps(row.as_mut_ptr().add(j0), _mm512_mul_ps(sums, vscale));
        }
        for (j, s) in row.iter_mut().enumerate().skip(whole) {
            let k = kp.add(j * hd);
            let mut acc = _mm512_setzero_ps();
            for c in (0..hd).step_by(16) {
                let p = _mm512_mul_ps(_mm512_loadu_ps(q.add(c)), _mm512_loadu_ps(k.add(c)));
                acc = _mm512_add_ps(acc, p);
            }
            // a[i] + a[i + 8], then + 4, + 2, + 1
            let a8 = _mm256_add_ps(
                _mm512_castps512_ps256(acc),
                _mm512_extractf32x8_ps::<1>(acc),
            );
            let a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps::<1>(a8));
            let a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
            let a1 = _mm_add_ss(a2, _mm_movehdup_ps(a2));
            *s = _mm_cvtss_f32(a1) * scale;
        }
    }
}

/// `out[h] = Σ_j probs[h, j] · values[j]` for `hd` a multiple of 16, each lane summed over the
/// positions in order as the portable loop does. Up to four heads and four 16-lane chunks of the row
/// run side by side, held in registers across all positions: each value row is loaded once for the
/// heads, and no sum waits on its own add at every position.
///
/// # Safety
/// The CPU must have AVX-512F; `values` `n` rows of `hd`, `probs` a row of `n` per row of `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_values_avx512(probs: &[f32], values: &[f32], hd: usize, out: &mut [f32]) {
    let g = out.len() / hd;
    macro_rules! tile {
        ($h0:expr, $c0:expr, $heads:expr, $chunks:expr; $(($h:literal, $c:literal))*) => {
            match ($heads, $chunks) {
                $(($h, $c) => weighted_tile::<$h, $c>(probs, values, hd, $h0, $c0, out),)*
                _ => unreachable!("a tile of {} heads and {} chunks", $heads, $chunks),
            }
        };
    }
    for h0 in (0..g).step_by(4) {
        for c0 in (0..hd).step_by(64) {
            let (heads, chunks) = ((g - h0).min(4), ((hd - c0) / 16).min(4));
            tile!(h0, c0, heads, chunks;
                (1, 1) (1, 2) (1, 3) (1, 4) (2, 1) (2, 2) (2, 3) (2, 4)
                (3, 1) (3, 2) (3, 3) (3, 4) (4, 1) (4, 2) (4, 3) (4, 4))
        }
    }
}

/// [`weighted_values_avx512`] for heads `h0..h0 + H` and the `C` sixteen-lane chunks from `c0`: all
/// `H · C` sums in registers (constant sizes, so that they stay there).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn weighted_tile<const H: usize, const C: usize>(
    probs: &[f32],
    values: &[f32],
    hd: usize,
    h0: usize,
    c0: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let n = values.len() / hd;
    let p = probs.as_ptr().add(h0 * n);
    let mut acc = [[_mm512_setzero_ps(); C]; H];
    for j in 0..n {
        if h0 == 0 && c0 == 0 {
            row_ahead(values.as_ptr().wrapping_add((j + ROWS_AHEAD) * hd), 4 * hd);
        }
        let v = values.as_ptr().add(j * hd + c0);
        let mut row = [_mm512_setzero_ps(); C];
        for (c, r) in row.iter_mut().enumerate() {
            *r = _mm512_loadu_ps(v.add(16 * c));
        }
        for (h, acc) in acc.iter_mut().enumerate() {
            let w = _mm512_set1_ps(*p.add(h * n + j));
            for (a, r) in acc.iter_mut().zip(row) {
                *a = _mm512_add_ps(*a, _mm512_mul_ps(w, r));
            }
        }
    }
    for (h, acc) in acc.iter().enumerate() {
        let o = out.as_mut_ptr().add((h0 + h) * hd + c0);
        for (c, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(o.add(16 * c), *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attend_caps_and_scales_the_scores() {
        let q = [2.0, 1.0];
        let keys = [3.0, 0.0, 0.0, 1.0, -2.0, 1.0];
        let values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let scoring = Scoring {
            scale: 0.7,
            softcap: Some(2.5),
        };
        let (mut scores, mut out) = ([0.0; 3], [0.0; 2]);
        attend(&q, &keys, &values, &scoring, &mut scores, &mut out);
        let logits = [6.0f64, 1.0, -3.0].map(|v| 2.5 * (v * 0.7 / 2.5).tanh());
        assert_softmax_weighted(logits, &values, &out);
    }

    /// `out` is softmax(`logits`) times the three rows of two `values`, computed by hand in f64.
    fn assert_softmax_weighted(logits: [f64; 3], values: &[f32; 6], out: &[f32; 2]) {
        let s = logits.map(f64::exp);
        let z: f64 = s.iter().sum();
        let v = values.map(|x| x as f64);
        let want = [
            (s[0] * v[0] + s[1] * v[2] + s[2] * v[4]) / z,
            (s[0] * v[1] + s[1] * v[3] + s[2] * v[5]) / z,
        ];
        for (a, b) in out.iter().zip(want) {
            assert!((*a as f64 - b).abs() < 1e-5, "{out:?} vs {want:?}");
        }
    }

    #[test]
    fn simd_scores_equal_the_portable_dot_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            let data = crate::kernels::testing::centered(64 * 37 + 64, 3);
            let (q, keys) = data.split_at(64);
            let mut fast = vec![0f32; 37];
            // SAFETY: checked above; 37 rows of 64
            unsafe { scores_avx512(q, keys, 64, 0.125, &mut fast) };
            let portable: Vec<f32> = keys.chunks_exact(64).map(|k| dot16(q, k) * 0.125).collect();
            assert_eq!(fast, portable);
        }
    }

    #[test]
    fn simd_weighted_values_equal_the_portable_loop_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            for hd in [16, 64, 80, 128] {
                let values = crate::kernels::testing::centered(hd * 29, hd as u64);
                let probs = crate::kernels::testing::centered(29, 7);
                let mut fast = vec![1f32; hd];
                // SAFETY: checked above; 29 rows of hd
                unsafe { weighted_values_avx512(&probs, &values, hd, &mut fast) };
                let mut portable = vec![0f32; hd];
                for (&p, v) in probs.iter().zip(values.chunks_exact(hd)) {
                    for (o, &x) in portable.iter_mut().zip(v) {
                        *o += p * x;
                    }
                }
                assert_eq!(fast, portable, "head size {hd}");
            }
        }
    }

    #[test]
    fn attend_is_softmax_weighted_values() {
        let q = [1.0, 0.0];
        let keys = [1.0, 0.0, 0.0, 1.0, -1.0, 0.0];
        let values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut scores = [0.0; 3];
        let mut out = [0.0; 2];
        let scoring = Scoring {
            scale: 1.0 / 2f32.sqrt(),
            softcap: None,
        };
        attend(&q, &keys, &values, &scoring, &mut scores, &mut out);
        assert_softmax_weighted([1.0f64, 0.0, -1.0].map(|v| v / 2f64.sqrt()), &values, &out);
    }

    #[test]
    fn heads_sharing_a_kv_head_get_the_bits_each_gets_alone() {
        // key counts around the sixteen-key blocks; head sizes on and off the AVX-512 path
        for hd in [8, 16, 64, 80, 128] {
            for n in [1, 15, 16, 17, 37, 100] {
                for g in 1..=5 {
                    let qs = crate::kernels::testing::centered(g * hd, (g * n) as u64);
                    let keys = crate::kernels::testing::centered(n * hd, hd as u64);
                    let values = crate::kernels::testing::centered(n * hd, n as u64 + 5);
                    for softcap in [None, Some(3.0)] {
                        let scoring = Scoring {
                            scale: 0.3,
                            softcap,
                        };
                        let mut scores = vec![0f32; g * n];
                        let mut together = vec![0f32; g * hd];
                        attend_heads(
                            &qs,
                            hd,
                            &keys,
                            &values,
                            &scoring,
                            &mut scores,
                            &mut together,
                        );
                        for h in 0..g {
                            let (mut scores, mut alone) = (vec![0f32; n], vec![0f32; hd]);
                            let q = &qs[h * hd..][..hd];
                            attend(q, &keys, &values, &scoring, &mut scores, &mut alone);
                            assert_eq!(
                                &together[h * hd..][..hd],
                                &alone[..],
                                "hd {hd} n {n} g {g} head {h}"
                            );
                            // against the definition in f64
                            let logits: Vec<f64> = keys
                                .chunks_exact(hd)
                                .map(|k| {
                                    let dot: f64 =
                                        q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
                                    let s = dot * 0.3;
                                    softcap.map_or(s, |c| c as f64 * (s / c as f64).tanh())
                                })
                                .collect();
                            let top = logits.iter().cloned().fold(f64::MIN, f64::max);
                            let e: Vec<f64> = logits.iter().map(|l| (l - top).exp()).collect();
                            let z: f64 = e.iter().sum();
                            for (d, &got) in alone.iter().enumerate() {
                                let want: f64 = e
                                    .iter()
                                    .zip(values.chunks_exact(hd))
                                    .map(|(p, v)| p / z * v[d] as f64)
                                    .sum();
                                assert!(
                                    (got as f64 - want).abs() < 1e-5,
                                    "hd {hd} n {n}: {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
