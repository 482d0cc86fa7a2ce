//! The instructions of a program, one struct each, as Python writes them (`"kind"` names the struct).
//!
//! Each struct is what its instruction reads from the wire and nothing more; what it means and how it
//! runs live in `instructions/`, in the file named like its family (`Matmul` in `gemm.rs`,
//! `LayerNorm` in `norm.rs`, ...).

use serde::Deserialize;

use super::{de_f64, one, Domain, EOp, Operand, UnaryFn};

#[derive(Deserialize, Clone, Debug)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Instr {
    Elementwise(Elementwise),
    Matmul(Matmul),
    GroupedMm(GroupedMm),
    Reduce(Reduce),
    Softmax(Softmax),
    Scan(Scan),
    Sort(Sort),
    LayerNorm(LayerNorm),
    RmsNorm(RmsNorm),
    GroupNorm(GroupNorm),
    Sdpa(Sdpa),
    Conv2d(Conv2d),
    Conv2dWeightGrad(Conv2dWeightGrad),
    MaxPool2d(MaxPool2d),
    AvgPool2d(AvgPool2d),
    AdaptiveAvgPool2d(AdaptiveAvgPool2d),
    Upsample2d(Upsample2d),
    IndexSelect(IndexSelect),
    Gather(Gather),
    Index(Index),
    Scatter(Scatter),
    IndexPut(IndexPut),
}

/// A fused chain of elementwise ops over one iteration shape: one sweep over memory.
#[derive(Deserialize, Clone, Debug)]
pub struct Elementwise {
    pub domain: Domain,
    pub shape: Vec<usize>,
    pub inputs: Vec<Operand>,
    pub outputs: Vec<Operand>,
    pub code: Vec<EOp>,
    pub nregs: usize,
}

/// `out[b] = alpha · a[b] @ b[b] + beta · bias` then an optional activation, for every batch b.
/// Operands are 3-D `[batch, rows, cols]` with strides (batch stride 0 broadcasts).
#[derive(Deserialize, Clone, Debug)]
pub struct Matmul {
    pub a: Operand,
    pub b: Operand,
    pub out: Operand,
    pub bias: Option<Operand>,
    /// Added to the product like the bias (but not scaled by `beta`), with `out`'s shape: a
    /// residual connection (`x + linear(y)`) folded into the product instead of a pass of its own.
    #[serde(default)]
    pub residual: Option<Operand>,
    #[serde(deserialize_with = "de_f64")]
    pub alpha: f64,
    #[serde(deserialize_with = "de_f64")]
    pub beta: f64,
    pub act: Option<UnaryFn>,
    /// 0: `b` is the strided view its operand describes. P > 0: `b` is a copy laid out in panels
    /// of P columns, each a contiguous row-major `rows × P` block (the last zero-padded), panel q
    /// at element `q·rows·P` past the operand's offset; the operand's strides are `(0, P, 1)`.
    /// MKL packs a contiguous row-major block faster than a transposed one (`nn.Linear`'s
    /// `x @ w.t()`), and a panel per thread hands each thread one such block.
    #[serde(default)]
    pub b_panel: usize,
    /// B packed by MKL for this product's sizes (`kernels/gemm_packed.rs`), made by the caller
    /// once per version of B: a 1-D f32 operand of at least `packed_b_bytes` bytes. The product
    /// reads it where it can (an f32 product of batch 1, alpha 1, A and C in layouts CBLAS
    /// takes), its addends and activation around it; `b` stays the operand it describes, for
    /// the other cases.
    #[serde(default)]
    pub b_packed: Option<Operand>,
}

