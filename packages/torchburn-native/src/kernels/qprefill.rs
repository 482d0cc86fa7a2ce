//! Products of quantized weights with many tokens at once (an LLM's prefill). GGUF's K-quants take
//! their own integer tiles (`ggml::kprefill`), and matrices regrouped for the x86 kernels the same
//! f32 arithmetic straight from their groups (`ggml::prompt_interleaved`); everything else comes here.
//!
//! One token against the weights (decode) is bound by reading them, so those kernels keep the weights
//! packed and quantize the activations to integers. Many tokens against the same rows are bound by
//! arithmetic instead; for the types here, f32 FMAs on dequantized rows (exact activations) run them.
//! The tokens are transposed once per product (k-major, so one k holds 16 tokens side by side in a
//! vector); each task dequantizes its
//! rows into f32 a group at a time, into L1, and multiplies the group with every token: per k, each
//! row's weight broadcast times two vectors of tokens, into accumulators that stay in registers (the
//! micro-kernel of a packed GEMM).
//!
//! Each (row, token) sums its products by fused multiply-adds in order of k. The dequantized values
//! are the same on every path (a multiply, or a multiply and an add, each rounded once), so every ISA
//! gives bit-identical results.

use std::ops::Range;

use torchburn_native_macros::isa_versions;

use half::f16;

#[cfg(target_arch = "x86_64")]
use super::ggml::{interleaved::Interleaved, prompt_interleaved};
use super::ggml::{kprefill, GgmlMatrix};
use super::quant::{QMatrix, QWeights, BLOCK};
use crate::threads;

/// A weight matrix this path can multiply: its shape, and rows dequantized to f32 on request.
pub trait RowSource: Sync {
    /// `(n, k)`
    fn shape(&self) -> (usize, usize);
    /// Rows `rows` as f32 into `out` (`rows.len() · k` values).
    fn rows_f32(&self, rows: Range<usize>, out: &mut [f32]);
    /// The matrix as GGUF blocks, where it is one (the K-quants multiply in integers instead).
    fn as_ggml(&self) -> Option<&GgmlMatrix> {
        None
    }
}

impl RowSource for QMatrix {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }
    fn rows_f32(&self, rows: Range<usize>, out: &mut [f32]) {
        dequantize_rows(self, rows, out)
    }
}

impl RowSource for GgmlMatrix {
    fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }
    fn rows_f32(&self, rows: Range<usize>, out: &mut [f32]) {
        self.dequantize_rows(rows, out)
    }
    fn as_ggml(&self) -> Option<&GgmlMatrix> {
        Some(self)
    }
}

/// From this many tokens on, [`QMatrix::matmul`] takes this path: below it the dequantizing costs more
/// than the faster products save.
pub const MIN_TOKENS: usize = 8;
/// Rows dequantized and multiplied together: 12 rows × 2 vectors of tokens are 24 accumulators,
/// which with the two token vectors and a broadcast fill 27 of AVX-512's 32 registers.
const GROUP: usize = 12;
/// Tokens per vector.
const LANES: usize = 16;
/// Elements of k per pass over the tokens: a group's 12 rows of it take 24 KiB of L1, 32 tokens 64 KiB
/// of L2, however long the rows (the x86 tiles' slicing; other targets take the portable loop).
#[cfg(target_arch = "x86_64")]
const K_SLICE: usize = 512;

/// Products of the same tokens with several matrices of one width (q, k and v; gate and up): the
/// tokens are transposed once and every matrix's row groups share one parallel job.
/// `outs[i][t·n_i + r] = Σ_k x[t·k + kk] · W_i[r, kk]`. Below [`MIN_TOKENS`] each product takes the
/// decode kernels, as [`QMatrix::matmul`] would.
pub fn matmul_many(ms: &[&QMatrix], x: &[f32], tokens: usize, outs: &mut [&mut [f32]]) {
    assert_eq!(ms.len(), outs.len(), "one output per matrix");
    if tokens < MIN_TOKENS {
        for (m, out) in ms.iter().zip(outs.iter_mut()) {
            m.matmul(x, tokens, out);
        }
        return;
    }
    let sources: Vec<&dyn RowSource> = ms.iter().map(|&m| m as &dyn RowSource).collect();
    matmul_many_on(&sources, x, tokens, outs, true)
}

