//! Branch-free f32 approximations of the transcendental functions that activations need.
//!
//! `std`'s `exp`/`tanh`/`erf` call libm one element at a time; these are written so that LLVM
//! vectorizes a loop over them (selects instead of branches, bit casts instead of `frexp`/`ldexp`).
//! Polynomials use `mul_add`: one fused instruction on the FMA/AVX-512/NEON paths the kernels are
//! compiled for, half the latency of a multiply then an add, and correctly rounded on every path
//! (the baseline x86-64 build calls libm's `fmaf`), so every ISA computes identical results.
//! Each stays within a few ULP of the correctly rounded result over the whole f32 range and propagates
//! NaN and infinities as IEEE 754 says.

// Polynomial coefficients are kept as published (minimax fits); f32 rounds them at compile time.
#![allow(clippy::excessive_precision)]

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Adding then subtracting 1.5·2^23 rounds an f32 to the nearest integer (ties to even).
const ROUND_MAGIC: f32 = 12_582_912.0;

#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // exp(x) = 2^n · exp(r), n = round(x / ln 2), |r| <= ln2 / 2
    let xc = x.clamp(-104.0, 88.73);
    let n = (xc * LOG2E + ROUND_MAGIC) - ROUND_MAGIC;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4_f32;
    let p = p.mul_add(r, 1.398_199_9e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 5.000_000_1e-1);
    let p = ((p * r) * r + r) + 1.0;
    // 2^n in two factors so that both overflow (n = 128) and subnormal results (n < -126) stay exact
    let n = (xc * LOG2E + ROUND_MAGIC).to_bits() as i32 - 0x4B40_0000;
    let n1 = n / 2;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n - n1 + 127) as u32) << 23);
    let y = p * s1 * s2;
    let y = if x > 88.722_84 { f32::INFINITY } else { y };
    let y = if x < -103.972_08 { 0.0 } else { y };
    if x.is_nan() {
        x
    } else {
        y
    }
}

#[inline(always)]
pub fn ln_f32(x: f32) -> f32 {
    const SQRT_HALF: f32 = std::f32::consts::FRAC_1_SQRT_2;
    let bits = x.to_bits();
    let e = ((bits >> 23) & 0xff) as i32 - 126;
    let m = f32::from_bits((bits & 0x807f_ffff) | 0x3f00_0000); // mantissa in [0.5, 1)
    let small = m < SQRT_HALF;
    let e = if small { e - 1 } else { e } as f32;
    let m = if small { m + m - 1.0 } else { m - 1.0 };
    let z = m * m;
    let p = 7.037_683_6e-2_f32;
    let p = p.mul_add(m, -1.151_461e-1);
    let p = p.mul_add(m, 1.167_699_9e-1);
    let p = p.mul_add(m, -1.242_014_1e-1);
    let p = p.mul_add(m, 1.424_932_3e-1);
    let p = p.mul_add(m, -1.666_805_8e-1);
    let p = p.mul_add(m, 2.000_071_4e-1);
    let p = p.mul_add(m, -2.499_999_4e-1);
    let p = p.mul_add(m, 3.333_333e-1);
    let y = p * m * z;
    let y = e.mul_add(LN2_LO, y);
    let y = z * -0.5 + y;
    let y = e.mul_add(LN2_HI, m + y);
    // subnormals are rare enough in activations to take the slow, exact path
    let y = if x < f32::MIN_POSITIVE && x > 0.0 {
        x.ln()
    } else {
        y
    };
    let y = if x == 0.0 { f32::NEG_INFINITY } else { y };
    let y = if x == f32::INFINITY { x } else { y };
    if x < 0.0 || x.is_nan() {
        f32::NAN
    } else {
        y
    }
}

