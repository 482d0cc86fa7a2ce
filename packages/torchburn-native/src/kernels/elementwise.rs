//! The fused elementwise machine: a chain of ATen elementwise ops runs as one sweep over memory.
//!
//! Python compiles a chain into register code (`EOp`s). The iteration space is cut into chunks of
//! `CHUNK` elements; for each chunk every op runs as a tight loop over register slices that LLVM
//! vectorizes, so a chunk's intermediates live in L1 and memory is read and written once.
//! The chunk interpreter is compiled once per ISA (AVX-512, AVX2+FMA, NEON, baseline) and picked at run time.

use crate::threads;
use std::cell::RefCell;
use torchburn_native_macros::isa_versions;

use super::math;
use super::polynomials::Orthogonal;
use super::prefetch;
use super::strided::{for_runs, layout_of, load_run, store_run, Lane, Layout};
use crate::plan::{BinaryFn, DType, Domain, EOp, UnaryFn};

/// The shortest chunk, in elements. A chain's chunk is as long as its register buffers allow within
/// [`L1_BUDGET`], up to [`MAX_CHUNK`]: each chunk costs a fixed ~60 ns of dispatch (the step loop, a
/// mispredicted loop exit per op), a quarter of a 512-element add streamed from memory.
pub const CHUNK: usize = 512;
const MAX_CHUNK: usize = 8192;
/// Bytes of register buffers a chunk may use: half of a 32 KiB L1, leaving the rest to the operand
/// streams passing through.
const L1_BUDGET: usize = 16 << 10;
/// Elements of padding after each register buffer. At exact multiples of 4 KiB apart, two buffers
/// share their low 12 address bits, and a loop storing one while loading the other makes the CPU
/// guess each load depends on the earlier store ("4K aliasing").
const REG_PAD: usize = 16;
/// Below this many elements a chain runs on the calling thread.
const SERIAL_LIMIT: usize = 1 << 15;

/// Checks register indices once at load so the interpreter can index without bounds checks.
pub fn validate(code: &[EOp], nregs: usize, n_in: usize, n_out: usize) -> Result<(), String> {
    let reg = |r: usize| {
        if r < nregs {
            Ok(())
        } else {
            Err(format!("register {r} out of range ({nregs})"))
        }
    };
    for op in code {
        match *op {
            EOp::Load { d, input } => {
                reg(d)?;
                if input >= n_in {
                    return Err(format!("load of input {input} of {n_in}"));
                }
            }
            EOp::Const { d, .. } | EOp::Iota { d } => reg(d)?,
            EOp::Unary { d, a, .. } => {
                reg(d)?;
                reg(a)?;
                if d == a {
                    return Err("unary op writes its own operand".into());
                }
            }
            EOp::Binary { d, a, b, .. } => {
                reg(d)?;
                reg(a)?;
                reg(b)?;
                if d == a || d == b {
                    return Err("binary op writes its own operand".into());
                }
            }
            EOp::Where { d, c, a, b } => {
                for r in [d, c, a, b] {
                    reg(r)?;
                }
                if d == a || d == b || d == c {
                    return Err("where writes its own operand".into());
                }
            }
            EOp::Store { a, output } => {
                reg(a)?;
                if output >= n_out {
                    return Err(format!("store to output {output} of {n_out}"));
                }
            }
        }
    }
    Ok(())
}

/// The arithmetic each compute type provides to the machine.
///
/// `stream`: some operand lives in a tensor rather than in a chunk buffer, so it streams through
/// memory and is worth prefetching ahead (see [`stream_map`]).
pub trait Arith: Lane {
    fn unary(f: UnaryFn, a: &[Self], out: &mut [Self], stream: bool);
    fn binary(f: BinaryFn, a: &[Self], b: &[Self], out: &mut [Self], stream: bool);
    /// `binary` with a scalar second operand (a constant, or an input the same for every element).
    fn binary_vs(f: BinaryFn, a: &[Self], s: Self, out: &mut [Self], stream: bool) {
        let fill = [s; SCALAR_PIECE];
        for (a, o) in a.chunks(SCALAR_PIECE).zip(out.chunks_mut(SCALAR_PIECE)) {
            Self::binary(f, a, &fill[..a.len()], o, stream);
        }
    }
    /// `binary` with a scalar first operand.
    fn binary_sv(f: BinaryFn, s: Self, b: &[Self], out: &mut [Self], stream: bool) {
        let fill = [s; SCALAR_PIECE];
        for (b, o) in b.chunks(SCALAR_PIECE).zip(out.chunks_mut(SCALAR_PIECE)) {
            Self::binary(f, &fill[..b.len()], b, o, stream);
        }
    }
}

/// Elements per piece where a type without scalar-operand loops of its own (i64) repeats the scalar.
const SCALAR_PIECE: usize = 256;

/// Which operand of a binary step is the same for every element (a hoisted constant or 0-d input),
/// read once per chunk instead of once per element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scalar {
    Neither,
    A,
    B,
}

/// `out[i] = f(a[i])`, prefetching ahead where `stream` says the operands are in memory. A macro
/// rather than a function taking a closure: the body must be expanded inside the ISA-specific chunk
/// function, or LLVM compiles it (as an out-of-line closure or `Fn::call` shim) for the baseline ISA,
/// one scalar call per element.
macro_rules! map1 {
    ($pf:expr, $a:expr, $out:expr, |$x:ident| $body:expr $(,)?) => {
        stream_map!($pf, ($a), $out, |i| {
            let $x = i.0;
            $body
        })
    };
    ($pf:expr, $a:expr, $out:expr, $f:expr) => {
        stream_map!($pf, ($a), $out, |i| ($f)(i.0))
    };
}

/// `out[i] = f(a[i], b[i])`, expanded in place like [`map1`].
macro_rules! map2 {
    ($pf:expr, $a:expr, $b:expr, $out:expr, |$x:ident, $y:ident| $body:expr $(,)?) => {
        stream_map!($pf, ($a, $b), $out, |i| {
            let ($x, $y) = i;
            $body
        })
    };
}

/// `out[i] = f(a[i], s)` for a scalar `s`, expanded in place like [`map2`].
macro_rules! map2_vs {
    ($pf:expr, $a:expr, $s:expr, $out:expr, |$x:ident, $y:ident| $body:expr $(,)?) => {{
        let $y = $s;
        stream_map!($pf, ($a), $out, |i| {
            let $x = i.0;
            $body
        })
    }};
}

/// `out[i] = f(s, b[i])` for a scalar `s`, expanded in place like [`map2`].
macro_rules! map2_sv {
    ($pf:expr, $s:expr, $b:expr, $out:expr, |$x:ident, $y:ident| $body:expr $(,)?) => {{
        let $x = $s;
        stream_map!($pf, ($b), $out, |i| {
            let $y = i.0;
            $body
        })
    }};
}

/// The loop under the `map` macros, `out[i] = body((a[i], ...))`. Where an operand streams through
/// memory (read in place from an input, or written straight into an output) it runs a cache line at
/// a time and prefetches every operand a fixed distance ahead ([`prefetch`]): with the hardware
/// prefetcher alone, exact-erf GELU over 4 MB on 2 threads took 158 us against 144, exp over 16 MB
/// 880 against 785. Over chunk buffers, already in L1, the same prefetches cost 5-8% of an in-cache
/// chain, so those keep the plain loop.
macro_rules! stream_map {
    ($pf:expr, ($($src:expr),+), $out:expr, |$i:ident| $body:expr) => {{
        let out = $out;
        let srcs = ($($src,)+);
        let n = out.len();
        // SAFETY (all unchecked accesses): every operand slice is at least as long as `out`
        unsafe {
            let mut at = 0;
            if $pf {
                let line = prefetch::elems_per_line(out);
                while at + line <= n {
                    stream_map!(@ahead srcs, at, $($src),+);
                    prefetch::write_ahead(out.as_ptr().add(at));
                    for j in at..at + line {
                        let $i = stream_map!(@get srcs, j, $($src),+);
                        *out.get_unchecked_mut(j) = $body;
                    }
                    at += line;
                }
            }
            for j in at..n {
                let $i = stream_map!(@get srcs, j, $($src),+);
                *out.get_unchecked_mut(j) = $body;
            }
        }
    }};
    (@ahead $s:ident, $at:expr, $a:expr) => {
        prefetch::read_ahead($s.0.as_ptr().add($at));
    };
    (@ahead $s:ident, $at:expr, $a:expr, $b:expr) => {
        prefetch::read_ahead($s.0.as_ptr().add($at));
        prefetch::read_ahead($s.1.as_ptr().add($at));
    };
    (@get $s:ident, $j:expr, $a:expr) => {
        (*$s.0.get_unchecked($j),)
    };
    (@get $s:ident, $j:expr, $a:expr, $b:expr) => {
        (*$s.0.get_unchecked($j), *$s.1.get_unchecked($j))
    };
}

