//! Scans (cumulative sum, product, log-sum-exp, max and min) and sorts along the middle dim of a
//! contiguous `[outer, n, inner]`, as PyTorch's CPU kernels define them.
//!
//! Sums and products of f32 accumulate in f64, as PyTorch's CPU scan does; NaN propagates through
//! every scan, and a running max/min keeps the index of the last element equal to it (PyTorch's `>=`).
//! Sorts are stable and order NaN above every number (last ascending, first descending).

use std::cmp::Ordering;

pub use crate::plan::ScanOp;

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
}

macro_rules! float_scalar {
    ($t:ty, $acc:ty) => {
        impl Scalar for $t {
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

float_scalar!(f32, f64);
float_scalar!(f64, f64);

impl Scalar for i64 {
    type Acc = i64;
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
    mut idx: Option<&mut [i64]>,
) {
    if n == 0 {
        return;
    }
    let plane = n * inner;
    for o in 0..outer {
        for j in 0..inner {
            let at = o * plane + j;
            let idx_line = idx.as_deref_mut().map(|i| &mut i[at..]);
            scan_line(op, &x[at..], &mut out[at..], idx_line, n, inner);
        }
    }
}

/// PyTorch's sort order: numbers ascending, NaN above them all.
fn ascending<T: Scalar>(a: T, b: T) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// Sorts each line of `x` (`[outer, n, inner]`, contiguous) along its middle dim, stably, and
/// writes the first `k` of each into `values` and `indices` (`[outer, k, inner]`): a full sort when
/// `k == n`, the top `k` (``topk``) otherwise.
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
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for o in 0..outer {
        for j in 0..inner {
            let base = o * n * inner + j;
            order.clear();
            order.extend(0..n);
            let at = |i: usize| x[base + i * inner];
            if descending {
                order.sort_by(|&a, &b| ascending(at(b), at(a)));
            } else {
                order.sort_by(|&a, &b| ascending(at(a), at(b)));
            }
            let out_base = o * k * inner + j;
            for (r, &i) in order.iter().take(k).enumerate() {
                values[out_base + r * inner] = at(i);
                indices[out_base + r * inner] = i as i64;
            }
        }
    }
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
}
