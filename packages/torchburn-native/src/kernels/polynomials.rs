//! The classical orthogonal polynomials of `torch.special`, `P_n(x)` with the degree `n` an operand.
//!
//! Each follows PyTorch's own evaluation so that results agree to rounding: the three-term recurrence
//! from `P_0` and `P_1`, stopped early once it turns NaN; for the Chebyshev kinds on the open interval
//! (-1, 1) and a degree past a few, the trigonometric closed form, which does not accumulate error.
//! The degree is the operand truncated toward zero; a degree that is negative, NaN, infinite or beyond
//! `i64` gives 0, as PyTorch's conversion to `int64` does on every platform it ships. Hermite
//! polynomials past degree 128 (f32) or 512 (f64) overflow anyway and are NaN, as in PyTorch.
//!
//! The shifted Chebyshev polynomials are these at `2x - 1`, composed in core.

/// The functions for one float type.
pub trait Orthogonal: Sized {
    fn chebyshev_t(x: Self, n: Self) -> Self;
    fn chebyshev_u(x: Self, n: Self) -> Self;
    fn chebyshev_v(x: Self, n: Self) -> Self;
    fn chebyshev_w(x: Self, n: Self) -> Self;
    fn hermite_h(x: Self, n: Self) -> Self;
    fn hermite_he(x: Self, n: Self) -> Self;
    fn laguerre_l(x: Self, n: Self) -> Self;
    fn legendre_p(x: Self, n: Self) -> Self;
}

