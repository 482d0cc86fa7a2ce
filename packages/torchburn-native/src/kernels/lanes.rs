//! Combining the independent accumulators ("lanes") that row kernels keep to hide add latency.

/// `acc`'s lanes combined by pairwise halving: `log2(N)` dependent vector steps where an in-order fold
/// is a chain of `N - 1` scalar ones. A layer-norm row folds three 32-lane accumulators, and on a
/// 1024-wide row the chains were a third of its time (one thread, in cache: 187 -> 132 ns per row).
/// (An earlier pairwise form made LLVM's SLP vectorizer rebuild the callers' lane loops with 2-wide
/// vectors, 4x slower; this one, splitting the halves off as slices, keeps them as they were.)
///
/// `N` must be a power of two. Inlined into the callers' per-ISA clones, like the closure.
#[inline(always)]
pub fn halve<T: Copy, const N: usize>(mut acc: [T; N], combine: impl Fn(T, T) -> T) -> T {
    debug_assert!(N.is_power_of_two());
    let mut width = N;
    while width > 1 {
        width /= 2;
        let (lo, hi) = acc.split_at_mut(width);
        for (a, &b) in lo.iter_mut().zip(&hi[..width]) {
            *a = combine(*a, b);
        }
    }
    acc[0]
}

/// The largest of `xs` (negative infinity for none), in sixteen running maxima: one fold over a
/// slice is a chain of dependent scalar steps, which a softmax over a few hundred scores paid per
/// (token, head). A NaN never wins a comparison, as it never wins `f32::max`; the maximum of
/// numbers does not depend on their order, so the result is the fold's.
#[inline(always)]
pub fn max16(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let chunks = xs.chunks_exact(16);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &v) in acc.iter_mut().zip(chunk) {
            if v > *m {
                *m = v;
            }
        }
    }
    for (m, &v) in acc.iter_mut().zip(tail) {
        if v > *m {
            *m = v;
        }
    }
    halve(acc, |a, b| if b > a { b } else { a })
}

/// The sum of `xs` in sixteen running sums, combined pairwise (vectorizes, and rounds less than an
/// in-order sum).
#[inline(always)]
pub fn sum16(xs: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = xs.chunks_exact(16);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += v;
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        *a += v;
    }
    halve(acc, |a, b| a + b)
}

/// An AVX-512 mask of lanes `0 .. len` (`len < 16`): the tail of a row shorter than a vector, for
/// masked loads and stores.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn tail_mask16(len: usize) -> std::arch::x86_64::__mmask16 {
    debug_assert!(len < 16);
    ((1u32 << len) - 1) as u16
}

#[cfg(test)]
mod tests {
    use super::{halve, max16, sum16};

    #[test]
    fn halving_sums_and_maxes_every_lane() {
        let acc: [f64; 32] = std::array::from_fn(|i| (i * i) as f64);
        assert_eq!(
            halve(acc, |a, b| a + b),
            (0..32).map(|i| (i * i) as f64).sum::<f64>()
        );
        assert_eq!(halve(acc, f64::max), 961.0);
        assert_eq!(halve([7.0f32], |a, b| a + b), 7.0);
    }

    #[test]
    fn max_and_sum_of_sixteen_lanes_match_the_folds() {
        for len in [0usize, 1, 5, 16, 17, 100, 257] {
            let xs: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25)
                .collect();
            let fold = xs.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            assert_eq!(max16(&xs), fold, "max of {len}");
            let exact: f64 = xs.iter().map(|&v| v as f64).sum();
            assert!(
                (sum16(&xs) as f64 - exact).abs() <= 1e-5 * (1.0 + exact.abs()),
                "sum of {len}"
            );
        }
        // a NaN is passed over, as f32::max passes over it
        assert_eq!(max16(&[1.0, f32::NAN, 3.0]), 3.0);
    }
}
