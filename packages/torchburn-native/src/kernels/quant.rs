//! Quantized matrix products for the LLM runtime: `out[t, n] = Σ_k x[t, k] · W[n, k]` with `W` held as
//!
//! - **Q8**: int8 per output row with one f32 scale per row (per-channel), or
//! - **Q4**: blocks of 32 along k, each 4-bit values with an f32 scale `d` and offset `m`
//!   (`w = d·q + m`, q in 0..16), nibbles laid out as GGUF's Q4_1: byte j holds elements j (low) and
//!   j + 16 (high), so GGUF Q4_1 weights import without re-quantizing.
//!
//! Activations are quantized per block of 32 to int8 with one scale each (as llama.cpp's Q8_0), and
//! each block's dot product is an exact integer sum; the f32 work that follows runs in one fixed order.
//! So every ISA path (AVX-512, AVX2, NEON, scalar) gives bit-identical results.

use crate::threads;

/// Elements per quantization block (weights in Q4, activations always).
pub const BLOCK: usize = 32;

/// One activation row quantized: per block, an int8 vector, its scale and the sum of its values.
pub struct QActs {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub sum: Vec<i32>,
}

/// Quantizes `x` (length a multiple of [`BLOCK`]) to int8 per block with scale `max|x| / 127`.
pub fn quantize_acts(x: &[f32]) -> QActs {
    assert!(
        x.len().is_multiple_of(BLOCK),
        "activation length must be a multiple of {BLOCK}"
    );
    let blocks = x.len() / BLOCK;
    let mut out = QActs {
        q: vec![0; x.len()],
        d: vec![0.0; blocks],
        sum: vec![0; blocks],
    };
    for b in 0..blocks {
        let xs = &x[b * BLOCK..(b + 1) * BLOCK];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut s = 0i32;
        for (q, &v) in out.q[b * BLOCK..(b + 1) * BLOCK].iter_mut().zip(xs) {
            *q = (v * inv).round() as i8;
            s += *q as i32;
        }
        out.d[b] = d;
        out.sum[b] = s;
    }
    out
}

/// A weight matrix `[n, k]` in one of the two formats.
pub enum QWeights {
    /// `q[n·k]`, `scale[n]`
    Q8 { q: Vec<i8>, scale: Vec<f32> },
    /// per row, `k / 32` blocks: `nibbles[n·k/2]`, `d[n·k/32]`, `m[n·k/32]`
    Q4 {
        nibbles: Vec<u8>,
        d: Vec<f32>,
        m: Vec<f32>,
    },
}

pub struct QMatrix {
    pub n: usize,
    pub k: usize,
    pub w: QWeights,
}

impl QMatrix {
    /// Per-row int8: `scale = max|w_row| / 127`, `q = round(w / scale)`.
    pub fn quantize_q8(w: &[f32], n: usize, k: usize) -> QMatrix {
        assert_eq!(w.len(), n * k, "weight length");
        let mut q = vec![0i8; n * k];
        let mut scale = vec![0f32; n];
        for r in 0..n {
            let row = &w[r * k..(r + 1) * k];
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let s = amax / 127.0;
            let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
            for (o, &v) in q[r * k..(r + 1) * k].iter_mut().zip(row) {
                *o = (v * inv).round() as i8;
            }
            scale[r] = s;
        }
        QMatrix {
            n,
            k,
            w: QWeights::Q8 { q, scale },
        }
    }

    /// Blocks of 32 with `d = (max - min) / 15`, `m = min`, `q = round((w - m) / d)`.
    pub fn quantize_q4(w: &[f32], n: usize, k: usize) -> QMatrix {
        assert_eq!(w.len(), n * k, "weight length");
        assert!(
            k.is_multiple_of(BLOCK),
            "k must be a multiple of {BLOCK} for Q4"
        );
        let blocks = n * k / BLOCK;
        let (mut nibbles, mut d, mut m) =
            (vec![0u8; n * k / 2], vec![0f32; blocks], vec![0f32; blocks]);
        for b in 0..blocks {
            let xs = &w[b * BLOCK..(b + 1) * BLOCK];
            let lo = xs.iter().fold(f32::INFINITY, |a, &v| a.min(v));
            let hi = xs.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let step = (hi - lo) / 15.0;
            let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
            let q = |v: f32| ((v - lo) * inv).round().clamp(0.0, 15.0) as u8;
            for j in 0..BLOCK / 2 {
                nibbles[b * BLOCK / 2 + j] = q(xs[j]) | (q(xs[j + BLOCK / 2]) << 4);
            }
            d[b] = step;
            m[b] = lo;
        }
        QMatrix {
            n,
            k,
            w: QWeights::Q4 { nibbles, d, m },
        }
    }