#[inline(always)]
pub fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    // small |x|: odd polynomial keeps the relative error tiny near zero
    let z = x * x;
    let p = -5.704_988_7e-3_f32;
    let p = p.mul_add(z, 2.063_908_9e-2);
    let p = p.mul_add(z, -5.373_971_6e-2);
    let p = p.mul_add(z, 1.333_144_2e-1);
    let p = p.mul_add(z, -3.333_328_2e-1);
    let small = (p * z) * x + x;
    // large |x|: 1 - 2 / (e^{2|x|} + 1), exact to f32 beyond |x| ≈ 9
    let large = 1.0 - 2.0 / (exp_f32(2.0 * a) + 1.0);
    let large = if x < 0.0 { -large } else { large };
    if a < 0.625 {
        small
    } else {
        large
    }
}

/// erfc(|x|) for the `t = 1 / (1 + |x| / 2)` expansion (relative error below 1.2e-7 on all of f32).
#[inline(always)]
fn erfc_abs(a: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * a);
    let p = 0.170_872_77_f32;
    let p = p.mul_add(t, -0.822_152_23);
    let p = p.mul_add(t, 1.488_515_9);
    let p = p.mul_add(t, -1.135_203_9);
    let p = p.mul_add(t, 0.278_868_07);
    let p = p.mul_add(t, -0.186_288_06);
    let p = p.mul_add(t, 0.096_784_18);
    let p = p.mul_add(t, 0.374_091_96);
    let p = p.mul_add(t, 1.000_023_7);
    let p = p.mul_add(t, -1.265_512_2);
    t * exp_f32(p - a * a)
}

/// erf(x) for |x| < 0.5 by its Maclaurin series, where `1 - erfc` would cancel.
#[inline(always)]
fn erf_series(x: f32) -> f32 {
    let z = x * x;
    let s = -1.0_f32 / 1320.0;
    let s = s.mul_add(z, 1.0 / 216.0);
    let s = s.mul_add(z, -1.0 / 42.0);
    let s = s.mul_add(z, 1.0 / 10.0);
    let s = s.mul_add(z, -1.0 / 3.0);
    let s = s.mul_add(z, 1.0);
    s * x * std::f32::consts::FRAC_2_SQRT_PI
}

#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let a = x.abs();
    let large = 1.0 - erfc_abs(a);
    let large = if x < 0.0 { -large } else { large };
    let y = if a < 0.5 { erf_series(x) } else { large };
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// erf(z) for GELU as z·P(z²)/Q(z²) on |z| <= 4 (beyond, erf is ±1 in f32): a (6, 4) rational fitted
/// by iteratively reweighted least squares to 6.5e-8 relative error in exact arithmetic, about 4e-7
/// absolute in f32. Eleven FMAs and one division, no exp: GELU's `1 + erf` only shows absolute
/// error, which this keeps under float32's resolution of the result.
#[inline(always)]
fn erf_rational(z: f32) -> f32 {
    let z = z.clamp(-4.0, 4.0);
    let t = z * z;
    let p = 1.911_311_7e-8_f32;
    let p = p.mul_add(t, -1.942_338e-6);
    let p = p.mul_add(t, 1.472_677_6e-4);
    let p = p.mul_add(t, 3.989_622_5e-3);
    let p = p.mul_add(t, 5.152_175e-2);
    let p = p.mul_add(t, 2.071_018_5e-1);
    let p = p.mul_add(t, std::f32::consts::FRAC_2_SQRT_PI);
    let q = 1.020_896_4e-3_f32;
    let q = q.mul_add(t, 1.495_608_3e-2);
    let q = q.mul_add(t, 1.179_610_5e-1);
    let q = q.mul_add(t, 5.168_705e-1);
    let q = q.mul_add(t, 1.0);
    z * p / q
}

/// What GELU gives at +inf. PyTorch's own vectorized CPU kernels disagree: the AVX-512 one gives NaN
/// (its erf form multiplies inf by 0), the AVX2 one +inf. The engine follows the eager kernel of the
/// process it runs in (set once at start, see [`set_gelu_positive_infinity_nan`]); NaN by default.
static GELU_POS_INF_NAN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether GELU(+inf) is NaN (true) or +inf (false). GELU(-inf) is NaN either way, as in PyTorch.
pub fn set_gelu_positive_infinity_nan(nan: bool) {
    GELU_POS_INF_NAN.store(nan, std::sync::atomic::Ordering::Relaxed);
}

