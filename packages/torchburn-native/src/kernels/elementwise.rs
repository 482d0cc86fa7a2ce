//! The fused elementwise machine: a chain of ATen elementwise ops runs as one sweep over memory.
//!
//! Python compiles a chain into register code (`EOp`s). The iteration space is cut into chunks of
//! `CHUNK` elements; for each chunk every op runs as a tight loop over register slices that LLVM
//! vectorizes, so a chunk's intermediates live in L1 and memory is read and written once.
//! The chunk interpreter is compiled once per ISA (AVX-512, AVX2+FMA, NEON, baseline) and picked at run time.

use multiversion::multiversion;
use rayon::prelude::*;
use serde::Deserialize;

use super::math;
use super::strided::{for_runs, layout_of, load_run, store_run, Lane, Layout};
use crate::plan::DType;

/// Elements per chunk: 16 registers of f32 stay within a 32 KiB L1.
pub const CHUNK: usize = 512;
/// Below this many elements a chain runs on the calling thread.
const SERIAL_LIMIT: usize = 1 << 15;

#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    F32,
    F64,
    I64,
}

#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum UnaryFn {
    Identity,
    Neg,
    Abs,
    Relu,
    Sigmoid,
    Tanh,
    Gelu,
    GeluTanh,
    Silu,
    Hardswish,
    Hardsigmoid,
    Exp,
    Exp2,
    Expm1,
    Log,
    Log2,
    Log10,
    Log1p,
    Sqrt,
    Rsqrt,
    Reciprocal,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Erf,
    Erfc,
    Floor,
    Ceil,
    Round,
    Trunc,
    Sign,
    Square,
    LogicalNot,
    IsNan,
    IsInf,
    IsFinite,
    Signbit,
    BitwiseNot,
}

#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BinaryFn {
    Add,
    Sub,
    Mul,
    Div,
    DivTrunc,
    DivFloor,
    Pow,
    Maximum,
    Minimum,
    Fmax,
    Fmin,
    Atan2,
    Fmod,
    Remainder,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    LogicalAnd,
    LogicalOr,
    LogicalXor,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    Copysign,
    Hypot,
}

/// One instruction of the register machine; `d` is the destination register (never an operand's).
#[derive(Deserialize, Clone, Copy, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum EOp {
    Load {
        d: usize,
        input: usize,
    },
    Const {
        d: usize,
        #[serde(deserialize_with = "crate::plan::de_f64")]
        value: f64,
        #[serde(default)]
        ivalue: i64,
    },
    /// the element's linear index in the iteration (arange, iota)
    Iota {
        d: usize,
    },
    Unary {
        d: usize,
        f: UnaryFn,
        a: usize,
    },
    Binary {
        d: usize,
        f: BinaryFn,
        a: usize,
        b: usize,
    },
    Where {
        d: usize,
        c: usize,
        a: usize,
        b: usize,
    },
    Store {
        a: usize,
        output: usize,
    },
}

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
pub trait Arith: Lane {
    fn unary(f: UnaryFn, a: &[Self], out: &mut [Self]);
    fn binary(f: BinaryFn, a: &[Self], b: &[Self], out: &mut [Self]);
}

#[inline(always)]
fn map1<T: Copy>(a: &[T], out: &mut [T], f: impl Fn(T) -> T) {
    for (o, &x) in out.iter_mut().zip(a) {
        *o = f(x);
    }
}

#[inline(always)]
fn map2<T: Copy>(a: &[T], b: &[T], out: &mut [T], f: impl Fn(T, T) -> T) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

