//! Quantized matrix products for the LLM runtime: `out[t, n] = Σ_k x[t, k] · W[n, k]` with `W` held as
//!
//! - **Q8**: int8 per output row with one f32 scale per row (per channel; the scale is the clipping
//!   of the row's range that minimises the squared rounding error),
//! - **Q8B**: int8 in blocks of 32 with one f16 scale each (for the output projection, whose rows
//!   span a wide range, and which GGUF files store this way, as Q8_0), or
//! - **Q4**: blocks of 32 along k, each 4-bit values with an f16 scale `d` and offset `m`
//!   (`w = d·q + m`, q in 0..16), nibbles laid out as GGUF's Q4_1: byte j holds elements j (low) and
//!   j + 16 (high), so GGUF Q4_1 weights re-quantize without loss. 20 bytes per 32 weights.
//!
//! Activations are quantized per block of 32: to int8 for Q4 weights (as llama.cpp's Q8_0), to int16
//! for the int8 formats (so that int8 weights are the only rounding their products see). Each block's
//! products are exact integer sums in eight lanes; the f32 work that follows runs in one fixed order
//! on every path, so the AVX-512, AVX2 and portable code give bit-identical results.
//!
//! Decode streams every weight once per token, so the kernels are bound by memory: they prefetch the
//! rows ahead of the ones they compute, and the scales are f16.

use half::f16;
use torchburn_native_macros::isa_versions;

use super::qprefill;
use super::row_blocks::par_rows_tokens;
use crate::threads;

/// A prefill tile of the AVX-512 kernel: rows of W by tokens.
#[cfg(target_arch = "x86_64")]
const TILE_ROWS: usize = 2;
#[cfg(target_arch = "x86_64")]
const TILE_TOKENS: usize = 4;

/// Elements per quantization block.
pub const BLOCK: usize = 32;
/// Partial sums per block, as one AVX2 register of eight i32 holds them (see [`lanes8`], [`lanes16`]).
const LANES: usize = 8;

/// One activation row quantized per block: int8 values with scale and sum (for Q4 weights) or
/// int16 values with scale (for the int8 formats).
pub struct QActs {
    q8: Vec<i8>,
    /// `q8` regrouped for the AVX-512 Q4 row kernel: per pair of blocks, elements 0..16 of the
    /// first, of the second, then elements 16..32 of each (the order a pair's 32 bytes of nibbles
    /// take when the low nibbles fill one half of a register and the high nibbles the other); a
    /// lone last block is paired with zeros
    q8_pairs: Vec<i8>,
    /// `-128 ·` the sum of each four consecutive `q8` (zero padded to whole pairs of blocks): what
    /// turns a product of `q8` with int8 weights offset to unsigned (`w + 128`, for `vpdpbusd`) back
    /// into the signed product
    unsigned_fix: Vec<i32>,
    d8: Vec<f32>,
    /// `d8[b] · Σ q8` of each block: what a Q4 block's offset `m` multiplies
    dsum8: Vec<f32>,
    q16: Vec<i16>,
    d16: Vec<f32>,
    /// the activations themselves, for bf16 weights
    f: Vec<f32>,
}

/// How a weight format takes its activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    /// int8 per block of 32 (Q4 weights)
    Int8,
    /// int16 per block of 32 (the int8 weight formats)
    Int16,
    /// as they are (bf16 weights)
    F32,
}

/// Quantizes `x` (length a multiple of [`BLOCK`]) per block to int8 (int16) with scale
/// `max|x| / 127` (`/ 32767`), or keeps it as f32.
#[isa_versions]
pub fn quantize_acts(x: &[f32], format: ActFormat) -> QActs {
    assert!(
        x.len().is_multiple_of(BLOCK),
        "activation length must be a multiple of {BLOCK}"
    );
    let blocks = x.len() / BLOCK;
    let mut out = QActs {
        q8: vec![],
        q8_pairs: vec![],
        unsigned_fix: vec![],
        d8: vec![],
        dsum8: vec![],
        q16: vec![],
        d16: vec![],
        f: vec![],
    };
    if format == ActFormat::F32 {
        out.f = x.to_vec();
        return out;
    }
    let wide = format == ActFormat::Int16;
    if wide {
        out.q16 = vec![0; x.len()];
        // zero past the last block, up to a whole group of sixteen (see `x86::rows_dot_avx512`)
        out.d16 = vec![0.0; blocks.next_multiple_of(2 * LANES)];
    } else {
        out.q8 = vec![0; x.len()];
        out.d8 = vec![0.0; blocks.next_multiple_of(2 * LANES)];
        // zero past the last block, up to a whole group of eight (see `x86::offsets`)
        out.dsum8 = vec![0.0; blocks.next_multiple_of(LANES)];
    }
    for b in 0..blocks {
        let xs = &x[b * BLOCK..(b + 1) * BLOCK];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let top = if wide { 32767.0 } else { 127.0 };
        let d = amax / top;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        if wide {
            for (q, &v) in out.q16[b * BLOCK..(b + 1) * BLOCK].iter_mut().zip(xs) {
                *q = round_away(v * inv) as i16;
            }
            out.d16[b] = d;
        } else {
            let mut s = 0i32;
            for (q, &v) in out.q8[b * BLOCK..(b + 1) * BLOCK].iter_mut().zip(xs) {
                *q = round_away(v * inv) as i8;
                s += *q as i32;
            }
            out.d8[b] = d;
            out.dsum8[b] = d * s as f32;
        }
    }
    if !wide {
        out.q8_pairs = pair_halves(&out.q8);
        out.unsigned_fix = vec![0; blocks.div_ceil(2) * 2 * LANES];
        for (fix, group) in out.unsigned_fix.iter_mut().zip(out.q8.chunks_exact(4)) {
            *fix = -128 * group.iter().map(|&v| v as i32).sum::<i32>();
        }
    }
    out
}

/// Regroups int8 blocks as [`QActs::q8_pairs`] describes.
fn pair_halves(q8: &[i8]) -> Vec<i8> {
    const HALF: usize = BLOCK / 2;
    let blocks = q8.len() / BLOCK;
    let mut out = vec![0i8; blocks.div_ceil(2) * 2 * BLOCK];
    for b in 0..blocks {
        let (pair, second) = (b / 2, b % 2);
        let dst = &mut out[pair * 2 * BLOCK..];
        let src = &q8[b * BLOCK..];
        dst[second * HALF..][..HALF].copy_from_slice(&src[..HALF]);
        dst[BLOCK + second * HALF..][..HALF].copy_from_slice(&src[HALF..BLOCK]);
    }
    out
}

/// A weight matrix in one of the formats.
pub enum QWeights {
    /// `q[n·k]`, `scale[n]`
    Q8 { q: Vec<i8>, scale: Vec<f32> },
    /// `q[n·k]`, `d[n·k/32]`
    Q8B { q: Vec<i8>, d: Vec<f16> },
    /// `nibbles[n·k/2]`, `d[n·k/32]`, `m[n·k/32]` followed by eight zeros
    /// `w[n·k]`: bf16 (the top half of f32, rounded to nearest even) times f32 activations
    BF16 { w: Vec<half::bf16> },
    Q4 {
        nibbles: Vec<u8>,
        d: Vec<f16>,
        m: Vec<f16>,
    },
}

/// A weight matrix `[n, k]`.
pub struct QMatrix {
    pub n: usize,
    pub k: usize,
    pub w: QWeights,
}

/// `v` as f16, saturated to the largest finite f16 rather than infinity.
fn to_f16(v: f32) -> f16 {
    f16::from_f32(v.clamp(-f16::MAX.to_f32(), f16::MAX.to_f32()))
}