/// [`matmul_many`] over any matrices this path takes, from [`MIN_TOKENS`] tokens on (the caller
/// takes the decode kernels below that).
pub fn matmul_sources(ms: &[&dyn RowSource], x: &[f32], tokens: usize, outs: &mut [&mut [f32]]) {
    assert_eq!(ms.len(), outs.len(), "one output per matrix");
    matmul_many_on(ms, x, tokens, outs, true)
}

/// `out[t·n + r] = Σ_k x[t·k + kk] · W[r, kk]` for `t` in `0..tokens`, over the thread pool, on the
/// SIMD micro-kernel where the CPU has it (`simd`) or the portable code.
pub(crate) fn matmul_on(m: &dyn RowSource, x: &[f32], tokens: usize, out: &mut [f32], simd: bool) {
    matmul_many_on(&[m], x, tokens, &mut [out], simd)
}

fn matmul_many_on(
    ms: &[&dyn RowSource],
    x: &[f32],
    tokens: usize,
    outs: &mut [&mut [f32]],
    simd: bool,
) {
    let k = ms.first().map_or(0, |m| m.shape().1);
    assert!(
        ms.iter().all(|m| m.shape().1 == k),
        "the matrices must share their width"
    );
    assert_eq!(x.len(), tokens * k, "input length");
    for (m, out) in ms.iter().zip(outs.iter()) {
        assert_eq!(out.len(), tokens * m.shape().0, "output length");
    }
    // the K-quants take their integer tiles (see `ggml::kprefill`), whatever they are grouped with
    let on_k_tiles = |gs: &[&GgmlMatrix], outs: &mut [&mut [f32]]| {
        kprefill::matmul_many_on(gs, x, tokens, outs, simd)
    };
    if route(ms, x, tokens, outs, simd, k_quant, on_k_tiles) {
        return;
    }
    // regrouped matrices take their own kernels, which give the tiles' sums bit for bit without
    // gathering rows out of the groups (see `ggml::prompt_interleaved`)
    #[cfg(target_arch = "x86_64")]
    if simd {
        let on_groups = |rs: &[&Interleaved], outs: &mut [&mut [f32]]| {
            prompt_interleaved::matmul_many(rs, x, tokens, outs)
        };
        if route(ms, x, tokens, outs, simd, regrouped, on_groups) {
            return;
        }
    }
    // xt[kk·stride + t] = x[t·k + kk], tokens padded with zeros to whole vectors
    let stride = tokens.next_multiple_of(LANES);
    let mut xt = vec![0f32; k * stride];
    let xt_ptr = threads::SendPtr(xt.as_mut_ptr());
    threads::par_ranges(k, 64, |lo, hi| {
        let xt = xt_ptr;
        // in tiles of 16 tokens: each row of xt is then written a cache line at a time, where a
        // token at a time writes one float to each of `hi - lo` lines
        for t0 in (0..tokens).step_by(LANES) {
            let rows = &x[t0 * k..(t0 + LANES).min(tokens) * k];
            for kk in lo..hi {
                // SAFETY: this task alone writes rows lo..hi of xt
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(xt.get().add(kk * stride + t0), LANES)
                };
                for (d, row) in dst.iter_mut().zip(rows.chunks_exact(k)) {
                    *d = row[kk];
                }
            }
        }
    });
    let xt = &xt;
    // the row groups of every matrix, numbered one after another: matrix i has firsts[i]..firsts[i + 1]
    let mut firsts = vec![0];
    for m in ms {
        firsts.push(firsts[firsts.len() - 1] + m.shape().0.div_ceil(GROUP));
    }
    let groups = firsts[ms.len()];
    let out_ptrs: Vec<threads::SendPtr<f32>> = outs
        .iter_mut()
        .map(|o| threads::SendPtr(o.as_mut_ptr()))
        .collect();
    threads::par_ranges(groups, 1, |lo, hi| {
        let mut rows_f32 = vec![0f32; GROUP * k];
        for g in lo..hi {
            let i = firsts.partition_point(|&f| f <= g) - 1;
            let (m, out) = (ms[i], out_ptrs[i]);
            let n = m.shape().0;
            let r0 = (g - firsts[i]) * GROUP;
            let rows = GROUP.min(n - r0);
            let w = &mut rows_f32[..rows * k];
            m.rows_f32(r0..r0 + rows, w);
            // SAFETY: this task alone writes columns r0..r0 + rows of every token's output row of
            // matrix i
            unsafe { group_product(w, rows, k, xt, stride, tokens, out.get().add(r0), n, simd) };
        }
    });
}

