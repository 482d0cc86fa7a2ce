//! Scans (cumulative sum, product, log-sum-exp, max and min) and sorts along the middle dim of a
//! contiguous `[outer, n, inner]`, as PyTorch's CPU kernels define them.
//!
//! Sums and products of f32 accumulate in f64, as PyTorch's CPU scan does; NaN propagates through
//! every scan, and a running max/min keeps the index of the last element equal to it (PyTorch's `>=`).
//! Sorts are stable and order NaN above every number (last ascending, first descending).

pub use crate::plan::ScanOp;
use crate::threads::{par_chunks_mut_min, par_ranges, SendPtr};

/// A number a scan or sort runs over: f32, f64 or i64, with the wide type its sums accumulate in.
pub trait Scalar: Copy + PartialOrd + Send + Sync {
    type Acc: Copy;
    fn zero_acc() -> Self::Acc;
    fn one_acc() -> Self::Acc;
    fn add(acc: Self::Acc, x: Self) -> Self::Acc;
    fn mul(acc: Self::Acc, x: Self) -> Self::Acc;
    fn narrow(acc: Self::Acc) -> Self;
    fn is_nan(self) -> bool;
    /// log(exp(a) + exp(b)), NaN-propagating; only floats reach it.
    fn logaddexp(a: Self, b: Self) -> Self;
    /// An unsigned key in the sort order: equal for values the sort treats as equal (-0.0 and 0.0,
    /// every NaN), NaN above every number.
    fn sort_key(self) -> u64;
    /// Running sums of the contiguous lines of `n` in `x` into `out` in explicit SIMD, where this
    /// type and the CPU have such a kernel; false where the portable loop must run.
    fn simd_running_sums(x: &[Self], out: &mut [Self], n: usize) -> bool;
}