/// `x.round()` (halves away from zero), in a form a loop over it vectorizes: `round` is a libm call
/// per element on x86-64, `trunc` one instruction from SSE4.1 on. Exact, since the fraction
/// `x - trunc(x)` of an f32 is itself an f32.
#[inline(always)]
pub(crate) fn round_away(x: f32) -> f32 {
    let t = x.trunc();
    if (x - t).abs() >= 0.5 {
        t + 1f32.copysign(x)
    } else {
        t
    }
}

/// Rounds `w / scale` to int8 (clamped to ±127) into `q`; returns the squared error, summed in
/// sixteen running sums (a fixed order, so every ISA picks the same scale).
#[isa_versions]
fn round_i8(w: &[f32], scale: f32, q: &mut [i8]) -> f32 {
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    const SUMS: usize = 16;
    let mut acc = [0f32; SUMS];
    let one = |o: &mut i8, v: f32| {
        *o = round_away(v * inv).clamp(-127.0, 127.0) as i8;
        let e = v - *o as f32 * scale;
        e * e
    };
    let (qc, wc) = (q.chunks_exact_mut(SUMS), w.chunks_exact(SUMS));
    let tail: f32 = qc
        .into_remainder()
        .iter_mut()
        .zip(wc.remainder())
        .map(|(o, &v)| one(o, v))
        .sum();
    for (qs, ws) in q.chunks_exact_mut(SUMS).zip(w.chunks_exact(SUMS)) {
        for ((a, o), &v) in acc.iter_mut().zip(qs).zip(ws) {
            *a += one(o, v);
        }
    }
    acc.iter().sum::<f32>() + tail
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

    /// bf16, rounded to nearest even.
    pub fn quantize_bf16(w: &[f32], n: usize, k: usize) -> QMatrix {
        assert_eq!(w.len(), n * k, "weight length");
        assert!(k.is_multiple_of(BLOCK), "k must be a multiple of {BLOCK}");
        QMatrix {
            n,
            k,
            w: QWeights::BF16 {
                w: w.iter().map(|&v| half::bf16::from_f32(v)).collect(),
            },
        }
    }

    /// Int8 in blocks of 32, `d = max|w_block| / 127`.
    pub fn quantize_q8_blocks(w: &[f32], n: usize, k: usize) -> QMatrix {
        assert_eq!(w.len(), n * k, "weight length");
        assert!(k.is_multiple_of(BLOCK), "k must be a multiple of {BLOCK}");
        let mut q = vec![0i8; n * k];
        let mut d = vec![f16::ZERO; n * k / BLOCK];
        for (b, (xs, qs)) in w
            .chunks_exact(BLOCK)
            .zip(q.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            // the scale is stored as f16, so the values are rounded against what will be read back
            d[b] = to_f16(xs.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0);
            round_i8(xs, d[b].to_f32(), qs);
        }
        // sixteen zeros past the end: the AVX-512 kernel reads scales sixteen at a time
        d.resize(n * k / BLOCK + 2 * LANES, f16::ZERO);
        QMatrix {
            n,
            k,
            w: QWeights::Q8B { q, d },
        }
    }

    /// Bytes of one block of GGUF's Q4_1: `d` and `m` (f16), then sixteen bytes of nibbles.
    pub const Q4_1_BLOCK_BYTES: usize = 20;

    /// Int4 weights taken as they are from GGUF Q4_1 blocks (`n · k / 32` of them, row after row):
    /// the same grid and nibble order as [`QMatrix::quantize_q4`], so a file's int4 weights need no
    /// round trip through f32.
    pub fn from_q4_1(raw: &[u8], n: usize, k: usize) -> QMatrix {
        assert!(
            k.is_multiple_of(BLOCK),
            "k must be a multiple of {BLOCK} for Q4"
        );
        let blocks = n * k / BLOCK;
        assert_eq!(
            raw.len(),
            blocks * Self::Q4_1_BLOCK_BYTES,
            "Q4_1 data length"
        );
        let mut nibbles = vec![0u8; n * k / 2];
        let (mut d, mut m) = (vec![f16::ZERO; blocks], vec![f16::ZERO; blocks]);
        for (b, block) in raw.chunks_exact(Self::Q4_1_BLOCK_BYTES).enumerate() {
            d[b] = f16::from_le_bytes([block[0], block[1]]);
            m[b] = f16::from_le_bytes([block[2], block[3]]);
            nibbles[b * BLOCK / 2..][..BLOCK / 2].copy_from_slice(&block[4..]);
        }
        Self::q4(n, k, nibbles, d, m)
    }

    /// Q4 weights from their parts, with the zeros past the end that the SIMD code reads: scales
    /// sixteen and offsets eight at a time.
    fn q4(n: usize, k: usize, nibbles: Vec<u8>, mut d: Vec<f16>, mut m: Vec<f16>) -> QMatrix {
        let blocks = n * k / BLOCK;
        d.resize(blocks + 2 * LANES, f16::ZERO);
        m.resize(blocks + LANES, f16::ZERO);
        QMatrix {
            n,
            k,
            w: QWeights::Q4 { nibbles, d, m },
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
        let (mut nibbles, mut d, mut m) = (
            vec![0u8; n * k / 2],
            vec![f16::ZERO; blocks],
            vec![f16::ZERO; blocks],
        );
        for b in 0..blocks {
            let xs = &w[b * BLOCK..(b + 1) * BLOCK];
            let lo = xs.iter().fold(f32::INFINITY, |a, &v| a.min(v));
            let hi = xs.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            // scale and offset are stored as f16 (as GGUF's Q4_1): round against those
            let (step, lo) = (to_f16((hi - lo) / 15.0), to_f16(lo));
            d[b] = step;
            m[b] = lo;
            let (step, lo) = (step.to_f32(), lo.to_f32());
            let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
            let q = |v: f32| round_away((v - lo) * inv).clamp(0.0, 15.0) as u8;
            for j in 0..BLOCK / 2 {
                nibbles[b * BLOCK / 2 + j] = q(xs[j]) | (q(xs[j + BLOCK / 2]) << 4);
            }
        }
        Self::q4(n, k, nibbles, d, m)
    }

    /// The activations this format's products take.
    pub fn act_format(&self) -> ActFormat {
        match self.w {
            QWeights::Q4 { .. } | QWeights::Q8B { .. } => ActFormat::Int8,
            QWeights::Q8 { .. } => ActFormat::Int16,
            QWeights::BF16 { .. } => ActFormat::F32,
        }
    }

    /// Bytes the quantized weights take.
    pub fn nbytes(&self) -> usize {
        match &self.w {
            QWeights::Q8 { q, scale } => q.len() + scale.len() * 4,
            QWeights::BF16 { w } => w.len() * 2,
            // the zeros of padding are not the model's
            QWeights::Q8B { q, d } => q.len() + (d.len() - 2 * LANES) * 2,
            QWeights::Q4 { nibbles, d, m } => {
                nibbles.len() + (d.len() - 2 * LANES + m.len() - LANES) * 2
            }
        }
    }

    /// Row `r` of the product with one activation row in [`QMatrix::act_format`].
    pub fn row_value(&self, r: usize, a: &QActs) -> f32 {
        self.row_with(r, a, Isa::best())
    }

    fn row_with(&self, r: usize, a: &QActs, isa: Isa) -> f32 {
        match isa {
            Isa::Portable => row_dot(self, r, a),
            // SAFETY: `Isa::best` picks only what the CPU has (tests pass only those too)
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::row_dot_avx2(self, r, a) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx512Vnni => unsafe { self.rows_avx512::<1>(r, a, isa)[0] },
        }
    }

    /// `R` rows from `r` on AVX-512 (with VNNI where `isa` says so).
    ///
    /// # Safety
    /// The CPU must have what `isa` names.
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows_avx512<const R: usize>(&self, r: usize, a: &QActs, isa: Isa) -> [f32; R] {
        match (&self.w, isa) {
            (QWeights::Q4 { .. }, Isa::Avx512Vnni) => x86::q4_rows_avx512_vnni::<R>(self, r, a),
            (QWeights::Q4 { .. }, _) => x86::q4_rows_avx512::<R>(self, r, a),
            (QWeights::Q8B { .. }, Isa::Avx512Vnni) => x86::q8b_rows_avx512_vnni::<R>(self, r, a),
            (QWeights::Q8B { .. }, _) => x86::q8b_rows_avx512::<R>(self, r, a),
            _ => x86::rows_dot_avx512::<R>(self, r, a),
        }
    }

    /// `out[i] = ` row `rows.start + i` of the product with one activation row.
    pub fn rows_into(&self, rows: std::ops::Range<usize>, a: &QActs, out: &mut [f32]) {
        self.rows_into_with(rows, a, out, Isa::best())
    }

    fn rows_into_with(&self, rows: std::ops::Range<usize>, a: &QActs, out: &mut [f32], isa: Isa) {
        assert!(
            rows.end <= self.n && out.len() >= rows.len(),
            "rows out of range"
        );
        // (only the x86 paths below move it)
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut r = rows.start;
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Avx512 | Isa::Avx512Vnni) {
            // four rows at a time: their accumulator chains overlap
            while r + 4 <= rows.end {
                // SAFETY: the CPU has AVX-512 (F, BW) and AVX2
                let v = unsafe { self.rows_avx512::<4>(r, a, isa) };
                out[r - rows.start..][..4].copy_from_slice(&v);
                r += 4;
            }
        }
        for (o, row) in out[r - rows.start..].iter_mut().zip(r..rows.end) {
            *o = self.row_with(row, a, isa);
        }
    }

    /// Bytes one row's weights and scales take (what a product reads per row).
    pub fn row_bytes(&self) -> usize {
        let k = self.k;
        match &self.w {
            QWeights::Q8 { .. } => k + 4,
            QWeights::BF16 { .. } => 2 * k,
            QWeights::Q8B { .. } => k + 2 * (k / BLOCK),
            QWeights::Q4 { .. } => k / 2 + 4 * (k / BLOCK),
        }
    }

    /// Rows `rows` against each of several activation rows: `out[t · rows.len() + i]` is row
    /// `rows.start + i` times `acts[t]`, the value [`QMatrix::rows_into`] gives. Every token runs
    /// over the rows before the next block of them is read, so the caller keeps `rows` small enough
    /// to stay in cache (see [`crate::kernels::row_blocks`]).
    pub fn rows_tokens_into(&self, rows: std::ops::Range<usize>, acts: &[&QActs], out: &mut [f32]) {
        self.rows_tokens_with(rows, acts, out, Isa::best())
    }

    fn rows_tokens_with(
        &self,
        rows: std::ops::Range<usize>,
        acts: &[&QActs],
        out: &mut [f32],
        isa: Isa,
    ) {
        let len = rows.len();
        assert!(rows.end <= self.n, "rows out of range");
        assert_eq!(out.len(), acts.len() * len, "output length");
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut first = 0; // the first token the row-by-row loop below still has to do
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Avx512 | Isa::Avx512Vnni)
            && matches!(self.w, QWeights::Q4 { .. } | QWeights::Q8 { .. })
        {
            // tiles of TILE_ROWS rows × TILE_TOKENS tokens: each weight pair expanded once for all
            // the tile's tokens (each result equals the row kernel's)
            while first + TILE_TOKENS <= acts.len() {
                let a: [&QActs; TILE_TOKENS] = std::array::from_fn(|j| acts[first + j]);
                let mut r = rows.start;
                while r + TILE_ROWS <= rows.end {
                    // SAFETY: the CPU has AVX-512 (and VNNI where used)
                    let v = unsafe {
                        if isa == Isa::Avx512Vnni {
                            x86::tile_avx512_vnni::<TILE_ROWS, TILE_TOKENS>(self, r, a)
                        } else {
                            x86::tile_avx512::<TILE_ROWS, TILE_TOKENS>(self, r, a)
                        }
                    };
                    for (j, row) in v.iter().enumerate() {
                        out[(first + j) * len + r - rows.start..][..TILE_ROWS].copy_from_slice(row);
                    }
                    r += TILE_ROWS;
                }
                for (j, act) in a.iter().enumerate() {
                    for rr in r..rows.end {
                        out[(first + j) * len + rr - rows.start] = self.row_with(rr, act, isa);
                    }
                }
                first += TILE_TOKENS;
            }
        }
        for (t, a) in acts.iter().enumerate().skip(first) {
            self.rows_into_with(rows.clone(), a, &mut out[t * len..][..len], isa);
        }
    }

    /// `out[t·n + r] = Σ_k x[t·k + kk] · W[r, kk]` for `t` in `0..rows`, over the thread pool.
    pub fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.matmul_with(x, rows, out, Isa::best())
    }

    fn matmul_with(&self, x: &[f32], rows: usize, out: &mut [f32], isa: Isa) {
        let (n, k) = (self.n, self.k);
        assert_eq!(x.len(), rows * k, "input length");
        assert_eq!(out.len(), rows * n, "output length");
        assert!(k.is_multiple_of(BLOCK), "k must be a multiple of {BLOCK}");
        if rows >= qprefill::MIN_TOKENS {
            return qprefill::matmul_on(self, x, rows, out, isa != Isa::Portable);
        }
        let acts: Vec<QActs> = (0..rows)
            .map(|t| quantize_acts(&x[t * k..(t + 1) * k], self.act_format()))
            .collect();
        let acts: Vec<&QActs> = acts.iter().collect();
        par_rows_tokens(n, self.row_bytes(), rows, out, |sub, got| {
            self.rows_tokens_with(sub, &acts, got, isa)
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

/// The instruction sets the row kernels run on; all give bit-identical results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX-512 with VNNI's `vpdpbusd` (decode rows and prefill tiles)
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl Isa {
    fn best() -> Isa {
        use std::sync::OnceLock;
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| Isa::available().into_iter().last().unwrap_or(Isa::Portable))
    }

    /// Every path this CPU can run, slowest first.
    fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut out = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            // the AVX2 level includes F16C (f16 scales) and FMA (block sums)
            if crate::isa::avx2() {
                out.push(Isa::Avx2);
            }
            if crate::isa::avx512() {
                out.push(Isa::Avx512);
                if std::arch::is_x86_feature_detected!("avx512vnni") {
                    out.push(Isa::Avx512Vnni);
                }
            }
        }
        out
    }
}