/// Where `pick` takes any of `ms` (as what it returns), runs those through `run` and the rest
/// through this path (recursively: the rest may go elsewhere again), and says so.
fn route<'m, T>(
    ms: &[&'m dyn RowSource],
    x: &[f32],
    tokens: usize,
    outs: &mut [&mut [f32]],
    simd: bool,
    pick: impl Fn(&'m dyn RowSource) -> Option<T>,
    run: impl FnOnce(&[T], &mut [&mut [f32]]),
) -> bool {
    if !ms.iter().any(|&m| pick(m).is_some()) {
        return false;
    }
    let (mut picked, mut picked_outs, mut rest, mut rest_outs) = (vec![], vec![], vec![], vec![]);
    for (&m, out) in ms.iter().zip(outs.iter_mut()) {
        match pick(m) {
            Some(p) => {
                picked.push(p);
                picked_outs.push(&mut **out);
            }
            None => {
                rest.push(m);
                rest_outs.push(&mut **out);
            }
        }
    }
    run(&picked, &mut picked_outs);
    if !rest.is_empty() {
        matmul_many_on(&rest, x, tokens, &mut rest_outs, simd);
    }
    true
}

/// `m`'s regrouped weights, where the running level's prompt kernels take them.
#[cfg(target_arch = "x86_64")]
fn regrouped(m: &dyn RowSource) -> Option<&Interleaved> {
    m.as_ggml()
        .and_then(|g| g.interleaved())
        .filter(|r| prompt_interleaved::takes(r.kind))
}

/// `m` as a K-quant matrix, which takes the integer tiles of `ggml::kprefill`.
fn k_quant(m: &dyn RowSource) -> Option<&GgmlMatrix> {
    m.as_ggml().filter(|g| kprefill::takes(g.kind))
}

/// Rows `rows` of the weights as f32 into `out` (`rows.len() · k` values).
#[isa_versions]
pub fn dequantize_rows(m: &QMatrix, rows: Range<usize>, out: &mut [f32]) {
    let k = m.k;
    let bpr = k / BLOCK;
    assert_eq!(out.len(), rows.len() * k, "output length");
    for (i, r) in rows.enumerate() {
        let dst = &mut out[i * k..(i + 1) * k];
        match &m.w {
            QWeights::Q8 { q, scale } => {
                let s = scale[r];
                for (o, &v) in dst.iter_mut().zip(&q[r * k..(r + 1) * k]) {
                    *o = v as f32 * s;
                }
            }
            QWeights::Q8B { q, d } => {
                for (b, (o, v)) in dst
                    .chunks_exact_mut(BLOCK)
                    .zip(q[r * k..(r + 1) * k].chunks_exact(BLOCK))
                    .enumerate()
                {
                    let s = d[r * bpr + b].to_f32();
                    for (o, &v) in o.iter_mut().zip(v) {
                        *o = v as f32 * s;
                    }
                }
            }
            QWeights::Q4 {
                nibbles,
                d,
                m: mins,
            } => {
                let nb = &nibbles[r * k / 2..(r + 1) * k / 2];
                #[cfg(target_arch = "x86_64")]
                if crate::isa::avx512() {
                    let (d, mins) = (&d[r * bpr..(r + 1) * bpr], &mins[r * bpr..(r + 1) * bpr]);
                    // SAFETY: the CPU has AVX-512F and F16C
                    unsafe { x86::dequantize_q4_row(nb, d, mins, dst) };
                    continue;
                }
                let (d, mins) = (&d[r * bpr..(r + 1) * bpr], &mins[r * bpr..(r + 1) * bpr]);
                dequantize_q4_row(nb, d, mins, dst);
            }
            QWeights::BF16 { w } => {
                for (o, v) in dst.iter_mut().zip(&w[r * k..(r + 1) * k]) {
                    *o = v.to_f32();
                }
            }
        }
    }
}

/// One Q4 row as f32: `q · d + m`, a multiply and an add, each rounded.
#[inline(always)]
fn dequantize_q4_row(nibbles: &[u8], d: &[f16], mins: &[f16], out: &mut [f32]) {
    for (b, (o, q)) in out
        .chunks_exact_mut(BLOCK)
        .zip(nibbles.chunks_exact(BLOCK / 2))
        .enumerate()
    {
        let (s, lo) = (d[b].to_f32(), mins[b].to_f32());
        for (j, &byte) in q.iter().enumerate() {
            o[j] = (byte & 0x0F) as f32 * s + lo;
            o[j + BLOCK / 2] = (byte >> 4) as f32 * s + lo;
        }
    }
}

/// `out[t·ld + i] = Σ_kk w[i·k + kk] · xt[kk·stride + t]` for the group's `rows` rows and every token.
///
/// # Safety
/// `out` must be valid for writes at `t·ld + i` for every token `t` and `i < rows`.
#[allow(clippy::too_many_arguments)]
unsafe fn group_product(
    w: &[f32],
    rows: usize,
    k: usize,
    xt: &[f32],
    stride: usize,
    tokens: usize,
    out: *mut f32,
    ld: usize,
    simd: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if simd && crate::isa::avx512() {
        // SAFETY: the CPU has AVX-512F and FMA
        return x86::group_product_avx512(w, rows, k, xt, stride, tokens, out, ld);
    }
    #[cfg(target_arch = "x86_64")]
    if simd && crate::isa::avx2() {
        // SAFETY: the CPU has AVX2 and FMA (the level includes them)
        return x86::group_product_avx2(w, rows, k, xt, stride, tokens, out, ld);
    }
    let _ = simd;
    group_product_portable(w, rows, k, xt, stride, tokens, out, ld)
}

/// [`group_product`] in plain Rust: the same fused multiply-adds in the same order.
#[allow(clippy::too_many_arguments)]
#[isa_versions]
unsafe fn group_product_portable(
    w: &[f32],
    rows: usize,
    k: usize,
    xt: &[f32],
    stride: usize,
    tokens: usize,
    out: *mut f32,
    ld: usize,
) {
    let mut acc = vec![0f32; stride];
    for i in 0..rows {
        acc.fill(0.0);
        for (kk, &wv) in w[i * k..(i + 1) * k].iter().enumerate() {
            for (a, &xv) in acc.iter_mut().zip(&xt[kk * stride..(kk + 1) * stride]) {
                *a = wv.mul_add(xv, *a);
            }
        }
        for (t, &v) in acc.iter().enumerate().take(tokens) {
            *out.add(t * ld + i) = v;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{BLOCK, GROUP, K_SLICE, LANES};
    use half::f16;
    use std::arch::x86_64::*;
    use std::ops::Range;

    /// One Q4 row as f32, a block per step: the same multiply and add as the portable loop.
    #[target_feature(enable = "avx512f,f16c")]
    pub unsafe fn dequantize_q4_row(nibbles: &[u8], d: &[f16], mins: &[f16], out: &mut [f32]) {
        assert!(
            nibbles.len() * 2 == out.len() && d.len() * BLOCK == out.len() && mins.len() == d.len()
        );
        let low = _mm_set1_epi8(0x0F);
        for (b, (&s, &m)) in d.iter().zip(mins).enumerate() {
            let bytes = _mm_loadu_si128(nibbles.as_ptr().add(b * BLOCK / 2) as *const __m128i);
            let lo = _mm_and_si128(bytes, low);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(bytes), low);
            let scale = _mm512_set1_ps(s.to_f32());
            let min = _mm512_set1_ps(m.to_f32());
            let value = |q: __m128i| {
                let q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q));
                _mm512_add_ps(_mm512_mul_ps(q, scale), min)
            };
            _mm512_storeu_ps(out.as_mut_ptr().add(b * BLOCK), value(lo));
            _mm512_storeu_ps(out.as_mut_ptr().add(b * BLOCK + LANES), value(hi));
        }
    }

    /// Rows `i0..i0 + R` × tokens `t0..t0 + 16·V`: one accumulator per row and vector of tokens.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const V: usize>(
        w: &[f32],
        i0: usize,
        k: usize,
        xt: &[f32],
        stride: usize,
        t0: usize,
        ks: Range<usize>,
        out_t: &mut [f32],
    ) {
        let ws: [*const f32; R] = std::array::from_fn(|i| w.as_ptr().add((i0 + i) * k));
        let at = |i: usize, v: usize| (i0 + i) * stride + t0 + v * LANES;
        // the sums so far (exactly as stored) continue where the previous slice of k left them
        let mut acc: [[__m512; V]; R] = if ks.start == 0 {
            [[_mm512_setzero_ps(); V]; R]
        } else {
            std::array::from_fn(|i| {
                std::array::from_fn(|v| _mm512_loadu_ps(out_t.as_ptr().add(at(i, v))))
            })
        };
        let mut x = xt.as_ptr().add(ks.start * stride + t0);
        for kk in ks {
            let xv: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(x.add(v * LANES)));
            for i in 0..R {
                let wv = _mm512_set1_ps(*ws[i].add(kk));
                for v in 0..V {
                    acc[i][v] = _mm512_fmadd_ps(wv, xv[v], acc[i][v]);
                }
            }
            x = x.add(stride);
        }
        // each accumulator holds one row for 16 tokens: into the group's transposed result
        for (i, row) in acc.iter().enumerate() {
            for (v, a) in row.iter().enumerate() {
                _mm512_storeu_ps(out_t.as_mut_ptr().add(at(i, v)), *a);
            }
        }
    }

    /// [`super::group_product`] on AVX-512: 32 tokens at a time, then 16 (the last padded with zeros).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,fma")]
    pub unsafe fn group_product_avx512(
        w: &[f32],
        rows: usize,
        k: usize,
        xt: &[f32],
        stride: usize,
        tokens: usize,
        out: *mut f32,
        ld: usize,
    ) {
        let mut out_t = vec![0f32; rows * stride];
        let out_t = &mut out_t[..];
        // slices of k whose rows and tokens stay in L1 and L2 while every token tile passes
        for k0 in (0..k).step_by(K_SLICE) {
            let ks = k0..(k0 + K_SLICE).min(k);
            let mut t = 0;
            while t < tokens {
                let wide = stride - t >= 2 * LANES;
                if rows == GROUP {
                    if wide {
                        tile::<GROUP, 2>(w, 0, k, xt, stride, t, ks.clone(), out_t);
                    } else {
                        tile::<GROUP, 1>(w, 0, k, xt, stride, t, ks.clone(), out_t);
                    }
                } else {
                    for i in 0..rows {
                        if wide {
                            tile::<1, 2>(w, i, k, xt, stride, t, ks.clone(), out_t);
                        } else {
                            tile::<1, 1>(w, i, k, xt, stride, t, ks.clone(), out_t);
                        }
                    }
                }
                t += if wide { 2 * LANES } else { LANES };
            }
        }
        for t in 0..tokens {
            for i in 0..rows {
                *out.add(t * ld + i) = out_t[i * stride + t];
            }
        }
    }

    /// AVX2's eight lanes per vector.
    const LANES8: usize = 8;
    /// Rows per AVX2 tile: six rows × two vectors of tokens keep twelve accumulators, two token
    /// vectors and a broadcast weight in the sixteen registers.
    const ROWS8: usize = 6;

    /// [`tile`] on AVX2: rows `i0..i0 + R` × tokens `t0..t0 + 16`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_avx2<const R: usize>(
        w: &[f32],
        i0: usize,
        k: usize,
        xt: &[f32],
        stride: usize,
        t0: usize,
        ks: Range<usize>,
        out_t: &mut [f32],
    ) {
        let ws: [*const f32; R] = std::array::from_fn(|i| w.as_ptr().add((i0 + i) * k));
        let at = |i: usize, v: usize| (i0 + i) * stride + t0 + v * LANES8;
        let mut acc: [[__m256; 2]; R] = if ks.start == 0 {
            [[_mm256_setzero_ps(); 2]; R]
        } else {
            std::array::from_fn(|i| {
                std::array::from_fn(|v| _mm256_loadu_ps(out_t.as_ptr().add(at(i, v))))
            })
        };
        let mut x = xt.as_ptr().add(ks.start * stride + t0);
        for kk in ks {
            let xv = [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(LANES8))];
            for i in 0..R {
                let wv = _mm256_set1_ps(*ws[i].add(kk));
                for v in 0..2 {
                    acc[i][v] = _mm256_fmadd_ps(wv, xv[v], acc[i][v]);
                }
            }
            x = x.add(stride);
        }
        for (i, row) in acc.iter().enumerate() {
            for (v, a) in row.iter().enumerate() {
                _mm256_storeu_ps(out_t.as_mut_ptr().add(at(i, v)), *a);
            }
        }
    }

    /// [`super::group_product`] on AVX2: six rows by sixteen tokens at a time, the same fused
    /// multiply-adds in the same order as every other path.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn group_product_avx2(
        w: &[f32],
        rows: usize,
        k: usize,
        xt: &[f32],
        stride: usize,
        tokens: usize,
        out: *mut f32,
        ld: usize,
    ) {
        let mut out_t = vec![0f32; rows * stride];
        let out_t = &mut out_t[..];
        for k0 in (0..k).step_by(K_SLICE) {
            let ks = k0..(k0 + K_SLICE).min(k);
            for t in (0..tokens).step_by(LANES) {
                let mut i = 0;
                while i + ROWS8 <= rows {
                    tile_avx2::<ROWS8>(w, i, k, xt, stride, t, ks.clone(), out_t);
                    i += ROWS8;
                }
                while i < rows {
                    tile_avx2::<1>(w, i, k, xt, stride, t, ks.clone(), out_t);
                    i += 1;
                }
            }
        }
        for t in 0..tokens {
            for i in 0..rows {
                *out.add(t * ld + i) = out_t[i * stride + t];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::centered as data;

    #[test]
    fn tiles_match_the_portable_path_bit_for_bit_and_the_dequantized_product_closely() {
        // 45 tokens: a 32-token tile and a 16-token one, part padding; 70 rows: groups of 12
        // and a partial one
        let (n, tokens) = (70, 45);
        for k in [32, 576, 608] {
            let w = data(n * k, k as u64);
            let x = data(tokens * k, 7);
            for m in [
                QMatrix::quantize_q8(&w, n, k),
                QMatrix::quantize_q8_blocks(&w, n, k),
                QMatrix::quantize_q4(&w, n, k),
                QMatrix::quantize_bf16(&w, n, k),
            ] {
                let mut portable = vec![0f32; tokens * n];
                matmul_on(&m, &x, tokens, &mut portable, false);
                let mut fast = vec![0f32; tokens * n];
                matmul_on(&m, &x, tokens, &mut fast, true);
                assert_eq!(fast, portable, "k={k}: the SIMD tiles differ");
                // against the dequantized weights in f64: only f32 rounding of the sums remains
                let mut wq = vec![0f32; n * k];
                dequantize_rows(&m, 0..n, &mut wq);
                for t in 0..tokens {
                    for r in 0..n {
                        let e: f64 = (0..k)
                            .map(|j| x[t * k + j] as f64 * wq[r * k + j] as f64)
                            .sum();
                        let g = fast[t * n + r] as f64;
                        assert!((g - e).abs() <= 1e-5 * (1.0 + e.abs()), "k={k}: {g} vs {e}");
                    }
                }
            }
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn simd_q4_dequantizing_matches_the_portable_loop_bit_for_bit() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return; // nothing to compare on this CPU
        }
        let k = 608;
        let m = QMatrix::quantize_q4(&data(3 * k, 5), 3, k);
        let QWeights::Q4 {
            nibbles,
            d,
            m: mins,
        } = &m.w
        else {
            panic!()
        };
        let bpr = k / BLOCK;
        for r in 0..3 {
            let (nb, d, mins) = (
                &nibbles[r * k / 2..(r + 1) * k / 2],
                &d[r * bpr..(r + 1) * bpr],
                &mins[r * bpr..(r + 1) * bpr],
            );
            let (mut want, mut got) = (vec![0f32; k], vec![0f32; k]);
            dequantize_q4_row(nb, d, mins, &mut want);
            unsafe { x86::dequantize_q4_row(nb, d, mins, &mut got) };
            assert_eq!(got, want, "row {r}");
        }
    }

    #[test]
    fn several_matrices_at_once_equal_one_at_a_time() {
        // q, k and v of different heights (one not a multiple of the row group), at prompt lengths
        // on both sides of MIN_TOKENS
        let k = 96;
        let ms: Vec<QMatrix> = [(40, 1), (13, 2), (13, 3)]
            .iter()
            .map(|&(n, seed)| QMatrix::quantize_q4(&data(n * k, seed), n, k))
            .collect();
        for tokens in [3, MIN_TOKENS, 20] {
            let x = data(tokens * k, 9);
            let mut together: Vec<Vec<f32>> = ms.iter().map(|m| vec![0f32; tokens * m.n]).collect();
            let mut outs: Vec<&mut [f32]> = together.iter_mut().map(|o| &mut o[..]).collect();
            let refs: Vec<&QMatrix> = ms.iter().collect();
            matmul_many(&refs, &x, tokens, &mut outs);
            for (m, got) in ms.iter().zip(&together) {
                let mut alone = vec![0f32; tokens * m.n];
                m.matmul(&x, tokens, &mut alone);
                assert_eq!(got, &alone, "{tokens} tokens, n = {}", m.n);
            }
        }
    }

    #[test]
    fn dequantized_q4_is_d_times_q_plus_m() {
        let w: Vec<f32> = (0..64).map(|i| 0.25 * (i % 16) as f32 - 1.5).collect();
        let m = QMatrix::quantize_q4(&w, 2, 32);
        let mut back = vec![0f32; 64];
        dequantize_rows(&m, 0..2, &mut back);
        assert_eq!(back, w);
    }
}
