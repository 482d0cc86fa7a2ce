//! The program format Python sends: buffers, operands (strided views of buffers) and instructions.
//!
//! Python does all shape, stride and liveness work once per input signature; the instructions here
//! carry concrete sizes, so running a program is a walk over a `Vec` with no decisions left.

use serde::Deserialize;

use std::sync::OnceLock;

use crate::kernels::elementwise::{Domain, EOp, Prepared, UnaryFn};

#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F64,
    F16,
    Bf16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::Bf16 | DType::I16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }
}

/// Where an operand's memory lives: a region input, a region output, or the scratch arena (byte offset).
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    In(usize),
    Out(usize),
    Tmp(usize),
}

/// A strided view: element offset, sizes and element strides (0 for a broadcast dimension).
#[derive(Deserialize, Clone, Debug)]
pub struct Operand {
    pub buf: Buf,
    pub dtype: DType,
    #[serde(default)]
    pub offset: isize,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
}

impl Operand {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true; // nothing to lay out
        }
        let mut expected = 1isize;
        for (&size, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if size != 1 && stride != expected {
                return false;
            }
            expected *= size as isize;
        }
        true
    }
}

#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReduceKind {
    Sum,
    Prod,
    Max,
    Min,
    ArgMax,
    ArgMin,
    Any,
    All,
    /// variance with `correction` (Bessel's when 1)
    Var,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Instr {
    /// A fused chain of elementwise ops over one iteration shape: one sweep over memory.
    Elementwise {
        domain: Domain,
        shape: Vec<usize>,
        inputs: Vec<Operand>,
        outputs: Vec<Operand>,
        code: Vec<EOp>,
        nregs: usize,
        /// the code specialized to the operands' layouts, made on the first run
        #[serde(skip)]
        prepared: OnceLock<Prepared>,
    },
    /// `out[b] = alpha · a[b] @ b[b] + beta · bias` then an optional activation, for every batch b.
    /// Operands are 3-D `[batch, rows, cols]` with strides (batch stride 0 broadcasts).
    Matmul {
        a: Operand,
        b: Operand,
        out: Operand,
        bias: Option<Operand>,
        /// Added to the product like the bias (but not scaled by `beta`), with `out`'s shape: a
        /// residual connection (`x + linear(y)`) folded into the product instead of a pass of its own.
        #[serde(default)]
        residual: Option<Operand>,
        #[serde(deserialize_with = "de_f64")]
        alpha: f64,
        #[serde(deserialize_with = "de_f64")]
        beta: f64,
        act: Option<UnaryFn>,
        /// 0: `b` is the strided view its operand describes. P > 0: `b` is a copy laid out in panels
        /// of P columns, each a contiguous row-major `rows × P` block (the last zero-padded), panel q
        /// at element `q·rows·P` past the operand's offset; the operand's strides are `(0, P, 1)`.
        /// MKL packs a contiguous row-major block faster than a transposed one (`nn.Linear`'s
        /// `x @ w.t()`), and a panel per thread hands each thread one such block.
        #[serde(default)]
        b_panel: usize,
        /// B packed by MKL for this product's sizes (`kernels/gemm_packed.rs`), made by the caller
        /// once per version of B: a 1-D f32 operand of at least `packed_b_bytes` bytes. The product
        /// reads it where it can (an f32 product of batch 1, alpha 1, A and C in layouts CBLAS
        /// takes), its addends and activation around it; `b` stays the operand it describes, for
        /// the other cases.
        #[serde(default)]
        b_packed: Option<Operand>,
    },
    /// Reduce the trailing `input.shape.len() - kept` dims of `input` into the contiguous `out`.
    Reduce {
        input: Operand,
        out: Operand,
        kept: usize,
        op: ReduceKind,
        #[serde(default = "one", deserialize_with = "de_f64")]
        scale: f64,
        #[serde(default)]
        correction: f64,
    },
    Softmax {
        input: Operand,
        out: Operand,
        outer: usize,
        n: usize,
        inner: usize,
        log: bool,
    },
    LayerNorm {
        input: Operand,
        weight: Option<Operand>,
        bias: Option<Operand>,
        out: Operand,
        mean: Option<Operand>,
        rstd: Option<Operand>,
        rows: usize,
        n: usize,
        eps: f64,
    },
    RmsNorm {
        input: Operand,
        weight: Option<Operand>,
        out: Operand,
        rows: usize,
        n: usize,
        eps: f64,
    },
    GroupNorm {
        input: Operand,
        weight: Option<Operand>,
        bias: Option<Operand>,
        out: Operand,
        mean: Option<Operand>,
        rstd: Option<Operand>,
        n: usize,
        c: usize,
        hw: usize,
        groups: usize,
        eps: f64,
    },
    Sdpa {
        q: Operand,
        k: Operand,
        v: Operand,
        mask: Option<Operand>,
        out: Operand,
        lse: Option<Operand>,
        causal: bool,
        #[serde(deserialize_with = "de_f64")]
        scale: f64,
    },
    Conv2d {
        input: Operand,
        weight: Operand,
        /// The weight tap-major, `[kh·kw, c_out, c_in]`: when present, the convolution runs as
        /// shifted GEMMs (`kernels::conv_shifted`), which needs a stride-1 "same" convolution.
        #[serde(default)]
        weight_taps: Option<Operand>,
        bias: Option<Operand>,
        out: Operand,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
        transposed: bool,
        output_padding: [usize; 2],
        /// Applied to the output as it is written (forward convolutions only); boxed, as it is
        /// large and rare next to the other instructions.
        #[serde(default)]
        epilogue: Option<Box<ConvEpilogue>>,
    },
    MaxPool2d {
        input: Operand,
        out: Operand,
        indices: Option<Operand>,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
    },
    AvgPool2d {
        input: Operand,
        out: Operand,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
        divisor_override: Option<i64>,
    },
    AdaptiveAvgPool2d {
        input: Operand,
        out: Operand,
    },
    /// `out = input.index_select(dim, index)` on a `[outer, size, inner]` view (embedding: outer = 1).
    IndexSelect {
        input: Operand,
        index: Operand,
        out: Operand,
        dim: usize,
    },
    /// `out[i] = input[..., index[i], ...]` along `dim`; index has out's shape (torch.gather).
    Gather {
        input: Operand,
        index: Operand,
        out: Operand,
        dim: usize,
    },
    /// Advanced indexing: `out = input[..., idx0, idx1, ..., ...]` with the indexed dims consecutive
    /// starting at `first`; every index operand is already broadcast to the common index shape.
    Index {
        input: Operand,
        indices: Vec<Operand>,
        out: Operand,
        first: usize,
    },
    /// In place on `out` (already holding a copy of the destination): `out[..index..] = / += src`.
    Scatter {
        out: Operand,
        index: Operand,
        src: Operand,
        dim: usize,
        accumulate: bool,
    },
    /// In place on `out`: `out[idx0, idx1, ...] = / += values` (index_put); indices broadcast already.
    IndexPut {
        out: Operand,
        indices: Vec<Operand>,
        values: Operand,
        accumulate: bool,
    },
}

fn one() -> f64 {
    1.0
}

/// A float that may be non-finite: JSON has no NaN/Infinity, so Python writes those as strings.
/// What a convolution applies to its output as it writes it, in this order: batch norm in eval
/// mode, a residual of the output's shape, relu.
#[derive(Deserialize, Clone, Debug)]
pub struct ConvEpilogue {
    #[serde(default)]
    pub norm: Option<BatchNormEval>,
    #[serde(default)]
    pub residual: Option<Operand>,
    #[serde(default)]
    pub relu: bool,
}

/// Batch norm with running statistics: `(y - mean) / sqrt(var + eps) · weight + bias` per channel.
#[derive(Deserialize, Clone, Debug)]
pub struct BatchNormEval {
    pub mean: Operand,
    pub var: Operand,
    pub weight: Option<Operand>,
    pub bias: Option<Operand>,
    #[serde(deserialize_with = "de_f64")]
    pub eps: f64,
}

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

#[derive(Deserialize, Clone, Debug)]
pub struct Plan {
    pub n_inputs: usize,
    pub n_outputs: usize,
    pub arena_bytes: usize,
    pub instrs: Vec<Instr>,
}
