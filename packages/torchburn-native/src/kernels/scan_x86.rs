//! Running sums of contiguous f32 lines in explicit AVX-512 or AVX2 instructions, accumulated in f64
//! as PyTorch's CPU scan does.
//!
//! A running sum is one dependent add per element, which the scalar loop pays in full (an f64 add's
//! latency per element, a conversion on each side). Here a block of lanes is widened to f64, summed
//! within the register in log2(lanes) shift-and-add steps, and offset by the running total carried
//! from the block before; the carry is the only dependency between blocks, one add per block. The
//! partial sums are added in another order than one at a time, both in f64: the results differ from
//! the sequential ones by f64 rounding, far below the f32 they are narrowed to.

use std::arch::x86_64::*;

/// Running sums of each of `out.len() / n` contiguous lines of `n` values of `x` into `out`, at the
/// running ISA level; false at the baseline level (the portable loop then runs).
pub fn running_sums_f32(x: &[f32], out: &mut [f32], n: usize) -> bool {
    if n == 0 {
        return true;
    }
    assert!(
        x.len() >= out.len() / n * n,
        "running sums: input shorter than the output"
    );
    let line: unsafe fn(&[f32], &mut [f32]) = if crate::isa::avx512() {
        line_avx512
    } else if crate::isa::avx2() {
        line_avx2
    } else {
        return false;
    };
    for (src, dst) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        // SAFETY: `line` is the version of the level the CPU runs; it reads `src` and writes `dst`
        // within bounds
        unsafe { line(src, dst) };
    }
    true
}

/// `valignq` with a zero vector: lanes move up by `SHIFT`, zeros come in at the bottom.
macro_rules! shift_up {
    ($v:expr, $zero:expr, $shift:literal) => {
        _mm512_castsi512_pd(_mm512_alignr_epi64::<{ 8 - $shift }>(
            _mm512_castpd_si512($v),
            _mm512_castpd_si512($zero),
        ))
    };
}

#[target_feature(enable = "avx512f")]
unsafe fn line_avx512(x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    let zero = _mm512_setzero_pd();
    let last = _mm512_set1_epi64(7);
    let mut carry = zero; // the line's total so far, in every lane
    let mut i = 0;
    while i + 8 <= n {
        let mut s = _mm512_cvtps_pd(_mm256_loadu_ps(x.as_ptr().add(i)));
        s = _mm512_add_pd(s, shift_up!(s, zero, 1));
        s = _mm512_add_pd(s, shift_up!(s, zero, 2));
        s = _mm512_add_pd(s, shift_up!(s, zero, 4));
        let total = _mm512_permutexvar_pd(last, s);
        _mm256_storeu_ps(
            out.as_mut_ptr().add(i),
            _mm512_cvtpd_ps(_mm512_add_pd(carry, s)),
        );
        carry = _mm512_add_pd(carry, total);
        i += 8;
    }
    let mut acc = _mm512_cvtsd_f64(carry);
    for j in i..n {
        acc += x[j] as f64;
        out[j] = acc as f32;
    }
}

#[target_feature(enable = "avx2")]
unsafe fn line_avx2(x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    let zero = _mm256_setzero_pd();
    let mut carry = zero;
    let mut i = 0;
    while i + 4 <= n {
        let mut s = _mm256_cvtps_pd(_mm_loadu_ps(x.as_ptr().add(i)));
        // lanes up by one and by two, zeros below
        s = _mm256_add_pd(
            s,
            _mm256_blend_pd::<0b0001>(_mm256_permute4x64_pd::<0b10_01_00_00>(s), zero),
        );
        s = _mm256_add_pd(
            s,
            _mm256_blend_pd::<0b0011>(_mm256_permute4x64_pd::<0b01_00_00_00>(s), zero),
        );
        let total = _mm256_permute4x64_pd::<0b11_11_11_11>(s);
        _mm_storeu_ps(
            out.as_mut_ptr().add(i),
            _mm256_cvtpd_ps(_mm256_add_pd(carry, s)),
        );
        carry = _mm256_add_pd(carry, total);
        i += 4;
    }
    let mut acc = _mm256_cvtsd_f64(carry);
    for j in i..n {
        acc += x[j] as f64;
        out[j] = acc as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every level against the sequential f64 sum, over line lengths around the block sizes, with
    /// large and cancelling values.
    #[test]
    fn running_sums_match_the_sequential_f64_sum() {
        for n in [1usize, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 1000] {
            let lines = 3;
            let x: Vec<f32> = (0..lines * n)
                .map(|i| ((i * 7919 % 1999) as f32 - 999.0) * if i % 5 == 0 { 1e4 } else { 0.37 })
                .collect();
            let mut want = vec![0f32; lines * n];
            for l in 0..lines {
                let mut acc = 0f64;
                for j in 0..n {
                    acc += x[l * n + j] as f64;
                    want[l * n + j] = acc as f32;
                }
            }
            let mut got = vec![f32::NAN; lines * n];
            if !running_sums_f32(&x, &mut got, n) {
                return; // the baseline level: the portable loop's own tests cover it
            }
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "n={n} at {k}: {g} vs {w}"
                );
            }
        }
    }
}
