//! Quantized matrix products for the LLM runtime: `out[t, n] = Σ_k x[t, k] · W[n, k]` with `W` held as
//!
//! - **Q8**: int8 per output row with one f32 scale per row (per channel; the scale is the clipping
//!   of the row's range that minimises the squared rounding error),
//! - **Q8B**: int8 in blocks of 32 with one scale each (for the output projection, whose rows span
//!   a wide range, and which GGUF files store this way), or
//! - **Q4**: blocks of 32 along k, each 4-bit values with an f32 scale `d` and offset `m`
//!   (`w = d·q + m`, q in 0..16), nibbles laid out as GGUF's Q4_1: byte j holds elements j (low) and
//!   j + 16 (high), so GGUF Q4_1 weights re-quantize without loss.
//!
//! Activations are quantized per block of 32: to int8 for Q4 weights (as llama.cpp's Q8_0), to int16
//! for the int8 formats (so that int8 weights are the only rounding their products see). Each block's
//! products are exact integer sums in eight lanes; the f32 work that follows runs in one fixed order
//! on every path, so the AVX2 kernels and the portable code give bit-identical results.

use crate::threads;

/// Elements per quantization block.
pub const BLOCK: usize = 32;
/// Partial sums per block, as one AVX2 register of eight i32 holds them (see [`lanes8`], [`lanes16`]).
const LANES: usize = 8;

/// One activation row quantized per block: int8 values with scale and sum (for Q4 weights) or
/// int16 values with scale (for the int8 formats).
pub struct QActs {
    q8: Vec<i8>,
    d8: Vec<f32>,
    sum8: Vec<i32>,
    q16: Vec<i16>,
    d16: Vec<f32>,
}

/// Quantizes `x` (length a multiple of [`BLOCK`]) per block to int8 (`wide`: int16) with scale
/// `max|x| / 127` (`/ 32767`).
pub fn quantize_acts(x: &[f32], wide: bool) -> QActs {
    assert!(
        x.len().is_multiple_of(BLOCK),
        "activation length must be a multiple of {BLOCK}"
    );
    let blocks = x.len() / BLOCK;
    let mut out = QActs {
        q8: vec![],
        d8: vec![],
        sum8: vec![],
        q16: vec![],
        d16: vec![],
    };
    if wide {
        out.q16 = vec![0; x.len()];
        out.d16 = vec![0.0; blocks];
    } else {
        out.q8 = vec![0; x.len()];
        out.d8 = vec![0.0; blocks];
        out.sum8 = vec![0; blocks];
    }
    for b in 0..blocks {
        let xs = &x[b * BLOCK..(b + 1) * BLOCK];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let top = if wide { 32767.0 } else { 127.0 };
        let d = amax / top;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        if wide {
            for (q, &v) in out.q16[b * BLOCK..(b + 1) * BLOCK].iter_mut().zip(xs) {
                *q = (v * inv).round() as i16;
            }
            out.d16[b] = d;
        } else {
            let mut s = 0i32;
            for (q, &v) in out.q8[b * BLOCK..(b + 1) * BLOCK].iter_mut().zip(xs) {
                *q = (v * inv).round() as i8;
                s += *q as i32;
            }
            out.d8[b] = d;
            out.sum8[b] = s;
        }
    }
    out
}

/// A weight matrix in one of the formats.
pub enum QWeights {
    /// `q[n·k]`, `scale[n]`
    Q8 { q: Vec<i8>, scale: Vec<f32> },
    /// `q[n·k]`, `d[n·k/32]`
    Q8B { q: Vec<i8>, d: Vec<f32> },
    /// `nibbles[n·k/2]`, `d[n·k/32]`, `m[n·k/32]`
    Q4 {
        nibbles: Vec<u8>,
        d: Vec<f32>,
        m: Vec<f32>,
    },
}

/// A weight matrix `[n, k]`.
pub struct QMatrix {
    pub n: usize,
    pub k: usize,
    pub w: QWeights,
}

/// Rounds `w / scale` to int8 (clamped to ±127) into `q`; returns the squared error.
fn round_i8(w: &[f32], scale: f32, q: &mut [i8]) -> f32 {
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let mut err = 0.0;
    for (o, &v) in q.iter_mut().zip(w) {
        *o = (v * inv).round().clamp(-127.0, 127.0) as i8;
        let e = v - *o as f32 * scale;
        err += e * e;
    }
    err
}