macro_rules! orthogonal {
    ($t:ty, $hermite_limit:expr) => {
        impl Orthogonal for $t {
            fn chebyshev_t(x: $t, n: $t) -> $t {
                let Some(n) = degree(n as f64) else {
                    return 0.0;
                };
                if x.abs() == 1.0 {
                    return if x > 0.0 || n % 2 == 0 { 1.0 } else { -1.0 };
                }
                if n > 6 && x.abs() < 1.0 {
                    return (n as $t * x.acos()).cos();
                }
                recurrence(x, n, 1.0, x)
            }

            fn chebyshev_u(x: $t, n: $t) -> $t {
                let Some(n) = degree(n as f64) else {
                    return 0.0;
                };
                if x.abs() == 1.0 {
                    let m = (n + 1) as $t;
                    return if x > 0.0 || n % 2 == 0 { m } else { -m };
                }
                if n > 8 && x.abs() < 1.0 {
                    let theta = x.acos();
                    let m = (n + 1) as $t;
                    return if theta.sin() != 0.0 {
                        (m * theta).sin() / theta.sin()
                    } else {
                        m * (m * theta).cos() / x
                    };
                }
                recurrence(x, n, 1.0, x + x)
            }

            fn chebyshev_v(x: $t, n: $t) -> $t {
                let Some(n) = degree(n as f64) else {
                    return 0.0;
                };
                let odd_end = if n % 2 == 0 {
                    (n + n + 1) as $t
                } else {
                    -((n + n + 1) as $t)
                };
                if x.abs() == 1.0 {
                    return if x > 0.0 { 1.0 } else { odd_end };
                }
                if n > 8 && x.abs() < 1.0 {
                    let theta = x.acos();
                    return if (theta / 2.0).sin() != 1.0 {
                        ((n as $t + 0.5) * theta).cos() / (theta / 2.0).cos()
                    } else {
                        odd_end
                    };
                }
                recurrence(x, n, 1.0, x + x - 1.0)
            }

            fn chebyshev_w(x: $t, n: $t) -> $t {
                let Some(n) = degree(n as f64) else {
                    return 0.0;
                };
                let at_one = (n + n + 1) as $t;
                let at_minus_one = if n % 2 == 0 { 1.0 } else { -1.0 };
                if x.abs() == 1.0 {
                    return if x > 0.0 { at_one } else { at_minus_one };
                }
                if n > 8 && x.abs() < 1.0 {
                    let theta = x.acos();
                    return if (theta / 2.0).cos() != 1.0 {
                        ((n as $t + 0.5) * theta).sin() / (theta / 2.0).sin()
                    } else if x > 0.0 {
                        at_one
                    } else {
                        at_minus_one
                    };
                }
                recurrence(x, n, 1.0, x + x + 1.0)
            }

            fn hermite_h(x: $t, n: $t) -> $t {
                let Some(n) = degree(n as f64) else {
                    return 0.0;
                };
                match n {
                    0 => return 1.0,
                    1 => return x + x,
                    _ if n > $hermite_limit => return <$t>::NAN,
                    _ => {}
                }
                // H_{k+1} = 2x H_k - 2k H_{k-1}
                let (mut p, mut q) = (1.0, x + x);
                for k in 1..n {
                    let r = (x + x) * q - (2 * k) as $t * p;
                    p = q;
                    q = r;
                }
                q
            }

            fn hermite_he(x: $t, n: $t) -> $t {
                let Some(n) = degree(n as f64) else {
                    return 0.0;
                };
                match n {
                    0 => return 1.0,
                    1 => return x,
                    _ if n > $hermite_limit => return <$t>::NAN,
                    _ => {}
                }
                // He_{k+1} = x He_k - k He_{k-1}
                let (mut p, mut q) = (1.0, x);
                for k in 1..n {
                    let r = x * q - k as $t * p;
                    p = q;
                    q = r;
                }
                q
            }

            fn laguerre_l(x: $t, n: $t) -> $t {
                let Some(n) = degree(n as f64) else {
                    return 0.0;
                };
                if x.abs() == 0.0 || n == 0 {
                    return 1.0;
                }
                // (k + 1) L_{k+1} = (2k + 1 - x) L_k - k L_{k-1}
                let (mut p, mut q) = (1.0, 1.0 - x);
                let mut k = 1;
                while k < n && !q.is_nan() {
                    let r = (((k + k) as $t + (1.0 - x)) * q - k as $t * p) / (k + 1) as $t;
                    p = q;
                    q = r;
                    k += 1;
                }
                q
            }

            fn legendre_p(x: $t, n: $t) -> $t {
                let Some(n) = degree(n as f64) else {
                    return 0.0;
                };
                if x.abs() == 1.0 {
                    return if x > 0.0 || n % 2 == 0 { 1.0 } else { -1.0 };
                }
                if n == 0 {
                    return 1.0;
                }
                // (k + 1) P_{k+1} = (2k + 1) x P_k - k P_{k-1}
                let (mut p, mut q) = (1.0, x);
                let mut k = 1;
                while k < n && !q.is_nan() {
                    let r = ((k + k + 1) as $t * x * q - k as $t * p) / (k + 1) as $t;
                    p = q;
                    q = r;
                    k += 1;
                }
                q
            }
        }

        impl Chebyshev for $t {
            fn recurrence_step(x: $t, p: $t, q: $t) -> $t {
                (x + x) * q - p
            }

            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}

/// The degree an operand names, or `None` where PyTorch's `int64` conversion gives a negative one.
fn degree(n: f64) -> Option<i64> {
    // 2^63: every float at or past it (and NaN, the infinities) converts to i64::MIN in C++ on x86
    if n.is_nan() || n.abs() >= 9_223_372_036_854_775_808.0 {
        return None;
    }
    let n = n as i64;
    (n >= 0).then_some(n)
}

/// The step shared by the four Chebyshev kinds, which differ only in where they start.
trait Chebyshev: Copy {
    fn recurrence_step(x: Self, p: Self, q: Self) -> Self;
    fn is_nan(self) -> bool;
}

/// `P_n` from `P_0 = first` and `P_1 = second` by `P_{k+1} = 2x P_k - P_{k-1}`, stopping once NaN.
fn recurrence<T: Chebyshev>(x: T, n: i64, first: T, second: T) -> T {
    match n {
        0 => first,
        1 => second,
        _ => {
            let (mut p, mut q) = (first, second);
            let mut k = 2;
            while k <= n && !q.is_nan() {
                let r = T::recurrence_step(x, p, q);
                p = q;
                q = r;
                k += 1;
            }
            q
        }
    }
}

orthogonal!(f32, 128);
orthogonal!(f64, 512);

#[cfg(test)]
mod tests {
    use super::*;

    /// Closed forms of low degrees, by hand.
    #[test]
    fn low_degrees_match_their_closed_forms() {
        for &x in &[-3.5f64, -0.7, -0.2, 0.0, 0.3, 0.9, 2.25] {
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
            assert!(close(f64::chebyshev_t(x, 3.0), 4.0 * x * x * x - 3.0 * x));
            assert!(close(f64::chebyshev_u(x, 2.0), 4.0 * x * x - 1.0));
            assert!(close(f64::chebyshev_v(x, 2.0), 4.0 * x * x - 2.0 * x - 1.0));
            assert!(close(f64::chebyshev_w(x, 2.0), 4.0 * x * x + 2.0 * x - 1.0));
            assert!(close(f64::hermite_h(x, 3.0), 8.0 * x * x * x - 12.0 * x));
            assert!(close(f64::hermite_he(x, 3.0), x * x * x - 3.0 * x));
            assert!(close(
                f64::laguerre_l(x, 2.0),
                0.5 * (x * x - 4.0 * x + 2.0)
            ));
            assert!(close(f64::legendre_p(x, 2.0), 0.5 * (3.0 * x * x - 1.0)));
        }
    }

    /// The closed forms used past degree 6/8 agree with the recurrence.
    #[test]
    fn trigonometric_forms_agree_with_the_recurrence() {
        for &x in &[-0.95f64, -0.4, 0.1, 0.6, 0.99] {
            for n in 9..30 {
                let t = recurrence(x, n, 1.0, x);
                let u = recurrence(x, n, 1.0, x + x);
                let v = recurrence(x, n, 1.0, x + x - 1.0);
                let w = recurrence(x, n, 1.0, x + x + 1.0);
                let nf = n as f64;
                assert!((f64::chebyshev_t(x, nf) - t).abs() < 1e-9, "T {x} {n}");
                assert!(
                    (f64::chebyshev_u(x, nf) - u).abs() < 1e-9 * u.abs().max(1.0),
                    "U {x} {n}"
                );
                assert!(
                    (f64::chebyshev_v(x, nf) - v).abs() < 1e-9 * v.abs().max(1.0),
                    "V {x} {n}"
                );
                assert!(
                    (f64::chebyshev_w(x, nf) - w).abs() < 1e-9 * w.abs().max(1.0),
                    "W {x} {n}"
                );
            }
        }
    }

    #[test]
    fn degrees_that_are_not_natural_numbers() {
        assert_eq!(f32::chebyshev_t(0.5, -1.0), 0.0);
        assert_eq!(f32::legendre_p(0.5, f32::NAN), 0.0);
        assert_eq!(f32::hermite_h(0.5, f32::INFINITY), 0.0);
        assert_eq!(f32::laguerre_l(0.5, 1e30), 0.0);
        // truncated toward zero
        assert_eq!(f32::hermite_he(2.0, 2.9), 3.0);
        assert!(f32::hermite_h(0.1, 129.0).is_nan());
        assert!(!f64::hermite_h(0.1, 129.0).is_nan());
    }
}
