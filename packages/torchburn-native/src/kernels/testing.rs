//! Test data shared by the kernels' unit tests.

/// `len` reproducible values, uniform in [0, 1), from `seed` (xorshift64: no dependency, the same
/// sequence on every platform).
pub fn uniform(len: usize, seed: u64) -> impl Iterator<Item = f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len).map(move |_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// `len` reproducible f32 values, uniform in [-0.5, 0.5), from `seed`.
pub fn centered(len: usize, seed: u64) -> Vec<f32> {
    uniform(len, seed).map(|u| (u - 0.5) as f32).collect()
}