impl QMatrix {
    /// Per-row int8. The scale is `c · max|w_row| / 127` for the clip `c` in 1.0, 0.98, ..., 0.5 with
    /// the least squared error: a few large weights no longer coarsen the rest of their row.
    pub fn quantize_q8(w: &[f32], n: usize, k: usize) -> QMatrix {
        assert_eq!(w.len(), n * k, "weight length");
        let mut q = vec![0i8; n * k];
        let mut scale = vec![0f32; n];
        let (qp, sp) = (
            threads::SendPtr(q.as_mut_ptr()),
            threads::SendPtr(scale.as_mut_ptr()),
        );
        threads::par_ranges(n, 8, |lo, hi| {
            let (qp, sp) = (qp, sp);
            let mut trial = vec![0i8; k];
            for r in lo..hi {
                let row = &w[r * k..(r + 1) * k];
                // SAFETY: row r's slots are written by this task only
                let (out, s) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(qp.0.add(r * k), k),
                        &mut *sp.0.add(r),
                    )
                };
                let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                let mut best = round_i8(row, amax / 127.0, out);
                *s = amax / 127.0;
                for i in 1..=25 {
                    let c = amax * (1.0 - 0.02 * i as f32) / 127.0;
                    let err = round_i8(row, c, &mut trial);
                    if err < best {
                        best = err;
                        *s = c;
                        out.copy_from_slice(&trial);
                    }
                }
            }
        });
        QMatrix {
            n,
            k,
            w: QWeights::Q8 { q, scale },
        }
    }

    /// Int8 in blocks of 32, `d = max|w_block| / 127`.
    pub fn quantize_q8_blocks(w: &[f32], n: usize, k: usize) -> QMatrix {
        assert_eq!(w.len(), n * k, "weight length");
        assert!(k.is_multiple_of(BLOCK), "k must be a multiple of {BLOCK}");
        let mut q = vec![0i8; n * k];
        let mut d = vec![0f32; n * k / BLOCK];
        for (b, (xs, qs)) in w
            .chunks_exact(BLOCK)
            .zip(q.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            d[b] = xs.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            round_i8(xs, d[b], qs);
        }
        QMatrix {
            n,
            k,
            w: QWeights::Q8B { q, d },
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

    /// Whether the products take int16 activations (the int8 formats) rather than int8 (Q4).
    pub fn wide(&self) -> bool {
        !matches!(self.w, QWeights::Q4 { .. })
    }

    /// Row `r` of the product with one activation row quantized as [`QMatrix::wide`] says.
    pub fn row_value(&self, r: usize, a: &QActs) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            // SAFETY: the CPU has AVX2
            return unsafe { x86::row_dot(self, r, a) };
        }
        row_dot(self, r, a)
    }

    /// Bytes the quantized weights take.
    pub fn nbytes(&self) -> usize {
        match &self.w {
            QWeights::Q8 { q, scale } => q.len() + scale.len() * 4,
            QWeights::Q8B { q, d } => q.len() + d.len() * 4,
            QWeights::Q4 { nibbles, d, m } => nibbles.len() + (d.len() + m.len()) * 4,
        }
    }

    /// `out[t·n + r] = Σ_k x[t·k + kk] · W[r, kk]` for `t` in `0..rows`, over the thread pool.
    pub fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.matmul_with(x, rows, out, has_avx2())
    }

    fn matmul_with(&self, x: &[f32], rows: usize, out: &mut [f32], avx2: bool) {
        let (n, k) = (self.n, self.k);
        assert_eq!(x.len(), rows * k, "input length");
        assert_eq!(out.len(), rows * n, "output length");
        assert!(k.is_multiple_of(BLOCK), "k must be a multiple of {BLOCK}");
        let acts: Vec<QActs> = (0..rows)
            .map(|t| quantize_acts(&x[t * k..(t + 1) * k], self.wide()))
            .collect();
        let out_ptr = threads::SendPtr(out.as_mut_ptr());
        threads::par_ranges(n, 16, |lo, hi| {
            let out = out_ptr;
            for r in lo..hi {
                for (t, a) in acts.iter().enumerate() {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `avx2` is true only where the CPU has it
                    let v = if avx2 {
                        unsafe { x86::row_dot(self, r, a) }
                    } else {
                        row_dot(self, r, a)
                    };
                    #[cfg(not(target_arch = "x86_64"))]
                    let v = {
                        let _ = avx2;
                        row_dot(self, r, a)
                    };
                    // SAFETY: each (t, r) is written by the one task that owns row r
                    unsafe { *out.0.add(t * n + r) = v };
                }
            }
        });
    }
}

