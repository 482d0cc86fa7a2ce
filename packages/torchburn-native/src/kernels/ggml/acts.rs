//! Activation rows quantized for the products with GGUF weights: int8 per block of 32 with an f32
//! scale for the 4- and 5-bit 32-element types (as llama.cpp pairs them), int8 per block of 256 for
//! the K-quants, int16 per block of 32 for `Q8_0` (so that its int8 weights are the only rounding
//! the product sees: a model's output projection is often `Q8_0`, and the next token hangs on its
//! last digits), and f32 as they are for the float types.
//!
//! The sum of each 16 integers is kept, and per block `d · Σ q`: the types with an offset (`Q4_1`,
//! `Q5_1`, the K-quants' mins) and the ones stored unsigned with a bias (`Q4_0`, `Q5_0`, `Q6_K`) need
//! `Σ x` per sub-block.

use torchburn_native_macros::isa_versions;

use super::blocks::{GgmlType, QK_K};
use crate::kernels::quant::round_away;

/// Elements per activation block of the 32-element types.
pub const QK8: usize = 32;
/// Elements per entry of [`Acts::sums16`].
pub const SUM_LEN: usize = 16;
/// Running maxima of a block's magnitudes (one AVX-512 register).
const LANES: usize = 16;

/// How one weight type takes its activations (the order of [`ActForm::ALL`], which
/// `form as usize` indexes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActForm {
    F32,
    /// int8 per block of 32
    Int8x32,
    /// int16 per block of 32
    Int16x32,
    /// int8 per block of 256
    Int8x256,
}

impl ActForm {
    pub const ALL: [ActForm; 4] = [
        ActForm::F32,
        ActForm::Int8x32,
        ActForm::Int16x32,
        ActForm::Int8x256,
    ];

    /// Elements per scale (0 for f32).
    pub fn block(self) -> usize {
        match self {
            ActForm::F32 => 0,
            ActForm::Int8x32 | ActForm::Int16x32 => QK8,
            ActForm::Int8x256 => QK_K,
        }
    }
}

// `ALL` lists the forms in declaration order, so `form as usize` is a form's place in it
const _: () = {
    let mut i = 0;
    while i < ActForm::ALL.len() {
        assert!(ActForm::ALL[i] as usize == i);
        i += 1;
    }
};

/// The form products with `kind` take.
pub fn act_form(kind: GgmlType) -> ActForm {
    match kind {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ActForm::F32,
        GgmlType::Q8_0 => ActForm::Int16x32,
        GgmlType::Q4K
        | GgmlType::Q5K
        | GgmlType::Q6K
        | GgmlType::Q2K
        | GgmlType::Q3K
        | GgmlType::IQ4XS => ActForm::Int8x256,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::IQ4NL => {
            ActForm::Int8x32
        }
    }
}

/// One activation row in one [`ActForm`].
pub struct Acts {
    pub form: ActForm,
    /// the integers of the int8 forms
    pub q: Vec<i8>,
    /// the integers of the int16 form
    pub q16: Vec<i16>,
    /// one scale per block: `x ≈ d · q`
    pub d: Vec<f32>,
    /// `Σ q` of each 16 consecutive integers
    pub sums16: Vec<i32>,
    /// the same sums as i16, for the K-quant kernels' 16-bit multiply-adds (int8 per 256 only,
    /// where each is at most 16 · 127 in magnitude; empty in the other forms)
    pub sums16_i16: Vec<i16>,
    /// `d · Σ q` of each block
    pub dsum: Vec<f32>,
    /// the row itself (float weight types)
    pub f: Vec<f32>,
}

impl Acts {
    /// Integer `i` of an int8 or int16 form.
    pub fn int(&self, i: usize) -> i32 {
        if self.form == ActForm::Int16x32 {
            self.q16[i] as i32
        } else {
            self.q[i] as i32
        }
    }
}

