//! Prompt products of the K-quant types (Q4_K, Q5_K, Q6_K) and, with VNNI, IQ4_NL and IQ4_XS in
//! integers: many tokens against the same rows, as a GEMM whose operands are the weights' own small
//! integers and the tokens quantized to int8.
//!
//! Dequantized to f32 (the path `qprefill` takes for the other types) a product is bound by f32 FMAs,
//! 16 multiply-adds an instruction with AVX-512. `vpdpbusd` does 64 (unsigned weights times signed
//! activations, four products summed per i32 lane), and the K-quants' values are small unsigned
//! integers with one factor per sub-block of 16 or 32, so the integer sums of a sub-block need one
//! conversion and two multiply-adds to join the f32 result.
//!
//! - The tokens are quantized per block of 32 (int8, one scale a block, as the decode products of the
//!   32-element types take them) and packed sixteen to a vector: for each 4 elements of k, the 4
//!   bytes of each of 16 tokens side by side, the lane layout of `vpdpbusd`.
//! - Each task decodes a few rows at a time ([`ROWS`]) into unsigned bytes (`q`, 0..63) with each
//!   sub-block's `scale` and `min` as f32, `w = scale · q - min` (Q6_K's `-32` is its min, `32 · scale`;
//!   an IQ4 value `v` is `q = v + 128`, up to 241, with `128 · scale` its min: too large for the
//!   i16 pairs of `vpmaddubsw`, so the IQ4 types take this path only where `vpdpbusd` sums in i32).
//! - The tile: four bytes of a row broadcast to every lane meet a vector of tokens; per sub-block,
//!   each (row, token) adds `scale · dx` times its exact integer sum and takes away `min` times the
//!   token's `dx · Σq` over the sub-block, in that order, one rounding each.
//!
//! Every path (AVX-512 VNNI or not, AVX2, the portable loop) computes the same integer sums and the
//! same float operations in the same order, so all give bit-identical results.

use std::ops::Range;

use half::f16;
use torchburn_native_macros::isa_versions;

use super::acts::{quantize, ActForm, SUM_LEN};
use super::blocks::{iq4xs_scale, k_scale_min, GgmlType, IQ4_VALUES, QK_K};
use super::GgmlMatrix;
use crate::threads;

/// Tokens per vector of the tile (one AVX-512 register of i32 lanes; two AVX2 registers).
const LANES: usize = 16;
/// Rows decoded and multiplied together.
const ROWS: usize = 4;
/// Elements of each quantized activation block.
const ACT_BLOCK: usize = 32;

/// Whether this path takes `kind` at the running level.
pub fn takes(kind: GgmlType) -> bool {
    kind.is_k_quant() || (is_iq4(kind) && vnni_tiles())
}

fn is_iq4(kind: GgmlType) -> bool {
    matches!(kind, GgmlType::IQ4NL | GgmlType::IQ4XS)
}

/// Whether the tile runs on `vpdpbusd` (the AVX-512 VNNI copy), the only SIMD copy whose sums do
/// not pass through i16.
fn vnni_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::isa::avx512() && super::vnni()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The tokens `[T, k]` quantized per block of 32 and packed for the tile, for sub-blocks of `sub`
/// elements (32 for Q4_K and Q5_K, 16 for Q6_K).
struct PackedTokens {
    /// token vectors (`T / 16` rounded up; padding tokens are zero)
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    vectors: usize,
    k: usize,
    sub: usize,
    /// `[vectors, k / 4, 16, 4]`: four elements of each token of the vector at a time
    q: Vec<i8>,
    /// `[vectors, k / sub, 16]`: each token's scale for the sub-block (its activation block's)
    dx: Vec<f32>,
    /// `[vectors, k / sub, 16]`: `dx · Σq` over the sub-block
    xsum: Vec<f32>,
}