/// Lane l of an int8 block product: the four products of elements 4l..4l+4.
fn lanes8(w: &[i8], x: &[i8]) -> [i32; LANES] {
    std::array::from_fn(|l| {
        (0..4)
            .map(|j| w[4 * l + j] as i32 * x[4 * l + j] as i32)
            .sum()
    })
}

/// Lane l of an int16 block product: elements 2l, 2l+1 of each half of the block.
fn lanes16(w: &[i8], x: &[i16]) -> [i32; LANES] {
    std::array::from_fn(|l| {
        [2 * l, 2 * l + 1, 16 + 2 * l, 17 + 2 * l]
            .iter()
            .map(|&j| w[j] as i32 * x[j] as i32)
            .sum()
    })
}

/// `scale · ((Σ lanes in a fixed tree) + mins)`.
fn finish(lanes: &[f32; LANES], mins: f32, scale: f32) -> f32 {
    let s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    (s + mins) * scale
}

/// Row `r` of the product with one activation row, portable code. Per block: the eight lanes, each
/// added in f32 after multiplying by the block's scale; the AVX2 path does exactly these operations.
fn row_dot(m: &QMatrix, r: usize, a: &QActs) -> f32 {
    let k = m.k;
    let bpr = k / BLOCK;
    let mut acc = [0f32; LANES];
    let mut mins = 0f32;
    let mut add = |part: [i32; LANES], scale: f32| {
        for (s, p) in acc.iter_mut().zip(part) {
            *s += scale * p as f32;
        }
    };
    match &m.w {
        QWeights::Q8 { q, scale } => {
            for b in 0..bpr {
                let x = &a.q16[b * BLOCK..(b + 1) * BLOCK];
                add(lanes16(&q[r * k + b * BLOCK..], x), a.d16[b]);
            }
            return finish(&acc, 0.0, scale[r]);
        }
        QWeights::Q8B { q, d } => {
            for b in 0..bpr {
                let x = &a.q16[b * BLOCK..(b + 1) * BLOCK];
                add(
                    lanes16(&q[r * k + b * BLOCK..], x),
                    d[r * bpr + b] * a.d16[b],
                );
            }
        }
        QWeights::Q4 { nibbles, d, m: mw } => {
            for b in 0..bpr {
                let nb = &nibbles[(r * k + b * BLOCK) / 2..];
                let w: [i8; BLOCK] = std::array::from_fn(|j| {
                    (if j < BLOCK / 2 {
                        nb[j] & 0x0F
                    } else {
                        nb[j - BLOCK / 2] >> 4
                    }) as i8
                });
                add(
                    lanes8(&w, &a.q8[b * BLOCK..(b + 1) * BLOCK]),
                    d[r * bpr + b] * a.d8[b],
                );
                mins += mw[r * bpr + b] * a.d8[b] * a.sum8[b] as f32;
            }
        }
    }
    finish(&acc, mins, 1.0)
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx2"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{finish, QActs, QMatrix, QWeights, BLOCK, LANES};
    use std::arch::x86_64::*;

    /// [`super::row_dot`] with AVX2: int8 blocks by `vpmaddubsw` (u8 × i8 pairs; signed weights pass
    /// their sign to the activations, so no pair sum can saturate: 2·127·127 < 2^15) then `vpmaddwd`;
    /// int16 blocks by `vpmaddwd` on sign-extended weights, both halves added.
    #[target_feature(enable = "avx2")]
    pub unsafe fn row_dot(m: &QMatrix, r: usize, a: &QActs) -> f32 {
        let k = m.k;
        let bpr = k / BLOCK;
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        let mut mins = 0f32;
        let (row_scale, have_mins) = match &m.w {
            QWeights::Q8 { q, scale } => {
                let w = q[r * k..(r + 1) * k].as_ptr();
                for b in 0..bpr {
                    let quads = block16(w.add(b * BLOCK), a.q16.as_ptr().add(b * BLOCK));
                    acc = _mm256_add_ps(
                        acc,
                        _mm256_mul_ps(_mm256_set1_ps(a.d16[b]), _mm256_cvtepi32_ps(quads)),
                    );
                }
                (scale[r], false)
            }
            QWeights::Q8B { q, d } => {
                let w = q[r * k..(r + 1) * k].as_ptr();
                for b in 0..bpr {
                    let quads = block16(w.add(b * BLOCK), a.q16.as_ptr().add(b * BLOCK));
                    let s = _mm256_set1_ps(d[r * bpr + b] * a.d16[b]);
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(s, _mm256_cvtepi32_ps(quads)));
                }
                (1.0, false)
            }
            QWeights::Q4 { nibbles, d, m: mw } => {
                let nib = nibbles[r * k / 2..(r + 1) * k / 2].as_ptr();
                let low = _mm_set1_epi8(0x0F);
                for b in 0..bpr {
                    let raw = _mm_loadu_si128(nib.add(b * BLOCK / 2) as *const __m128i);
                    let lo = _mm_and_si128(raw, low);
                    let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), low);
                    let wv = _mm256_set_m128i(hi, lo);
                    let xv = _mm256_loadu_si256(a.q8.as_ptr().add(b * BLOCK) as *const __m256i);
                    let quads = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones);
                    let s = _mm256_set1_ps(d[r * bpr + b] * a.d8[b]);
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(s, _mm256_cvtepi32_ps(quads)));
                    mins += mw[r * bpr + b] * a.d8[b] * a.sum8[b] as f32;
                }
                (1.0, true)
            }
        };
        let lanes = std::mem::transmute::<__m256, [f32; LANES]>(acc);
        finish(&lanes, if have_mins { mins } else { 0.0 }, row_scale)
    }

    /// Eight lanes of an int8 × int16 block: `vpmaddwd` on each sign-extended half, halves added.
    #[inline(always)]
    unsafe fn block16(w: *const i8, x: *const i16) -> __m256i {
        let w_lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(w as *const __m128i));
        let w_hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(16) as *const __m128i));
        let x_lo = _mm256_loadu_si256(x as *const __m256i);
        let x_hi = _mm256_loadu_si256(x.add(16) as *const __m256i);
        _mm256_add_epi32(_mm256_madd_epi16(w_lo, x_lo), _mm256_madd_epi16(w_hi, x_hi))
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

    #[test]
    fn every_format_matches_the_portable_path_bit_for_bit_and_fp32_closely() {
        let (n, k, rows) = (70, 96, 5);
        let mut w = data(n * k, 1);
        w[5] = 3.0; // an outlier: the clipped per-row scale must still round it sensibly
        let x = data(rows * k, 2);
        let exact: Vec<f32> = (0..rows * n)
            .map(|i| {
                let (t, r) = (i / n, i % n);
                (0..k).map(|kk| x[t * k + kk] * w[r * k + kk]).sum()
            })
            .collect();
        for (m, tol) in [
            (QMatrix::quantize_q8(&w, n, k), 0.02),
            (QMatrix::quantize_q8_blocks(&w, n, k), 0.01),
            (QMatrix::quantize_q4(&w, n, k), 0.12),
        ] {
            let (mut fast, mut portable) = (vec![0f32; rows * n], vec![0f32; rows * n]);
            m.matmul_with(&x, rows, &mut fast, has_avx2());
            m.matmul_with(&x, rows, &mut portable, false);
            assert_eq!(fast, portable, "the ISA path differs from the portable one");
            let scale = exact.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (g, e) in fast.iter().zip(&exact) {
                assert!((g - e).abs() <= tol * scale, "{g} vs {e}");
            }
        }
    }

    #[test]
    fn q4_of_values_on_a_q4_grid_is_lossless() {
        // a block whose values are d·q + m for q = 0..15 comes back exactly
        let w: Vec<f32> = (0..32).map(|i| 0.25 * (i % 16) as f32 - 1.5).collect();
        let m = QMatrix::quantize_q4(&w, 1, 32);
        let QWeights::Q4 { d, m: mins, .. } = &m.w else {
            panic!()
        };
        assert_eq!((d[0], mins[0]), (0.25, -1.5));
    }

    #[test]
    fn zero_rows_and_blocks_stay_zero() {
        for m in [
            QMatrix::quantize_q4(&[0.0; 64], 2, 32),
            QMatrix::quantize_q8(&[0.0; 64], 2, 32),
        ] {
            let mut out = vec![1.0; 2];
            m.matmul(&[0.5; 32], 1, &mut out);
            assert_eq!(out, vec![0.0, 0.0]);
        }
    }
}
