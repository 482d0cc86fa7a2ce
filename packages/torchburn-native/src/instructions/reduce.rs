//! `Reduce`: sums, products, extrema, any/all and variance over trailing dims (`kernels/reduce.rs`).

use super::{Check, Frame, Instruction};
use crate::kernels::reduce;
use crate::plan;

impl Instruction for plan::Reduce {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Reduce {
            input, out, kept, ..
        } = self;
        check.operand(input)?;
        check.operand(out)?;
        if !out.is_contiguous() || *kept > input.shape.len() {
            return Err("reduce output must be contiguous".into());
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::Reduce {
            input,
            out,
            kept,
            op,
            scale,
            correction,
        } = self;
        let iv = f.view(input);
        let ov = f.view(out);
        reduce::reduce(&reduce::ReduceArgs {
            input: &iv,
            in_shape: &input.shape,
            kept: *kept,
            out: &ov,
            op: *op,
            scale: *scale,
            correction: *correction,
        })
    }
}