impl PackedTokens {
    fn new(x: &[f32], tokens: usize, k: usize, sub: usize) -> PackedTokens {
        let vectors = tokens.div_ceil(LANES);
        let subs = k / sub;
        let mut p = PackedTokens {
            vectors,
            k,
            sub,
            q: vec![0; vectors * k * LANES],
            dx: vec![0.0; vectors * subs * LANES],
            xsum: vec![0.0; vectors * subs * LANES],
        };
        let (q_ptr, dx_ptr, xsum_ptr) = (
            threads::SendPtr(p.q.as_mut_ptr()),
            threads::SendPtr(p.dx.as_mut_ptr()),
            threads::SendPtr(p.xsum.as_mut_ptr()),
        );
        threads::par_ranges(tokens, 4, |lo, hi| {
            for t in lo..hi {
                let a = quantize(ActForm::Int8x32, &x[t * k..(t + 1) * k]);
                let (v, lane) = (t / LANES, t % LANES);
                // SAFETY: token t's lanes of every vector belong to this task alone
                unsafe {
                    let q = q_ptr.get().add(v * k * LANES);
                    for (k4, four) in a.q.chunks_exact(4).enumerate() {
                        let dst = q.add((k4 * LANES + lane) * 4);
                        std::ptr::copy_nonoverlapping(four.as_ptr(), dst, 4);
                    }
                    for s in 0..subs {
                        let at = (v * subs + s) * LANES + lane;
                        let d = a.d[s * sub / ACT_BLOCK];
                        let sums = &a.sums16[s * sub / SUM_LEN..(s + 1) * sub / SUM_LEN];
                        let qsum: i32 = sums.iter().sum();
                        *dx_ptr.get().add(at) = d;
                        *xsum_ptr.get().add(at) = d * qsum as f32;
                    }
                }
            }
        });
        p
    }

    fn subs(&self) -> usize {
        self.k / self.sub
    }
}

/// A few rows decoded for the tile: `q[r · k + i]` unsigned, and per sub-block `w = scale · q - min`.
struct DecodedRows {
    q: Vec<u8>,
    scale: Vec<f32>,
    min: Vec<f32>,
    /// the largest value `q` can hold (15 for Q4_K, 31 for Q5_K, 63 for Q6_K)
    top: usize,
}

impl DecodedRows {
    /// Steps of four elements whose `vpmaddubsw` pairs (each at most `2 · top · 128`) can add up in
    /// i16 lanes before one widening to i32: 8 for Q4_K, 4 for Q5_K, 2 for Q6_K.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn steps_in_i16(&self) -> usize {
        i16::MAX as usize / (2 * self.top * 128)
    }
}

fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Row `row` of a K-quant type into unsigned values `q` (`k` of them) and its sub-blocks' factors.
/// The factors are [`super::blocks::decode`]'s (the same products, rounded once); Q6_K's values are
/// stored plus 32, which its min takes back.
#[isa_versions]
fn decode_row(kind: GgmlType, row: &[u8], q: &mut [u8], scale: &mut [f32], min: &mut [f32]) {
    match kind {
        GgmlType::Q4K | GgmlType::Q5K => {
            let five = kind == GgmlType::Q5K;
            let bytes = kind.block_bytes();
            for (b, block) in row.chunks_exact(bytes).enumerate() {
                let (d, dmin) = (half_at(block, 0), half_at(block, 2));
                for j in 0..8 {
                    let (sc, m) = k_scale_min(&block[4..16], j);
                    scale[8 * b + j] = d * sc as f32;
                    min[8 * b + j] = dmin * m as f32;
                }
                let (high, nib) = if five {
                    (&block[16..48], &block[48..176])
                } else {
                    (&block[16..48], &block[16..144])
                };
                let out = &mut q[QK_K * b..QK_K * (b + 1)];
                for c in 0..4 {
                    let n = &nib[32 * c..32 * c + 32];
                    let (lo, hi) = out[64 * c..64 * c + 64].split_at_mut(32);
                    for l in 0..32 {
                        let (mut a, mut z) = (n[l] & 0x0F, n[l] >> 4);
                        if five {
                            a |= ((high[l] >> (2 * c)) & 1) << 4;
                            z |= ((high[l] >> (2 * c + 1)) & 1) << 4;
                        }
                        lo[l] = a;
                        hi[l] = z;
                    }
                }
            }
        }
        GgmlType::Q6K => {
            for (b, block) in row.chunks_exact(210).enumerate() {
                let d = half_at(block, 208);
                for (j, &sc) in block[192..208].iter().enumerate() {
                    let s = d * (sc as i8) as f32;
                    scale[16 * b + j] = s;
                    min[16 * b + j] = 32.0 * s;
                }
                for half in 0..2 {
                    let ql = &block[64 * half..64 * half + 64];
                    let qh = &block[128 + 32 * half..160 + 32 * half];
                    let out = &mut q[QK_K * b + 128 * half..QK_K * b + 128 * half + 128];
                    for l in 0..32 {
                        let h = qh[l];
                        out[l] = (ql[l] & 0x0F) | ((h & 3) << 4);
                        out[l + 32] = (ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4);
                        out[l + 64] = (ql[l] >> 4) | (((h >> 4) & 3) << 4);
                        out[l + 96] = (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4);
                    }
                }
            }
        }
        GgmlType::IQ4NL | GgmlType::IQ4XS => {
            // each block ends in its sub-blocks' sixteen bytes of indices apiece
            let subs = kind.block_len() / 32;
            for (b, block) in row.chunks_exact(kind.block_bytes()).enumerate() {
                let d = half_at(block, 0);
                let indices = &block[block.len() - 16 * subs..];
                for j in 0..subs {
                    let s = if kind == GgmlType::IQ4XS {
                        d * iq4xs_scale(block, j) as f32
                    } else {
                        d
                    };
                    let at = subs * b + j;
                    scale[at] = s;
                    min[at] = 128.0 * s;
                    iq4_stored(&indices[16 * j..16 * j + 16], &mut q[32 * at..32 * at + 32]);
                }
            }
        }
        other => panic!("{} has no integer prompt tiles", other.name()),
    }
}