    /// `out[t·n + r] = Σ_k x[t·k + kk] · W[r, kk]` for `t` in `0..rows`, over the thread pool.
    pub fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        assert_eq!(x.len(), rows * k, "input length");
        assert_eq!(out.len(), rows * n, "output length");
        assert!(k.is_multiple_of(BLOCK), "k must be a multiple of {BLOCK}");
        let acts: Vec<QActs> = (0..rows)
            .map(|t| quantize_acts(&x[t * k..(t + 1) * k]))
            .collect();
        let out_ptr = threads::SendPtr(out.as_mut_ptr());
        let avx2 = has_avx2();
        // rows of W in chunks: each row's blocks are unpacked once and applied to every token
        threads::par_ranges(n, 16, |lo, hi| {
            let out = out_ptr;
            let mut lanes = vec![[0f32; LANES]; rows];
            let mut mins = vec![0f32; rows];
            for r in lo..hi {
                lanes.iter_mut().for_each(|l| *l = [0.0; LANES]);
                mins.iter_mut().for_each(|m| *m = 0.0);
                // SAFETY: `avx2` was detected at run time
                unsafe { self.row(r, &acts, &mut lanes, &mut mins, avx2) };
                for t in 0..rows {
                    let v = finish(&lanes[t], mins[t], self.row_scale(r));
                    // SAFETY: each (t, r) is written by the one task that owns row r
                    unsafe { *out.0.add(t * n + r) = v };
                }
            }
        });
    }

    fn row_scale(&self, r: usize) -> f32 {
        match &self.w {
            QWeights::Q8 { scale, .. } => scale[r],
            QWeights::Q4 { .. } => 1.0,
        }
    }

    /// Accumulates row `r`'s products with every token into `lanes` / `mins`.
    ///
    /// # Safety
    /// `avx2` only if the CPU has AVX2.
    unsafe fn row(
        &self,
        r: usize,
        acts: &[QActs],
        lanes: &mut [[f32; LANES]],
        mins: &mut [f32],
        avx2: bool,
    ) {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            return x86::row(self, r, acts, lanes, mins);
        }
        let _ = avx2;
        row_generic(self, r, acts, lanes, mins, block_lanes_scalar)
    }
}

/// The row loop, generic over how a block's eight lane sums are formed; inlined into each ISA's
/// wrapper so that the block function inlines too.
#[inline(always)]
fn row_generic(
    m: &QMatrix,
    r: usize,
    acts: &[QActs],
    lanes: &mut [[f32; LANES]],
    mins: &mut [f32],
    block: fn(&[i8; BLOCK], &[i8]) -> [i32; LANES],
) {
    let k = m.k;
    let bpr = k / BLOCK;
    for b in 0..bpr {
        let mut w = [0i8; BLOCK]; // the block's weights as bytes (Q4: 0..15, Q8: -127..127)
        let (dw, mw) = match &m.w {
            QWeights::Q8 { q, .. } => {
                w.copy_from_slice(&q[r * k + b * BLOCK..r * k + (b + 1) * BLOCK]);
                (1.0, 0.0)
            }
            QWeights::Q4 { nibbles, d, m } => {
                let nb = &nibbles[(r * k + b * BLOCK) / 2..(r * k + (b + 1) * BLOCK) / 2];
                for j in 0..BLOCK / 2 {
                    w[j] = (nb[j] & 0x0F) as i8;
                    w[j + BLOCK / 2] = (nb[j] >> 4) as i8;
                }
                (d[r * bpr + b], m[r * bpr + b])
            }
        };
        for (t, a) in acts.iter().enumerate() {
            let part = block(&w, &a.q[b * BLOCK..(b + 1) * BLOCK]);
            let scale = dw * a.d[b];
            for (acc, p) in lanes[t].iter_mut().zip(part) {
                *acc += scale * p as f32;
            }
            mins[t] += mw * a.d[b] * a.sum[b] as f32;
        }
    }
}

/// Partial sums per block: lane l holds the sum of the products of elements 4l..4l+4 (an AVX2
/// register of eight i32). Every path accumulates these lanes in f32 the same way, so all agree bit
/// for bit.
const LANES: usize = 8;

fn block_lanes_scalar(w: &[i8; BLOCK], x: &[i8]) -> [i32; LANES] {
    let mut out = [0i32; LANES];
    for (l, o) in out.iter_mut().enumerate() {
        *o = (0..4)
            .map(|j| w[4 * l + j] as i32 * x[4 * l + j] as i32)
            .sum();
    }
    out
}

