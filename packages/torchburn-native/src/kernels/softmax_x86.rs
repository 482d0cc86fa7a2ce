//! Softmax and log-softmax over contiguous rows in explicit AVX-512 instructions.
//!
//! A row of a few thousand elements stays in L1 after its first pass, so softmax is bound by its
//! `exp`, not by memory. The portable exp ([`super::softmax`]'s `exp_nonpos_f32`) builds `2^n` from
//! integer bits in two factors so that subnormal results come out exact: about 25 vector operations
//! per 16 lanes. Here `vscalefps` multiplies by `2^n` in one instruction, rounding once as IEEE
//! arithmetic does (subnormal results included), and `maxps` clamps while keeping NaN: 14 operations.
//! Same reduction, same polynomial, same passes and special values as the portable rows.

#![allow(clippy::excessive_precision)]

use std::arch::x86_64::*;

use crate::kernels::lanes::tail_mask16;
use crate::kernels::prefetch;

use crate::kernels::math::ln_f32;

/// Softmax (or, with `log`, log-softmax) of each length-`n` row of `x` into `out`, where the CPU
/// has AVX-512F; false (nothing written) where it has not.
///
/// Panics unless `n > 0` and `x` and `out` hold the same whole number of rows.
pub fn rows_f32(x: &[f32], out: &mut [f32], n: usize, log: bool) -> bool {
    assert!(
        n > 0 && x.len().is_multiple_of(n) && out.len() == x.len(),
        "softmax rows: {} and {} elements are not whole rows of {n}",
        x.len(),
        out.len()
    );
    if crate::isa::avx512() {
        // SAFETY: the CPU has AVX-512F; every access below stays within a row of `x` or `out`
        unsafe { rows_avx512(x, out, n, log) };
        true
    } else {
        false
    }
}

/// `exp(x)` for the `x <= 0`, NaN and `-inf` that softmax feeds it (`x - max`), within 2 ULP.
///
/// `x = n·ln2 + r` with `|r| <= ln2/2` (Cody-Waite, two constants), `e^r` by the degree-7 polynomial
/// of [`crate::kernels::math::exp_f32`], then `scalef(e^r, n)`. The clamp at -104 keeps `r` small;
/// below it the result rounds to 0 anyway (`e^-103.97` is half the smallest subnormal). `maxps`
/// returns its second operand when either is NaN, so a NaN `x` passes through every step.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp_nonpos(x: __m512) -> __m512 {
    let xc = _mm512_max_ps(_mm512_set1_ps(-104.0), x);
    // t = x·log2(e) + 1.5·2^23 rounds to the nearest integer n, read back as t - 1.5·2^23
    let magic = _mm512_set1_ps(12_582_912.0);
    let n = _mm512_sub_ps(
        _mm512_fmadd_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E), magic),
        magic,
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), xc);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let p = _mm512_add_ps(
        _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r),
        _mm512_set1_ps(1.0),
    );
    _mm512_scalef_ps(p, n)
}

#[target_feature(enable = "avx512f")]
unsafe fn rows_avx512(x: &[f32], out: &mut [f32], n: usize, log: bool) {
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let (xp, op) = (xr.as_ptr(), or.as_mut_ptr());
        let m = row_max(xp, n);
        if log {
            // (x - max) - ln(sum), rounded as PyTorch does
            let ls = ln_f32(exp_sum(xp, n, m, None));
            shift_twice(xp, op, n, m, ls);
        } else {
            let inv = 1.0 / exp_sum(xp, n, m, Some(op));
            scale(op, n, inv);
        }
    }
}

/// Largest non-NaN element of `x[..n]` (`-inf` when there is none).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn row_max(x: *const f32, n: usize) -> f32 {
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    // maxps(v, acc) is `v > acc ? v : acc`: a NaN v never enters an accumulator
    let mut acc = [neg_inf; 4];
    let mut i = 0;
    while i + 64 <= n {
        for (j, a) in acc.iter_mut().enumerate() {
            prefetch::read_ahead(x.add(i + 16 * j));
            *a = _mm512_max_ps(_mm512_loadu_ps(x.add(i + 16 * j)), *a);
        }
        i += 64;
    }
    while i + 16 <= n {
        acc[0] = _mm512_max_ps(_mm512_loadu_ps(x.add(i)), acc[0]);
        i += 16;
    }
    if i < n {
        let v = _mm512_mask_loadu_ps(neg_inf, tail_mask16(n - i), x.add(i));
        acc[0] = _mm512_max_ps(v, acc[0]);
    }
    let all = _mm512_max_ps(_mm512_max_ps(acc[0], acc[1]), _mm512_max_ps(acc[2], acc[3]));
    _mm512_reduce_max_ps(all)
}