/// Thirty-two IQ4 values plus 128 (`q`, 1..=241) from sixteen bytes of indices in Q4_0's order:
/// looked up sixteen at a time by `pshufb` where the CPU has it (the IQ4 types reach these tiles
/// only on AVX-512 VNNI CPUs; the loop is the portable reference).
fn iq4_stored(nib: &[u8], out: &mut [u8]) {
    assert!(nib.len() == 16 && out.len() == 32, "a run of 32 IQ4 values");
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        // SAFETY: the level includes SSSE3; the lengths are checked above
        return unsafe { iq4_stored_ssse3(nib, out) };
    }
    for (l, &byte) in nib.iter().enumerate() {
        out[l] = IQ4_STORED[(byte & 0x0F) as usize];
        out[l + 16] = IQ4_STORED[(byte >> 4) as usize];
    }
}

/// [`IQ4_VALUES`] plus 128, as the unsigned bytes the tiles multiply.
const IQ4_STORED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (IQ4_VALUES[i] as i16 + 128) as u8;
        i += 1;
    }
    t
};

/// # Safety
/// The CPU must have SSSE3; `nib` 16 bytes, `out` 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "ssse3")]
unsafe fn iq4_stored_ssse3(nib: &[u8], out: &mut [u8]) {
    use std::arch::x86_64::*;
    let table = _mm_loadu_si128(IQ4_STORED.as_ptr() as *const __m128i);
    let bytes = _mm_loadu_si128(nib.as_ptr() as *const __m128i);
    let low = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(bytes, low);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(bytes), low);
    _mm_storeu_si128(
        out.as_mut_ptr() as *mut __m128i,
        _mm_shuffle_epi8(table, lo),
    );
    _mm_storeu_si128(
        out.as_mut_ptr().add(16) as *mut __m128i,
        _mm_shuffle_epi8(table, hi),
    );
}

impl DecodedRows {
    fn new(k: usize, sub: usize) -> DecodedRows {
        DecodedRows {
            q: vec![0; ROWS * k],
            scale: vec![0.0; ROWS * k / sub],
            min: vec![0.0; ROWS * k / sub],
            top: 63,
        }
    }

    fn fill(&mut self, m: &GgmlMatrix, rows: Range<usize>) {
        let (k, subs) = (m.k, m.k / m.kind.sub_len());
        self.top = match m.kind {
            GgmlType::Q4K => 15,
            GgmlType::Q5K => 31,
            GgmlType::IQ4NL | GgmlType::IQ4XS => 241,
            _ => 63,
        };
        for (i, r) in rows.enumerate() {
            decode_row(
                m.kind,
                m.row(r),
                &mut self.q[i * k..(i + 1) * k],
                &mut self.scale[i * subs..(i + 1) * subs],
                &mut self.min[i * subs..(i + 1) * subs],
            );
        }
    }
}

/// Products of the same tokens with several K-quant matrices of one width, each into its own
/// `[T, n_i]` output: `outs[i][t·n_i + r] = Σ_k W_i[r, k] · x[t·k + k]` with the tokens quantized.
pub fn matmul_many(ms: &[&GgmlMatrix], x: &[f32], tokens: usize, outs: &mut [&mut [f32]]) {
    matmul_many_on(ms, x, tokens, outs, true)
}

