//! `LayerNorm`, `RmsNorm` and `GroupNorm` over contiguous rows (`kernels/norm.rs`).

use super::check::{require_contiguous, FLOATS};
use super::{Check, Frame, Instruction};
use crate::kernels::norm;
use crate::plan::{self, DType};

/// Calls the f64 or the f32 variant of a kernel with the same arguments (slices take their type from it).
macro_rules! by_float {
    ($dtype:expr, $f32:path, $f64:path, ($($arg:expr),* $(,)?)) => {
        match $dtype {
            DType::F64 => $f64($($arg),*),
            _ => $f32($($arg),*),
        }
    };
}

impl Instruction for plan::LayerNorm {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::LayerNorm {
            input,
            weight,
            bias,
            out,
            mean,
            rstd,
            rows,
            n,
            ..
        } = self;
        for op in [input, out] {
            check.operand(op)?;
            require_contiguous(op, "layer_norm", FLOATS)?;
            if op.numel() != rows * n {
                return Err("layer_norm extent mismatch".into());
            }
        }
        for op in [weight, bias].into_iter().flatten() {
            check.operand(op)?;
            require_contiguous(op, "layer_norm weight", &[input.dtype])?;
            if op.numel() != *n {
                return Err("layer_norm weight size mismatch".into());
            }
        }
        for op in [mean, rstd].into_iter().flatten() {
            check.operand(op)?;
            require_contiguous(op, "layer_norm stats", &[input.dtype])?;
            if op.numel() != *rows {
                return Err("layer_norm stats size mismatch".into());
            }
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::LayerNorm {
            input,
            weight,
            bias,
            out,
            mean,
            rstd,
            rows,
            n,
            eps,
        } = self;
        by_float!(
            input.dtype,
            norm::layer_norm_f32,
            norm::layer_norm_f64,
            (
                *rows,
                *n,
                f.slice(input),
                weight.as_ref().map(|w| f.slice(w)),
                bias.as_ref().map(|w| f.slice(w)),
                *eps,
                f.slice_mut(out),
                mean.as_ref().map(|w| f.slice_mut(w)),
                rstd.as_ref().map(|w| f.slice_mut(w)),
            )
        );
        Ok(())
    }
}

impl Instruction for plan::RmsNorm {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::RmsNorm {
            input,
            weight,
            out,
            rows,
            n,
            ..
        } = self;
        for op in [input, out] {
            check.operand(op)?;
            require_contiguous(op, "rms_norm", FLOATS)?;
            if op.numel() != rows * n {
                return Err("rms_norm extent mismatch".into());
            }
        }
        if let Some(w) = weight {
            check.operand(w)?;
            require_contiguous(w, "rms_norm weight", &[input.dtype])?;
            if w.numel() != *n {
                return Err("rms_norm weight size mismatch".into());
            }
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::RmsNorm {
            input,
            weight,
            out,
            rows,
            n,
            eps,
        } = self;
        match input.dtype {
            DType::F64 => norm::rms_norm_f64(
                *rows,
                *n,
                f.slice(input),
                weight.as_ref().map(|w| f.slice(w)),
                *eps,
                f.slice_mut(out),
            ),
            _ => norm::rms_norm_f32(
                *rows,
                *n,
                f.slice(input),
                weight.as_ref().map(|w| f.slice(w)),
                *eps,
                f.slice_mut(out),
            ),
        }
        Ok(())
    }
}

impl Instruction for plan::GroupNorm {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::GroupNorm {
            input,
            weight,
            bias,
            out,
            mean,
            rstd,
            n,
            c,
            hw,
            groups,
            ..
        } = self;
        for op in [input, out] {
            check.operand(op)?;
            require_contiguous(op, "group_norm", FLOATS)?;
            if op.numel() != n * c * hw {
                return Err("group_norm extent mismatch".into());
            }
        }
        for op in [weight, bias].into_iter().flatten() {
            check.operand(op)?;
            require_contiguous(op, "group_norm weight", &[input.dtype])?;
            if op.numel() != *c {
                return Err("group_norm weight size mismatch".into());
            }
        }
        for op in [mean, rstd].into_iter().flatten() {
            check.operand(op)?;
            require_contiguous(op, "group_norm stats", &[input.dtype])?;
            if op.numel() != n * groups {
                return Err("group_norm stats size mismatch".into());
            }
        }
        if *groups == 0 || c % groups != 0 {
            return Err("group_norm: channels must divide into groups".into());
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::GroupNorm {
            input,
            weight,
            bias,
            out,
            mean,
            rstd,
            n,
            c,
            hw,
            groups,
            eps,
        } = self;
        by_float!(
            input.dtype,
            norm::group_norm_f32,
            norm::group_norm_f64,
            (
                *n,
                *c,
                *hw,
                *groups,
                f.slice(input),
                weight.as_ref().map(|w| f.slice(w)),
                bias.as_ref().map(|w| f.slice(w)),
                *eps,
                f.slice_mut(out),
                mean.as_ref().map(|w| f.slice_mut(w)),
                rstd.as_ref().map(|w| f.slice_mut(w)),
            )
        );
        Ok(())
    }
}
