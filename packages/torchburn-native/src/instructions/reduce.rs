//! `Reduce`: sums, products, extrema, any/all and variance over trailing dims (`kernels/reduce.rs`).

use super::{Check, Frame, Instruction};
use crate::kernels::reduce;
use crate::plan;

impl Instruction for plan::Reduce {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Reduce {
            input,
            out,
            kept,
            op,
            mean_out,
            ..
        } = self;
        check.operand(input)?;
        check.operand(out)?;
        if !out.is_contiguous() || *kept > input.shape.len() {
            return Err("reduce output must be contiguous".into());
        }
        if let Some(mean) = mean_out {
            check.operand(mean)?;
            if *op != plan::ReduceKind::Var {
                return Err("only a variance reduce writes a mean".into());
            }
            if !mean.is_contiguous() || mean.numel() != out.numel() {
                return Err(
                    "a variance's mean output must be contiguous and as large as its output".into(),
                );
            }
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
            mean_out,
        } = self;
        let iv = f.view(input);
        let ov = f.view(out);
        let mv = mean_out.as_ref().map(|m| f.view(m));
        reduce::reduce(&reduce::ReduceArgs {
            input: &iv,
            in_shape: &input.shape,
            kept: *kept,
            out: &ov,
            op: *op,
            scale: *scale,
            correction: *correction,
            mean_out: mv.as_ref(),
        })
    }
}