/// [`matmul_many`] on the SIMD tile where the CPU has it (`simd`) or the portable loop.
pub(crate) fn matmul_many_on(
    ms: &[&GgmlMatrix],
    x: &[f32],
    tokens: usize,
    outs: &mut [&mut [f32]],
    simd: bool,
) {
    assert_eq!(ms.len(), outs.len(), "one output per matrix");
    let k = ms.first().map_or(0, |m| m.k);
    for (m, out) in ms.iter().zip(outs.iter()) {
        assert!(
            takes(m.kind),
            "{} has no integer prompt tiles at this level",
            m.kind.name()
        );
        assert_eq!(m.k, k, "the matrices must share their width");
        assert_eq!(out.len(), tokens * m.n, "output length");
    }
    assert_eq!(x.len(), tokens * k, "input length");
    if tokens == 0 || ms.is_empty() {
        return;
    }
    // one packing per sub-block length the matrices use
    let pack = |sub: usize| {
        ms.iter()
            .any(|m| m.kind.sub_len() == sub)
            .then(|| PackedTokens::new(x, tokens, k, sub))
    };
    let (p32, p16) = (pack(32), pack(16));
    let mut firsts = vec![0];
    for m in ms {
        firsts.push(firsts[firsts.len() - 1] + m.n.div_ceil(ROWS));
    }
    let groups = firsts[ms.len()];
    let out_ptrs: Vec<threads::SendPtr<f32>> = outs
        .iter_mut()
        .map(|o| threads::SendPtr(o.as_mut_ptr()))
        .collect();
    threads::par_ranges(groups, 1, |lo, hi| {
        let mut decoded: [Option<DecodedRows>; 2] = [None, None];
        for g in lo..hi {
            let i = firsts.partition_point(|&f| f <= g) - 1;
            let m = ms[i];
            let sub = m.kind.sub_len();
            let (tokens_packed, slot) = if sub == 32 {
                (p32.as_ref(), 0)
            } else {
                (p16.as_ref(), 1)
            };
            let tp = tokens_packed.expect("tokens packed for every sub-block length used");
            let rows = (g - firsts[i]) * ROWS..((g - firsts[i] + 1) * ROWS).min(m.n);
            let dec = decoded[slot].get_or_insert_with(|| DecodedRows::new(k, sub));
            dec.fill(m, rows.clone());
            // SAFETY: this task alone writes columns `rows` of every token's output row of matrix i
            unsafe {
                tile(
                    dec,
                    rows.len(),
                    tp,
                    tokens,
                    out_ptrs[i].get().add(rows.start),
                    m.n,
                    simd,
                )
            };
        }
    });
}

/// `out[t·n + r] = Σ` over the decoded rows `0..rows` and every token, on the best path.
///
/// # Safety
/// `out` must hold `tokens` rows of `n` floats, of which this call writes the first `rows` of each.
unsafe fn tile(
    w: &DecodedRows,
    rows: usize,
    x: &PackedTokens,
    tokens: usize,
    out: *mut f32,
    n: usize,
    simd: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if simd && crate::isa::avx512() {
        // (IQ4's values reach here only with VNNI: see `takes`)
        if super::vnni() {
            return x86::tile_avx512_vnni(w, rows, x, tokens, out, n);
        }
        return x86::tile_avx512(w, rows, x, tokens, out, n);
    } else if simd && crate::isa::avx2() {
        return x86::tile_avx2(w, rows, x, tokens, out, n);
    }
    let _ = simd;
    tile_portable(w, rows, x, tokens, out, n)
}