/// `scale · (Σ lanes in a fixed tree + mins)`.
fn finish(lanes: &[f32; LANES], mins: f32, scale: f32) -> f32 {
    let s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    (s + mins) * scale
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{QActs, QMatrix, QWeights, BLOCK, LANES};
    use std::arch::x86_64::*;

    /// Row `r` against every token, in registers: per block, the 4-bit weights are unpacked (low
    /// nibbles: elements 0..16, high: 16..32), multiplied with the int8 activations by `vpmaddubsw`
    /// (u8 × i8 pairs) and `vpmaddwd` (pairs to four-product lanes), and the eight lanes accumulated in
    /// f32 exactly as [`super::row_generic`] does (multiply by the block scale, then add).
    #[target_feature(enable = "avx2")]
    pub unsafe fn row(
        m: &QMatrix,
        r: usize,
        acts: &[QActs],
        lanes: &mut [[f32; LANES]],
        mins: &mut [f32],
    ) {
        let k = m.k;
        let bpr = k / BLOCK;
        let ones = _mm256_set1_epi16(1);
        let low = _mm_set1_epi8(0x0F);
        for (t, a) in acts.iter().enumerate() {
            let mut acc = _mm256_loadu_ps(lanes[t].as_ptr());
            let mut min_acc = mins[t];
            match &m.w {
                QWeights::Q4 { nibbles, d, m: mw } => {
                    let nib = nibbles[r * k / 2..(r + 1) * k / 2].as_ptr();
                    let (d, mw) = (&d[r * bpr..(r + 1) * bpr], &mw[r * bpr..(r + 1) * bpr]);
                    for b in 0..bpr {
                        let raw = _mm_loadu_si128(nib.add(b * BLOCK / 2) as *const __m128i);
                        let lo = _mm_and_si128(raw, low);
                        let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), low);
                        let wv = _mm256_set_m128i(hi, lo);
                        let xv = _mm256_loadu_si256(a.q.as_ptr().add(b * BLOCK) as *const __m256i);
                        let quads = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones);
                        let scale = _mm256_set1_ps(d[b] * a.d[b]);
                        acc = _mm256_add_ps(acc, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(quads)));
                        min_acc += mw[b] * a.d[b] * a.sum[b] as f32;
                    }
                }
                QWeights::Q8 { q, .. } => {
                    let w = q[r * k..(r + 1) * k].as_ptr();
                    for b in 0..bpr {
                        let wv = _mm256_loadu_si256(w.add(b * BLOCK) as *const __m256i);
                        let xv = _mm256_loadu_si256(a.q.as_ptr().add(b * BLOCK) as *const __m256i);
                        // |w| · (sign(w)·x): the unsigned operand stays non-negative, and no pair
                        // sum can saturate (2·127·127 < 2^15)
                        let pairs = _mm256_maddubs_epi16(
                            _mm256_sign_epi8(wv, wv),
                            _mm256_sign_epi8(xv, wv),
                        );
                        let quads = _mm256_madd_epi16(pairs, ones);
                        let scale = _mm256_set1_ps(a.d[b]);
                        acc = _mm256_add_ps(acc, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(quads)));
                    }
                }
            }
            _mm256_storeu_ps(lanes[t].as_mut_ptr(), acc);
            mins[t] = min_acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32
            })
            .collect()
    }

    /// The same arithmetic with the AVX2 path switched off (lanes of four products, f32 in the same
    /// order): the dispatched path must match it bit for bit.
    fn reference(m: &QMatrix, x: &[f32], rows: usize) -> Vec<f32> {
        let (n, k) = (m.n, m.k);
        let acts: Vec<QActs> = (0..rows)
            .map(|t| quantize_acts(&x[t * k..(t + 1) * k]))
            .collect();
        let mut out = vec![0f32; rows * n];
        for r in 0..n {
            let mut lanes = vec![[0f32; LANES]; rows];
            let mut mins = vec![0f32; rows];
            // SAFETY: the scalar path needs no CPU feature
            unsafe { m.row(r, &acts, &mut lanes, &mut mins, false) };
            for t in 0..rows {
                out[t * n + r] = finish(&lanes[t], mins[t], m.row_scale(r));
            }
        }
        out
    }

    #[test]
    fn quantized_products_are_exactly_the_scalar_reference_and_close_to_fp32() {
        let (n, k, rows) = (70, 96, 5);
        let w = data(n * k, 1);
        let x = data(rows * k, 2);
        let exact: Vec<f32> = (0..rows * n)
            .map(|i| {
                let (t, r) = (i / n, i % n);
                (0..k).map(|kk| x[t * k + kk] * w[r * k + kk]).sum()
            })
            .collect();
        for (m, tol) in [
            (QMatrix::quantize_q8(&w, n, k), 0.02),
            (QMatrix::quantize_q4(&w, n, k), 0.12),
        ] {
            let mut out = vec![0f32; rows * n];
            m.matmul(&x, rows, &mut out);
            assert_eq!(
                out,
                reference(&m, &x, rows),
                "ISA path differs from the scalar order"
            );
            let scale = exact.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (g, e) in out.iter().zip(&exact) {
                assert!((g - e).abs() <= tol * scale, "{g} vs {e}");
            }
        }
    }

    #[test]
    fn zero_rows_and_blocks_stay_zero() {
        let m = QMatrix::quantize_q4(&[0.0; 64], 2, 32);
        let mut out = vec![1.0; 2];
        m.matmul(&[0.5; 32], 1, &mut out);
        assert_eq!(out, vec![0.0, 0.0]);
    }
}
