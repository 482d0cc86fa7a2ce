// float64 helpers, included only in kernels that compute in f64 (on adapters with `shader-f64`).

// NaN survives the conversion to f32, whose bits are easy to test (`x != x` may be folded away)
fn tb_isnan64(x: f64) -> bool {
    return tb_isnan(f32(x));
}

fn tb_max64(a: f64, b: f64) -> f64 {
    if (tb_isnan64(a)) {
        return a;
    }
    if (tb_isnan64(b)) {
        return b;
    }
    return max(a, b);
}

fn tb_min64(a: f64, b: f64) -> f64 {
    if (tb_isnan64(a)) {
        return a;
    }
    if (tb_isnan64(b)) {
        return b;
    }
    return min(a, b);
}