// The canonical order every path follows. A row's blocks alternate between two sets of eight f32
// accumulators (even blocks, odd blocks: one 16-lane register on AVX-512, two on AVX2); lane l of a
// block's integer product times the block's scale is added to lane l of its set in one fused
// multiply-add (one rounding: `mul_add` in portable code, FMA instructions on x86). Q4's
// offsets add `m · d8 · Σq8` of block b into lane b mod 8 of an eight-lane sum. At the end both sets
// and the offsets fold in the fixed tree of `finish`. Integer sums are exact, so every path that keeps
// this order rounds identically.

fn tree8(a: &[f32; LANES]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// `scale · (tree(even + odd) + tree(offsets))`.
fn finish(acc: &[f32; 2 * LANES], offsets: &[f32; LANES], scale: f32) -> f32 {
    let folded: [f32; LANES] = std::array::from_fn(|l| acc[l] + acc[LANES + l]);
    (tree8(&folded) + tree8(offsets)) * scale
}

/// Q4 block `b` of row `r` as 32 values in 0..16.
fn q4_block(nibbles: &[u8], k: usize, r: usize, b: usize) -> [i8; BLOCK] {
    let nb = &nibbles[(r * k + b * BLOCK) / 2..];
    std::array::from_fn(|j| {
        (if j < BLOCK / 2 {
            nb[j] & 0x0F
        } else {
            nb[j - BLOCK / 2] >> 4
        }) as i8
    })
}

/// Row `r` of the product with one activation row, portable code: exactly the operations the SIMD
/// paths do, in the same order.
fn row_dot(m: &QMatrix, r: usize, a: &QActs) -> f32 {
    let k = m.k;
    let bpr = k / BLOCK;
    let mut acc = [0f32; 2 * LANES];
    let mut offsets = [0f32; LANES];
    let mut add = |b: usize, part: [i32; LANES], scale: f32| {
        let set = &mut acc[(b % 2) * LANES..][..LANES];
        for (s, p) in set.iter_mut().zip(part) {
            *s = (p as f32).mul_add(scale, *s);
        }
    };
    let row_scale = match &m.w {
        QWeights::BF16 { w } => {
            // sixteen lanes: lane l takes elements l, l + 16, ...; lanes l and l + 8 are the two
            // accumulator sets of the other formats
            let w = &w[r * k..(r + 1) * k];
            for (j, (wv, &x)) in w.iter().zip(&a.f).enumerate() {
                let lane = j % (2 * LANES);
                acc[lane] = wv.to_f32().mul_add(x, acc[lane]);
            }
            1.0
        }
        QWeights::Q8 { q, scale } => {
            for b in 0..bpr {
                let x = &a.q16[b * BLOCK..(b + 1) * BLOCK];
                add(b, lanes16(&q[r * k + b * BLOCK..], x), a.d16[b]);
            }
            scale[r]
        }
        QWeights::Q8B { q, d } => {
            for b in 0..bpr {
                let x = &a.q8[b * BLOCK..(b + 1) * BLOCK];
                add(
                    b,
                    lanes8(&q[r * k + b * BLOCK..], x),
                    d[r * bpr + b].to_f32() * a.d8[b],
                );
            }
            1.0
        }
        QWeights::Q4 { nibbles, d, m: mw } => {
            for b in 0..bpr {
                let w = q4_block(nibbles, k, r, b);
                add(
                    b,
                    lanes8(&w, &a.q8[b * BLOCK..(b + 1) * BLOCK]),
                    d[r * bpr + b].to_f32() * a.d8[b],
                );
                offsets[b % LANES] += mw[r * bpr + b].to_f32() * a.dsum8[b];
            }
            1.0
        }
    };
    finish(&acc, &offsets, row_scale)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{QActs, QMatrix, QWeights, BLOCK, LANES};
    use half::f16;
    use std::arch::x86_64::*;

    /// Q4's offset sums of one row (`bpr` blocks): lane l gathers blocks l, l + 8, ... Whole groups of
    /// eight are read: past the row's last block `mw` runs into the next row (or the matrix's eight
    /// zeros) and `dsum` is zero, and adding those zero products leaves every lane as the portable
    /// path has it (its sums start at +0.0, so they never become -0.0).
    #[inline(always)]
    unsafe fn offsets(mw: *const f16, dsum: *const f32, bpr: usize) -> __m256 {
        let mut acc = _mm256_setzero_ps();
        for g in 0..bpr.div_ceil(LANES) {
            let m = _mm256_cvtph_ps(_mm_loadu_si128(mw.add(g * LANES) as *const __m128i));
            let p = _mm256_mul_ps(m, _mm256_loadu_ps(dsum.add(g * LANES)));
            acc = _mm256_add_ps(acc, p);
        }
        acc
    }

    /// `((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))`, as [`super::finish`] adds them.
    #[inline(always)]
    unsafe fn tree8(v: __m256) -> __m128 {
        let pairs = _mm256_hadd_ps(v, v); // a0+a1, a2+a3, .. | a4+a5, a6+a7, ..
        let quads = _mm256_hadd_ps(pairs, pairs); // (a0+a1)+(a2+a3) | (a4+a5)+(a6+a7)
        _mm_add_ss(
            _mm256_castps256_ps128(quads),
            _mm256_extractf128_ps::<1>(quads),
        )
    }

    /// [`super::finish`] on registers: `scale · (tree(even + odd) + tree(offsets))`.
    #[inline(always)]
    unsafe fn finish_simd(even: __m256, odd: __m256, offsets: __m256, scale: f32) -> f32 {
        let s = _mm_add_ss(tree8(_mm256_add_ps(even, odd)), tree8(offsets));
        _mm_cvtss_f32(_mm_mul_ss(s, _mm_set_ss(scale)))
    }

    /// Sixteen f16 from `p` as f32 (exact).
    #[inline(always)]
    unsafe fn f16x16(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }

    /// One f16 as f32 (exact, as `f16::to_f32`).
    #[inline(always)]
    unsafe fn f32_of(v: f16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v.to_bits() as i32)))
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

    /// Eight lanes of an int8 × int8 block: `vpmaddubsw` on |w| and x with w's sign (no pair sum can
    /// saturate: both are within ±127), then `vpmaddwd` by ones.
    #[inline(always)]
    unsafe fn block8(w: *const i8, x: *const i8) -> __m256i {
        let wv = _mm256_loadu_si256(w as *const __m256i);
        let xv = _mm256_loadu_si256(x as *const __m256i);
        _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv)),
            _mm256_set1_epi16(1),
        )
    }

    /// Eight lanes of a Q4 × int8 block: `vpmaddubsw` (the 4-bit values are unsigned, so no pair sum
    /// can saturate: 2·15·127 < 2^15) then `vpmaddwd` by ones.
    #[inline(always)]
    unsafe fn block4(nib: *const u8, x: *const i8) -> __m256i {
        let raw = _mm_loadu_si128(nib as *const __m128i);
        let low = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(raw, low);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), low);
        let xv = _mm256_loadu_si256(x as *const __m256i);
        _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_set_m128i(hi, lo), xv),
            _mm256_set1_epi16(1),
        )
    }

    /// [`super::row_dot`] on AVX2: one eight-lane register per accumulator set.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub unsafe fn row_dot_avx2(m: &QMatrix, r: usize, a: &QActs) -> f32 {
        prefetch_rows(m, r + PREFETCH_ROWS, 1);
        let k = m.k;
        let bpr = k / BLOCK;
        let mut sets = [_mm256_setzero_ps(); 2];
        let mut add = |b: usize, part: __m256i, scale: f32| {
            sets[b % 2] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(part), _mm256_set1_ps(scale), sets[b % 2]);
        };
        let mut offs = _mm256_setzero_ps();
        let row_scale = match &m.w {
            QWeights::BF16 { w } => {
                let (wp, x) = (w[r * k..].as_ptr() as *const u16, a.f.as_ptr());
                for j in (0..k).step_by(2 * LANES) {
                    for (h, set) in sets.iter_mut().enumerate() {
                        let at = j + h * LANES;
                        let wv =
                            _mm256_cvtepu16_epi32(_mm_loadu_si128(wp.add(at) as *const __m128i));
                        let wv = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wv));
                        *set = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.add(at)), *set);
                    }
                }
                1.0
            }
            QWeights::Q8 { q, scale } => {
                let w = q[r * k..(r + 1) * k].as_ptr();
                for b in 0..bpr {
                    add(
                        b,
                        block16(w.add(b * BLOCK), a.q16.as_ptr().add(b * BLOCK)),
                        a.d16[b],
                    );
                }
                scale[r]
            }
            QWeights::Q8B { q, d } => {
                let w = q[r * k..(r + 1) * k].as_ptr();
                for b in 0..bpr {
                    add(
                        b,
                        block8(w.add(b * BLOCK), a.q8.as_ptr().add(b * BLOCK)),
                        f32_of(d[r * bpr + b]) * a.d8[b],
                    );
                }
                1.0
            }
            QWeights::Q4 { nibbles, d, m: mw } => {
                let nib = nibbles[r * k / 2..(r + 1) * k / 2].as_ptr();
                for b in 0..bpr {
                    add(
                        b,
                        block4(nib.add(b * BLOCK / 2), a.q8.as_ptr().add(b * BLOCK)),
                        f32_of(d[r * bpr + b]) * a.d8[b],
                    );
                }
                offs = offsets(mw[r * bpr..].as_ptr(), a.dsum8.as_ptr(), bpr);
                1.0
            }
        };
        finish_simd(sets[0], sets[1], offs, row_scale)
    }

    /// Both accumulator sets in one register: lanes 0..8 even blocks, 8..16 odd blocks.
    #[inline(always)]
    unsafe fn add_pair(acc: __m512, part: __m512i, s_even: f32, s_odd: f32) -> __m512 {
        let scale = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s_even), _mm512_set1_ps(s_odd));
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(part), scale, acc)
    }

    /// `acc + part · scale`, `scale` already [s_even ×8, s_odd ×8].
    #[inline(always)]
    unsafe fn add_pair_scaled(acc: __m512, part: __m512i, scale: __m512) -> __m512 {
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(part), scale, acc)
    }

    /// The block scales `d_w · d_x` of the sixteen blocks from block `16g` on, for each of `R` rows
    /// (their f16 weight scales at `dw[i]`); past a row's last block they run into padding whose
    /// products go unused.
    #[inline(always)]
    unsafe fn group_scales<const R: usize>(
        dw: &[*const f16; R],
        dx: *const f32,
        g: usize,
    ) -> [__m512; R] {
        let sx = _mm512_loadu_ps(dx.add(g * 2 * LANES));
        let mut scales = [_mm512_setzero_ps(); R];
        for (scale, &w) in scales.iter_mut().zip(dw) {
            *scale = _mm512_mul_ps(f16x16(w.add(g * 2 * LANES)), sx);
        }
        scales
    }

    /// A lone last (even) block, added to the low half.
    #[inline(always)]
    unsafe fn add_last(acc: __m512, part: __m256i, scale: f32) -> __m512 {
        let lo = _mm512_castps512_ps256(acc);
        let lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(part), _mm256_set1_ps(scale), lo);
        _mm512_mask_blend_ps(0x00FF, acc, _mm512_castps256_ps512(lo))
    }

    /// Two int8 × int16 blocks: lanes 0..8 the first block's, 8..16 the second's.
    #[inline(always)]
    unsafe fn pair16(w: *const i8, x: *const i16) -> __m512i {
        let p0 = _mm512_madd_epi16(
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(w as *const __m256i)),
            _mm512_loadu_si512(x as *const __m512i),
        );
        let p1 = _mm512_madd_epi16(
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(w.add(BLOCK) as *const __m256i)),
            _mm512_loadu_si512(x.add(BLOCK) as *const __m512i),
        );
        // lane l of a block is pairs l and l + 8 of its products: low 256 bits plus high 256 bits
        let lows = _mm512_shuffle_i64x2::<0b01_00_01_00>(p0, p1);
        let highs = _mm512_shuffle_i64x2::<0b11_10_11_10>(p0, p1);
        _mm512_add_epi32(lows, highs)
    }

    /// Two Q4 blocks (32 bytes of nibbles) as 64 bytes in 0..16, in element order.
    #[inline(always)]
    unsafe fn expand4(nib: *const u8) -> __m512i {
        let raw = _mm256_loadu_si256(nib as *const __m256i);
        let low = _mm256_set1_epi8(0x0F);
        let lo = _mm256_and_si256(raw, low); // [block 0 elements 0..16, block 1 elements 0..16]
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low); // elements 16..32 of each
        let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        _mm512_shuffle_i64x2::<0b11_01_10_00>(w, w) // block 0 lo, hi, block 1 lo, hi
    }

    /// Lanes of two expanded Q4 blocks times 64 int8 activations.
    #[inline(always)]
    unsafe fn dot4(w: __m512i, x: __m512i) -> __m512i {
        _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1))
    }

    /// How far ahead of the rows being computed their weights are prefetched.
    const PREFETCH_ROWS: usize = 32;

    /// Asks for `count` rows from `r0` on to be brought into L2 ahead of their use (addresses past
    /// the matrix are harmless: a prefetch never faults).
    #[inline(always)]
    unsafe fn prefetch_rows(m: &QMatrix, r0: usize, count: usize) {
        let k = m.k;
        let bpr = k / BLOCK;
        let lines = |p: *const u8, bytes: usize| {
            for off in (0..bytes).step_by(64) {
                _mm_prefetch::<_MM_HINT_T2>(p.wrapping_add(off) as *const i8);
            }
        };
        match &m.w {
            QWeights::BF16 { w } => {
                lines(w.as_ptr().wrapping_add(r0 * k) as *const u8, count * k * 2)
            }
            QWeights::Q8 { q, .. } => {
                lines(q.as_ptr().wrapping_add(r0 * k) as *const u8, count * k)
            }
            QWeights::Q8B { q, d } => {
                lines(q.as_ptr().wrapping_add(r0 * k) as *const u8, count * k);
                lines(
                    d.as_ptr().wrapping_add(r0 * bpr) as *const u8,
                    count * bpr * 2,
                );
            }
            QWeights::Q4 { nibbles, d, m } => {
                lines(nibbles.as_ptr().wrapping_add(r0 * k / 2), count * k / 2);
                lines(
                    d.as_ptr().wrapping_add(r0 * bpr) as *const u8,
                    count * bpr * 2,
                );
                lines(
                    m.as_ptr().wrapping_add(r0 * bpr) as *const u8,
                    count * bpr * 2,
                );
            }
        }
    }

    /// [`super::row_dot`] on AVX-512 for `R` consecutive rows from `r0`, two blocks per step. The rows
    /// are interleaved so their accumulator chains overlap (one row alone waits on its adds) and they
    /// share the activation loads; each row still follows the canonical order.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx2,f16c,fma")]
    pub unsafe fn rows_dot_avx512<const R: usize>(m: &QMatrix, r0: usize, a: &QActs) -> [f32; R] {
        let k = m.k;
        let bpr = k / BLOCK;
        let pairs = bpr / 2;
        let lone = bpr % 2 == 1;
        prefetch_rows(m, r0 + PREFETCH_ROWS, R);
        let mut acc = [_mm512_setzero_ps(); R];
        let offs = [_mm256_setzero_ps(); R];
        let mut row_scale = [1f32; R];
        match &m.w {
            QWeights::BF16 { w } => {
                let x = a.f.as_ptr();
                let wp: [*const u16; R] =
                    std::array::from_fn(|i| w[(r0 + i) * k..].as_ptr() as *const u16);
                for j in (0..k).step_by(2 * LANES) {
                    let xv = _mm512_loadu_ps(x.add(j));
                    for i in 0..R {
                        let wv = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                            wp[i].add(j) as *const __m256i
                        ));
                        let wv = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wv));
                        acc[i] = _mm512_fmadd_ps(wv, xv, acc[i]);
                    }
                }
            }
            QWeights::Q8 { q, scale } => {
                let x = a.q16.as_ptr();
                let w: [*const i8; R] = std::array::from_fn(|i| q[(r0 + i) * k..].as_ptr());
                // the per-row weight scale is applied at the end
                for p in 0..pairs {
                    let b = 2 * p;
                    for i in 0..R {
                        let part = pair16(w[i].add(b * BLOCK), x.add(b * BLOCK));
                        acc[i] = add_pair(acc[i], part, a.d16[b], a.d16[b + 1]);
                    }
                }
                if lone {
                    let b = bpr - 1;
                    for i in 0..R {
                        let part = block16(w[i].add(b * BLOCK), x.add(b * BLOCK));
                        acc[i] = add_last(acc[i], part, a.d16[b]);
                    }
                }
                row_scale = std::array::from_fn(|i| scale[r0 + i]);
            }
            QWeights::Q4 { .. } | QWeights::Q8B { .. } => {
                unreachable!("Q4 and Q8B rows run in their own kernels")
            }
        }
        std::array::from_fn(|i| {
            let even = _mm512_castps512_ps256(acc[i]);
            let odd = _mm512_extractf32x8_ps::<1>(acc[i]);
            finish_simd(even, odd, offs[i], row_scale[i])
        })
    }

    /// Defines the Q4 row kernel of a decode step: `R` consecutive rows from `r0` against one
    /// activation row, a pair of blocks per step. Per pair and row it is one load that fills both
    /// halves of a register with the pair's 32 bytes of nibbles, a shift of the upper half and a mask
    /// (low nibbles below, high nibbles above: no byte shuffles, because the activations were
    /// regrouped to match, see [`QActs::q8_pairs`]), the integer product (`vpdpbusd` with VNNI, else
    /// `vpmaddubsw` + `vpmaddwd`), and one multiply-add with the pair's scales. A register's lanes
    /// hold the even block's accumulators in 0..4 and 8..12 and the odd block's in 4..8 and 12..16;
    /// `finish` puts them back in the canonical order, in which every lane sees the same operations
    /// as on the portable path. A macro, so the VNNI variant is compiled with VNNI enabled.
    macro_rules! q4_rows_kernel {
        ($(#[$attr:meta])* $name:ident, $features:literal, $vnni:literal) => {
            $(#[$attr])*
            #[target_feature(enable = $features)]
            pub unsafe fn $name<const R: usize>(m: &QMatrix, r0: usize, a: &QActs) -> [f32; R] {
                const VNNI: bool = $vnni;
                let QWeights::Q4 { nibbles, d, m: mw } = &m.w else {
                    unreachable!("the Q4 kernel takes Q4 weights")
                };
                let k = m.k;
                let bpr = k / BLOCK;
                let pairs = bpr / 2;
                prefetch_rows(m, r0 + PREFETCH_ROWS, R);
                let nib: [*const u8; R] = std::array::from_fn(|i| nibbles.as_ptr().add((r0 + i) * k / 2));
                let dw: [*const f16; R] = std::array::from_fn(|i| d.as_ptr().add((r0 + i) * bpr));
                let x = a.q8_pairs.as_ptr();
                // the upper 256 bits take the high nibbles
                let shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
                let low = _mm512_set1_epi8(0x0F);
                // a macro, not a closure: closures do not inherit the function's target features, and
                // one here stayed an out-of-line call per product
                macro_rules! product {
                    ($w:expr, $xv:expr) => {
                        if VNNI {
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), $w, $xv)
                        } else {
                            dot4($w, $xv)
                        }
                    };
                }
                let mut acc = [_mm512_setzero_ps(); R];
                // lane l of pair q's scales: block 2q + (l / 4) % 2
                let spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
                for g in 0..pairs.div_ceil(LANES) {
                    let scales = group_scales(&dw, a.d8.as_ptr(), g);
                    for q in 0..LANES.min(pairs - g * LANES) {
                        let p = g * LANES + q;
                        let idx = _mm512_add_epi32(spread, _mm512_set1_epi32(2 * q as i32));
                        let xv = _mm512_loadu_si512(x.add(p * 2 * BLOCK) as *const __m512i);
                        for i in 0..R {
                            let raw = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                nib[i].add(p * BLOCK) as *const __m256i,
                            ));
                            let w = _mm512_and_si512(_mm512_srlv_epi64(raw, shift), low);
                            let part = _mm512_cvtepi32_ps(product!(w, xv));
                            acc[i] = _mm512_fmadd_ps(part, _mm512_permutexvar_ps(idx, scales[i]), acc[i]);
                        }
                    }
                }
                if bpr % 2 == 1 {
                    // the lone last block in the even lanes; its partner's activations are zeros
                    let b = bpr - 1;
                    let xv = _mm512_loadu_si512(x.add(pairs * 2 * BLOCK) as *const __m512i);
                    for i in 0..R {
                        let raw = _mm512_broadcast_i32x4(_mm_loadu_si128(
                            nib[i].add(b * BLOCK / 2) as *const __m128i,
                        ));
                        let w = _mm512_and_si512(_mm512_srlv_epi64(raw, shift), low);
                        let part = _mm512_cvtepi32_ps(product!(w, xv));
                        let s = f32_of(*dw[i].add(b)) * a.d8[b];
                        acc[i] = _mm512_mask3_fmadd_ps(part, _mm512_set1_ps(s), acc[i], 0x0F0F);
                    }
                }
                let canonical = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
                let mut out = [0f32; R];
                for i in 0..R {
                    let offs = offsets(mw[(r0 + i) * bpr..].as_ptr(), a.dsum8.as_ptr(), bpr);
                    let v = _mm512_permutexvar_ps(canonical, acc[i]);
                    let even = _mm512_castps512_ps256(v);
                    let odd = _mm512_extractf32x8_ps::<1>(v);
                    out[i] = finish_simd(even, odd, offs, 1.0);
                }
                out
            }
        };
    }

    /// Defines the Q8B row kernel of a decode step (the output projection under int8 and int4): `R`
    /// rows from `r0` against one int8 activation row, a pair of blocks (64 bytes of weights, in
    /// their stored order) per step, lanes in the canonical order as they come. With VNNI, the
    /// weights are offset to unsigned (`w ^ 0x80` is `w + 128`) for `vpdpbusd`, whose sum starts from
    /// [`QActs::unsigned_fix`] so that the offset cancels exactly; without, `vpmaddubsw` takes |w|
    /// and x with w's sign.
    macro_rules! q8b_rows_kernel {
        ($(#[$attr:meta])* $name:ident, $features:literal, $vnni:literal) => {
            $(#[$attr])*
            #[target_feature(enable = $features)]
            pub unsafe fn $name<const R: usize>(m: &QMatrix, r0: usize, a: &QActs) -> [f32; R] {
                const VNNI: bool = $vnni;
                let QWeights::Q8B { q, d } = &m.w else {
                    unreachable!("the Q8B kernel takes Q8B weights")
                };
                let k = m.k;
                let bpr = k / BLOCK;
                let pairs = bpr / 2;
                prefetch_rows(m, r0 + PREFETCH_ROWS, R);
                let w: [*const i8; R] = std::array::from_fn(|i| q.as_ptr().add((r0 + i) * k));
                let dw: [*const f16; R] = std::array::from_fn(|i| d.as_ptr().add((r0 + i) * bpr));
                let (x, fix) = (a.q8.as_ptr(), a.unsigned_fix.as_ptr());
                let offset = _mm512_set1_epi8(-128);
                let mut acc = [_mm512_setzero_ps(); R];
                let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
                for g in 0..pairs.div_ceil(LANES) {
                    let scales = group_scales(&dw, a.d8.as_ptr(), g);
                    for q in 0..LANES.min(pairs - g * LANES) {
                        let p = g * LANES + q;
                        let idx = _mm512_add_epi32(spread, _mm512_set1_epi32(2 * q as i32));
                        let xv = _mm512_loadu_si512(x.add(p * 2 * BLOCK) as *const __m512i);
                        let fv = _mm512_loadu_si512(fix.add(p * 2 * LANES) as *const __m512i);
                        for i in 0..R {
                            let wv = _mm512_loadu_si512(w[i].add(p * 2 * BLOCK) as *const __m512i);
                            let part = if VNNI {
                                _mm512_dpbusd_epi32(fv, _mm512_xor_si512(wv, offset), xv)
                            } else {
                                let negative = _mm512_movepi8_mask(wv);
                                let signed_x = _mm512_mask_sub_epi8(xv, negative, _mm512_setzero_si512(), xv);
                                _mm512_madd_epi16(
                                    _mm512_maddubs_epi16(_mm512_abs_epi8(wv), signed_x),
                                    _mm512_set1_epi16(1),
                                )
                            };
                            let part = _mm512_cvtepi32_ps(part);
                            acc[i] = _mm512_fmadd_ps(part, _mm512_permutexvar_ps(idx, scales[i]), acc[i]);
                        }
                    }
                }
                if bpr % 2 == 1 {
                    let b = bpr - 1;
                    for i in 0..R {
                        let part = block8(w[i].add(b * BLOCK), x.add(b * BLOCK));
                        acc[i] = add_last(acc[i], part, f32_of(*dw[i].add(b)) * a.d8[b]);
                    }
                }
                let mut out = [0f32; R];
                for i in 0..R {
                    let even = _mm512_castps512_ps256(acc[i]);
                    let odd = _mm512_extractf32x8_ps::<1>(acc[i]);
                    out[i] = finish_simd(even, odd, _mm256_setzero_ps(), 1.0);
                }
                out
            }
        };
    }

    q8b_rows_kernel!(
        q8b_rows_avx512,
        "avx512f,avx512bw,avx512dq,avx2,f16c,fma",
        false
    );
    q8b_rows_kernel!(
        /// With VNNI's `vpdpbusd`.
        q8b_rows_avx512_vnni,
        "avx512f,avx512bw,avx512dq,avx2,f16c,fma,avx512vnni",
        true
    );

    q4_rows_kernel!(
        q4_rows_avx512,
        "avx512f,avx512bw,avx512dq,avx2,f16c,fma",
        false
    );
    q4_rows_kernel!(
        /// With VNNI's `vpdpbusd`: the same integers in one instruction, not two.
        q4_rows_avx512_vnni,
        "avx512f,avx512bw,avx512dq,avx2,f16c,fma,avx512vnni",
        true
    );

    /// Defines a prefill tile kernel: rows `r0..r0 + R` against `C` activation rows at once. Each pair
    /// of weight blocks is expanded once for all `C` tokens and each activation pair loaded once for
    /// all `R` rows. Every (row, token) follows the canonical order, so each result equals
    /// [`rows_dot_avx512`]'s. A macro, so that the VNNI variant's body (and its closures) is compiled
    /// with VNNI enabled and the other without.
    macro_rules! tile_kernel {
        ($(#[$attr:meta])* $name:ident, $features:literal, $vnni:literal) => {
            $(#[$attr])*
            #[target_feature(enable = $features)]
            pub unsafe fn $name<const R: usize, const C: usize>(
                m: &QMatrix,
                r0: usize,
                acts: [&QActs; C],
            ) -> [[f32; R]; C] {
                const VNNI: bool = $vnni;
        let k = m.k;
        let bpr = k / BLOCK;
        let pairs = bpr / 2;
        let lone = bpr % 2 == 1;
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut offs = [[_mm256_setzero_ps(); C]; R];
        let mut row_scale = [1f32; R];
        let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        // the (row, token) block scales of pair p: weight scale × activation scale, or the
        // activation's alone where the weight scale is per row (applied at the end)
        let scaled = |sw: Option<__m512>, sx: __m512| match sw {
            Some(w) => _mm512_mul_ps(w, sx),
            None => sx,
        };
        match &m.w {
                    QWeights::BF16 { .. } => unreachable!("bf16 weights take no tiles"),
            QWeights::Q4 { nibbles, d, m: mw } => {
                let nib: [*const u8; R] =
                    std::array::from_fn(|i| nibbles[(r0 + i) * k / 2..].as_ptr());
                let dw: [*const f16; R] = std::array::from_fn(|i| d[(r0 + i) * bpr..].as_ptr());
                for g in 0..pairs.div_ceil(LANES) {
                    let sw: [__m512; R] = std::array::from_fn(|i| f16x16(dw[i].add(g * 2 * LANES)));
                    let sx: [__m512; C] = std::array::from_fn(|t| {
                        _mm512_loadu_ps(acts[t].d8.as_ptr().add(g * 2 * LANES))
                    });
                    for q in 0..LANES.min(pairs - g * LANES) {
                        let b = 2 * (g * LANES + q);
                        let idx = _mm512_add_epi32(spread, _mm512_set1_epi32(2 * q as i32));
                        let xv: [__m512i; C] = std::array::from_fn(|t| {
                            _mm512_loadu_si512(acts[t].q8.as_ptr().add(b * BLOCK) as *const __m512i)
                        });
                        let sxp: [__m512; C] =
                            std::array::from_fn(|t| _mm512_permutexvar_ps(idx, sx[t]));
                        for i in 0..R {
                            let w = expand4(nib[i].add(b * BLOCK / 2));
                            let swp = Some(_mm512_permutexvar_ps(idx, sw[i]));
                            for t in 0..C {
                                let part = if VNNI {
                                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xv[t])
                                } else {
                                    dot4(w, xv[t])
                                };
                                acc[i][t] = add_pair_scaled(acc[i][t], part, scaled(swp, sxp[t]));
                            }
                        }
                    }
                }
                for i in 0..R {
                    for t in 0..C {
                        if lone {
                            let b = bpr - 1;
                            let part = block4(
                                nib[i].add(b * BLOCK / 2),
                                acts[t].q8.as_ptr().add(b * BLOCK),
                            );
                            let s = f32_of(d[(r0 + i) * bpr + b]) * acts[t].d8[b];
                            acc[i][t] = add_last(acc[i][t], part, s);
                        }
                        offs[i][t] =
                            offsets(mw[(r0 + i) * bpr..].as_ptr(), acts[t].dsum8.as_ptr(), bpr);
                    }
                }
            }
            QWeights::Q8B { .. } => unreachable!("Q8B weights take no tiles"),
            QWeights::Q8 { q, scale } => {
                // the per-row scale is applied at the end
                let (dw, per_row): ([*const f16; R], Option<&[f32]>) =
                    ([std::ptr::null(); R], Some(scale));
                let w: [*const i8; R] = std::array::from_fn(|i| q[(r0 + i) * k..].as_ptr());
                for g in 0..pairs.div_ceil(LANES) {
                    let sw: [Option<__m512>; R] = std::array::from_fn(|i| {
                        per_row
                            .is_none()
                            .then(|| f16x16(dw[i].add(g * 2 * LANES)))
                    });
                    let sx: [__m512; C] = std::array::from_fn(|t| {
                        _mm512_loadu_ps(acts[t].d16.as_ptr().add(g * 2 * LANES))
                    });
                    for q in 0..LANES.min(pairs - g * LANES) {
                        let b = 2 * (g * LANES + q);
                        let idx = _mm512_add_epi32(spread, _mm512_set1_epi32(2 * q as i32));
                        let sxp: [__m512; C] =
                            std::array::from_fn(|t| _mm512_permutexvar_ps(idx, sx[t]));
                        for i in 0..R {
                            let w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                                w[i].add(b * BLOCK) as *const __m256i
                            ));
                            let w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                                w[i].add((b + 1) * BLOCK) as *const __m256i,
                            ));
                            let swp = sw[i].map(|v| _mm512_permutexvar_ps(idx, v));
                            for t in 0..C {
                                let x = acts[t].q16.as_ptr().add(b * BLOCK);
                                let p0 =
                                    _mm512_madd_epi16(w0, _mm512_loadu_si512(x as *const __m512i));
                                let p1 = _mm512_madd_epi16(
                                    w1,
                                    _mm512_loadu_si512(x.add(BLOCK) as *const __m512i),
                                );
                                let part = _mm512_add_epi32(
                                    _mm512_shuffle_i64x2::<0b01_00_01_00>(p0, p1),
                                    _mm512_shuffle_i64x2::<0b11_10_11_10>(p0, p1),
                                );
                                acc[i][t] = add_pair_scaled(acc[i][t], part, scaled(swp, sxp[t]));
                            }
                        }
                    }
                }
                for i in 0..R {
                    for t in 0..C {
                        if lone {
                            let b = bpr - 1;
                            let part =
                                block16(w[i].add(b * BLOCK), acts[t].q16.as_ptr().add(b * BLOCK));
                            let s = match per_row {
                                Some(_) => acts[t].d16[b],
                                None => f32_of(*dw[i].add(b)) * acts[t].d16[b],
                            };
                            acc[i][t] = add_last(acc[i][t], part, s);
                        }
                    }
                }
                if let Some(scale) = per_row {
                    row_scale = std::array::from_fn(|i| scale[r0 + i]);
                }
            }
        }
        std::array::from_fn(|t| {
            std::array::from_fn(|i| {
                let even = _mm512_castps512_ps256(acc[i][t]);
                let odd = _mm512_extractf32x8_ps::<1>(acc[i][t]);
                finish_simd(even, odd, offs[i][t], row_scale[i])
            })
        })
                }
        };
    }

    tile_kernel!(
        tile_avx512,
        "avx512f,avx512bw,avx512dq,avx2,f16c,fma",
        false
    );
    tile_kernel!(
        /// With VNNI's `vpdpbusd` for the Q4 products: the same integers in one instruction, not two.
        tile_avx512_vnni,
        "avx512f,avx512bw,avx512dq,avx2,f16c,fma,avx512vnni",
        true
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{centered as data, uniform};

    #[test]
    fn q4_1_blocks_load_as_the_quantizer_would_write_them() {
        let (n, k) = (5, 96);
        let w = data(n * k, 11);
        let q = QMatrix::quantize_q4(&w, n, k);
        let QWeights::Q4 { nibbles, d, m } = &q.w else {
            unreachable!()
        };
        // the same weights as GGUF would store them: d, m, then the nibbles, block after block
        let raw: Vec<u8> = (0..n * k / BLOCK)
            .flat_map(|b| {
                let mut block = d[b].to_le_bytes().to_vec();
                block.extend(m[b].to_le_bytes());
                block.extend(&nibbles[b * BLOCK / 2..][..BLOCK / 2]);
                block
            })
            .collect();
        let loaded = QMatrix::from_q4_1(&raw, n, k);
        let (mut want, mut got) = (vec![0f32; n * k], vec![0f32; n * k]);
        qprefill::dequantize_rows(&q, 0..n, &mut want);
        qprefill::dequantize_rows(&loaded, 0..n, &mut got);
        assert_eq!(want, got);
        assert_eq!(loaded.nbytes(), q.nbytes());
    }

    #[test]
    fn round_away_is_std_round_bit_for_bit() {
        let mut cases = vec![
            0.0f32,
            -0.0,
            0.5,
            -0.5,
            1.5,
            -2.5,
            0.499_999_97,
            -0.499_999_97,
            8_388_607.5,
            16_777_216.0,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        cases.extend(uniform(20_000, 5).map(|u| ((u - 0.5) * 300.0) as f32));
        cases.extend((0..2000).map(|i| i as f32 * 0.25 - 250.0));
        for x in cases {
            assert_eq!(round_away(x).to_bits(), x.round().to_bits(), "{x}");
        }
        assert!(round_away(f32::NAN).is_nan());
    }

    #[test]
    fn every_format_matches_the_portable_path_bit_for_bit_and_fp32_closely() {
        // rows of 1, 2, 3, 18 and 19 blocks: no pair, pairs only, a lone last block, offsets past
        // one and two groups of eight
        for k in [32, 64, 96, 576, 608] {
            let (n, rows) = (70, 5);
            let mut w = data(n * k, k as u64);
            if k >= 96 {
                w[5] = 3.0; // an outlier: the clipped per-row scale must still round it sensibly
            }
            let x = data(rows * k, 2);
            let exact: Vec<f32> = (0..rows * n)
                .map(|i| {
                    let (t, r) = (i / n, i % n);
                    (0..k).map(|kk| x[t * k + kk] * w[r * k + kk]).sum()
                })
                .collect();
            for (m, tol) in [
                (QMatrix::quantize_q8(&w, n, k), 0.02),
                (QMatrix::quantize_q8_blocks(&w, n, k), 0.03),
                (QMatrix::quantize_q4(&w, n, k), 0.12),
                (QMatrix::quantize_bf16(&w, n, k), 0.005),
            ] {
                let mut portable = vec![0f32; rows * n];
                m.matmul_with(&x, rows, &mut portable, Isa::Portable);
                let mut fast = portable.clone();
                for isa in Isa::available() {
                    m.matmul_with(&x, rows, &mut fast, isa);
                    assert_eq!(
                        fast, portable,
                        "k={k}: {isa:?} differs from the portable path"
                    );
                }
                let scale = exact.iter().fold(0f32, |a, v| a.max(v.abs()));
                for (g, e) in fast.iter().zip(&exact) {
                    assert!((g - e).abs() <= tol * scale, "k={k}: {g} vs {e}");
                }
            }
        }
    }

    #[test]
    fn a_few_tokens_give_each_row_what_one_token_gives() {
        // rows enough for several cache blocks per task, and 1..8 tokens (tiles of four and the rest)
        let (n, k) = (300, 576);
        let w = data(n * k, 21);
        let x = data(7 * k, 22);
        for m in [
            QMatrix::quantize_q8(&w, n, k),
            QMatrix::quantize_q8_blocks(&w, n, k),
            QMatrix::quantize_q4(&w, n, k),
            QMatrix::quantize_bf16(&w, n, k),
        ] {
            assert!(m.row_bytes() * n > 2 * crate::kernels::row_blocks::BLOCK_BYTES);
            for isa in Isa::available() {
                let alone: Vec<f32> = x
                    .chunks_exact(k)
                    .flat_map(|row| {
                        let mut out = vec![0f32; n];
                        m.matmul_with(row, 1, &mut out, isa);
                        out
                    })
                    .collect();
                for tokens in 2..=7 {
                    let mut out = vec![0f32; tokens * n];
                    m.matmul_with(&x[..tokens * k], tokens, &mut out, isa);
                    assert_eq!(out, alone[..tokens * n], "{isa:?}, {tokens} tokens");
                }
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
        assert_eq!((d[0].to_f32(), mins[0].to_f32()), (0.25, -1.5));
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