/// `x` (a multiple of the block length long) in `form`.
pub fn quantize(form: ActForm, x: &[f32]) -> Acts {
    let block = form.block();
    let mut out = Acts {
        form,
        q: vec![],
        q16: vec![],
        d: vec![],
        sums16: vec![],
        sums16_i16: vec![],
        dsum: vec![],
        f: vec![],
    };
    if block == 0 {
        out.f = x.to_vec();
        return out;
    }
    assert!(
        x.len().is_multiple_of(block),
        "activation length {} is not a multiple of {block}",
        x.len()
    );
    let top = if form == ActForm::Int16x32 {
        32767.0
    } else {
        127.0
    };
    let blocks = x.len() / block;
    (out.d, out.dsum) = (vec![0f32; blocks], vec![0f32; blocks]);
    out.sums16 = vec![0i32; x.len() / SUM_LEN];
    let (d, dsum, sums16) = (&mut out.d, &mut out.dsum, &mut out.sums16);
    block_maxima(x, block, d);
    if form == ActForm::Int16x32 {
        out.q16 = vec![0i16; x.len()];
        quantize_blocks(x, block, top, &mut out.q16, d, dsum, sums16);
    } else {
        out.q = vec![0i8; x.len()];
        quantize_blocks(x, block, top, &mut out.q, d, dsum, sums16);
    }
    if form == ActForm::Int8x256 {
        out.sums16_i16 = out.sums16.iter().map(|&s| s as i16).collect();
    }
    out
}

/// The largest magnitude of each block of `block` values of `x`, into `out`; NaNs never win (as they
/// never win `f32::max`), and the maximum of exact values does not depend on the order it is taken
/// in, so every level gives the same values. Explicit vectors on x86: the compiler vectorized the
/// portable loop two lanes wide, and it took half a row's quantization.
fn block_maxima(x: &[f32], block: usize, out: &mut [f32]) {
    assert!(block.is_multiple_of(LANES), "blocks of whole lanes");
    assert_eq!(out.len() * block, x.len(), "one maximum per block");
    #[cfg(target_arch = "x86_64")]
    if crate::isa::avx2() {
        // SAFETY: the level includes AVX2 (and AVX-512 F where asked); lengths checked above
        unsafe {
            if crate::isa::avx512() {
                block_maxima_zmm(x, block, out)
            } else {
                block_maxima_ymm(x, block, out)
            }
        }
        return;
    }
    for (xs, m) in x.chunks_exact(block).zip(out.iter_mut()) {
        *m = xs
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m { v.abs() } else { m });
    }
}

/// [`block_maxima`] on AVX-512: sixteen running maxima per block (`vmaxps` keeps its second operand,
/// the running maximum, against a NaN), then folded.
///
/// # Safety
/// The CPU must have AVX-512 F; `x` whole blocks of whole vectors, `out` one entry per block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn block_maxima_zmm(x: &[f32], block: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    for (b, m) in out.iter_mut().enumerate() {
        let p = x.as_ptr().add(b * block);
        let mut acc = _mm512_setzero_ps();
        for i in (0..block).step_by(16) {
            acc = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(p.add(i))), acc);
        }
        *m = _mm512_reduce_max_ps(acc);
    }
}

/// [`block_maxima`] on AVX2: as [`block_maxima_zmm`], eight lanes to a register.
///
/// # Safety
/// The CPU must have AVX2; `x` whole blocks of whole vectors, `out` one entry per block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_maxima_ymm(x: &[f32], block: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    for (b, m) in out.iter_mut().enumerate() {
        let p = x.as_ptr().add(b * block);
        let mut acc = _mm256_setzero_ps();
        for i in (0..block).step_by(8) {
            acc = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(i))), acc);
        }
        let half = _mm_max_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let half = _mm_max_ps(half, _mm_movehl_ps(half, half));
        *m = _mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half)));
    }
}

/// An integer type the activations are stored in, which holds every value within its form's `top`.
trait Narrow: Copy {
    fn narrow(v: i32) -> Self;
}

impl Narrow for i8 {
    #[inline(always)]
    fn narrow(v: i32) -> i8 {
        v as i8
    }
}

impl Narrow for i16 {
    #[inline(always)]
    fn narrow(v: i32) -> i16 {
        v as i16
    }
}