/// The float binary ops, each expanded through `$m` (`map2`, `map2_vs` or `map2_sv`): one table for
/// the three operand shapes, so a scalar operand costs no load per element.
macro_rules! float_binary {
    ($t:ty, $f:expr, $m:ident, $pf:expr, $a:expr, $b:expr, $out:expr) => {{
        let c = |v: bool| if v { 1.0 } else { 0.0 };
        let nz = |v: $t| v != 0.0;
        match $f {
            BinaryFn::Add => $m!($pf, $a, $b, $out, |x, y| x + y),
            BinaryFn::Sub => $m!($pf, $a, $b, $out, |x, y| x - y),
            BinaryFn::Mul => $m!($pf, $a, $b, $out, |x, y| x * y),
            BinaryFn::Div => $m!($pf, $a, $b, $out, |x, y| x / y),
            BinaryFn::DivTrunc => $m!($pf, $a, $b, $out, |x, y| (x / y).trunc()),
            BinaryFn::DivFloor => $m!($pf, $a, $b, $out, |x, y| (x / y).floor()),
            BinaryFn::Pow => $m!($pf, $a, $b, $out, |x, y| x.powf(y)),
            BinaryFn::Maximum => $m!($pf, $a, $b, $out, |x, y| {
                if x.is_nan() || y.is_nan() {
                    <$t>::NAN
                } else {
                    x.max(y)
                }
            }),
            BinaryFn::Minimum => $m!($pf, $a, $b, $out, |x, y| {
                if x.is_nan() || y.is_nan() {
                    <$t>::NAN
                } else {
                    x.min(y)
                }
            }),
            BinaryFn::Fmax => $m!($pf, $a, $b, $out, |x, y| x.max(y)),
            BinaryFn::Fmin => $m!($pf, $a, $b, $out, |x, y| x.min(y)),
            BinaryFn::Atan2 => $m!($pf, $a, $b, $out, |x, y| x.atan2(y)),
            BinaryFn::Fmod => $m!($pf, $a, $b, $out, |x, y| x % y),
            BinaryFn::Remainder => $m!($pf, $a, $b, $out, |x, y| {
                let r = x % y;
                if r != 0.0 && ((r < 0.0) != (y < 0.0)) {
                    r + y
                } else {
                    r
                }
            }),
            BinaryFn::Eq => $m!($pf, $a, $b, $out, |x, y| c(x == y)),
            BinaryFn::Ne => $m!($pf, $a, $b, $out, |x, y| c(x != y)),
            BinaryFn::Lt => $m!($pf, $a, $b, $out, |x, y| c(x < y)),
            BinaryFn::Le => $m!($pf, $a, $b, $out, |x, y| c(x <= y)),
            BinaryFn::Gt => $m!($pf, $a, $b, $out, |x, y| c(x > y)),
            BinaryFn::Ge => $m!($pf, $a, $b, $out, |x, y| c(x >= y)),
            BinaryFn::LogicalAnd | BinaryFn::BitAnd => {
                $m!($pf, $a, $b, $out, |x, y| c(nz(x) && nz(y)))
            }
            BinaryFn::LogicalOr | BinaryFn::BitOr => {
                $m!($pf, $a, $b, $out, |x, y| c(nz(x) || nz(y)))
            }
            BinaryFn::LogicalXor | BinaryFn::BitXor => {
                $m!($pf, $a, $b, $out, |x, y| c(nz(x) != nz(y)))
            }
            BinaryFn::Shl | BinaryFn::Shr => $out.fill(<$t>::NAN), // rejected by the planner
            BinaryFn::Copysign => $m!($pf, $a, $b, $out, |x, y| x.copysign(y)),
            BinaryFn::Hypot => $m!($pf, $a, $b, $out, |x, y| x.hypot(y)),
            BinaryFn::ChebyshevT => $m!($pf, $a, $b, $out, |x, y| <$t>::chebyshev_t(x, y)),
            BinaryFn::ChebyshevU => $m!($pf, $a, $b, $out, |x, y| <$t>::chebyshev_u(x, y)),
            BinaryFn::ChebyshevV => $m!($pf, $a, $b, $out, |x, y| <$t>::chebyshev_v(x, y)),
            BinaryFn::ChebyshevW => $m!($pf, $a, $b, $out, |x, y| <$t>::chebyshev_w(x, y)),
            BinaryFn::HermiteH => $m!($pf, $a, $b, $out, |x, y| <$t>::hermite_h(x, y)),
            BinaryFn::HermiteHe => $m!($pf, $a, $b, $out, |x, y| <$t>::hermite_he(x, y)),
            BinaryFn::LaguerreL => $m!($pf, $a, $b, $out, |x, y| <$t>::laguerre_l(x, y)),
            BinaryFn::LegendreP => $m!($pf, $a, $b, $out, |x, y| <$t>::legendre_p(x, y)),
        }
    }};
}

macro_rules! float_arith {
    ($t:ty, $exp:expr, $ln:expr, $tanh:expr, $sigmoid:expr, $erf:expr, $gelu_slice:expr, $gelu_tanh:expr) => {
        impl Arith for $t {
            #[inline(always)]
            fn unary(f: UnaryFn, a: &[$t], out: &mut [$t], stream: bool) {
                let b = |v: bool| if v { 1.0 } else { 0.0 };
                match f {
                    UnaryFn::Identity => out.copy_from_slice(a),
                    UnaryFn::Neg => map1!(stream, a, out, |x| -x),
                    UnaryFn::Abs => map1!(stream, a, out, |x| x.abs()),
                    // `x < 0 ? 0 : x` keeps NaN, as PyTorch's relu does
                    UnaryFn::Relu => map1!(stream, a, out, |x| if x < 0.0 { 0.0 } else { x }),
                    UnaryFn::Sigmoid => map1!(stream, a, out, $sigmoid),
                    UnaryFn::Tanh => map1!(stream, a, out, $tanh),
                    UnaryFn::Gelu => ($gelu_slice)(a, out),
                    UnaryFn::GeluTanh => map1!(stream, a, out, $gelu_tanh),
                    UnaryFn::Silu => map1!(stream, a, out, |x| x * ($sigmoid)(x)),
                    UnaryFn::Hardswish => {
                        map1!(stream, a, out, |x| x * (x + 3.0).clamp(0.0, 6.0) / 6.0)
                    }
                    UnaryFn::Hardsigmoid => {
                        map1!(stream, a, out, |x| (x + 3.0).clamp(0.0, 6.0) / 6.0)
                    }
                    UnaryFn::Exp => map1!(stream, a, out, $exp),
                    UnaryFn::Exp2 => map1!(stream, a, out, |x| x.exp2()),
                    UnaryFn::Expm1 => map1!(stream, a, out, |x| x.exp_m1()),
                    UnaryFn::Log => map1!(stream, a, out, $ln),
                    UnaryFn::Log2 => map1!(stream, a, out, |x| x.log2()),
                    UnaryFn::Log10 => map1!(stream, a, out, |x| x.log10()),
                    UnaryFn::Log1p => map1!(stream, a, out, |x| x.ln_1p()),
                    UnaryFn::Sqrt => map1!(stream, a, out, |x| x.sqrt()),
                    UnaryFn::Rsqrt => map1!(stream, a, out, |x| 1.0 / x.sqrt()),
                    UnaryFn::Reciprocal => map1!(stream, a, out, |x| 1.0 / x),
                    UnaryFn::Sin => map1!(stream, a, out, |x| x.sin()),
                    UnaryFn::Cos => map1!(stream, a, out, |x| x.cos()),
                    UnaryFn::Tan => map1!(stream, a, out, |x| x.tan()),
                    UnaryFn::Asin => map1!(stream, a, out, |x| x.asin()),
                    UnaryFn::Acos => map1!(stream, a, out, |x| x.acos()),
                    UnaryFn::Atan => map1!(stream, a, out, |x| x.atan()),
                    UnaryFn::Sinh => map1!(stream, a, out, |x| x.sinh()),
                    UnaryFn::Cosh => map1!(stream, a, out, |x| x.cosh()),
                    UnaryFn::Asinh => map1!(stream, a, out, |x| x.asinh()),
                    UnaryFn::Acosh => map1!(stream, a, out, |x| x.acosh()),
                    UnaryFn::Atanh => map1!(stream, a, out, |x| x.atanh()),
                    UnaryFn::Erf => map1!(stream, a, out, $erf),
                    UnaryFn::Erfc => map1!(stream, a, out, |x| 1.0 - ($erf)(x)),
                    UnaryFn::Floor => map1!(stream, a, out, |x| x.floor()),
                    UnaryFn::Ceil => map1!(stream, a, out, |x| x.ceil()),
                    UnaryFn::Round => map1!(stream, a, out, |x| x.round_ties_even()),
                    UnaryFn::Trunc => map1!(stream, a, out, |x| x.trunc()),
                    UnaryFn::Sign => map1!(stream, a, out, |x| {
                        if x > 0.0 {
                            1.0
                        } else if x < 0.0 {
                            -1.0
                        } else {
                            x * 0.0
                        }
                    }),
                    UnaryFn::Square => map1!(stream, a, out, |x| x * x),
                    UnaryFn::LogicalNot => map1!(stream, a, out, |x| b(x == 0.0)),
                    UnaryFn::IsNan => map1!(stream, a, out, |x| b(x.is_nan())),
                    UnaryFn::IsInf => map1!(stream, a, out, |x| b(x.is_infinite())),
                    UnaryFn::IsFinite => map1!(stream, a, out, |x| b(x.is_finite())),
                    UnaryFn::Signbit => map1!(stream, a, out, |x| b(x.is_sign_negative())),
                    UnaryFn::BitwiseNot => map1!(stream, a, out, |x| b(x == 0.0)), // bool tensors only
                }
            }

            #[inline(always)]
            fn binary(f: BinaryFn, a: &[$t], b: &[$t], out: &mut [$t], stream: bool) {
                float_binary!($t, f, map2, stream, a, b, out)
            }

            #[inline(always)]
            fn binary_vs(f: BinaryFn, a: &[$t], s: $t, out: &mut [$t], stream: bool) {
                float_binary!($t, f, map2_vs, stream, a, s, out)
            }

            #[inline(always)]
            fn binary_sv(f: BinaryFn, s: $t, b: &[$t], out: &mut [$t], stream: bool) {
                float_binary!($t, f, map2_sv, stream, s, b, out)
            }
        }
    };
}

