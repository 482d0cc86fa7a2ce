//! `Softmax`: softmax and log-softmax over one dim of a contiguous tensor (`kernels/softmax.rs`).

use super::check::{require_contiguous, FLOATS};
use super::{Check, Frame, Instruction};
use crate::kernels::softmax;
use crate::plan::{self, DType};

impl Instruction for plan::Softmax {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Softmax {
            input,
            out,
            outer,
            n,
            inner,
            ..
        } = self;
        for op in [input, out] {
            check.operand(op)?;
            require_contiguous(op, "softmax", FLOATS)?;
            if op.numel() != outer * n * inner {
                return Err("softmax extent mismatch".into());
            }
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::Softmax {
            input,
            out,
            outer,
            n,
            inner,
            log,
        } = self;
        match input.dtype {
            DType::F64 => {
                softmax::softmax_f64(*outer, *n, *inner, f.slice(input), f.slice_mut(out), *log)
            }
            _ => softmax::softmax_f32(*outer, *n, *inner, f.slice(input), f.slice_mut(out), *log),
        }
        Ok(())
    }
}