/// The tile's arithmetic one (row, token) at a time: the reference every SIMD path equals.
///
/// # Safety
/// As [`tile`].
unsafe fn tile_portable(
    w: &DecodedRows,
    rows: usize,
    x: &PackedTokens,
    tokens: usize,
    out: *mut f32,
    n: usize,
) {
    let (k, sub, subs) = (x.k, x.sub, x.subs());
    for r in 0..rows {
        let wq = &w.q[r * k..(r + 1) * k];
        for t in 0..tokens {
            let (v, lane) = (t / LANES, t % LANES);
            let xq = &x.q[v * k * LANES..(v + 1) * k * LANES];
            let mut acc = 0f32;
            for s in 0..subs {
                let mut isum = 0i32;
                for e in s * sub..(s + 1) * sub {
                    isum += wq[e] as i32 * xq[((e / 4) * LANES + lane) * 4 + e % 4] as i32;
                }
                let at = (v * subs + s) * LANES + lane;
                let f = w.scale[r * subs + s] * x.dx[at];
                acc = (isum as f32).mul_add(f, acc);
                acc = (-w.min[r * subs + s]).mul_add(x.xsum[at], acc);
            }
            *out.add(t * n + r) = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{DecodedRows, PackedTokens, LANES, ROWS};

    /// # Safety
    /// As [`super::tile`]; the CPU has AVX-512 F and BW.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    pub unsafe fn tile_avx512(
        w: &DecodedRows,
        rows: usize,
        x: &PackedTokens,
        tokens: usize,
        out: *mut f32,
        n: usize,
    ) {
        tile_zmm::<false>(w, rows, x, tokens, out, n)
    }

    /// # Safety
    /// As [`super::tile`]; the CPU has AVX-512 F, BW and VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
    pub unsafe fn tile_avx512_vnni(
        w: &DecodedRows,
        rows: usize,
        x: &PackedTokens,
        tokens: usize,
        out: *mut f32,
        n: usize,
    ) {
        tile_zmm::<true>(w, rows, x, tokens, out, n)
    }

    /// Sixteen i32 lanes of `acc + Σ` of four products each (unsigned `w`, signed `x`).
    #[inline(always)]
    unsafe fn dot4<const VNNI: bool>(acc: __m512i, w: __m512i, x: __m512i) -> __m512i {
        if VNNI {
            _mm512_dpbusd_epi32(acc, w, x)
        } else {
            // exact in i16: two products of at most 63 · 128
            let pairs = _mm512_maddubs_epi16(w, x);
            _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)))
        }
    }

    #[inline(always)]
    unsafe fn tile_zmm<const VNNI: bool>(
        w: &DecodedRows,
        rows: usize,
        x: &PackedTokens,
        tokens: usize,
        out: *mut f32,
        n: usize,
    ) {
        let mut v = 0;
        while v < x.vectors {
            let pair = v + 1 < x.vectors;
            macro_rules! pass {
                ($v:literal: $($r:literal)*) => {
                    match rows {
                        $($r => rows_zmm::<VNNI, $r, $v>(w, x, v, tokens, out, n),)*
                        other => unreachable!("{other} rows in a tile"),
                    }
                };
            }
            if pair {
                pass!(2: 1 2 3 4);
                v += 2;
            } else {
                pass!(1: 1 2 3 4);
                v += 1;
            }
        }
    }

    /// `R` rows against token vectors `v0..v0 + V`.
    #[inline(always)]
    unsafe fn rows_zmm<const VNNI: bool, const R: usize, const V: usize>(
        w: &DecodedRows,
        x: &PackedTokens,
        v0: usize,
        tokens: usize,
        out: *mut f32,
        n: usize,
    ) {
        let (k, sub, subs) = (x.k, x.sub, x.subs());
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        let mut xq = [x.q.as_ptr(); V];
        for (j, p) in xq.iter_mut().enumerate() {
            *p = x.q.as_ptr().add((v0 + j) * k * LANES);
        }
        for s in 0..subs {
            let mut isum = [[_mm512_setzero_si512(); V]; R];
            for k4 in (s * sub / 4)..((s + 1) * sub / 4) {
                // (loops, not closures, around the intrinsics: a closure is compiled without this
                // function's instruction sets)
                let mut xv = [_mm512_setzero_si512(); V];
                for (v, p) in xv.iter_mut().zip(&xq) {
                    *v = _mm512_loadu_si512(p.add(k4 * 64) as *const __m512i);
                }
                for (r, isum) in isum.iter_mut().enumerate() {
                    let four = (w.q.as_ptr().add(r * k + 4 * k4) as *const i32).read_unaligned();
                    let wv = _mm512_set1_epi32(four);
                    for (acc, &xv) in isum.iter_mut().zip(&xv) {
                        *acc = dot4::<VNNI>(*acc, wv, xv);
                    }
                }
            }
            for j in 0..V {
                let at = ((v0 + j) * subs + s) * LANES;
                let dx = _mm512_loadu_ps(x.dx.as_ptr().add(at));
                let xsum = _mm512_loadu_ps(x.xsum.as_ptr().add(at));
                for r in 0..R {
                    let scale = _mm512_mul_ps(_mm512_set1_ps(w.scale[r * subs + s]), dx);
                    let a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][j]), scale, acc[r][j]);
                    acc[r][j] = _mm512_fnmadd_ps(_mm512_set1_ps(w.min[r * subs + s]), xsum, a);
                }
            }
        }
        let mut lanes = [[[0f32; LANES]; V]; R];
        for (dst, row) in lanes.iter_mut().zip(&acc) {
            for (d, &a) in dst.iter_mut().zip(row) {
                _mm512_storeu_ps(d.as_mut_ptr(), a);
            }
        }
        store::<R, V>(&lanes, v0, tokens, out, n);
    }

    /// Each (row, token) of a tile into its output row, past-the-end (padding) tokens dropped.
    #[inline(always)]
    unsafe fn store<const R: usize, const V: usize>(
        acc: &[[[f32; LANES]; V]; R],
        v0: usize,
        tokens: usize,
        out: *mut f32,
        n: usize,
    ) {
        for (r, row) in acc.iter().enumerate() {
            for (j, lanes) in row.iter().enumerate() {
                for (lane, &value) in lanes.iter().enumerate() {
                    let t = (v0 + j) * LANES + lane;
                    if t < tokens {
                        *out.add(t * n + r) = value;
                    }
                }
            }
        }
    }

    /// # Safety
    /// As [`super::tile`]; the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile_avx2(
        w: &DecodedRows,
        rows: usize,
        x: &PackedTokens,
        tokens: usize,
        out: *mut f32,
        n: usize,
    ) {
        // two rows at a time: their accumulators for a vector of 16 tokens (two registers each, an
        // integer and a float one per half) take 8 of the 16 registers
        let mut r = 0;
        while r < rows {
            let take = (rows - r).min(2);
            for v in 0..x.vectors {
                macro_rules! pass {
                    ($($g:literal)*) => {
                        match (take, w.steps_in_i16().min(8)) {
                            $((2, $g) => rows_ymm::<2, $g>(w, r, x, v, tokens, out.add(r), n),)*
                            $((_, $g) => rows_ymm::<1, $g>(w, r, x, v, tokens, out.add(r), n),)*
                            (_, other) => unreachable!("{other} steps in i16"),
                        }
                    };
                }
                pass!(2 4 8);
            }
            r += take;
        }
        debug_assert!(rows <= ROWS);
    }

    /// Rows `r0..r0 + R` against token vector `v`, in two halves of eight tokens; `G` steps' pairs
    /// summed in i16 before each widening (exact: see [`DecodedRows::steps_in_i16`]).
    #[inline(always)]
    unsafe fn rows_ymm<const R: usize, const G: usize>(
        w: &DecodedRows,
        r0: usize,
        x: &PackedTokens,
        v: usize,
        tokens: usize,
        out: *mut f32,
        n: usize,
    ) {
        let (k, sub, subs) = (x.k, x.sub, x.subs());
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let xq = x.q.as_ptr().add(v * k * LANES);
        for s in 0..subs {
            let mut isum = [[_mm256_setzero_si256(); 2]; R];
            let (first, end) = (s * sub / 4, (s + 1) * sub / 4);
            for g in (first..end).step_by(G) {
                let mut pairs = [[_mm256_setzero_si256(); 2]; R];
                for k4 in g..(g + G).min(end) {
                    let lo = _mm256_loadu_si256(xq.add(k4 * 64) as *const __m256i);
                    let hi = _mm256_loadu_si256(xq.add(k4 * 64 + 32) as *const __m256i);
                    for (r, pairs) in pairs.iter_mut().enumerate() {
                        let four = (w.q.as_ptr().add((r0 + r) * k + 4 * k4) as *const i32)
                            .read_unaligned();
                        let wv = _mm256_set1_epi32(four);
                        for (p, xv) in pairs.iter_mut().zip([lo, hi]) {
                            *p = _mm256_add_epi16(*p, _mm256_maddubs_epi16(wv, xv));
                        }
                    }
                }
                for (isum, pairs) in isum.iter_mut().zip(&pairs) {
                    for (acc, &p) in isum.iter_mut().zip(pairs) {
                        *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(p, ones));
                    }
                }
            }
            let at = (v * subs + s) * LANES;
            for h in 0..2 {
                let dx = _mm256_loadu_ps(x.dx.as_ptr().add(at + 8 * h));
                let xsum = _mm256_loadu_ps(x.xsum.as_ptr().add(at + 8 * h));
                for r in 0..R {
                    let i = (r0 + r) * subs + s;
                    let scale = _mm256_mul_ps(_mm256_set1_ps(w.scale[i]), dx);
                    let a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][h]), scale, acc[r][h]);
                    acc[r][h] = _mm256_fnmadd_ps(_mm256_set1_ps(w.min[i]), xsum, a);
                }
            }
        }
        for (r, halves) in acc.iter().enumerate() {
            let mut lanes = [0f32; LANES];
            _mm256_storeu_ps(lanes.as_mut_ptr(), halves[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), halves[1]);
            for (lane, &value) in lanes.iter().enumerate() {
                let t = v * LANES + lane;
                if t < tokens {
                    *out.add(t * n + r) = value;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::blocks::dequantize_row;
    use super::super::tests::matrix;
    use super::*;
    use crate::kernels::testing::centered;

    /// Every type with integer prompt tiles somewhere (the IQ4 types only with VNNI).
    const TILED: [GgmlType; 5] = [
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
    ];

    /// `Σ_k W[r, k] · x̂[t, k]` in f64 over the dequantized weights and the tokens as quantized.
    fn reference(m: &GgmlMatrix, x: &[f32], tokens: usize) -> Vec<f64> {
        let k = m.k;
        let mut w = vec![0f32; k];
        let mut out = vec![0f64; tokens * m.n];
        for t in 0..tokens {
            let a = quantize(ActForm::Int8x32, &x[t * k..(t + 1) * k]);
            for r in 0..m.n {
                dequantize_row(m.kind, m.row(r), &mut w);
                out[t * m.n + r] = (0..k)
                    .map(|i| w[i] as f64 * a.d[i / ACT_BLOCK] as f64 * a.q[i] as f64)
                    .sum();
            }
        }
        out
    }

    #[test]
    fn every_path_gives_the_portable_bits_and_the_dequantized_product() {
        let k = 512;
        for kind in TILED.into_iter().filter(|&kind| takes(kind)) {
            // 11 rows: groups of four and a part group; 37 tokens: two vectors, a pair and a lone one
            for (n, tokens) in [(11, 37), (4, 16), (3, 1)] {
                let m = matrix(kind, n, k, 3);
                let x = centered(tokens * k, 9);
                let (mut simd, mut portable) = (vec![0f32; tokens * n], vec![0f32; tokens * n]);
                matmul_many_on(&[&m], &x, tokens, &mut [&mut simd], true);
                matmul_many_on(&[&m], &x, tokens, &mut [&mut portable], false);
                for (i, (a, b)) in simd.iter().zip(&portable).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{} {n}x{k}, {tokens} tokens, value {i}: {a} against {b} at {}",
                        kind.name(),
                        crate::isa::level().name()
                    );
                }
                let want = reference(&m, &x, tokens);
                let size = want.iter().fold(0f64, |s, v| s.max(v.abs())).max(1e-9);
                for (i, (&got, &want)) in simd.iter().zip(&want).enumerate() {
                    assert!(
                        (got as f64 - want).abs() <= 2e-5 * size,
                        "{} value {i}: {got} against {want}",
                        kind.name()
                    );
                }
            }
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_avx512_tile_without_vnni_gives_the_portable_bits() {
        // the matmul above takes VNNI where the CPU has it; the plain AVX-512 tile runs here
        if !crate::isa::avx512() {
            return;
        }
        let (k, tokens) = (512, 37);
        for kind in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
            let m = matrix(kind, 3, k, 12);
            let x = centered(tokens * k, 13);
            let packed = PackedTokens::new(&x, tokens, k, kind.sub_len());
            let mut dec = DecodedRows::new(k, kind.sub_len());
            dec.fill(&m, 0..3);
            let (mut plain, mut portable) = (vec![0f32; tokens * 3], vec![0f32; tokens * 3]);
            // SAFETY: the CPU has AVX-512 F and BW (the level includes them); the outputs hold
            // `tokens` rows of 3
            unsafe {
                x86::tile_avx512(&dec, 3, &packed, tokens, plain.as_mut_ptr(), 3);
                tile_portable(&dec, 3, &packed, tokens, portable.as_mut_ptr(), 3);
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&plain), bits(&portable), "{}", kind.name());
        }
    }

    #[test]
    fn extreme_blocks_do_not_overflow_the_narrow_sums() {
        // every value at its largest and every activation at ±127 of one sign: the widest i16 pair
        // sums the AVX2 tile adds before widening
        use super::super::WeightBytes;
        let (k, tokens) = (256, 17);
        for kind in TILED.into_iter().filter(|&kind| takes(kind)) {
            // (IQ4: index 15, the value 113, stored as 241, the largest `q`; 6-bit scales of 31)
            let mut bytes = vec![0xFFu8; kind.row_bytes(k) * 2];
            for block in bytes.chunks_exact_mut(kind.block_bytes()) {
                let at: &[usize] = match kind {
                    GgmlType::Q6K => &[208],
                    GgmlType::IQ4NL | GgmlType::IQ4XS => &[0],
                    _ => &[0, 2],
                };
                for &a in at {
                    block[a..a + 2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
                }
                if kind == GgmlType::Q6K {
                    block[192..208].fill(0x7F); // scales +127
                }
            }
            let m = GgmlMatrix::new(kind, 2, k, WeightBytes::owned(bytes)).unwrap();
            for sign in [1.0f32, -1.0] {
                let x = vec![sign; tokens * k];
                let (mut simd, mut portable) = (vec![0f32; tokens * 2], vec![0f32; tokens * 2]);
                matmul_many_on(&[&m], &x, tokens, &mut [&mut simd], true);
                matmul_many_on(&[&m], &x, tokens, &mut [&mut portable], false);
                assert_eq!(simd, portable, "{} at {sign}", kind.name());
                let want = reference(&m, &x, tokens);
                for (&got, &want) in simd.iter().zip(&want) {
                    assert!(
                        (got as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{got} against {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn several_matrices_at_once_equal_one_at_a_time() {
        let k = 256;
        let ms = [
            matrix(GgmlType::Q4K, 9, k, 1),
            matrix(GgmlType::Q6K, 5, k, 2),
            matrix(GgmlType::Q5K, 6, k, 3),
        ];
        let tokens = 20;
        let x = centered(tokens * k, 4);
        let mut together: Vec<Vec<f32>> = ms.iter().map(|m| vec![0f32; tokens * m.n]).collect();
        let refs: Vec<&GgmlMatrix> = ms.iter().collect();
        let mut outs: Vec<&mut [f32]> = together.iter_mut().map(|o| o.as_mut_slice()).collect();
        matmul_many(&refs, &x, tokens, &mut outs);
        for (m, got) in ms.iter().zip(&together) {
            let mut alone = vec![0f32; tokens * m.n];
            matmul_many(&[m], &x, tokens, &mut [&mut alone]);
            assert_eq!(got, &alone, "{}", m.kind.name());
        }
    }

    #[test]
    fn k_quants_grouped_with_other_types_get_what_they_get_alone() {
        // a prompt's q/k/v may mix a K-quant with a 32-element type: each takes its own path
        use crate::kernels::qprefill::{matmul_sources, RowSource};
        let k = 256;
        let ms = [
            matrix(GgmlType::Q8_0, 7, k, 5),
            matrix(GgmlType::Q4K, 6, k, 6),
        ];
        let tokens = 12;
        let x = centered(tokens * k, 7);
        let mut together: Vec<Vec<f32>> = ms.iter().map(|m| vec![0f32; tokens * m.n]).collect();
        let sources: Vec<&dyn RowSource> = ms.iter().map(|m| m as &dyn RowSource).collect();
        let mut outs: Vec<&mut [f32]> = together.iter_mut().map(|o| o.as_mut_slice()).collect();
        matmul_sources(&sources, &x, tokens, &mut outs);
        for (m, got) in ms.iter().zip(&together) {
            let mut alone = vec![0f32; tokens * m.n];
            m.matmul(&x, tokens, &mut alone);
            assert_eq!(got, &alone, "{}", m.kind.name());
        }
        let mut kq = vec![0f32; tokens * ms[1].n];
        matmul_many(&[&ms[1]], &x, tokens, &mut [&mut kq]);
        assert_eq!(together[1], kq, "the K-quant on the integer tiles");
    }

    #[test]
    fn decoded_rows_are_the_reference_decoders_values() {
        let k = 512;
        for kind in TILED {
            let m = matrix(kind, 2, k, 8);
            let mut dec = DecodedRows::new(k, kind.sub_len());
            dec.fill(&m, 0..2);
            let subs = k / kind.sub_len();
            let mut want = vec![0f32; k];
            for r in 0..2 {
                dequantize_row(kind, m.row(r), &mut want);
                for (i, &w) in want.iter().enumerate() {
                    let s = r * subs + i / kind.sub_len();
                    let got = dec.scale[s] * dec.q[r * k + i] as f32 - dec.min[s];
                    assert!(
                        (got - w).abs() <= 1e-6 * w.abs().max(1e-3),
                        "{} row {r} element {i}: {got} against {w}",
                        kind.name()
                    );
                }
            }
        }
    }
}