/// `out[s] = a[s] @ b[g]` for the rows `s` of group `g`: rows `offs[g-1]..offs[g]` (from 0 for the
/// first group). `a` is `[S, K]`, `b` `[G, K, N]`, `offs` `[G]` cumulative row counts (i32 or i64),
/// `out` `[S, N]`; rows past the last offset are zero. A mixture of experts' product over its tokens
/// sorted by expert (`_grouped_mm` with offsets).
#[derive(Deserialize, Clone, Debug)]
pub struct GroupedMm {
    pub a: Operand,
    pub b: Operand,
    pub offs: Operand,
    pub out: Operand,
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

/// Reduce the trailing `input.shape.len() - kept` dims of `input` into the contiguous `out`.
#[derive(Deserialize, Clone, Debug)]
pub struct Reduce {
    pub input: Operand,
    pub out: Operand,
    pub kept: usize,
    pub op: ReduceKind,
    #[serde(default = "one", deserialize_with = "de_f64")]
    pub scale: f64,
    #[serde(default)]
    pub correction: f64,
    /// `Var` only: also write each block's mean here (`var_mean` in one instruction)
    #[serde(default)]
    pub mean_out: Option<Operand>,
}

/// Softmax (or log-softmax) over the middle dim of a contiguous `[outer, n, inner]`.
#[derive(Deserialize, Clone, Debug)]
pub struct Softmax {
    pub input: Operand,
    pub out: Operand,
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
    pub log: bool,
}

/// The running operation of a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScanOp {
    Sum,
    Prod,
    Logsumexp,
    Max,
    Min,
}

/// A cumulative sum, product, log-sum-exp, max or min along the middle dim of a contiguous
/// `[outer, n, inner]`; max and min also write the running arg into `indices`.
#[derive(Deserialize, Clone, Debug)]
pub struct Scan {
    pub input: Operand,
    pub out: Operand,
    pub indices: Option<Operand>,
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
    pub op: ScanOp,
}

/// A stable sort of each line along the middle dim of a contiguous `[outer, n, inner]`, keeping the
/// first `k` (all `n` for a sort, fewer for top-k) as `values` and `indices` (`[outer, k, inner]`).
#[derive(Deserialize, Clone, Debug)]
pub struct Sort {
    pub input: Operand,
    pub values: Operand,
    pub indices: Operand,
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
    pub k: usize,
    pub descending: bool,
}

/// Layer norm over the last `n` of `rows · n` values, with optional affine parameters and statistics.
#[derive(Deserialize, Clone, Debug)]
pub struct LayerNorm {
    pub input: Operand,
    pub weight: Option<Operand>,
    pub bias: Option<Operand>,
    pub out: Operand,
    pub mean: Option<Operand>,
    pub rstd: Option<Operand>,
    pub rows: usize,
    pub n: usize,
    pub eps: f64,
}

/// RMS norm over the last `n` of `rows · n` values.
#[derive(Deserialize, Clone, Debug)]
pub struct RmsNorm {
    pub input: Operand,
    pub weight: Option<Operand>,
    pub out: Operand,
    pub rows: usize,
    pub n: usize,
    pub eps: f64,
}

/// Group norm of `[n, c, hw]` in `groups` groups of channels.
#[derive(Deserialize, Clone, Debug)]
pub struct GroupNorm {
    pub input: Operand,
    pub weight: Option<Operand>,
    pub bias: Option<Operand>,
    pub out: Operand,
    pub mean: Option<Operand>,
    pub rstd: Option<Operand>,
    pub n: usize,
    pub c: usize,
    pub hw: usize,
    pub groups: usize,
    pub eps: f64,
}

/// Scaled dot-product attention over `[b, h, t, d]` operands (grouped-query when k/v have fewer heads).
#[derive(Deserialize, Clone, Debug)]
pub struct Sdpa {
    pub q: Operand,
    pub k: Operand,
    pub v: Operand,
    pub mask: Option<Operand>,
    pub out: Operand,
    pub lse: Option<Operand>,
    pub causal: bool,
    #[serde(deserialize_with = "de_f64")]
    pub scale: f64,
}

