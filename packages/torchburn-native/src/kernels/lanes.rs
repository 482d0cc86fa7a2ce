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
    use super::halve;

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
}
