//! Exact-erf GELU over a slice in explicit AVX-512 or AVX2 instructions.
//!
//! The portable form in [`super::math`] ends its erf with a division, and a vector division is the
//! slowest instruction in the loop (about ten cycles per 16 lanes, not pipelined): it alone made the
//! in-cache GELU 20% slower than the same polynomial without it. Here the quotient comes from the
//! hardware reciprocal estimate refined by one Newton step, which LLVM will not emit from portable
//! code (it needs permission to reassociate the division), and the clamp and the infinities take one
//! instruction each (`vrangeps`, `vfixupimmps`). Same rational, same clamp; the results differ from
//! the portable form's by an ulp or two of erf, below its fit error.

#![allow(clippy::excessive_precision)]

use super::prefetch;
use std::arch::x86_64::*;

/// `erf(z) = z·p(z²)/q(z²)`, the fit of [`super::math`], with `z = x/√2` and GELU's one half folded in:
/// with `s = x²`, `erf(x/√2)/2 = x·P(s)/Q(s)` where `P_i = p_i·2^-i/(2√2)` and `Q_i = q_i·2^-i`
/// (highest power first), so that `gelu(x) = x·(1/2 + x·P(s)/Q(s))`.
const P: [f32; 7] = fold(
    [
        1.911_311_7e-8,
        -1.942_338e-6,
        1.472_677_6e-4,
        3.989_622_5e-3,
        5.152_175e-2,
        2.071_018_5e-1,
        std::f64::consts::FRAC_2_SQRT_PI,
    ],
    0.5 * std::f64::consts::FRAC_1_SQRT_2,
);
const Q: [f32; 5] = fold(
    [
        1.020_896_4e-3,
        1.495_608_3e-2,
        1.179_610_5e-1,
        5.168_705e-1,
        1.0,
    ],
    1.0,
);
/// Beyond |x/√2| = 4 erf is ±1 in f32 (and the rational is fitted only that far).
const CLAMP: f32 = 4.0 * std::f32::consts::SQRT_2;

const fn fold<const N: usize>(c: [f64; N], scale: f64) -> [f32; N] {
    let mut out = [0f32; N];
    let mut i = 0;
    while i < N {
        // c[i] multiplies t^(N-1-i) and t = s/2
        let mut k = c[i] * scale;
        let mut j = 0;
        while j < N - 1 - i {
            k *= 0.5;
            j += 1;
        }
        out[i] = k as f32;
        i += 1;
    }
    out
}

/// GELU of `a` into `out` (same length) at the running ISA level: AVX-512 (F and DQ) or AVX2 + FMA;
/// false at the baseline level (the portable loop then runs).
pub fn gelu_f32(a: &[f32], out: &mut [f32]) -> bool {
    debug_assert_eq!(a.len(), out.len());
    if crate::isa::avx512() {
        // SAFETY: the CPU has AVX-512F and DQ; the function reads and writes only within the slices
        unsafe { gelu_avx512(a, out) };
        true
    } else if crate::isa::avx2() {
        // SAFETY: the CPU has AVX2 and FMA; the function reads and writes only within the slices
        unsafe { gelu_avx2(a, out) };
        true
    } else {
        false
    }
}