/// A 2-D convolution, forward or transposed, of contiguous NCHW operands.
#[derive(Deserialize, Clone, Debug)]
pub struct Conv2d {
    pub input: Operand,
    pub weight: Operand,
    /// The weight tap-major, `[kh·kw, c_out, c_in]`: when present, the convolution runs as
    /// shifted GEMMs (`kernels::conv_shifted`), which needs a stride-1 "same" convolution.
    #[serde(default)]
    pub weight_taps: Option<Operand>,
    pub bias: Option<Operand>,
    pub out: Operand,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub transposed: bool,
    pub output_padding: [usize; 2],
    /// Applied to the output as it is written (forward convolutions only); boxed, as it is
    /// large and rare next to the other instructions.
    #[serde(default)]
    pub epilogue: Option<Box<ConvEpilogue>>,
}

/// The weight gradient of a forward 2-D convolution (one group) from its NCHW input
/// `[n, c_in, h, w]` and output gradient `[n, c_out, h_out, w_out]`: out `[c_out, c_in, kh, kw]`.
/// Stride, padding and dilation are the forward convolution's.
#[derive(Deserialize, Clone, Debug)]
pub struct Conv2dWeightGrad {
    pub input: Operand,
    pub grad: Operand,
    pub out: Operand,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

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

#[derive(Deserialize, Clone, Debug)]
pub struct MaxPool2d {
    pub input: Operand,
    pub out: Operand,
    pub indices: Option<Operand>,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

#[derive(Deserialize, Clone, Debug)]
pub struct AvgPool2d {
    pub input: Operand,
    pub out: Operand,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub count_include_pad: bool,
    pub divisor_override: Option<i64>,
}

#[derive(Deserialize, Clone, Debug)]
pub struct AdaptiveAvgPool2d {
    pub input: Operand,
    pub out: Operand,
}

/// 2-D upsampling of contiguous NCHW planes: `mode` is "bilinear", "nearest" or "nearest_exact";
/// `scales` are the caller's factors (height, width), null where the sizes decide.
#[derive(Deserialize, Clone, Debug)]
pub struct Upsample2d {
    pub input: Operand,
    pub out: Operand,
    pub mode: String,
    #[serde(default)]
    pub align_corners: bool,
    pub scales: [Option<f64>; 2],
}

/// `out = input.index_select(dim, index)` on a `[outer, size, inner]` view (embedding: outer = 1).
#[derive(Deserialize, Clone, Debug)]
pub struct IndexSelect {
    pub input: Operand,
    pub index: Operand,
    pub out: Operand,
    pub dim: usize,
}

/// `out[i] = input[..., index[i], ...]` along `dim`; index has out's shape (torch.gather).
#[derive(Deserialize, Clone, Debug)]
pub struct Gather {
    pub input: Operand,
    pub index: Operand,
    pub out: Operand,
    pub dim: usize,
}

/// Advanced indexing: `out = input[..., idx0, idx1, ..., ...]` with the indexed dims consecutive
/// starting at `first`; every index operand is already broadcast to the common index shape.
#[derive(Deserialize, Clone, Debug)]
pub struct Index {
    pub input: Operand,
    pub indices: Vec<Operand>,
    pub out: Operand,
    pub first: usize,
}

/// In place on `out` (already holding a copy of the destination): `out[..index..] = / += src`.
#[derive(Deserialize, Clone, Debug)]
pub struct Scatter {
    pub out: Operand,
    pub index: Operand,
    pub src: Operand,
    pub dim: usize,
    pub accumulate: bool,
    /// `scatter_reduce`: how values landing on one element combine (then `accumulate` is unused)
    #[serde(default)]
    pub reduce: Option<ScatterReduce>,
    #[serde(default)]
    pub include_self: bool,
}

/// How `scatter_reduce` combines the values that land on one element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScatterReduce {
    Sum,
    Prod,
    Mean,
    Amax,
    Amin,
}

/// In place on `out`: `out[idx0, idx1, ...] = / += values` (index_put); indices broadcast already.
#[derive(Deserialize, Clone, Debug)]
pub struct IndexPut {
    pub out: Operand,
    pub indices: Vec<Operand>,
    pub values: Operand,
    pub accumulate: bool,
}