/// Sum of `exp(x[i] - m)` over `x[..n]`, also stored to `out[..n]` when given.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp_sum(x: *const f32, n: usize, m: f32, out: Option<*mut f32>) -> f32 {
    let mv = _mm512_set1_ps(m);
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= n {
        for (j, a) in acc.iter_mut().enumerate() {
            let e = exp_nonpos(_mm512_sub_ps(_mm512_loadu_ps(x.add(i + 16 * j)), mv));
            if let Some(o) = out {
                prefetch::write_ahead(o.add(i + 16 * j));
                _mm512_storeu_ps(o.add(i + 16 * j), e);
            }
            *a = _mm512_add_ps(*a, e);
        }
        i += 64;
    }
    while i + 16 <= n {
        let e = exp_nonpos(_mm512_sub_ps(_mm512_loadu_ps(x.add(i)), mv));
        if let Some(o) = out {
            _mm512_storeu_ps(o.add(i), e);
        }
        acc[0] = _mm512_add_ps(acc[0], e);
        i += 16;
    }
    if i < n {
        let k = tail_mask16(n - i);
        let e = exp_nonpos(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x.add(i)), mv));
        if let Some(o) = out {
            _mm512_mask_storeu_ps(o.add(i), k, e);
        }
        acc[0] = _mm512_mask_add_ps(acc[0], k, acc[0], e);
    }
    let all = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(all)
}

/// `out[i] = (x[i] - m) - ls` over `n` elements: log-softmax, rounded as PyTorch's.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn shift_twice(x: *const f32, out: *mut f32, n: usize, m: f32, ls: f32) {
    let (m, ls) = (_mm512_set1_ps(m), _mm512_set1_ps(ls));
    let mut i = 0;
    while i + 16 <= n {
        let v = _mm512_loadu_ps(x.add(i));
        _mm512_storeu_ps(out.add(i), _mm512_sub_ps(_mm512_sub_ps(v, m), ls));
        i += 16;
    }
    if i < n {
        let k = tail_mask16(n - i);
        let v = _mm512_maskz_loadu_ps(k, x.add(i));
        _mm512_mask_storeu_ps(out.add(i), k, _mm512_sub_ps(_mm512_sub_ps(v, m), ls));
    }
}

/// `out[i] *= s` over `n` elements.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scale(out: *mut f32, n: usize, s: f32) {
    let s = _mm512_set1_ps(s);
    let mut i = 0;
    while i + 16 <= n {
        _mm512_storeu_ps(out.add(i), _mm512_mul_ps(_mm512_loadu_ps(out.add(i)), s));
        i += 16;
    }
    if i < n {
        let k = tail_mask16(n - i);
        let v = _mm512_maskz_loadu_ps(k, out.add(i));
        _mm512_mask_storeu_ps(out.add(i), k, _mm512_mul_ps(v, s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp16(xs: [f32; 16]) -> [f32; 16] {
        let mut out = [0f32; 16];
        // SAFETY: the test runs only where AVX-512F is present
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), exp_nonpos(_mm512_loadu_ps(xs.as_ptr()))) };
        out
    }

    #[test]
    fn exp_nonpos_is_within_two_ulp_down_to_the_subnormals() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut worst = 0.0f64;
        for i in 0..=200_000u32 {
            let x = -(i as f32) * (110.0 / 200_000.0);
            let got = exp16([x; 16])[0] as f64;
            let want = (x as f64).exp();
            // error in units of the last place of the f32 nearest the true value (subnormal spacing
            // 2^-149 where the result is that small)
            let ulp = ((want as f32).abs() * f32::EPSILON).max(f32::from_bits(1)) as f64;
            worst = worst.max((got - want).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} ULP");
    }

    #[test]
    fn exp_nonpos_special_values() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut xs = [0f32; 16];
        xs[..8].copy_from_slice(&[
            0.0,
            -0.0,
            f32::NEG_INFINITY,
            f32::NAN,
            -1e30,
            -104.0,
            -87.5,
            -1.0,
        ]);
        let got = exp16(xs);
        assert_eq!(&got[..3], &[1.0, 1.0, 0.0]);
        assert!(got[3].is_nan());
        assert_eq!(&got[4..6], &[0.0, 0.0]);
        let subnormal = (-87.5f64).exp() as f32;
        assert!(subnormal < f32::MIN_POSITIVE && (got[6] - subnormal).abs() <= f32::from_bits(1));
        assert!((got[7] - (-1f32).exp()).abs() <= f32::EPSILON);
    }
}