/// The AVX-512 loop's arithmetic in eight lanes. AVX2 has neither `vrangeps` nor `vfixupimmps`: the
/// clamp is a min and a max whose operand order keeps NaN (the second operand wins when one is NaN),
/// -inf comes out NaN by itself (-inf times the exact 0 that `max(0, ·)` gives at the clamp), and +inf
/// is blended to NaN where the process's eager kernel gives NaN there.
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_avx2(a: &[f32], out: &mut [f32]) {
    let n = a.len().min(out.len());
    let (clamp, low, half) = (
        _mm256_set1_ps(CLAMP),
        _mm256_set1_ps(-CLAMP),
        _mm256_set1_ps(0.5),
    );
    let (infinity, nan) = (_mm256_set1_ps(f32::INFINITY), _mm256_set1_ps(f32::NAN));
    let pos_inf_nan = super::math::gelu_positive_infinity_nan();
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_loadu_ps(a.as_ptr().add(i));
        let xc = _mm256_max_ps(low, _mm256_min_ps(clamp, x));
        let s = _mm256_mul_ps(xc, xc);
        let mut p = _mm256_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(c));
        }
        let mut q = _mm256_set1_ps(Q[0]);
        for &c in &Q[1..] {
            q = _mm256_fmadd_ps(q, s, _mm256_set1_ps(c));
        }
        // a 12-bit reciprocal estimate, then one Newton step on the quotient itself
        let num = _mm256_mul_ps(xc, p);
        let r = _mm256_rcp_ps(q);
        let y = _mm256_mul_ps(num, r);
        let half_erf = _mm256_fmadd_ps(_mm256_fnmadd_ps(q, y, num), r, y);
        let phi = _mm256_max_ps(_mm256_setzero_ps(), _mm256_add_ps(half, half_erf));
        let mut g = _mm256_mul_ps(x, phi);
        if pos_inf_nan {
            g = _mm256_blendv_ps(g, nan, _mm256_cmp_ps::<_CMP_EQ_OQ>(x, infinity));
        }
        _mm256_storeu_ps(out.as_mut_ptr().add(i), g);
        i += 8;
    }
    for j in i..n {
        out[j] = super::math::gelu_f32(a[j]);
    }
}

/// `vfixupimmps` table: lanes whose input is -inf (class 4) become the default NaN (response 3), as
/// PyTorch's GELU gives there, and +inf (class 5) NaN or +inf (response 5) by
/// [`super::math::gelu_positive_infinity_nan`]; every other class keeps the computed value (0).
const NEG_INFINITY_TO_NAN: i32 = 3 << 16;
const POS_INFINITY_TO_NAN: i32 = 3 << 20;
const POS_INFINITY_KEPT: i32 = 5 << 20;
/// `vrangeps` control: the smaller absolute value (0b10) with the sign of the first operand (0b00 << 2),
/// which clamps x to [-CLAMP, CLAMP] in one instruction (and keeps NaN).
const CLAMP_KEEPING_SIGN: i32 = 0b0010;

#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn gelu_avx512(a: &[f32], out: &mut [f32]) {
    let n = a.len().min(out.len());
    let (clamp, half) = (_mm512_set1_ps(CLAMP), _mm512_set1_ps(0.5));
    let pos_inf = if super::math::gelu_positive_infinity_nan() {
        POS_INFINITY_TO_NAN
    } else {
        POS_INFINITY_KEPT
    };
    let fixup = _mm512_set1_epi32(NEG_INFINITY_TO_NAN | pos_inf);
    let mut i = 0;
    while i + 16 <= n {
        prefetch::read_ahead(a.as_ptr().add(i));
        prefetch::write_ahead(out.as_ptr().add(i));
        let x = _mm512_loadu_ps(a.as_ptr().add(i));
        let xc = _mm512_range_ps::<CLAMP_KEEPING_SIGN>(x, clamp);
        let s = _mm512_mul_ps(xc, xc);
        let mut p = _mm512_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(c));
        }
        let mut q = _mm512_set1_ps(Q[0]);
        for &c in &Q[1..] {
            q = _mm512_fmadd_ps(q, s, _mm512_set1_ps(c));
        }
        // erf/2 = num/q: a 14-bit reciprocal estimate, then one Newton step on the quotient itself
        let num = _mm512_mul_ps(xc, p);
        let r = _mm512_rcp14_ps(q);
        let y = _mm512_mul_ps(num, r);
        let half_erf = _mm512_fmadd_ps(_mm512_fnmadd_ps(q, y, num), r, y);
        // Φ(x) = 1/2 + erf/2. At the clamp's low end the fit lands a few 1e-8 below zero, which
        // times a large negative x would be far off; max(0, ·) makes it the exact 0 (-0 out, as
        // PyTorch). Its second operand wins when one is NaN, so NaN stays NaN.
        let phi = _mm512_max_ps(_mm512_setzero_ps(), _mm512_add_ps(half, half_erf));
        let g = _mm512_mul_ps(x, phi);
        let g = _mm512_fixupimm_ps::<0>(g, x, fixup);
        _mm512_storeu_ps(out.as_mut_ptr().add(i), g);
        i += 16;
    }
    for j in i..n {
        out[j] = super::math::gelu_f32(a[j]);
    }
}