/// Each block of `block` values of `x` as integers into `q` (rounded half away from zero, within
/// ±`top`), its scale into `d` (which holds the block's largest magnitude on entry: the scale is it
/// over `top`), `d · Σ q` into `dsum`, and the sum of each 16 integers into `sums16`. One function for the row, so the loops vectorize under
/// each level's instructions (`f32::round` is a libm call per element, which showed in a decode
/// step's profile; [`round_away`] is the same rounding in a form that vectorizes).
#[isa_versions]
fn quantize_blocks<T: Narrow>(
    x: &[f32],
    block: usize,
    top: f32,
    q: &mut [T],
    d: &mut [f32],
    dsum: &mut [f32],
    sums16: &mut [i32],
) {
    assert!(block.is_multiple_of(LANES), "blocks of whole lanes");
    let rows = x
        .chunks_exact(block)
        .zip(q.chunks_exact_mut(block))
        .zip(sums16.chunks_exact_mut(block / SUM_LEN));
    for (((xs, qs), sums), (d, dsum)) in rows.zip(d.iter_mut().zip(dsum.iter_mut())) {
        let amax = *d; // the block's largest magnitude, from `block_maxima`
        let scale = amax / top;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut total = 0i32;
        for ((xc, qc), sum) in xs
            .chunks_exact(SUM_LEN)
            .zip(qs.chunks_exact_mut(SUM_LEN))
            .zip(sums.iter_mut())
        {
            let mut ints = [0i32; SUM_LEN];
            for (o, &v) in ints.iter_mut().zip(xc) {
                // |v · inv| <= top up to rounding, clamped for safety
                let r = round_away(v * inv).clamp(-top, top);
                // a NaN becomes 0, as `as i32` makes it; the saturating `as` itself stays scalar
                *o = if r.is_nan() {
                    0
                } else {
                    // SAFETY: a number within ±top, which i32 holds
                    unsafe { r.to_int_unchecked::<i32>() }
                };
            }
            for (o, &v) in qc.iter_mut().zip(&ints) {
                *o = T::narrow(v);
            }
            // integer sums: exact in any order
            *sum = ints.iter().sum();
            total += *sum;
        }
        *d = scale;
        *dsum = scale * total as f32;
    }
}

/// `x` in the form products with `kind` take.
pub fn quantize_for(kind: GgmlType, x: &[f32]) -> Acts {
    quantize(act_form(kind), x)
}

/// Tokens the multi-token kernels take in one pass: eight pairs, a pair to an AVX-512 register (a
/// token to each half), and one lane each in the register of the offsets' sums.
pub const GROUP_TOKENS: usize = 16;

/// Several activation rows in one form (a few tokens against the same weights), with what the
/// multi-token kernels read for the 32-element integer forms: the tokens in pairs, each pair's blocks
/// side by side so that one 512-bit register holds a block of both (see `dot_tokens`).
pub struct TokenActs {
    pub form: ActForm,
    pub rows: Vec<Acts>,
    /// the tokens in groups of up to [`GROUP_TOKENS`] (none for a single token or other forms)
    pub groups: Vec<PairedGroup>,
}

/// Up to [`GROUP_TOKENS`] tokens in pairs; an odd last token is paired with itself.
pub struct PairedGroup {
    /// the group's first token and how many it has
    pub first: usize,
    pub count: usize,
    /// `[blocks, pairs, 64]` (int8 form): block b of the pair's first token, then of its second
    pub q: Vec<i8>,
    /// `[blocks, pairs, 2, 32]` (int16 form): elements 0..16 of block b of each token of the pair,
    /// then elements 16..32 of each
    pub q16: Vec<i16>,
    /// `[blocks, pairs, 16]`: the pair's two block scales, eight times each
    pub d: Vec<f32>,
    /// `[blocks, 16]`: each token's `d · Σ q` of block b (zero past `count`)
    pub dsum: Vec<f32>,
}

impl PairedGroup {
    pub fn pairs(&self) -> usize {
        self.count.div_ceil(2)
    }
}

impl TokenActs {
    /// The `tokens` rows of `x` (`[T, k]`) in `form`, also in pairs where the form has them.
    pub fn quantize(form: ActForm, x: &[f32], tokens: usize) -> TokenActs {
        Self::quantize_rows(form, x, tokens, true)
    }

    /// [`TokenActs::quantize`], with the pairs only if `paired` (some product will read them: see
    /// [`super::GgmlMatrix::reads_pairs`]); a step's few rows cost less than arranging them.
    pub fn quantize_rows(form: ActForm, x: &[f32], tokens: usize, paired: bool) -> TokenActs {
        let k = x.len().checked_div(tokens).unwrap_or(0);
        let rows: Vec<Acts> = (0..tokens)
            .map(|t| quantize(form, &x[t * k..][..k]))
            .collect();
        let paired = paired && matches!(form, ActForm::Int8x32 | ActForm::Int16x32) && tokens > 1;
        let groups = if paired {
            (0..tokens)
                .step_by(GROUP_TOKENS)
                .map(|first| pair_up(&rows, first, GROUP_TOKENS.min(tokens - first), k / QK8))
                .collect()
        } else {
            vec![]
        };
        TokenActs { form, rows, groups }
    }
}

