// Math the WGSL library lacks, shared by every kernel family that computes activations.

// erf with |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26), enough for float32 results
fn tb_erf(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    let y = 1.0 - poly * exp(-a * a);
    return select(y, -y, x < 0.0);
}

// tanh that stays finite for large |x| (exp overflows long before tanh reaches ±1)
fn tb_tanh(x: f32) -> f32 {
    let a = min(abs(x), 15.0);
    let e = exp(-2.0 * a);
    let y = (1.0 - e) / (1.0 + e);
    return select(select(y, -y, x < 0.0), x, tb_isnan(x));
}

fn tb_sigmoid(x: f32) -> f32 {
    let e = exp(-abs(x));
    return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}

fn tb_gelu_erf(x: f32) -> f32 {
    return 0.5 * x * (1.0 + tb_erf(x * 0.70710678118654752));
}

fn tb_gelu_tanh(x: f32) -> f32 {
    return 0.5 * x * (1.0 + tb_tanh(0.79788456080286536 * (x + 0.044715 * x * x * x)));
}

// x^y with PyTorch's answers where WGSL's pow is undefined (negative bases, zero exponents)
fn tb_pow(x: f32, y: f32) -> f32 {
    if (y == 0.0) {
        return 1.0;
    }
    if (y == 1.0) {
        return x;
    }
    if (y == 2.0) {
        return x * x;
    }
    if (y == 3.0) {
        return x * x * x;
    }
    let r = pow(abs(x), y);
    if (x >= 0.0) {
        return r;
    }
    if (floor(y) != y) {
        return bitcast<f32>(0x7fc00000u);  // negative base, fractional exponent: NaN
    }
    let odd = (abs(y) % 2.0) == 1.0;
    return select(r, -r, odd);
}

// by the bits: shader compilers may fold `x != x` to false, as if NaN could not occur
fn tb_isnan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn tb_nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

// max/min that propagate NaN, as torch.maximum/minimum and relu/clamp do
fn tb_max(a: f32, b: f32) -> f32 {
    if (tb_isnan(a) || tb_isnan(b)) {
        return tb_nan();
    }
    return max(a, b);
}

fn tb_min(a: f32, b: f32) -> f32 {
    if (tb_isnan(a) || tb_isnan(b)) {
        return tb_nan();
    }
    return min(a, b);
}

// sqrt(a² + b²) without overflow or underflow in the squares; infinite if either is, else NaN if either is
fn tb_hypot(a: f32, b: f32) -> f32 {
    let x = abs(a);
    let y = abs(b);
    let inf = bitcast<f32>(0x7f800000u);
    if (x == inf || y == inf) {
        return inf;
    }
    if (tb_isnan(x) || tb_isnan(y)) {
        return tb_nan();
    }
    let big = max(x, y);
    if (big == 0.0) {
        return 0.0;
    }
    let ratio = min(x, y) / big;
    return big * sqrt(1.0 + ratio * ratio);
}