macro_rules! float_arith {
    ($t:ty, $exp:expr, $ln:expr, $tanh:expr, $sigmoid:expr, $erf:expr, $gelu:expr, $gelu_tanh:expr) => {
        impl Arith for $t {
            #[inline(always)]
            fn unary(f: UnaryFn, a: &[$t], out: &mut [$t]) {
                let b = |v: bool| if v { 1.0 } else { 0.0 };
                match f {
                    UnaryFn::Identity => out.copy_from_slice(a),
                    UnaryFn::Neg => map1(a, out, |x| -x),
                    UnaryFn::Abs => map1(a, out, |x| x.abs()),
                    // `x < 0 ? 0 : x` keeps NaN, as PyTorch's relu does
                    UnaryFn::Relu => map1(a, out, |x| if x < 0.0 { 0.0 } else { x }),
                    UnaryFn::Sigmoid => map1(a, out, $sigmoid),
                    UnaryFn::Tanh => map1(a, out, $tanh),
                    UnaryFn::Gelu => map1(a, out, $gelu),
                    UnaryFn::GeluTanh => map1(a, out, $gelu_tanh),
                    UnaryFn::Silu => map1(a, out, |x| x * ($sigmoid)(x)),
                    UnaryFn::Hardswish => map1(a, out, |x| x * (x + 3.0).clamp(0.0, 6.0) / 6.0),
                    UnaryFn::Hardsigmoid => map1(a, out, |x| (x + 3.0).clamp(0.0, 6.0) / 6.0),
                    UnaryFn::Exp => map1(a, out, $exp),
                    UnaryFn::Exp2 => map1(a, out, |x| x.exp2()),
                    UnaryFn::Expm1 => map1(a, out, |x| x.exp_m1()),
                    UnaryFn::Log => map1(a, out, $ln),
                    UnaryFn::Log2 => map1(a, out, |x| x.log2()),
                    UnaryFn::Log10 => map1(a, out, |x| x.log10()),
                    UnaryFn::Log1p => map1(a, out, |x| x.ln_1p()),
                    UnaryFn::Sqrt => map1(a, out, |x| x.sqrt()),
                    UnaryFn::Rsqrt => map1(a, out, |x| 1.0 / x.sqrt()),
                    UnaryFn::Reciprocal => map1(a, out, |x| 1.0 / x),
                    UnaryFn::Sin => map1(a, out, |x| x.sin()),
                    UnaryFn::Cos => map1(a, out, |x| x.cos()),
                    UnaryFn::Tan => map1(a, out, |x| x.tan()),
                    UnaryFn::Asin => map1(a, out, |x| x.asin()),
                    UnaryFn::Acos => map1(a, out, |x| x.acos()),
                    UnaryFn::Atan => map1(a, out, |x| x.atan()),
                    UnaryFn::Sinh => map1(a, out, |x| x.sinh()),
                    UnaryFn::Cosh => map1(a, out, |x| x.cosh()),
                    UnaryFn::Asinh => map1(a, out, |x| x.asinh()),
                    UnaryFn::Acosh => map1(a, out, |x| x.acosh()),
                    UnaryFn::Atanh => map1(a, out, |x| x.atanh()),
                    UnaryFn::Erf => map1(a, out, $erf),
                    UnaryFn::Erfc => map1(a, out, |x| 1.0 - ($erf)(x)),
                    UnaryFn::Floor => map1(a, out, |x| x.floor()),
                    UnaryFn::Ceil => map1(a, out, |x| x.ceil()),
                    UnaryFn::Round => map1(a, out, |x| x.round_ties_even()),
                    UnaryFn::Trunc => map1(a, out, |x| x.trunc()),
                    UnaryFn::Sign => map1(a, out, |x| {
                        if x > 0.0 {
                            1.0
                        } else if x < 0.0 {
                            -1.0
                        } else {
                            x * 0.0
                        }
                    }),
                    UnaryFn::Square => map1(a, out, |x| x * x),
                    UnaryFn::LogicalNot => map1(a, out, |x| b(x == 0.0)),
                    UnaryFn::IsNan => map1(a, out, |x| b(x.is_nan())),
                    UnaryFn::IsInf => map1(a, out, |x| b(x.is_infinite())),
                    UnaryFn::IsFinite => map1(a, out, |x| b(x.is_finite())),
                    UnaryFn::Signbit => map1(a, out, |x| b(x.is_sign_negative())),
                    UnaryFn::BitwiseNot => map1(a, out, |x| b(x == 0.0)), // bool tensors only
                }
            }

            #[inline(always)]
            fn binary(f: BinaryFn, a: &[$t], b: &[$t], out: &mut [$t]) {
                let c = |v: bool| if v { 1.0 } else { 0.0 };
                let nz = |v: $t| v != 0.0;
                match f {
                    BinaryFn::Add => map2(a, b, out, |x, y| x + y),
                    BinaryFn::Sub => map2(a, b, out, |x, y| x - y),
                    BinaryFn::Mul => map2(a, b, out, |x, y| x * y),
                    BinaryFn::Div => map2(a, b, out, |x, y| x / y),
                    BinaryFn::DivTrunc => map2(a, b, out, |x, y| (x / y).trunc()),
                    BinaryFn::DivFloor => map2(a, b, out, |x, y| (x / y).floor()),
                    BinaryFn::Pow => map2(a, b, out, |x, y| x.powf(y)),
                    BinaryFn::Maximum => map2(a, b, out, |x, y| {
                        if x.is_nan() || y.is_nan() {
                            <$t>::NAN
                        } else {
                            x.max(y)
                        }
                    }),
                    BinaryFn::Minimum => map2(a, b, out, |x, y| {
                        if x.is_nan() || y.is_nan() {
                            <$t>::NAN
                        } else {
                            x.min(y)
                        }
                    }),
                    BinaryFn::Fmax => map2(a, b, out, |x, y| x.max(y)),
                    BinaryFn::Fmin => map2(a, b, out, |x, y| x.min(y)),
                    BinaryFn::Atan2 => map2(a, b, out, |x, y| x.atan2(y)),
                    BinaryFn::Fmod => map2(a, b, out, |x, y| x % y),
                    BinaryFn::Remainder => map2(a, b, out, |x, y| {
                        let r = x % y;
                        if r != 0.0 && ((r < 0.0) != (y < 0.0)) {
                            r + y
                        } else {
                            r
                        }
                    }),
                    BinaryFn::Eq => map2(a, b, out, |x, y| c(x == y)),
                    BinaryFn::Ne => map2(a, b, out, |x, y| c(x != y)),
                    BinaryFn::Lt => map2(a, b, out, |x, y| c(x < y)),
                    BinaryFn::Le => map2(a, b, out, |x, y| c(x <= y)),
                    BinaryFn::Gt => map2(a, b, out, |x, y| c(x > y)),
                    BinaryFn::Ge => map2(a, b, out, |x, y| c(x >= y)),
                    BinaryFn::LogicalAnd | BinaryFn::BitAnd => {
                        map2(a, b, out, |x, y| c(nz(x) && nz(y)))
                    }
                    BinaryFn::LogicalOr | BinaryFn::BitOr => {
                        map2(a, b, out, |x, y| c(nz(x) || nz(y)))
                    }
                    BinaryFn::LogicalXor | BinaryFn::BitXor => {
                        map2(a, b, out, |x, y| c(nz(x) != nz(y)))
                    }
                    BinaryFn::Shl | BinaryFn::Shr => out.fill(<$t>::NAN), // rejected by the planner
                    BinaryFn::Copysign => map2(a, b, out, |x, y| x.copysign(y)),
                    BinaryFn::Hypot => map2(a, b, out, |x, y| x.hypot(y)),
                }
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
    math::gelu_f32,
    math::gelu_tanh_f32
);
float_arith!(
    f64,
    |x: f64| x.exp(),
    |x: f64| x.ln(),
    |x: f64| x.tanh(),
    |x: f64| 1.0 / (1.0 + (-x).exp()),
    erf_f64,
    |x: f64| 0.5 * x * (1.0 + erf_f64(x * std::f64::consts::FRAC_1_SQRT_2)),
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
    fn unary(f: UnaryFn, a: &[i64], out: &mut [i64]) {
        let b = |v: bool| v as i64;
        match f {
            UnaryFn::Identity => out.copy_from_slice(a),
            UnaryFn::Neg => map1(a, out, |x| x.wrapping_neg()),
            UnaryFn::Abs => map1(a, out, |x| x.wrapping_abs()),
            UnaryFn::Relu => map1(a, out, |x| x.max(0)),
            UnaryFn::Sign => map1(a, out, |x| x.signum()),
            UnaryFn::Square => map1(a, out, |x| x.wrapping_mul(x)),
            UnaryFn::LogicalNot => map1(a, out, |x| b(x == 0)),
            UnaryFn::BitwiseNot => map1(a, out, |x| !x),
            UnaryFn::IsNan | UnaryFn::IsInf | UnaryFn::Signbit => {
                map1(a, out, |x| b(f == UnaryFn::Signbit && x < 0))
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
    fn binary(f: BinaryFn, a: &[i64], b: &[i64], out: &mut [i64]) {
        let c = |v: bool| v as i64;
        match f {
            BinaryFn::Add => map2(a, b, out, |x, y| x.wrapping_add(y)),
            BinaryFn::Sub => map2(a, b, out, |x, y| x.wrapping_sub(y)),
            BinaryFn::Mul => map2(a, b, out, |x, y| x.wrapping_mul(y)),
            BinaryFn::Div | BinaryFn::DivTrunc => {
                map2(a, b, out, |x, y| if y == 0 { 0 } else { x.wrapping_div(y) })
            }
            BinaryFn::DivFloor => map2(a, b, out, |x, y| {
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
            BinaryFn::Pow => map2(a, b, out, |x, y| {
                if y < 0 {
                    0
                } else {
                    x.wrapping_pow(y.min(u32::MAX as i64) as u32)
                }
            }),
            BinaryFn::Maximum | BinaryFn::Fmax => map2(a, b, out, |x, y| x.max(y)),
            BinaryFn::Minimum | BinaryFn::Fmin => map2(a, b, out, |x, y| x.min(y)),
            BinaryFn::Fmod => map2(a, b, out, |x, y| if y == 0 { 0 } else { x.wrapping_rem(y) }),
            BinaryFn::Remainder => map2(a, b, out, |x, y| {
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
            BinaryFn::Eq => map2(a, b, out, |x, y| c(x == y)),
            BinaryFn::Ne => map2(a, b, out, |x, y| c(x != y)),
            BinaryFn::Lt => map2(a, b, out, |x, y| c(x < y)),
            BinaryFn::Le => map2(a, b, out, |x, y| c(x <= y)),
            BinaryFn::Gt => map2(a, b, out, |x, y| c(x > y)),
            BinaryFn::Ge => map2(a, b, out, |x, y| c(x >= y)),
            BinaryFn::LogicalAnd => map2(a, b, out, |x, y| c(x != 0 && y != 0)),
            BinaryFn::LogicalOr => map2(a, b, out, |x, y| c(x != 0 || y != 0)),
            BinaryFn::LogicalXor => map2(a, b, out, |x, y| c((x != 0) != (y != 0))),
            BinaryFn::BitAnd => map2(a, b, out, |x, y| x & y),
            BinaryFn::BitOr => map2(a, b, out, |x, y| x | y),
            BinaryFn::BitXor => map2(a, b, out, |x, y| x ^ y),
            BinaryFn::Shl => map2(
                a,
                b,
                out,
                |x, y| if (0..64).contains(&y) { x << y } else { 0 },
            ),
            BinaryFn::Shr => map2(a, b, out, |x, y| {
                if (0..64).contains(&y) {
                    x >> y
                } else {
                    x >> 63
                }
            }),
            BinaryFn::Copysign | BinaryFn::Atan2 | BinaryFn::Hypot => out.fill(0),
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

/// # Safety
/// Every view must be valid for the whole iteration `shape`; outputs must not overlap inputs.
#[inline(always)]
unsafe fn run_chunk<T: Arith>(
    shape: &[usize],
    inputs: &[View],
    outputs: &[View],
    code: &[EOp],
    regs: &mut [T],
    start: usize,
    len: usize,
) {
    let base = regs.as_mut_ptr();
    // SAFETY (all `reg` uses): `validate` proved every index < nregs and destinations distinct from
    // operands, and `regs` holds nregs·CHUNK elements.
    let reg = |r: usize| std::slice::from_raw_parts_mut(base.add(r * CHUNK), len);
    for op in code {
        match *op {
            EOp::Load { d, input } => {
                let v = &inputs[input];
                let dst = reg(d);
                for_runs(
                    shape,
                    &v.strides,
                    v.layout,
                    start,
                    len,
                    |pos, off, n, st| {
                        load_run(v.dtype, v.ptr, off, st, &mut dst[pos..pos + n]);
                    },
                );
            }
            EOp::Const { d, value, ivalue } => {
                reg(d).fill(T::constant(value, ivalue));
            }
            EOp::Iota { d } => {
                for (i, x) in reg(d).iter_mut().enumerate() {
                    *x = T::from_i64((start + i) as i64);
                }
            }
            EOp::Unary { d, f, a } => T::unary(f, reg(a), reg(d)),
            EOp::Binary { d, f, a, b } => T::binary(f, reg(a), reg(b), reg(d)),
            EOp::Where { d, c, a, b } => {
                let (c, a, b, o) = (reg(c), reg(a), reg(b), reg(d));
                for i in 0..len {
                    o[i] = if c[i].is_nonzero() { a[i] } else { b[i] };
                }
            }
            EOp::Store { a, output } => {
                let v = &outputs[output];
                let src = reg(a);
                for_runs(
                    shape,
                    &v.strides,
                    v.layout,
                    start,
                    len,
                    |pos, off, n, st| {
                        store_run(v.dtype, v.ptr, off, st, &src[pos..pos + n]);
                    },
                );
            }
        }
    }
}

type ChunkFn<T> = unsafe fn(&[usize], &[View], &[View], &[EOp], &mut [T], usize, usize);

#[multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
unsafe fn chunk_f32(
    s: &[usize],
    i: &[View],
    o: &[View],
    c: &[EOp],
    r: &mut [f32],
    st: usize,
    n: usize,
) {
    run_chunk::<f32>(s, i, o, c, r, st, n)
}

#[multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl+fma",
    "x86_64+avx2+fma",
    "aarch64+neon"
))]
unsafe fn chunk_f64(
    s: &[usize],
    i: &[View],
    o: &[View],
    c: &[EOp],
    r: &mut [f64],
    st: usize,
    n: usize,
) {
    run_chunk::<f64>(s, i, o, c, r, st, n)
}

#[multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512dq+avx512vl",
    "x86_64+avx2",
    "aarch64+neon"
))]
unsafe fn chunk_i64(
    s: &[usize],
    i: &[View],
    o: &[View],
    c: &[EOp],
    r: &mut [i64],
    st: usize,
    n: usize,
) {
    run_chunk::<i64>(s, i, o, c, r, st, n)
}

/// # Safety
/// As `run_chunk`.
unsafe fn run_typed<T: Arith>(
    f: ChunkFn<T>,
    shape: &[usize],
    inputs: &[View],
    outputs: &[View],
    code: &[EOp],
    nregs: usize,
) {
    let total: usize = shape.iter().product();
    if total == 0 {
        return;
    }
    let task = |lo: usize, hi: usize| {
        let mut regs = vec![T::default(); nregs.max(1) * CHUNK];
        let mut s = lo;
        while s < hi {
            let n = CHUNK.min(hi - s);
            f(shape, inputs, outputs, code, &mut regs, s, n);
            s += n;
        }
    };
    let threads = rayon::current_num_threads();
    if total <= SERIAL_LIMIT || threads == 1 {
        return task(0, total);
    }
    // a few tasks per thread balance load; each task is a whole number of chunks
    let per = total.div_ceil(threads * 4).div_ceil(CHUNK).max(8) * CHUNK;
    let ntasks = total.div_ceil(per);
    (0..ntasks)
        .into_par_iter()
        .for_each(|t| task(t * per, ((t + 1) * per).min(total)));
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
    match domain {
        Domain::F32 => run_typed::<f32>(chunk_f32, shape, inputs, outputs, code, nregs),
        Domain::F64 => run_typed::<f64>(chunk_f64, shape, inputs, outputs, code, nregs),
        Domain::I64 => run_typed::<i64>(chunk_i64, shape, inputs, outputs, code, nregs),
    }
}

/// Applies an activation in place to a contiguous f32/f64 buffer (GEMM epilogues).
pub fn apply_unary_inplace<T: Arith>(f: UnaryFn, data: &mut [T]) {
    let work = |chunk: &mut [T]| {
        let mut tmp = [T::default(); CHUNK];
        for c in chunk.chunks_mut(CHUNK) {
            let t = &mut tmp[..c.len()];
            t.copy_from_slice(c);
            T::unary(f, t, c);
        }
    };
    if data.len() <= SERIAL_LIMIT {
        work(data);
    } else {
        data.par_chunks_mut(CHUNK * 16).for_each(work);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<T>(v: &mut [T], dtype: DType, shape: &[usize], strides: &[isize]) -> View {
        View::new(v.as_mut_ptr() as *mut u8, dtype, shape, strides)
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
