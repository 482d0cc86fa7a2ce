//! The elementwise expression: a fused chain of ATen elementwise ops as register code.
//!
//! Python compiles a chain into `EOp`s over numbered registers; `kernels::elementwise` runs them one
//! chunk of the iteration space at a time. `Domain` is the compute type the chain promotes to.

use serde::Deserialize;

/// The compute type of a chain: every register holds values of this type.
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    F32,
    F64,
    I64,
}

/// A one-operand function; also a matmul's activation.
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

/// A two-operand function.
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
    // orthogonal polynomials: (x, degree)
    ChebyshevT,
    ChebyshevU,
    ChebyshevV,
    ChebyshevW,
    HermiteH,
    HermiteHe,
    LaguerreL,
    LegendreP,
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
        #[serde(deserialize_with = "super::de_f64")]
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
