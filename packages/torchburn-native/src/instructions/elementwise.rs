//! `Elementwise`: a fused chain of elementwise ops, one sweep over memory (`kernels/elementwise.rs`).

use std::sync::OnceLock;

use super::{Check, Frame, Instruction};
use crate::kernels::elementwise::{self, Prepared, View};
use crate::plan;

/// A chain as the plan gives it, and its code specialized to the operands' layouts (which a program
/// fixes), made on the first run.
pub struct Elementwise {
    wire: plan::Elementwise,
    prepared: OnceLock<Prepared>,
}

impl From<plan::Elementwise> for Elementwise {
    fn from(wire: plan::Elementwise) -> Self {
        Elementwise {
            wire,
            prepared: OnceLock::new(),
        }
    }
}

impl Instruction for Elementwise {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Elementwise {
            shape,
            inputs,
            outputs,
            code,
            nregs,
            ..
        } = &self.wire;
        for op in inputs.iter().chain(outputs) {
            check.operand(op)?;
            if &op.shape != shape {
                return Err("elementwise operand shape differs from iteration shape".into());
            }
        }
        if shape.is_empty() {
            return Err("elementwise iteration needs rank >= 1".into());
        }
        elementwise::validate(code, *nregs, inputs.len(), outputs.len())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::Elementwise {
            domain,
            shape,
            inputs,
            outputs,
            code,
            nregs,
        } = &self.wire;
        let iv: Vec<View> = inputs.iter().map(|o| f.view(o)).collect();
        let ov: Vec<View> = outputs.iter().map(|o| f.view(o)).collect();
        let prepared = self
            .prepared
            .get_or_init(|| elementwise::prepare_for(*domain, code, *nregs, &iv, &ov));
        elementwise::run_prepared(*domain, shape, &iv, &ov, prepared);
        Ok(())
    }
}
