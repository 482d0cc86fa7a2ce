//! Layer norm over contiguous f32 rows in explicit AVX-512 instructions.
//!
//! The same statistics as [`super::norm`] (deviations from the mean of the row's first 32
//! elements, summed in f32 lanes, merged in f64; redone around the row's own mean when that first
//! guess was poor) and the same output form, `((x - mean_hi)·rstd - mean_lo·rstd)·w + b`. What
//! changes is the code: four independent accumulators per sum, masked tails instead of scalar
//! loops, and no per-row division by the count. Rows wider than one statistics block (2048)
//! stay on the portable path, which merges blocks.
//!
//! Layer norm over 4096 rows of 1024 is bound by memory, but only once a row's arithmetic takes
//! less time than its loads: the portable rows spent 159 ns on a cache-resident 1024-wide row.

use std::arch::x86_64::*;

use crate::kernels::lanes::tail_mask16;
use crate::kernels::prefetch;

/// Rows up to this wide take this path: one statistics block of [`super::norm`].
pub const MAX_ROW: usize = 2048;
/// Elements whose mean is the first guess of a row's mean (the portable path's `LANES`).
const HEAD: usize = 32;

/// Layer norm of each length-`n` row of `x` into `out` (and its mean and rstd per row, if asked),
/// where the CPU has AVX-512F and `0 < n <= MAX_ROW`; false (nothing written) otherwise.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_rows_f32(
    n: usize,
    x: &[f32],
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    eps: f64,
    out: &mut [f32],
    mean: Option<&mut [f32]>,
    rstd: Option<&mut [f32]>,
) -> bool {
    if n == 0 || n > MAX_ROW || !crate::isa::avx512() {
        return false;
    }
    let rows = x.len() / n;
    assert!(
        x.len() == rows * n
            && out.len() == x.len()
            && w.is_none_or(|w| w.len() >= n)
            && b.is_none_or(|b| b.len() >= n)
            && mean.as_ref().is_none_or(|m| m.len() >= rows)
            && rstd.as_ref().is_none_or(|s| s.len() >= rows),
        "layer norm rows: operand lengths do not fit {rows} rows of {n}"
    );
    // SAFETY: the CPU has AVX-512F; every access stays within the rows checked above
    unsafe { rows_avx512(n, x, w, b, eps, out, mean, rstd) };
    true
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn rows_avx512(
    n: usize,
    x: &[f32],
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    eps: f64,
    out: &mut [f32],
    mut mean: Option<&mut [f32]>,
    mut rstd: Option<&mut [f32]>,
) {
    let (count, inv_count) = (n as f64, 1.0 / n as f64);
    let head = n.min(HEAD);
    let inv_head = 1.0 / head as f64;
    for (r, (xr, or)) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)).enumerate() {
        let xp = xr.as_ptr();
        let c = (sum(xp, head) as f64 * inv_head) as f32;
        let (d1, d2) = deviations(xp, n, c);
        let (d1, d2) = (d1 as f64, d2 as f64);
        let mut m2 = d2 - d1 * d1 * inv_count;
        let mut mu = c as f64 + d1 * inv_count;
        if d2 > 2.0 * m2 {
            // the first guess was far from the mean (a sorted or patterned row): around its own
            let c = (sum(xp, n) as f64 / count) as f32;
            let (d1, d2) = deviations(xp, n, c);
            let (d1, d2) = (d1 as f64, d2 as f64);
            m2 = d2 - d1 * d1 * inv_count;
            mu = c as f64 + d1 * inv_count;
        }
        if m2.is_nan() {
            mu = f64::NAN;
        }
        let var = m2 * inv_count;
        let var = if var < 0.0 { 0.0 } else { var };
        let scale = 1.0 / (var + eps).sqrt();
        // the mean as hi + lo: (x - hi)·scale - lo·scale, as if the mean were exact
        let hi = mu as f32;
        let shift = (-(mu - hi as f64) * scale) as f32;
        let scale = scale as f32;
        affine(xp, or.as_mut_ptr(), n, hi, scale, shift, w, b);
        if let Some(m) = mean.as_deref_mut() {
            m[r] = hi;
        }
        if let Some(s) = rstd.as_deref_mut() {
            s[r] = scale;
        }
    }
}