macro_rules! float_scalar {
    ($t:ty, $acc:ty, $bits:ty, $sums:expr) => {
        impl Scalar for $t {
            fn simd_running_sums(x: &[$t], out: &mut [$t], n: usize) -> bool {
                ($sums)(x, out, n)
            }
            type Acc = $acc;
            fn zero_acc() -> $acc {
                0.0
            }
            fn one_acc() -> $acc {
                1.0
            }
            fn add(acc: $acc, x: $t) -> $acc {
                acc + x as $acc
            }
            fn mul(acc: $acc, x: $t) -> $acc {
                acc * x as $acc
            }
            fn narrow(acc: $acc) -> $t {
                acc as $t
            }
            fn is_nan(self) -> bool {
                self.is_nan()
            }
            fn sort_key(self) -> u64 {
                if self.is_nan() {
                    return u64::MAX;
                }
                // +0.0 for both zeros; then flip the sign bit of positives and every bit of
                // negatives, so that unsigned order is numeric order
                let bits = (if self == 0.0 { 0.0 } else { self }).to_bits();
                let sign = 1 << (<$bits>::BITS - 1);
                (if bits & sign != 0 { !bits } else { bits | sign }) as u64
            }
            fn logaddexp(a: $t, b: $t) -> $t {
                if a.is_nan() || b.is_nan() {
                    return <$t>::NAN;
                }
                let (hi, lo) = if a >= b { (a, b) } else { (b, a) };
                if hi == <$t>::NEG_INFINITY {
                    return hi; // both -inf: exp sums to 0
                }
                if hi == <$t>::INFINITY {
                    return hi;
                }
                hi + (lo - hi).exp().ln_1p()
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
float_scalar!(f32, f64, u32, super::scan_x86::running_sums_f32);
#[cfg(not(target_arch = "x86_64"))]
float_scalar!(f32, f64, u32, |_: &[f32], _: &mut [f32], _| false);
float_scalar!(f64, f64, u64, |_: &[f64], _: &mut [f64], _| false);

impl Scalar for i64 {
    type Acc = i64;
    fn simd_running_sums(_: &[i64], _: &mut [i64], _: usize) -> bool {
        false
    }
    fn zero_acc() -> i64 {
        0
    }
    fn one_acc() -> i64 {
        1
    }
    fn add(acc: i64, x: i64) -> i64 {
        acc.wrapping_add(x)
    }
    fn mul(acc: i64, x: i64) -> i64 {
        acc.wrapping_mul(x)
    }
    fn narrow(acc: i64) -> i64 {
        acc
    }
    fn is_nan(self) -> bool {
        false
    }
    fn logaddexp(a: i64, b: i64) -> i64 {
        a.max(b)
    }
    fn sort_key(self) -> u64 {
        (self as u64) ^ (1 << 63)
    }
}

/// One scan of `n` values `stride` apart, from `x` into `out` (and the running arg into `idx` for
/// max/min).
fn scan_line<T: Scalar>(
    op: ScanOp,
    x: &[T],
    out: &mut [T],
    mut idx: Option<&mut [i64]>,
    n: usize,
    stride: usize,
) {
    match op {
        ScanOp::Sum | ScanOp::Prod => {
            let mut acc = if op == ScanOp::Sum {
                T::zero_acc()
            } else {
                T::one_acc()
            };
            for i in 0..n {
                let v = x[i * stride];
                acc = if op == ScanOp::Sum {
                    T::add(acc, v)
                } else {
                    T::mul(acc, v)
                };
                out[i * stride] = T::narrow(acc);
            }
        }
        ScanOp::Logsumexp => {
            let mut run = x[0];
            out[0] = run;
            for i in 1..n {
                run = T::logaddexp(run, x[i * stride]);
                out[i * stride] = run;
            }
        }
        ScanOp::Max | ScanOp::Min => {
            let mut best = x[0];
            let mut at = 0usize;
            for i in 0..n {
                let v = x[i * stride];
                let better = if op == ScanOp::Max {
                    v >= best
                } else {
                    v <= best
                };
                if v.is_nan() || (!best.is_nan() && better) {
                    best = v;
                    at = i;
                }
                out[i * stride] = best;
                if let Some(idx) = idx.as_deref_mut() {
                    idx[i * stride] = at as i64;
                }
            }
        }
    }
}

/// Scans `x` (`[outer, n, inner]`, contiguous) along its middle dim into `out` (and `idx`).
pub fn scan<T: Scalar>(
    op: ScanOp,
    outer: usize,
    n: usize,
    inner: usize,
    x: &[T],
    out: &mut [T],
    idx: Option<&mut [i64]>,
) {
    if n == 0 {
        return;
    }
    let plane = n * inner;
    // planes are disjoint: one task takes at least ~16K elements' worth
    let min_planes = (16384 / plane.max(1)).max(1);
    let out = &mut out[..outer * plane];
    if inner == 1 && idx.is_none() && matches!(op, ScanOp::Sum | ScanOp::Prod) {
        // a running sum is one long dependency chain: GROUP lines side by side keep the adder busy
        let groups_per_task = (min_planes / GROUP).max(1);
        par_chunks_mut_min(out, n * GROUP, groups_per_task, |g, chunk| {
            let xs = &x[g * GROUP * n..];
            if op == ScanOp::Sum && T::simd_running_sums(&xs[..chunk.len()], chunk, n) {
                return;
            }
            if chunk.len() == GROUP * n {
                scan_group(op, xs, chunk, n);
            } else {
                for l in 0..chunk.len() / n {
                    scan_line(op, &xs[l * n..], &mut chunk[l * n..], None, n, 1);
                }
            }
        });
        return;
    }
    match idx {
        None => par_chunks_mut_min(out, plane, min_planes, |o, chunk| {
            for j in 0..inner {
                scan_line(op, &x[o * plane + j..], &mut chunk[j..], None, n, inner);
            }
        }),
        Some(idx) => {
            assert!(idx.len() >= outer * plane);
            let ip = SendPtr(idx.as_mut_ptr());
            par_chunks_mut_min(out, plane, min_planes, |o, chunk| {
                // SAFETY: plane `o` of the indices, like that of `out`, belongs to this task alone
                let idx_plane =
                    unsafe { std::slice::from_raw_parts_mut(ip.get().add(o * plane), plane) };
                for j in 0..inner {
                    scan_line(
                        op,
                        &x[o * plane + j..],
                        &mut chunk[j..],
                        Some(&mut idx_plane[j..]),
                        n,
                        inner,
                    );
                }
            });
        }
    }
}

const GROUP: usize = 8;

/// Sums or products of `GROUP` contiguous lines of `n` at once, each exactly as [`scan_line`] would.
fn scan_group<T: Scalar>(op: ScanOp, x: &[T], out: &mut [T], n: usize) {
    let sum = op == ScanOp::Sum;
    let mut acc = [if sum { T::zero_acc() } else { T::one_acc() }; GROUP];
    let (x, out) = (&x[..GROUP * n], &mut out[..GROUP * n]);
    for i in 0..n {
        for (l, a) in acc.iter_mut().enumerate() {
            let v = x[l * n + i];
            *a = if sum { T::add(*a, v) } else { T::mul(*a, v) };
            out[l * n + i] = T::narrow(*a);
        }
    }
}

/// Sorts each line of `x` (`[outer, n, inner]`, contiguous) along its middle dim, stably, and
/// writes the first `k` of each into `values` and `indices` (`[outer, k, inner]`): a full sort when
/// `k == n`, the top `k` (``topk``) otherwise.
///
/// Each element becomes one integer, its order key above its position, so an unstable sort of the
/// integers is the stable sort of the values; for a small `k` a selection splits off the first `k`
/// before they alone are sorted. Lines run in parallel.
#[allow(clippy::too_many_arguments)]
pub fn sort<T: Scalar>(
    outer: usize,
    n: usize,
    inner: usize,
    k: usize,
    descending: bool,
    x: &[T],
    values: &mut [T],
    indices: &mut [i64],
) {
    assert!(
        x.len() >= outer * n * inner
            && values.len() >= outer * k * inner
            && indices.len() >= outer * k * inner
    );
    assert!(
        n <= u32::MAX as usize,
        "sort: a line of {n} elements is longer than 2^32"
    );
    if k == 0 {
        return;
    }
    let (vp, ip) = (SendPtr(values.as_mut_ptr()), SendPtr(indices.as_mut_ptr()));
    let lines = outer * inner;
    par_ranges(lines, (4096 / n.max(1)).max(1), |lo, hi| {
        let mut keyed: Vec<u128> = Vec::with_capacity(n);
        for line in lo..hi {
            let (o, j) = (line / inner, line % inner);
            let base = o * n * inner + j;
            keyed.clear();
            keyed.extend((0..n).map(|i| {
                let key = x[base + i * inner].sort_key();
                let key = if descending { !key } else { key };
                ((key as u128) << 32) | i as u128
            }));
            if k < n && k <= n / 4 {
                keyed.select_nth_unstable(k - 1);
                keyed[..k].sort_unstable();
            } else {
                keyed.sort_unstable();
            }
            let out_base = o * k * inner + j;
            for (r, &entry) in keyed[..k].iter().enumerate() {
                let i = (entry as u32) as usize;
                // SAFETY: each line writes only its own k positions; lines are split between tasks
                unsafe {
                    *vp.get().add(out_base + r * inner) = x[base + i * inner];
                    *ip.get().add(out_base + r * inner) = i as i64;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_sum_and_product_along_each_dim() {
        // [2, 3, 2]: scan along the middle dim
        let x: Vec<f32> = (1..=12).map(|v| v as f32).collect();
        let mut out = vec![0.0f32; 12];
        scan(ScanOp::Sum, 2, 3, 2, &x, &mut out, None);
        assert_eq!(
            out,
            vec![1., 2., 4., 6., 9., 12., 7., 8., 16., 18., 27., 30.]
        );
        scan(ScanOp::Prod, 1, 4, 1, &x[..4], &mut out[..4], None);
        assert_eq!(&out[..4], &[1., 2., 6., 24.]);
    }

    #[test]
    fn running_max_keeps_the_last_equal_index_and_nan_sticks() {
        let x = [1.0f32, 3.0, 3.0, 2.0, f32::NAN, 5.0];
        let mut out = [0.0f32; 6];
        let mut idx = [0i64; 6];
        scan(ScanOp::Max, 1, 6, 1, &x, &mut out, Some(&mut idx));
        assert_eq!(&out[..4], &[1.0, 3.0, 3.0, 3.0]);
        assert!(out[4].is_nan() && out[5].is_nan());
        assert_eq!(idx, [0, 1, 2, 2, 4, 4]);
    }

    #[test]
    fn logcumsumexp_matches_the_direct_formula() {
        let x = [0.5f64, -1.0, 2.0, f64::NEG_INFINITY];
        let mut out = [0.0f64; 4];
        scan(ScanOp::Logsumexp, 1, 4, 1, &x, &mut out, None);
        let mut direct = 0.0;
        for (i, &v) in x.iter().enumerate() {
            direct += v.exp();
            assert!((out[i] - direct.ln()).abs() < 1e-12);
        }
    }

    #[test]
    fn sort_is_stable_puts_nan_last_and_topk_takes_the_first_k() {
        let x = [3.0f32, f32::NAN, 1.0, 3.0, -2.0];
        let (mut v, mut i) = ([0.0f32; 5], [0i64; 5]);
        sort(1, 5, 1, 5, false, &x, &mut v, &mut i);
        assert_eq!(&v[..4], &[-2.0, 1.0, 3.0, 3.0]);
        assert!(v[4].is_nan());
        assert_eq!(i, [4, 2, 0, 3, 1]);
        let (mut v2, mut i2) = ([0.0f32; 2], [0i64; 2]);
        sort(1, 5, 1, 2, true, &x, &mut v2, &mut i2);
        assert!(v2[0].is_nan() && v2[1] == 3.0);
        assert_eq!(i2, [1, 0]);
    }

    /// The stable comparison sort the keyed sort must equal, written out directly.
    fn reference_sort(x: &[f32], descending: bool) -> Vec<usize> {
        let rank = |v: f32| {
            if v.is_nan() {
                (1, 0.0)
            } else {
                (0, if v == 0.0 { 0.0 } else { v })
            }
        };
        let mut order: Vec<usize> = (0..x.len()).collect();
        order.sort_by(|&a, &b| {
            let (ra, rb) = (rank(x[a]), rank(x[b]));
            let o = ra.0.cmp(&rb.0).then(ra.1.partial_cmp(&rb.1).unwrap());
            if descending {
                o.reverse()
            } else {
                o
            }
        });
        order
    }

    #[test]
    fn keyed_sort_and_selection_equal_a_stable_comparison_sort_with_ties_zeros_and_nan() {
        let mut state = 12345u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        // few distinct values (many ties), both zeros, infinities and NaN
        let palette = [
            0.0f32,
            -0.0,
            1.5,
            -1.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            7.0,
        ];
        let (outer, n, inner) = (3, 257, 2);
        let x: Vec<f32> = (0..outer * n * inner)
            .map(|_| palette[next() as usize % palette.len()])
            .collect();
        for descending in [false, true] {
            for k in [1, 5, 64, 200, n] {
                let (mut v, mut i) = (
                    vec![0.0f32; outer * k * inner],
                    vec![0i64; outer * k * inner],
                );
                sort(outer, n, inner, k, descending, &x, &mut v, &mut i);
                for o in 0..outer {
                    for j in 0..inner {
                        let line: Vec<f32> =
                            (0..n).map(|t| x[o * n * inner + t * inner + j]).collect();
                        let want = reference_sort(&line, descending);
                        for r in 0..k {
                            let at = o * k * inner + r * inner + j;
                            assert_eq!(
                                i[at] as usize, want[r],
                                "k {k} descending {descending} line {o},{j} rank {r}"
                            );
                            assert_eq!(v[at].to_bits(), line[want[r]].to_bits());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn integer_keys_order_negatives_first() {
        let x = [5i64, i64::MIN, -1, 0, i64::MAX, -1];
        let (mut v, mut i) = ([0i64; 6], [0i64; 6]);
        sort(1, 6, 1, 6, false, &x, &mut v, &mut i);
        assert_eq!(v, [i64::MIN, -1, -1, 0, 5, i64::MAX]);
        assert_eq!(i, [1, 2, 5, 3, 0, 4]);
    }

    #[test]
    fn grouped_running_sums_equal_one_line_at_a_time() {
        let (outer, n) = (19, 37); // two full groups of 8 and a short one
        let x: Vec<f32> = (0..outer * n)
            .map(|i| ((i * 7919) % 113) as f32 * 0.37 - 20.0)
            .collect();
        for op in [ScanOp::Sum, ScanOp::Prod] {
            let mut grouped = vec![0.0f32; outer * n];
            scan(op, outer, n, 1, &x, &mut grouped, None);
            for o in 0..outer {
                let mut line = vec![0.0f32; n];
                scan_line(op, &x[o * n..], &mut line, None, n, 1);
                assert_eq!(&grouped[o * n..(o + 1) * n], &line[..], "{op:?} line {o}");
            }
        }
    }
}
