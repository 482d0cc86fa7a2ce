// torch.special's orthogonal polynomials P_n(x), evaluated as PyTorch evaluates them: the three-term
// recurrence from P_0 and P_1 (stopped once it turns NaN), or for the Chebyshev kinds on (-1, 1) past a
// degree the trigonometric closed form. PyTorch switches at degree 6 or 8; here the switch is at
// CLOSED_FORM_FROM, since GPU sin/cos are only held to an absolute error (2^-11 in Vulkan) that the
// closed forms' division by sin or cos of the angle magnifies, while the recurrence in float32 stays
// within a few ULP per degree. The degree is n truncated toward zero; a negative, NaN,
// infinite or out-of-int64 degree gives 0, as PyTorch's conversion to int64 does. Pulled into a kernel
// only when its body calls one of these (shaders/__init__.py).

const CLOSED_FORM_FROM = 64.0;

// the degree as a whole number, or -1 where it is not one PyTorch would loop to
fn tb_degree(n: f32) -> f32 {
    if (tb_isnan(n) || abs(n) >= 9.2233720e18) {
        return -1.0;
    }
    return trunc(n);
}

// loop bound: the recurrence counts in i32 (a degree past it would loop for minutes in PyTorch too)
fn tb_steps(d: f32) -> i32 {
    return i32(min(d, 2147483520.0));
}

// through atan2: some drivers' acos is off by 1e-4, which the closed forms multiply by the degree
fn tb_acos(x: f32) -> f32 {
    return atan2(sqrt((1.0 - x) * (1.0 + x)), x);
}

fn tb_is_even(d: f32) -> bool {
    return d % 2.0 == 0.0;
}

// P_{k+1} = 2x P_k - P_{k-1} from P_0 = 1 and P_1 = second, up to degree d
fn tb_chebyshev_recurrence(x: f32, d: f32, second: f32) -> f32 {
    if (d == 0.0) {
        return 1.0;
    }
    var p = 1.0;
    var q = second;
    let last = tb_steps(d);
    for (var k = 2; k <= last && !tb_isnan(q); k++) {
        let r = (x + x) * q - p;
        p = q;
        q = r;
    }
    return q;
}

fn tb_chebyshev_t(x: f32, n: f32) -> f32 {
    let d = tb_degree(n);
    if (d < 0.0) {
        return 0.0;
    }
    if (abs(x) == 1.0) {
        return select(-1.0, 1.0, x > 0.0 || tb_is_even(d));
    }
    if (d > CLOSED_FORM_FROM && abs(x) < 1.0) {
        return cos(d * tb_acos(x));
    }
    return tb_chebyshev_recurrence(x, d, x);
}

fn tb_chebyshev_u(x: f32, n: f32) -> f32 {
    let d = tb_degree(n);
    if (d < 0.0) {
        return 0.0;
    }
    if (abs(x) == 1.0) {
        return select(-(d + 1.0), d + 1.0, x > 0.0 || tb_is_even(d));
    }
    if (d > CLOSED_FORM_FROM && abs(x) < 1.0) {
        let theta = tb_acos(x);
        if (sin(theta) != 0.0) {
            return sin((d + 1.0) * theta) / sin(theta);
        }
        return (d + 1.0) * cos((d + 1.0) * theta) / x;
    }
    return tb_chebyshev_recurrence(x, d, x + x);
}

fn tb_chebyshev_v(x: f32, n: f32) -> f32 {
    let d = tb_degree(n);
    if (d < 0.0) {
        return 0.0;
    }
    let at_minus_one = select(-(d + d + 1.0), d + d + 1.0, tb_is_even(d));
    if (abs(x) == 1.0) {
        return select(at_minus_one, 1.0, x > 0.0);
    }
    if (d > CLOSED_FORM_FROM && abs(x) < 1.0) {
        let theta = tb_acos(x);
        if (sin(theta / 2.0) != 1.0) {
            return cos((d + 0.5) * theta) / cos(theta / 2.0);
        }
        return at_minus_one;
    }
    return tb_chebyshev_recurrence(x, d, x + x - 1.0);
}

fn tb_chebyshev_w(x: f32, n: f32) -> f32 {
    let d = tb_degree(n);
    if (d < 0.0) {
        return 0.0;
    }
    let at_one = d + d + 1.0;
    let at_minus_one = select(-1.0, 1.0, tb_is_even(d));
    if (abs(x) == 1.0) {
        return select(at_minus_one, at_one, x > 0.0);
    }
    if (d > CLOSED_FORM_FROM && abs(x) < 1.0) {
        let theta = tb_acos(x);
        if (cos(theta / 2.0) != 1.0) {
            return sin((d + 0.5) * theta) / sin(theta / 2.0);
        }
        return select(at_minus_one, at_one, x > 0.0);
    }
    return tb_chebyshev_recurrence(x, d, x + x + 1.0);
}

// H_{k+1} = 2x H_k - 2k H_{k-1}; past degree 128 a float32 result has overflowed: NaN, as in PyTorch
fn tb_hermite_h(x: f32, n: f32) -> f32 {
    let d = tb_degree(n);
    if (d < 0.0) {
        return 0.0;
    }
    if (d == 0.0) {
        return 1.0;
    }
    if (d > 128.0) {
        return tb_nan();
    }
    var p = 1.0;
    var q = x + x;
    for (var k = 1; k < i32(d); k++) {
        let r = (x + x) * q - f32(2 * k) * p;
        p = q;
        q = r;
    }
    return q;
}

// He_{k+1} = x He_k - k He_{k-1}
fn tb_hermite_he(x: f32, n: f32) -> f32 {
    let d = tb_degree(n);
    if (d < 0.0) {
        return 0.0;
    }
    if (d == 0.0) {
        return 1.0;
    }
    if (d > 128.0) {
        return tb_nan();
    }
    var p = 1.0;
    var q = x;
    for (var k = 1; k < i32(d); k++) {
        let r = x * q - f32(k) * p;
        p = q;
        q = r;
    }
    return q;
}

// (k + 1) L_{k+1} = (2k + 1 - x) L_k - k L_{k-1}
fn tb_laguerre_l(x: f32, n: f32) -> f32 {
    let d = tb_degree(n);
    if (d < 0.0) {
        return 0.0;
    }
    if (x == 0.0 || d == 0.0) {
        return 1.0;
    }
    var p = 1.0;
    var q = 1.0 - x;
    let last = tb_steps(d);
    for (var k = 1; k < last && !tb_isnan(q); k++) {
        let r = ((f32(k + k) + (1.0 - x)) * q - f32(k) * p) / f32(k + 1);
        p = q;
        q = r;
    }
    return q;
}

// (k + 1) P_{k+1} = (2k + 1) x P_k - k P_{k-1}
fn tb_legendre_p(x: f32, n: f32) -> f32 {
    let d = tb_degree(n);
    if (d < 0.0) {
        return 0.0;
    }
    if (abs(x) == 1.0) {
        return select(-1.0, 1.0, x > 0.0 || tb_is_even(d));
    }
    if (d == 0.0) {
        return 1.0;
    }
    var p = 1.0;
    var q = x;
    let last = tb_steps(d);
    for (var k = 1; k < last && !tb_isnan(q); k++) {
        let r = (f32(k + k + 1) * x * q - f32(k) * p) / f32(k + 1);
        p = q;
        q = r;
    }
    return q;
}