/// `Σ x[..n]` in f32 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn sum(x: *const f32, n: usize) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut i = 0;
    while i + 32 <= n {
        acc[0] = _mm512_add_ps(acc[0], _mm512_loadu_ps(x.add(i)));
        acc[1] = _mm512_add_ps(acc[1], _mm512_loadu_ps(x.add(i + 16)));
        i += 32;
    }
    while i + 16 <= n {
        acc[0] = _mm512_add_ps(acc[0], _mm512_loadu_ps(x.add(i)));
        i += 16;
    }
    if i < n {
        acc[1] = _mm512_add_ps(acc[1], _mm512_maskz_loadu_ps(tail_mask16(n - i), x.add(i)));
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]))
}

/// `(Σ (x - c), Σ (x - c)²)` over `x[..n]`, four accumulators each.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn deviations(x: *const f32, n: usize, c: f32) -> (f32, f32) {
    let cv = _mm512_set1_ps(c);
    let mut s1 = [_mm512_setzero_ps(); 4];
    let mut s2 = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= n {
        for j in 0..4 {
            prefetch::read_ahead(x.add(i + 16 * j));
            let d = _mm512_sub_ps(_mm512_loadu_ps(x.add(i + 16 * j)), cv);
            s1[j] = _mm512_add_ps(s1[j], d);
            s2[j] = _mm512_fmadd_ps(d, d, s2[j]);
        }
        i += 64;
    }
    let mut j = 0;
    while i + 16 <= n {
        let d = _mm512_sub_ps(_mm512_loadu_ps(x.add(i)), cv);
        s1[j] = _mm512_add_ps(s1[j], d);
        s2[j] = _mm512_fmadd_ps(d, d, s2[j]);
        i += 16;
        j = (j + 1) % 4;
    }
    if i < n {
        let k = tail_mask16(n - i);
        let d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x.add(i)), cv);
        s1[j] = _mm512_add_ps(s1[j], d);
        s2[j] = _mm512_fmadd_ps(d, d, s2[j]);
    }
    let fold = |s: [__m512; 4]| _mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3]));
    (
        _mm512_reduce_add_ps(fold(s1)),
        _mm512_reduce_add_ps(fold(s2)),
    )
}

/// `out = ((x - hi)·scale + shift)·w + b` over `n` elements (`w`, `b` 1 and 0 when absent).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn affine(
    x: *const f32,
    out: *mut f32,
    n: usize,
    hi: f32,
    scale: f32,
    shift: f32,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
) {
    let (hi, scale, shift) = (
        _mm512_set1_ps(hi),
        _mm512_set1_ps(scale),
        _mm512_set1_ps(shift),
    );
    let (wp, bp) = (w.map(|w| w.as_ptr()), b.map(|b| b.as_ptr()));
    let mut i = 0;
    while i < n {
        let k = if i + 16 <= n {
            0xffff
        } else {
            tail_mask16(n - i)
        };
        prefetch::write_ahead(out.add(i));
        let t = _mm512_fmadd_ps(
            _mm512_sub_ps(_mm512_maskz_loadu_ps(k, x.add(i)), hi),
            scale,
            shift,
        );
        let y = match (wp, bp) {
            (Some(w), Some(b)) => _mm512_fmadd_ps(
                t,
                _mm512_maskz_loadu_ps(k, w.add(i)),
                _mm512_maskz_loadu_ps(k, b.add(i)),
            ),
            (Some(w), None) => _mm512_mul_ps(t, _mm512_maskz_loadu_ps(k, w.add(i))),
            (None, Some(b)) => _mm512_add_ps(t, _mm512_maskz_loadu_ps(k, b.add(i))),
            (None, None) => t,
        };
        _mm512_mask_storeu_ps(out.add(i), k, y);
        i += 16;
    }
}