float_arith!(
    f32,
    math::exp_f32,
    math::ln_f32,
    math::tanh_f32,
    math::sigmoid_f32,
    math::erf_f32,
    math::gelu_slice_f32,
    math::gelu_tanh_f32
);
float_arith!(
    f64,
    |x: f64| x.exp(),
    |x: f64| x.ln(),
    |x: f64| x.tanh(),
    |x: f64| 1.0 / (1.0 + (-x).exp()),
    erf_f64,
    |a: &[f64], out: &mut [f64]| map1!(true, a, out, |x: f64| 0.5
        * x
        * (1.0 + erf_f64(x * std::f64::consts::FRAC_1_SQRT_2))),
    |x: f64| 0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh())
);

/// erf in f64 (Abramowitz–Stegun 7.1.28 is too coarse; use the series and continued fraction).
fn erf_f64(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a < 2.5 {
        let mut sum = 0.0f64;
        let mut term = x;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs().max(1e-300) {
            sum += term / (2.0 * n + 1.0);
            n += 1.0;
            term *= -x * x / n;
            if n > 200.0 {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a > 6.0 {
        x.signum()
    } else {
        let mut f = 0.0;
        for k in (1..80).rev() {
            f = (k as f64 / 2.0) / (a + f);
        }
        let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f);
        (1.0 - erfc).copysign(x)
    }
}

impl Arith for i64 {
    #[inline(always)]
    fn unary(f: UnaryFn, a: &[i64], out: &mut [i64], stream: bool) {
        let b = |v: bool| v as i64;
        match f {
            UnaryFn::Identity => out.copy_from_slice(a),
            UnaryFn::Neg => map1!(stream, a, out, |x| x.wrapping_neg()),
            UnaryFn::Abs => map1!(stream, a, out, |x| x.wrapping_abs()),
            UnaryFn::Relu => map1!(stream, a, out, |x| x.max(0)),
            UnaryFn::Sign => map1!(stream, a, out, |x| x.signum()),
            UnaryFn::Square => map1!(stream, a, out, |x| x.wrapping_mul(x)),
            UnaryFn::LogicalNot => map1!(stream, a, out, |x| b(x == 0)),
            UnaryFn::BitwiseNot => map1!(stream, a, out, |x| !x),
            UnaryFn::IsNan | UnaryFn::IsInf | UnaryFn::Signbit => {
                map1!(stream, a, out, |x| b(f == UnaryFn::Signbit && x < 0))
            }
            UnaryFn::IsFinite => out.fill(1),
            UnaryFn::Floor | UnaryFn::Ceil | UnaryFn::Round | UnaryFn::Trunc => {
                out.copy_from_slice(a)
            }
            // float-only functions never reach the integer domain: the planner computes them in f32/f64
            _ => out.fill(0),
        }
    }

    #[inline(always)]
    fn binary(f: BinaryFn, a: &[i64], b: &[i64], out: &mut [i64], stream: bool) {
        let c = |v: bool| v as i64;
        match f {
            BinaryFn::Add => map2!(stream, a, b, out, |x, y| x.wrapping_add(y)),
            BinaryFn::Sub => map2!(stream, a, b, out, |x, y| x.wrapping_sub(y)),
            BinaryFn::Mul => map2!(stream, a, b, out, |x, y| x.wrapping_mul(y)),
            BinaryFn::Div | BinaryFn::DivTrunc => {
                map2!(stream, a, b, out, |x, y| if y == 0 {
                    0
                } else {
                    x.wrapping_div(y)
                })
            }
            BinaryFn::DivFloor => map2!(stream, a, b, out, |x, y| {
                if y == 0 {
                    0
                } else {
                    let q = x.wrapping_div(y);
                    if (x % y != 0) && ((x < 0) != (y < 0)) {
                        q - 1
                    } else {
                        q
                    }
                }
            }),
            BinaryFn::Pow => map2!(stream, a, b, out, |x, y| {
                if y < 0 {
                    0
                } else {
                    x.wrapping_pow(y.min(u32::MAX as i64) as u32)
                }
            }),
            BinaryFn::Maximum | BinaryFn::Fmax => map2!(stream, a, b, out, |x, y| x.max(y)),
            BinaryFn::Minimum | BinaryFn::Fmin => map2!(stream, a, b, out, |x, y| x.min(y)),
            BinaryFn::Fmod => map2!(stream, a, b, out, |x, y| if y == 0 {
                0
            } else {
                x.wrapping_rem(y)
            }),
            BinaryFn::Remainder => map2!(stream, a, b, out, |x, y| {
                if y == 0 {
                    0
                } else {
                    let r = x.wrapping_rem(y);
                    if r != 0 && ((r < 0) != (y < 0)) {
                        r + y
                    } else {
                        r
                    }
                }
            }),
            BinaryFn::Eq => map2!(stream, a, b, out, |x, y| c(x == y)),
            BinaryFn::Ne => map2!(stream, a, b, out, |x, y| c(x != y)),
            BinaryFn::Lt => map2!(stream, a, b, out, |x, y| c(x < y)),
            BinaryFn::Le => map2!(stream, a, b, out, |x, y| c(x <= y)),
            BinaryFn::Gt => map2!(stream, a, b, out, |x, y| c(x > y)),
            BinaryFn::Ge => map2!(stream, a, b, out, |x, y| c(x >= y)),
            BinaryFn::LogicalAnd => map2!(stream, a, b, out, |x, y| c(x != 0 && y != 0)),
            BinaryFn::LogicalOr => map2!(stream, a, b, out, |x, y| c(x != 0 || y != 0)),
            BinaryFn::LogicalXor => map2!(stream, a, b, out, |x, y| c((x != 0) != (y != 0))),
            BinaryFn::BitAnd => map2!(stream, a, b, out, |x, y| x & y),
            BinaryFn::BitOr => map2!(stream, a, b, out, |x, y| x | y),
            BinaryFn::BitXor => map2!(stream, a, b, out, |x, y| x ^ y),
            BinaryFn::Shl => map2!(stream, a, b, out, |x, y| if (0..64).contains(&y) {
                x << y
            } else {
                0
            },),
            BinaryFn::Shr => map2!(stream, a, b, out, |x, y| {
                if (0..64).contains(&y) {
                    x >> y
                } else {
                    x >> 63
                }
            }),
            // float functions: the planner never gives them integer operands
            BinaryFn::Copysign
            | BinaryFn::Atan2
            | BinaryFn::Hypot
            | BinaryFn::ChebyshevT
            | BinaryFn::ChebyshevU
            | BinaryFn::ChebyshevV
            | BinaryFn::ChebyshevW
            | BinaryFn::HermiteH
            | BinaryFn::HermiteHe
            | BinaryFn::LaguerreL
            | BinaryFn::LegendreP => out.fill(0),
        }
    }
}

/// A resolved operand: base pointer (its element offset applied), dtype, strides over the iteration.
#[derive(Clone, Debug)]
pub struct View {
    pub ptr: *mut u8,
    pub dtype: DType,
    pub strides: Vec<isize>,
    pub layout: Layout,
}

// SAFETY: a View is a pointer into memory the program owns for the duration of a run; the planner
// guarantees that concurrently running chunks write disjoint elements.
unsafe impl Send for View {}
unsafe impl Sync for View {}

impl View {
    pub fn new(ptr: *mut u8, dtype: DType, shape: &[usize], strides: &[isize]) -> View {
        View {
            ptr,
            dtype,
            strides: strides.to_vec(),
            layout: layout_of(shape, strides),
        }
    }
}

/// Where a computed value goes: a register's chunk buffer, or straight into a contiguous output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dst {
    Reg(usize),
    Out(usize),
}

/// An instruction as a chunk runs it, after [`prepare`].
#[derive(Clone, Copy, Debug)]
enum Step {
    /// the register reads the input in place (contiguous, already the compute type): no copy
    Alias {
        d: usize,
        input: usize,
    },
    Load {
        d: usize,
        input: usize,
    },
    Iota {
        d: usize,
    },
    Unary {
        d: Dst,
        f: UnaryFn,
        a: usize,
    },
    Binary {
        d: Dst,
        f: BinaryFn,
        a: usize,
        b: usize,
        scalar: Scalar,
    },
    Where {
        d: Dst,
        c: usize,
        a: usize,
        b: usize,
    },
    Store {
        a: usize,
        output: usize,
    },
}

/// A value that is the same for every element, filled into its register once per task.
#[derive(Clone, Copy, Debug)]
enum Hoisted {
    Const {
        value: f64,
        ivalue: i64,
    },
    /// an input whose strides are all zero (a 0-d tensor, an expanded scalar)
    Scalar {
        input: usize,
    },
}

/// A chain's code specialized to its operands. Per chunk, the register machine would copy every input
/// into a register, fill every constant, and copy every result out: three passes over L1 where one
/// does. So: constants and scalar inputs move to registers of their own, filled once per task (and a
/// binary op reads such an operand as one scalar, not a load per element: see [`Scalar`]);
/// contiguous inputs already of the compute type are read where they lie; and a result whose next
/// use is the store into a contiguous output of the compute type is written there directly.
///
/// It depends on the operands' dtypes and layouts only, so a program prepares each chain once.
#[derive(Clone, Debug)]
pub struct Prepared {
    steps: Vec<Step>,
    /// `(slot, value)`, in buffer slots of their own that no step writes
    hoisted: Vec<(usize, Hoisted)>,
    /// register slots: those below `buffers` own a chunk buffer; the rest point into inputs
    slots: usize,
    buffers: usize,
    /// elements per chunk
    chunk: usize,
}

/// [`Prepared`] code for a chain computed in `domain` over these operands.
pub fn prepare_for(
    domain: Domain,
    code: &[EOp],
    nregs: usize,
    inputs: &[View],
    outputs: &[View],
) -> Prepared {
    let lane = match domain {
        Domain::F32 => f32::STORAGE,
        Domain::F64 => f64::STORAGE,
        Domain::I64 => i64::STORAGE,
    };
    prepare(code, nregs, inputs, outputs, lane)
}

fn prepare(code: &[EOp], nregs: usize, inputs: &[View], outputs: &[View], lane: DType) -> Prepared {
    let in_place = |v: &View| v.layout == Layout::Contiguous && v.dtype == lane;
    // `cur[r]`: the register that holds what the code calls `r` (a hoisted one after a constant)
    let mut cur: Vec<usize> = (0..nregs).collect();
    let mut hoisted = Vec::new();
    let mut hoist = |d: usize, h: Hoisted, cur: &mut Vec<usize>| {
        cur[d] = nregs + hoisted.len();
        hoisted.push((cur[d], h));
    };
    let mut steps = Vec::with_capacity(code.len());
    for op in code {
        match *op {
            EOp::Const { d, value, ivalue } => hoist(d, Hoisted::Const { value, ivalue }, &mut cur),
            EOp::Load { d, input } if inputs[input].layout == Layout::Scalar => {
                hoist(d, Hoisted::Scalar { input }, &mut cur)
            }
            EOp::Load { d, input } => {
                cur[d] = d;
                steps.push(if in_place(&inputs[input]) {
                    Step::Alias { d, input }
                } else {
                    Step::Load { d, input }
                });
            }
            EOp::Iota { d } => {
                cur[d] = d;
                steps.push(Step::Iota { d });
            }
            EOp::Unary { d, f, a } => {
                let a = cur[a];
                cur[d] = d;
                steps.push(Step::Unary {
                    d: Dst::Reg(d),
                    f,
                    a,
                });
            }
            EOp::Binary { d, f, a, b } => {
                let (a, b) = (cur[a], cur[b]);
                cur[d] = d;
                // registers from nregs up are hoisted: the same value in every element
                let scalar = match (a >= nregs, b >= nregs) {
                    (false, true) => Scalar::B,
                    (true, false) => Scalar::A,
                    _ => Scalar::Neither,
                };
                steps.push(Step::Binary {
                    d: Dst::Reg(d),
                    f,
                    a,
                    b,
                    scalar,
                });
            }
            EOp::Where { d, c, a, b } => {
                let (c, a, b) = (cur[c], cur[a], cur[b]);
                cur[d] = d;
                steps.push(Step::Where {
                    d: Dst::Reg(d),
                    c,
                    a,
                    b,
                });
            }
            EOp::Store { a, output } => steps.push(Step::Store { a: cur[a], output }),
        }
    }
    // a compute step directly followed by the store of its result, which nothing reads afterwards,
    // writes into the output itself
    let mut i = 0;
    while i + 1 < steps.len() {
        if let (Some(d), Step::Store { a, output }) = (dst_reg(&steps[i]), steps[i + 1]) {
            if a == d && in_place(&outputs[output]) && !read_later(&steps[i + 2..], d) {
                set_dst(&mut steps[i], Dst::Out(output));
                steps.remove(i + 1);
            }
        }
        i += 1;
    }
    let registers = nregs + hoisted.len();
    let (slots, buffers) = assign_slots(&mut steps, &mut hoisted, registers);
    let fit = L1_BUDGET / (buffers.max(1) * lane.size());
    Prepared {
        steps,
        hoisted,
        slots,
        buffers,
        chunk: (fit / 64 * 64).clamp(CHUNK, MAX_CHUNK),
    }
}

/// The operands a step reads.
fn reads(step: &Step) -> impl Iterator<Item = usize> {
    let (a, b, c) = match *step {
        Step::Unary { a, .. } | Step::Store { a, .. } => (Some(a), None, None),
        Step::Binary { a, b, .. } => (Some(a), Some(b), None),
        Step::Where { c, a, b, .. } => (Some(c), Some(a), Some(b)),
        Step::Alias { .. } | Step::Load { .. } | Step::Iota { .. } => (None, None, None),
    };
    a.into_iter().chain(b).chain(c)
}

/// Renames the code's registers to slots so that values whose lives do not overlap share a chunk
/// buffer. Fewer buffers keep a chunk's working set in L1 at a longer chunk, and so fewer chunks.
/// A step's destination never shares a buffer with its operands (they are borrowed as distinct
/// slices). Values read in place from an input get slots above every buffer: they need only a
/// pointer. Returns the number of slots and of buffers.
fn assign_slots(
    steps: &mut [Step],
    hoisted: &mut [(usize, Hoisted)],
    nregs: usize,
) -> (usize, usize) {
    // `slot_of[r]`: where register r's live value is; hoisted values own the first buffers for good
    let mut slot_of: Vec<usize> = vec![usize::MAX; nregs];
    for (i, (r, _)) in hoisted.iter_mut().enumerate() {
        slot_of[*r] = i;
        *r = i;
    }
    let pinned = hoisted.len();
    let mut buffers = pinned;
    let mut free: Vec<usize> = Vec::new();
    let mut aliases = 0;
    let alias_base = nregs; // no more buffers than registers can ever be live at once
    for i in 0..steps.len() {
        let step = steps[i];
        let operands: Vec<usize> = reads(&step).collect();
        let dst = match step {
            Step::Alias { d, .. } | Step::Load { d, .. } | Step::Iota { d } => Some(d),
            _ => dst_reg(&step),
        };
        // the register written here loses its old value (not among the operands: validate ensures it)
        if let Some(d) = dst {
            let old = slot_of[d];
            if old >= pinned && old < alias_base && !operands.contains(&d) {
                free.push(old);
            }
        }
        let mut renamed = step;
        let new_slot = |free: &mut Vec<usize>, buffers: &mut usize| {
            free.pop().unwrap_or_else(|| {
                *buffers += 1;
                *buffers - 1
            })
        };
        match &mut renamed {
            Step::Alias { d, .. } => {
                slot_of[*d] = alias_base + aliases;
                aliases += 1;
                *d = slot_of[*d];
            }
            Step::Load { d, .. } | Step::Iota { d } => {
                slot_of[*d] = new_slot(&mut free, &mut buffers);
                *d = slot_of[*d];
            }
            Step::Unary { a, .. } | Step::Store { a, .. } => *a = slot_of[*a],
            Step::Binary { a, b, .. } => (*a, *b) = (slot_of[*a], slot_of[*b]),
            Step::Where { c, a, b, .. } => (*c, *a, *b) = (slot_of[*c], slot_of[*a], slot_of[*b]),
        }
        if let (Some(d), true) = (
            dst,
            matches!(
                step,
                Step::Unary { .. } | Step::Binary { .. } | Step::Where { .. }
            ),
        ) {
            slot_of[d] = new_slot(&mut free, &mut buffers);
            set_dst(&mut renamed, Dst::Reg(slot_of[d]));
        }
        // operands read for the last time give their buffers back, after the destination is chosen
        let later = &steps[i + 1..];
        let mut done: Vec<usize> = operands
            .into_iter()
            .filter(|&r| !read_later(later, r) && dst != Some(r))
            .collect();
        done.extend(dst.filter(|&d| !read_later(later, d)));
        done.sort_unstable();
        done.dedup();
        for r in done {
            let slot = slot_of[r];
            if slot >= pinned && slot < alias_base {
                free.push(slot);
            }
            slot_of[r] = usize::MAX;
        }
        steps[i] = renamed;
    }
    (alias_base + aliases, buffers)
}

fn dst_reg(step: &Step) -> Option<usize> {
    match *step {
        Step::Unary { d: Dst::Reg(d), .. }
        | Step::Binary { d: Dst::Reg(d), .. }
        | Step::Where { d: Dst::Reg(d), .. } => Some(d),
        _ => None,
    }
}

fn set_dst(step: &mut Step, to: Dst) {
    match step {
        Step::Unary { d, .. } | Step::Binary { d, .. } | Step::Where { d, .. } => *d = to,
        _ => {}
    }
}

/// Whether register `r` is read by `steps` before something overwrites it.
fn read_later(steps: &[Step], r: usize) -> bool {
    for s in steps {
        let reads = match *s {
            Step::Unary { a, .. } | Step::Store { a, .. } => a == r,
            Step::Binary { a, b, .. } => a == r || b == r,
            Step::Where { c, a, b, .. } => c == r || a == r || b == r,
            Step::Alias { .. } | Step::Load { .. } | Step::Iota { .. } => false,
        };
        if reads {
            return true;
        }
        let writes = match *s {
            Step::Alias { d, .. } | Step::Load { d, .. } | Step::Iota { d } => d == r,
            _ => dst_reg(s) == Some(r),
        };
        if writes {
            return false;
        }
    }
    false
}

/// A task's registers: chunk buffers `stride` elements apart and, per slot, where its current value
/// lives (its buffer, or an input read in place).
struct Regs<'a, T> {
    buf: &'a mut [T],
    stride: usize,
    at: Vec<*const T>,
}

