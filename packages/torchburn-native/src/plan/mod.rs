//! The program format Python sends: buffers, operands (strided views of buffers) and instructions.
//!
//! Python does all shape, stride and liveness work once per input signature; the instructions here
//! carry concrete sizes, so running a program is a walk over a `Vec` with no decisions left.
//!
//! This is the wire format and nothing else: plain data that serde reads. Kernels and instructions
//! import their vocabulary (dtypes, op enums, the elementwise register code) from here; the plan
//! imports nothing from them, so it can be read, checked or extended without the engine behind it.

mod expr;
mod instr;
mod operand;

pub use expr::{BinaryFn, Domain, EOp, UnaryFn};
pub use instr::{
    AdaptiveAvgPool2d, AvgPool2d, BatchNormEval, Conv2d, Conv2dWeightGrad, ConvEpilogue,
    Elementwise, Gather, GroupNorm, GroupedMm, Index, IndexPut, IndexSelect, Instr, LayerNorm,
    Matmul, MaxPool2d, Reduce, ReduceKind, RmsNorm, Scan, ScanOp, Scatter, ScatterReduce, Sdpa,
    Softmax, Sort, Upsample2d,
};
pub use operand::{Buf, DType, Operand};

use serde::Deserialize;

#[derive(Deserialize, Clone, Debug)]
pub struct Plan {
    pub n_inputs: usize,
    pub n_outputs: usize,
    pub arena_bytes: usize,
    pub instrs: Vec<Instr>,
}

fn one() -> f64 {
    1.0
}

/// A float that may be non-finite: JSON has no NaN/Infinity, so Python writes those as strings.
pub fn de_f64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum F {
        Num(f64),
        Text(String),
    }
    match F::deserialize(d)? {
        F::Num(v) => Ok(v),
        F::Text(t) => match t.as_str() {
            "nan" => Ok(f64::NAN),
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            other => Err(serde::de::Error::custom(format!("not a number: {other:?}"))),
        },
    }
}