/// Tokens `first..first + count` of `rows` arranged as [`PairedGroup`] describes.
fn pair_up(rows: &[Acts], first: usize, count: usize, blocks: usize) -> PairedGroup {
    let pairs = count.div_ceil(2);
    // the second token of pair p (the first again for a lone last token)
    let token = |p: usize, second: usize| &rows[first + (2 * p + second).min(count - 1)];
    let wide = rows[first].form == ActForm::Int16x32;
    let mut g = PairedGroup {
        first,
        count,
        q: vec![],
        q16: vec![],
        d: vec![0.0; blocks * pairs * 16],
        dsum: vec![0.0; blocks * 16],
    };
    if wide {
        g.q16 = vec![0; blocks * pairs * 2 * QK8];
    } else {
        g.q = vec![0; blocks * pairs * 2 * QK8];
    }
    for b in 0..blocks {
        for p in 0..pairs {
            let at = (b * pairs + p) * 2 * QK8;
            for s in 0..2 {
                let a = token(p, s);
                if wide {
                    let src = &a.q16[b * QK8..][..QK8];
                    g.q16[at + 16 * s..][..16].copy_from_slice(&src[..16]);
                    g.q16[at + QK8 + 16 * s..][..16].copy_from_slice(&src[16..]);
                } else {
                    g.q[at + QK8 * s..][..QK8].copy_from_slice(&a.q[b * QK8..][..QK8]);
                }
                g.d[(b * pairs + p) * 16 + 8 * s..][..8].fill(a.d[b]);
            }
        }
        for t in 0..count {
            g.dsum[b * 16 + t] = rows[first + t].dsum[b];
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::centered;

    /// The quantization written out one element at a time, with the standard library's rounding (half
    /// away from zero) and maximum: what every level's vectors must give, bit for bit.
    fn by_hand(form: ActForm, x: &[f32]) -> (Vec<i32>, Vec<f32>, Vec<f32>, Vec<i32>) {
        let top = if form == ActForm::Int16x32 {
            32767.0
        } else {
            127.0
        };
        let (mut ints, mut d, mut dsum) = (vec![], vec![], vec![]);
        for xs in x.chunks_exact(form.block()) {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / top;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let qs: Vec<i32> = xs
                .iter()
                .map(|v| (v * inv).round().clamp(-top, top) as i32)
                .collect();
            d.push(scale);
            dsum.push(scale * qs.iter().sum::<i32>() as f32);
            ints.extend(qs);
        }
        let sums16 = ints.chunks_exact(SUM_LEN).map(|c| c.iter().sum()).collect();
        (ints, d, dsum, sums16)
    }

    #[test]
    fn rows_quantize_as_written_out_by_hand() {
        for form in [ActForm::Int8x32, ActForm::Int16x32, ActForm::Int8x256] {
            let mut x: Vec<f32> = centered(1024, 3).iter().map(|v| v * 40.0).collect();
            // a block of zeros, NaNs, one with an infinity, negative zeros, ties and
            // values too small to survive their block's scale
            x[..32].fill(0.0);
            // (in a block's first vector, and in the last vector of a 32- and of a 256-block)
            x[40] = f32::NAN;
            x[63] = f32::NAN;
            x[511] = f32::NAN;
            x[70] = f32::INFINITY;
            x[100] = -0.0;
            x[300..332].copy_from_slice(
                &[0.5f32, -0.5, 2.5, -126.5, 1e-30, -1e-30, 127.0, -127.0].repeat(4),
            );
            let a = quantize(form, &x);
            let (ints, d, dsum, sums16) = by_hand(form, &x);
            let got: Vec<i32> = (0..x.len()).map(|i| a.int(i)).collect();
            assert_eq!(got, ints, "{form:?} integers");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.d), bits(&d), "{form:?} scales");
            assert_eq!(bits(&a.dsum), bits(&dsum), "{form:?} scaled sums");
            assert_eq!(a.sums16, sums16, "{form:?} sums of 16");
            if form == ActForm::Int8x256 {
                let narrow: Vec<i32> = a.sums16_i16.iter().map(|&s| s as i32).collect();
                assert_eq!(narrow, sums16, "{form:?} sums as i16");
            }
        }
    }
}