thread_local! {
    /// Register buffers, kept per thread between runs: a fresh zeroed allocation per task costs more
    /// than a small chain's whole arithmetic.
    static SCRATCH: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f` with `len` elements of scratch (contents unspecified but initialized): this thread's
/// buffer, or a fresh one if it is already lent out.
fn with_scratch<T: Arith, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    // T is f32, f64 or i64: 8-byte alignment suffices and every bit pattern is a valid value
    debug_assert!(std::mem::align_of::<T>() <= 8);
    let words = (len * std::mem::size_of::<T>()).div_ceil(8);
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => {
            // one cache line of slack, so the buffers can start on a line: a vector load or store
            // that straddles two lines costs two accesses, on every element of every op
            if v.len() < words + 8 {
                *v = vec![0u64; words + 8];
            }
            let skip = v.as_ptr().align_offset(64);
            // SAFETY: from a 64-byte boundary the buffer still holds at least `len` T-sized, T-aligned,
            // initialized elements
            let buf =
                unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().add(skip) as *mut T, len) };
            f(buf)
        }
        Err(_) => f(&mut vec![T::default(); len]),
    })
}

/// # Safety
/// Every view must be valid for the whole iteration `shape`; outputs must not overlap inputs; `regs`
/// was set up by `run_typed` for these steps.
#[inline(always)]
unsafe fn run_chunk<T: Arith>(
    shape: &[usize],
    inputs: &[View],
    outputs: &[View],
    steps: &[Step],
    regs: &mut Regs<'_, T>,
    start: usize,
    len: usize,
) {
    let base = regs.buf.as_mut_ptr();
    let at = regs.at.as_mut_ptr();
    // SAFETY (all uses): `validate` and `prepare` keep every register index below the buffer count,
    // a destination distinct from its operands, and the buffer holds a stride per buffer slot.
    let stride = regs.stride;
    let buf = |r: usize| std::slice::from_raw_parts_mut(base.add(r * stride), len);
    let src = |r: usize| std::slice::from_raw_parts(*at.add(r), len);
    let dst = |d: Dst| match d {
        Dst::Reg(r) => {
            *at.add(r) = base.add(r * stride);
            buf(r)
        }
        Dst::Out(o) => std::slice::from_raw_parts_mut((outputs[o].ptr as *mut T).add(start), len),
    };
    // an operand outside the chunk buffers is a tensor's memory (read in place): it streams
    let buffers = base as *const T..base.add(regs.buf.len()) as *const T;
    let streams = |r: usize| !buffers.contains(&*at.add(r));
    for step in steps {
        match *step {
            Step::Alias { d, input } => *at.add(d) = (inputs[input].ptr as *const T).add(start),
            Step::Load { d, input } => {
                let v = &inputs[input];
                let out = dst(Dst::Reg(d));
                if v.layout == Layout::Contiguous {
                    // called directly (not through a closure) so it compiles for this ISA
                    load_run(v.dtype, v.ptr, start as isize, 1, out);
                } else {
                    for_runs(
                        shape,
                        &v.strides,
                        v.layout,
                        start,
                        len,
                        |pos, off, n, st| {
                            load_run(v.dtype, v.ptr, off, st, &mut out[pos..pos + n]);
                        },
                    );
                }
            }
            Step::Iota { d } => {
                for (i, x) in dst(Dst::Reg(d)).iter_mut().enumerate() {
                    *x = T::from_i64((start + i) as i64);
                }
            }
            Step::Unary { d, f, a } => {
                let stream = matches!(d, Dst::Out(_)) || streams(a);
                T::unary(f, src(a), dst(d), stream)
            }
            Step::Binary { d, f, a, b, scalar } => {
                let out = matches!(d, Dst::Out(_));
                match scalar {
                    Scalar::Neither => {
                        let stream = out || streams(a) || streams(b);
                        T::binary(f, src(a), src(b), dst(d), stream)
                    }
                    Scalar::B => T::binary_vs(f, src(a), **at.add(b), dst(d), out || streams(a)),
                    Scalar::A => T::binary_sv(f, **at.add(a), src(b), dst(d), out || streams(b)),
                }
            }
            Step::Where { d, c, a, b } => {
                let (c, a, b, o) = (src(c), src(a), src(b), dst(d));
                for i in 0..len {
                    o[i] = if c[i].is_nonzero() { a[i] } else { b[i] };
                }
            }
            Step::Store { a, output } => {
                let v = &outputs[output];
                let from = src(a);
                if v.layout == Layout::Contiguous {
                    store_run(v.dtype, v.ptr, start as isize, 1, from);
                } else {
                    for_runs(
                        shape,
                        &v.strides,
                        v.layout,
                        start,
                        len,
                        |pos, off, n, st| {
                            store_run(v.dtype, v.ptr, off, st, &from[pos..pos + n]);
                        },
                    );
                }
            }
        }
    }
}

type ChunkFn<T> = unsafe fn(&[usize], &[View], &[View], &[Step], &mut Regs<T>, usize, usize);

/// The chunk interpreter compiled per ISA, one function per compute type.
macro_rules! chunk_fn {
    ($name:ident, $t:ty) => {
        #[isa_versions]
        unsafe fn $name(
            s: &[usize],
            i: &[View],
            o: &[View],
            c: &[Step],
            r: &mut Regs<$t>,
            st: usize,
            n: usize,
        ) {
            run_chunk::<$t>(s, i, o, c, r, st, n)
        }
    };
}

chunk_fn!(chunk_f32, f32);
chunk_fn!(chunk_f64, f64);
chunk_fn!(chunk_i64, i64);

/// # Safety
/// As `run_chunk`.
unsafe fn run_typed<T: Arith>(
    f: ChunkFn<T>,
    shape: &[usize],
    inputs: &[View],
    outputs: &[View],
    prepared: &Prepared,
) {
    let total: usize = shape.iter().product();
    if total == 0 {
        return;
    }
    let task = |lo: usize, hi: usize| {
        let (chunk, stride) = (prepared.chunk, prepared.chunk + REG_PAD);
        with_scratch::<T, _>(prepared.buffers * stride, |buf| {
            let mut regs = Regs {
                buf,
                stride,
                at: vec![std::ptr::null(); prepared.slots],
            };
            for &(r, h) in &prepared.hoisted {
                let b = &mut regs.buf[r * stride..r * stride + chunk];
                match h {
                    Hoisted::Const { value, ivalue } => b.fill(T::constant(value, ivalue)),
                    Hoisted::Scalar { input } => {
                        let v = &inputs[input];
                        load_run(v.dtype, v.ptr, 0, 0, &mut b[..1]);
                        let x = b[0];
                        b.fill(x);
                    }
                }
                regs.at[r] = b.as_ptr();
            }
            let mut s = lo;
            while s < hi {
                let n = chunk.min(hi - s);
                f(shape, inputs, outputs, &prepared.steps, &mut regs, s, n);
                s += n;
            }
        })
    };
    let threads = threads::current();
    if total <= SERIAL_LIMIT || threads == 1 {
        return task(0, total);
    }
    // a few tasks per thread balance load; each task is a whole number of chunks
    let chunk = prepared.chunk;
    let per = total.div_ceil(threads * 4).div_ceil(chunk).max(8) * chunk;
    threads::parallel_for(total.div_ceil(per), |t| {
        task(t * per, ((t + 1) * per).min(total))
    });
}

/// Runs a fused chain.
///
/// # Safety
/// Every view must be valid for the whole iteration `shape`; outputs must not overlap inputs, and the
/// code must have passed [`validate`].
pub unsafe fn run(
    domain: Domain,
    shape: &[usize],
    inputs: &[View],
    outputs: &[View],
    code: &[EOp],
    nregs: usize,
) {
    let prepared = prepare_for(domain, code, nregs, inputs, outputs);
    run_prepared(domain, shape, inputs, outputs, &prepared)
}

/// Runs a fused chain prepared by [`prepare_for`] for operands of these dtypes and layouts.
///
/// # Safety
/// As [`run`]; `prepared` came from the same code and operand layouts.
pub unsafe fn run_prepared(
    domain: Domain,
    shape: &[usize],
    inputs: &[View],
    outputs: &[View],
    prepared: &Prepared,
) {
    match domain {
        Domain::F32 => run_typed::<f32>(chunk_f32, shape, inputs, outputs, prepared),
        Domain::F64 => run_typed::<f64>(chunk_f64, shape, inputs, outputs, prepared),
        Domain::I64 => run_typed::<i64>(chunk_i64, shape, inputs, outputs, prepared),
    }
}

#[inline(always)]
fn unary_inplace<T: Arith>(f: UnaryFn, data: &mut [T]) {
    let mut tmp = [T::default(); CHUNK];
    for c in data.chunks_mut(CHUNK) {
        let t = &mut tmp[..c.len()];
        t.copy_from_slice(c);
        T::unary(f, t, c, false);
    }
}

/// `data = act(data + beta·bias + residual)` (each addend optional), a chunk at a time through an L1
/// buffer: the epilogue of a GEMM whose product was written first.
#[inline(always)]
fn add_activate_inplace<T: Arith>(
    f: Option<UnaryFn>,
    beta: T,
    bias: Option<&[T]>,
    residual: Option<&[T]>,
    data: &mut [T],
) {
    let (mut t, mut u) = ([T::default(); CHUNK], [T::default(); CHUNK]);
    for (ci, c) in data.chunks_mut(CHUNK).enumerate() {
        let (lo, n) = (ci * CHUNK, c.len());
        let (t, u) = (&mut t[..n], &mut u[..n]);
        // the running sum lives in `t`; `u` holds beta·bias
        match bias.map(|b| &b[lo..lo + n]) {
            Some(b) if beta == T::from_i64(1) => T::binary(BinaryFn::Add, c, b, t, false),
            Some(b) => {
                T::binary_vs(BinaryFn::Mul, b, beta, u, false);
                T::binary(BinaryFn::Add, c, u, t, false);
            }
            None => t.copy_from_slice(c),
        }
        if let Some(r) = residual {
            u.copy_from_slice(t);
            T::binary(BinaryFn::Add, u, &r[lo..lo + n], t, false);
        }
        match f {
            Some(f) => T::unary(f, t, c, false),
            None => c.copy_from_slice(t),
        }
    }
}

/// In-place activation, and the same after addends, compiled per ISA, one function each per float
/// type.
macro_rules! activate_fns {
    ($activate:ident, $add_activate:ident, $t:ty) => {
        #[isa_versions]
        fn $activate(f: UnaryFn, data: &mut [$t]) {
            unary_inplace(f, data)
        }

        #[isa_versions]
        fn $add_activate(
            f: Option<UnaryFn>,
            beta: $t,
            bias: Option<&[$t]>,
            residual: Option<&[$t]>,
            data: &mut [$t],
        ) {
            add_activate_inplace(f, beta, bias, residual, data)
        }
    };
}

activate_fns!(unary_inplace_f32, add_activate_f32, f32);
activate_fns!(unary_inplace_f64, add_activate_f64, f64);

/// A compute type with ISA-dispatched GEMM epilogues.
pub trait Activate: Arith {
    /// `data = f(data)`.
    fn activate(f: UnaryFn, data: &mut [Self]);
    /// `data = f(data + beta·bias + residual)`; `bias` and `residual` (when given) at least as long
    /// as `data`.
    fn add_activate(
        f: Option<UnaryFn>,
        beta: Self,
        bias: Option<&[Self]>,
        residual: Option<&[Self]>,
        data: &mut [Self],
    );
}

macro_rules! activate_impl {
    ($t:ty, $activate:ident, $add_activate:ident) => {
        impl Activate for $t {
            fn activate(f: UnaryFn, data: &mut [$t]) {
                $activate(f, data)
            }
            fn add_activate(
                f: Option<UnaryFn>,
                beta: $t,
                bias: Option<&[$t]>,
                residual: Option<&[$t]>,
                data: &mut [$t],
            ) {
                $add_activate(f, beta, bias, residual, data)
            }
        }
    };
}

activate_impl!(f32, unary_inplace_f32, add_activate_f32);
activate_impl!(f64, unary_inplace_f64, add_activate_f64);

#[cfg(test)]
mod tests {
    use super::*;

    fn view<T>(v: &mut [T], dtype: DType, shape: &[usize], strides: &[isize]) -> View {
        View::new(v.as_mut_ptr() as *mut u8, dtype, shape, strides)
    }

    /// Every op through the prefetching loop (operands in memory) and the plain one (chunk buffers)
    /// gives the same bits, over lengths around a cache line's worth of lanes and with specials.
    #[test]
    fn streaming_and_plain_loops_agree_for_every_op() {
        let unary: Vec<UnaryFn> = serde_json::from_str(r#"["identity","neg","abs","relu","sigmoid","tanh","gelu","gelu_tanh","silu","hardswish","hardsigmoid","exp","exp2","expm1","log","log2","log10","log1p","sqrt","rsqrt","reciprocal","sin","cos","tan","asin","acos","atan","sinh","cosh","asinh","acosh","atanh","erf","erfc","floor","ceil","round","trunc","sign","square","logical_not","is_nan","is_inf","is_finite","signbit","bitwise_not"]"#).unwrap();
        let binary: Vec<BinaryFn> = serde_json::from_str(r#"["add","sub","mul","div","div_trunc","div_floor","pow","maximum","minimum","fmax","fmin","atan2","fmod","remainder","eq","ne","lt","le","gt","ge","logical_and","logical_or","logical_xor","bit_and","bit_or","bit_xor","shl","shr","copysign","hypot"]"#).unwrap();
        fn check<T: Arith + PartialEq + std::fmt::Debug>(
            unary: &[UnaryFn],
            binary: &[BinaryFn],
            value: impl Fn(usize) -> T,
        ) {
            let same =
                |x: &[T], y: &[T]| x.iter().zip(y).all(|(a, b)| a == b || (a != a && b != b));
            for n in [0usize, 1, 7, 15, 16, 17, 33, 64, 100, 257] {
                let a: Vec<T> = (0..n).map(&value).collect();
                let b: Vec<T> = (0..n).map(|i| value(i * 7 + 3)).collect();
                let (mut p, mut q) = (vec![T::default(); n], vec![T::default(); n]);
                for &f in unary {
                    T::unary(f, &a, &mut p, true);
                    T::unary(f, &a, &mut q, false);
                    assert!(same(&p, &q), "{f:?} over {n}");
                }
                for &f in binary {
                    T::binary(f, &a, &b, &mut p, true);
                    T::binary(f, &a, &b, &mut q, false);
                    assert!(same(&p, &q), "{f:?} over {n}");
                    if n > 0 {
                        T::binary_vs(f, &a, b[0], &mut p, true);
                        T::binary_vs(f, &a, b[0], &mut q, false);
                        assert!(same(&p, &q), "{f:?} with a scalar second operand over {n}");
                        T::binary_sv(f, b[0], &a, &mut p, true);
                        T::binary_sv(f, b[0], &a, &mut q, false);
                        assert!(same(&p, &q), "{f:?} with a scalar first operand over {n}");
                    }
                }
            }
        }
        let special = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0];
        let float = |i: usize| {
            if i % 11 == 5 {
                special[i % special.len()]
            } else {
                (i as f64 * 0.37).sin() * 4.0
            }
        };
        check(&unary, &binary, |i| float(i) as f32);
        check(&unary, &binary, float);
        check(&unary, &binary, |i| (i as i64 % 13) - 6);
    }

    #[test]
    fn fused_chain_with_broadcast_and_bool_output() {
        // out = relu(x * 2 + bias) ; mask = out > 1   over [3, 1000] with bias [1000] broadcast on rows
        let (r, c) = (3usize, 1000usize);
        let mut x: Vec<f32> = (0..r * c).map(|i| (i as f32 - 1500.0) / 500.0).collect();
        let mut bias: Vec<f32> = (0..c).map(|i| i as f32 / 1000.0).collect();
        let mut out = vec![0f32; r * c];
        let mut mask = vec![7u8; r * c];
        let shape = [r, c];
        let code = vec![
            EOp::Load { d: 0, input: 0 },
            EOp::Const {
                d: 1,
                value: 2.0,
                ivalue: 2,
            },
            EOp::Binary {
                d: 2,
                f: BinaryFn::Mul,
                a: 0,
                b: 1,
            },
            EOp::Load { d: 3, input: 1 },
            EOp::Binary {
                d: 4,
                f: BinaryFn::Add,
                a: 2,
                b: 3,
            },
            EOp::Unary {
                d: 5,
                f: UnaryFn::Relu,
                a: 4,
            },
            EOp::Store { a: 5, output: 0 },
            EOp::Binary {
                d: 6,
                f: BinaryFn::Gt,
                a: 5,
                b: 7,
            },
            EOp::Store { a: 6, output: 1 },
        ];
        let mut code = code;
        code.insert(
            7,
            EOp::Const {
                d: 7,
                value: 1.0,
                ivalue: 1,
            },
        );
        validate(&code, 8, 2, 2).unwrap();
        let ins = [
            view(&mut x, DType::F32, &shape, &[c as isize, 1]),
            view(&mut bias, DType::F32, &shape, &[0, 1]),
        ];
        let outs = [
            view(&mut out, DType::F32, &shape, &[c as isize, 1]),
            view(&mut mask, DType::Bool, &shape, &[c as isize, 1]),
        ];
        unsafe { run(Domain::F32, &shape, &ins, &outs, &code, 8) };
        for i in 0..r * c {
            let want = (x[i] * 2.0 + bias[i % c]).max(0.0);
            assert_eq!(out[i], want);
            assert_eq!(mask[i], (want > 1.0) as u8);
        }
    }

    #[test]
    fn prepared_code_reads_in_place_hoists_constants_and_stores_directly() {
        // r1 holds 3, then x·3, then 0.5 (reused registers must keep their meaning per position);
        // out0 = (x·3 + s)·0.5 with s a 0-d input; out1 = x·3 (stored, then still read: not direct)
        let n = 1500usize;
        let mut x: Vec<f32> = (0..n).map(|i| i as f32 * 0.01 - 3.0).collect();
        let mut s = vec![0.25f32];
        let (mut out0, mut out1) = (vec![0f32; n], vec![0f32; n]);
        let c = |d, value: f64| EOp::Const {
            d,
            value,
            ivalue: 0,
        };
        let bin = |d, f, a, b| EOp::Binary { d, f, a, b };
        let code = vec![
            EOp::Load { d: 0, input: 0 },
            c(1, 3.0),
            bin(2, BinaryFn::Mul, 0, 1),
            EOp::Store { a: 2, output: 1 },
            EOp::Load { d: 1, input: 1 },
            bin(3, BinaryFn::Add, 2, 1),
            c(1, 0.5),
            bin(0, BinaryFn::Mul, 3, 1),
            EOp::Store { a: 0, output: 0 },
        ];
        validate(&code, 4, 2, 2).unwrap();
        let shape = [n];
        let ins = [
            view(&mut x, DType::F32, &shape, &[1]),
            view(&mut s, DType::F32, &shape, &[0]),
        ];
        let outs = [
            view(&mut out0, DType::F32, &shape, &[1]),
            view(&mut out1, DType::F32, &shape, &[1]),
        ];
        let p = prepare(&code, 4, &ins, &outs, DType::F32);
        assert_eq!(p.hoisted.len(), 3, "two constants and the scalar input");
        assert!(matches!(p.steps[0], Step::Alias { input: 0, .. }));
        let stores = p
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Store { .. }))
            .count();
        assert_eq!(
            stores, 1,
            "x·3 is read after its store; the last result goes out directly"
        );
        assert!(matches!(
            p.steps.last(),
            Some(Step::Binary { d: Dst::Out(0), .. })
        ));
        unsafe { run(Domain::F32, &shape, &ins, &outs, &code, 4) };
        for i in 0..n {
            assert_eq!(out1[i], x[i] * 3.0);
            assert_eq!(out0[i], (x[i] * 3.0 + 0.25) * 0.5);
        }
    }

    #[test]
    fn values_with_disjoint_lives_share_buffers_and_stay_correct() {
        // x·x (one operand twice), a redefined register, a dead load, a value stored and read again,
        // and a 3-buffer-deep chain over a length that is not a multiple of any chunk
        let n = 20_011;
        let mut x: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.05 - 2.0).collect();
        let mut y: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.25 + 0.5).collect();
        let mut xs: Vec<f32> = x.iter().rev().copied().collect(); // read through a negative stride
        let (mut out0, mut out1) = (vec![0f32; n], vec![0f32; n]);
        let bin = |d, f, a, b| EOp::Binary { d, f, a, b };
        let code = vec![
            EOp::Load { d: 0, input: 0 },
            EOp::Load { d: 1, input: 1 },
            EOp::Load { d: 6, input: 2 }, // read and then never used
            bin(2, BinaryFn::Mul, 0, 0),
            bin(3, BinaryFn::Add, 2, 1),
            EOp::Store { a: 3, output: 1 },
            EOp::Unary {
                d: 4,
                f: UnaryFn::Relu,
                a: 3,
            },
            bin(2, BinaryFn::Sub, 4, 0), // register 2 redefined
            bin(5, BinaryFn::Mul, 2, 3),
            bin(4, BinaryFn::Div, 5, 1),
            EOp::Store { a: 4, output: 0 },
        ];
        validate(&code, 7, 3, 2).unwrap();
        let shape = [n];
        let ins = [
            view(&mut x, DType::F32, &shape, &[1]),
            view(&mut y, DType::F32, &shape, &[1]),
            View::new(
                unsafe { xs.as_mut_ptr().add(n - 1) } as *mut u8,
                DType::F32,
                &shape,
                &[-1],
            ),
        ];
        let outs = [
            view(&mut out0, DType::F32, &shape, &[1]),
            view(&mut out1, DType::F32, &shape, &[1]),
        ];
        let p = prepare(&code, 7, &ins, &outs, DType::F32);
        assert!(
            p.buffers <= 4,
            "{} buffers for at most 4 values live at once",
            p.buffers
        );
        assert!(p.chunk > CHUNK, "few buffers buy a longer chunk");
        unsafe { run(Domain::F32, &shape, &ins, &outs, &code, 7) };
        for i in 0..n {
            let (a, b) = (x[i], y[i]);
            let t = a * a + b;
            assert_eq!(out1[i], t, "{i}");
            let u = (if t < 0.0 { 0.0 } else { t }) - a;
            assert_eq!(out0[i], u * t / b, "{i}");
        }
    }

    #[test]
    fn scalar_operands_on_either_side_of_non_commutative_ops() {
        // out0 = 3 - x, out1 = x / 4, out2 = s ** x (s a 0-d input), out3 = max(x, s): the hoisted
        // constant or scalar read once per chunk, on the left or the right, in every domain
        fn run_domain<T: Copy + Default>(
            domain: Domain,
            dtype: DType,
            x: &mut [T],
            s: &mut [T],
        ) -> Vec<Vec<T>> {
            let n = x.len();
            let mut outs: Vec<Vec<T>> = (0..4).map(|_| vec![T::default(); n]).collect();
            let c = |d, value: f64| EOp::Const {
                d,
                value,
                ivalue: value as i64,
            };
            let bin = |d, f, a, b| EOp::Binary { d, f, a, b };
            let code = vec![
                EOp::Load { d: 0, input: 0 },
                EOp::Load { d: 1, input: 1 },
                c(2, 3.0),
                c(3, 4.0),
                bin(4, BinaryFn::Sub, 2, 0),
                EOp::Store { a: 4, output: 0 },
                bin(5, BinaryFn::Div, 0, 3),
                EOp::Store { a: 5, output: 1 },
                bin(6, BinaryFn::Pow, 1, 0),
                EOp::Store { a: 6, output: 2 },
                bin(7, BinaryFn::Maximum, 0, 1),
                EOp::Store { a: 7, output: 3 },
            ];
            validate(&code, 8, 2, 4).unwrap();
            let shape = [n];
            let ins = [view(x, dtype, &shape, &[1]), view(s, dtype, &shape, &[0])];
            let outs_v: Vec<View> = outs
                .iter_mut()
                .map(|o| view(o, dtype, &shape, &[1]))
                .collect();
            let p = prepare_for(domain, &code, 8, &ins, &outs_v);
            assert!(
                p.steps.iter().any(|st| matches!(
                    st,
                    Step::Binary {
                        scalar: Scalar::A,
                        ..
                    }
                )) && p.steps.iter().any(|st| matches!(
                    st,
                    Step::Binary {
                        scalar: Scalar::B,
                        ..
                    }
                )),
                "{:?}",
                p.steps
            );
            unsafe { run_prepared(domain, &shape, &ins, &outs_v, &p) };
            outs
        }
        let n = 3000; // several chunks, and pieces of the integer fallback
        let mut x: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.5 - 2.0).collect();
        let mut s = vec![1.5f32];
        let got = run_domain(Domain::F32, DType::F32, &mut x, &mut s);
        for i in 0..n {
            let v = x[i];
            assert_eq!(got[0][i], 3.0 - v);
            assert_eq!(got[1][i], v / 4.0);
            assert_eq!(got[2][i], 1.5f32.powf(v));
            assert_eq!(got[3][i], v.max(1.5));
        }
        let mut x: Vec<f64> = (0..n).map(|i| (i % 13) as f64 * 0.5 - 2.0).collect();
        let mut s = vec![1.5f64];
        let got = run_domain(Domain::F64, DType::F64, &mut x, &mut s);
        for i in 0..n {
            let v = x[i];
            assert_eq!(
                (got[0][i], got[1][i], got[2][i]),
                (3.0 - v, v / 4.0, 1.5f64.powf(v))
            );
        }
        let mut x: Vec<i64> = (0..n as i64).map(|i| i % 13 - 6).collect();
        let mut s = vec![2i64];
        let got = run_domain(Domain::I64, DType::I64, &mut x, &mut s);
        for i in 0..n {
            let v = x[i];
            let pow = if v < 0 { 0 } else { 2i64.pow(v as u32) };
            assert_eq!(
                (got[0][i], got[1][i], got[2][i], got[3][i]),
                (3 - v, v / 4, pow, v.max(2))
            );
        }
    }

    #[test]
    fn integer_domain_stays_exact_beyond_f32() {
        let mut x: Vec<i64> = vec![(1 << 40) + 1, -7, 9];
        let mut out = vec![0i64; 3];
        let shape = [3usize];
        let code = [
            EOp::Load { d: 0, input: 0 },
            EOp::Const {
                d: 1,
                value: 3.0,
                ivalue: 3,
            },
            EOp::Binary {
                d: 2,
                f: BinaryFn::DivFloor,
                a: 0,
                b: 1,
            },
            EOp::Store { a: 2, output: 0 },
        ];
        let ins = [view(&mut x, DType::I64, &shape, &[1])];
        let outs = [view(&mut out, DType::I64, &shape, &[1])];
        unsafe { run(Domain::I64, &shape, &ins, &outs, &code, 3) };
        assert_eq!(out, vec![((1i64 << 40) + 1).div_euclid(3), -3, 3]);
    }

    #[test]
    fn large_strided_parallel_copy_and_half_conversion() {
        // transpose-copy a 300×700 f32 matrix into bf16 (exercises runs, threads, conversion)
        let (r, c) = (300usize, 700usize);
        let mut x: Vec<f32> = (0..r * c).map(|i| (i % 97) as f32).collect();
        let mut out = vec![half::bf16::ZERO; r * c];
        let shape = [c, r];
        let ins = [view(&mut x, DType::F32, &shape, &[1, c as isize])];
        let outs = [view(&mut out, DType::Bf16, &shape, &[r as isize, 1])];
        let code = [EOp::Load { d: 0, input: 0 }, EOp::Store { a: 0, output: 0 }];
        unsafe { run(Domain::F32, &shape, &ins, &outs, &code, 1) };
        for j in 0..c {
            for i in 0..r {
                assert_eq!(out[j * r + i].to_f32(), x[i * c + j]);
            }
        }
    }
}