pub fn gelu_positive_infinity_nan() -> bool {
    GELU_POS_INF_NAN.load(std::sync::atomic::Ordering::Relaxed)
}

/// GELU with the exact (erf) form: x/2 · (1 + erf(x/√2)).
#[inline(always)]
pub fn gelu_f32(x: f32) -> f32 {
    gelu_rule(x, gelu_positive_infinity_nan())
}

/// [`gelu_f32`] with the +inf rule passed in: read once per slice, outside the loop, so that the
/// loop stays branch-free and vectorizes (an atomic load inside it would keep it scalar).
#[inline(always)]
fn gelu_rule(x: f32, pos_inf_nan: bool) -> f32 {
    let c = 1.0 + erf_rational(x * std::f32::consts::FRAC_1_SQRT_2);
    let special = if x > 0.0 && !pos_inf_nan {
        f32::INFINITY
    } else {
        f32::NAN
    };
    if x.is_infinite() {
        special
    } else {
        0.5 * x * c
    }
}

/// GELU of each element of `a` into `out`: explicit SIMD where the CPU has it (the portable form's
/// division is the loop's slowest instruction), else the portable loop.
#[inline(always)]
pub fn gelu_slice_f32(a: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::gelu_x86::gelu_f32(a, out) {
        return;
    }
    let pos_inf_nan = gelu_positive_infinity_nan();
    for (o, &x) in out.iter_mut().zip(a) {
        *o = gelu_rule(x, pos_inf_nan);
    }
}

/// GELU with PyTorch's `approximate="tanh"` form.
#[inline(always)]
pub fn gelu_tanh_f32(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // sqrt(2/pi)
    let inner = K * (x + 0.044_715 * x * x * x);
    0.5 * x * (1.0 + tanh_f32(inner))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<f32> {
        let mut v: Vec<f32> = (-20000..=20000).map(|i| i as f32 * 0.005).collect();
        v.extend([
            0.0, -0.0, 1e-30, -1e-30, 1e-6, 1e-3, 80.0, 88.0, 88.7, -87.0, -100.0, -110.0, 1e30,
        ]);
        v
    }

    fn rel(a: f32, b: f64) -> f64 {
        let (a, b) = (a as f64, b);
        if a == b {
            return 0.0;
        }
        (a - b).abs() / b.abs().max(1e-30)
    }

    #[test]
    fn exp_matches_libm() {
        for x in samples() {
            let want = (x as f64).exp();
            if want > f32::MAX as f64 {
                assert_eq!(exp_f32(x), f32::INFINITY, "exp({x})");
                continue;
            }
            if want < f32::MIN_POSITIVE as f64 * 4.0 {
                assert!(exp_f32(x) <= 1e-37, "exp({x})");
                continue;
            }
            assert!(
                rel(exp_f32(x), want) < 4e-7,
                "exp({x}) = {} want {want}",
                exp_f32(x)
            );
        }
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn ln_matches_libm() {
        for x in samples().into_iter().map(f32::abs).filter(|x| *x > 0.0) {
            assert!(
                rel(ln_f32(x), (x as f64).ln()) < 4e-7
                    || (ln_f32(x) as f64 - (x as f64).ln()).abs() < 1e-7
            );
        }
        assert_eq!(ln_f32(0.0), f32::NEG_INFINITY);
        assert!(ln_f32(-1.0).is_nan());
        assert_eq!(ln_f32(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn tanh_and_sigmoid_match_libm() {
        for x in samples() {
            let t = (x as f64).tanh();
            assert!(
                rel(tanh_f32(x), t) < 6e-7 || (tanh_f32(x) as f64 - t).abs() < 1e-7,
                "tanh({x})"
            );
            let s = 1.0 / (1.0 + (-(x as f64)).exp());
            assert!(
                (sigmoid_f32(x) as f64 - s).abs() < 2e-7 + 4e-7 * s,
                "sigmoid({x})"
            );
        }
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
    }

    fn erf64(x: f64) -> f64 {
        // high-precision reference: series for small x, continued fraction erfc for large x
        if x.abs() < 3.0 {
            let mut sum = 0.0;
            let mut term = x;
            let mut n = 0.0;
            while term.abs() > 1e-18 {
                sum += term / (2.0 * n + 1.0);
                n += 1.0;
                term *= -x * x / n;
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            let a = x.abs();
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = (k as f64 / 2.0) / (a + f);
            }
            let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f);
            (1.0 - erfc) * x.signum()
        }
    }

    /// Held by the tests that read or flip the process-wide GELU(+inf) rule.
    static GELU_RULE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn erf_and_gelu_match_reference() {
        let _rule = GELU_RULE.lock().unwrap_or_else(|e| e.into_inner());
        for x in samples().into_iter().filter(|x| x.abs() < 12.0) {
            let e = erf64(x as f64);
            assert!(
                (erf_f32(x) as f64 - e).abs() < 2e-7 * (1.0 + e.abs()) || rel(erf_f32(x), e) < 1e-6,
                "erf({x})"
            );
            let g = 0.5 * x as f64 * (1.0 + erf64(x as f64 / 2f64.sqrt()));
            assert!(
                (gelu_f32(x) as f64 - g).abs() < 1e-6 * (1.0 + g.abs()),
                "gelu({x})"
            );
        }
        assert!(gelu_f32(f32::NAN).is_nan());
        assert!(gelu_f32(f32::NEG_INFINITY).is_nan(), "as PyTorch: -inf · 0");
        assert!(
            gelu_f32(f32::INFINITY).is_nan(),
            "as PyTorch's AVX-512 kernel (the default)"
        );
    }

    #[test]
    fn gelu_over_a_slice_matches_reference_on_every_path() {
        let _rule = GELU_RULE.lock().unwrap_or_else(|e| e.into_inner());
        // specials sit among ordinary values so that they go through the vector loop, and the length
        // leaves a tail for the scalar one
        let mut xs: Vec<f32> = samples().into_iter().filter(|x| x.abs() < 12.0).collect();
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            5.65,
            -5.66,
            -110.0,
            1e30,
            -1e30,
        ];
        for (k, &v) in specials.iter().enumerate() {
            xs.insert(3 + 17 * k, v);
        }
        xs.truncate(xs.len() / 16 * 16 + 7);
        assert_ne!(xs.len() % 16, 0);
        let mut out = vec![0f32; xs.len()];
        gelu_slice_f32(&xs, &mut out);
        // the other +inf rule, as PyTorch's AVX2 kernel has it (the flag is process-wide: restore it)
        set_gelu_positive_infinity_nan(false);
        let mut out_inf = vec![0f32; xs.len()];
        gelu_slice_f32(&xs, &mut out_inf);
        set_gelu_positive_infinity_nan(true);
        for (i, (&x, &y)) in xs.iter().zip(&out).enumerate() {
            if x == f32::INFINITY {
                assert!(
                    y.is_nan(),
                    "gelu(+inf) = {y}, PyTorch's AVX-512 kernel gives NaN"
                );
                assert_eq!(
                    out_inf[i],
                    f32::INFINITY,
                    "gelu(+inf), PyTorch's AVX2 kernel gives +inf"
                );
                continue;
            }
            assert!(
                y.to_bits() == out_inf[i].to_bits() || (y.is_nan() && out_inf[i].is_nan()),
                "gelu({x}) depends on the +inf rule"
            );
            if x.is_nan() || x.is_infinite() {
                assert!(y.is_nan(), "gelu({x}) = {y}, PyTorch gives NaN");
                continue;
            }
            let g = 0.5 * x as f64 * (1.0 + erf64(x as f64 / 2f64.sqrt()));
            assert!(
                (y as f64 - g).abs() < 1e-6 * (1.0 + g.abs()),
                "gelu({x}) = {y}, want {g}"
            );
        }
    }
}
