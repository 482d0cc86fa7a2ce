//! What an instruction sees when it is validated: the sizes of the buffers its operands point into.
//!
//! Every check an instruction's `run` relies on happens here, once per program, so that running is
//! unchecked pointer arithmetic.

use crate::kernels::strided::MAX_RANK;
use crate::plan::{Buf, DType, Operand};

pub const FLOATS: &[DType] = &[DType::F32, DType::F64];
pub const F32: &[DType] = &[DType::F32];

/// The byte sizes of a program's inputs, outputs and scratch arena.
pub struct Check<'a> {
    pub in_bytes: &'a [usize],
    pub out_bytes: &'a [usize],
    pub arena_bytes: usize,
}

impl Check<'_> {
    /// Every element the operand's offset, shape and strides reach lies inside its buffer.
    pub fn operand(&self, op: &Operand) -> Result<(), String> {
        if op.shape.len() != op.strides.len() || op.shape.len() > MAX_RANK {
            return Err(format!("operand rank mismatch or too large: {op:?}"));
        }
        let (limit, start) = match op.buf {
            Buf::In(i) => (
                *self.in_bytes.get(i).ok_or("input index out of range")?,
                0usize,
            ),
            Buf::Out(i) => (
                *self.out_bytes.get(i).ok_or("output index out of range")?,
                0,
            ),
            Buf::Tmp(off) => (self.arena_bytes, off),
        };
        if op.numel() == 0 {
            return Ok(());
        }
        let mut lo = op.offset;
        let mut hi = op.offset;
        for (&n, &s) in op.shape.iter().zip(&op.strides) {
            let span = (n as isize - 1) * s;
            if span < 0 {
                lo += span;
            } else {
                hi += span;
            }
        }
        let es = op.dtype.size() as isize;
        if lo < 0 || start as isize + (hi + 1) * es > limit as isize {
            return Err(format!(
                "operand reaches outside its buffer ({limit} bytes): {op:?}"
            ));
        }
        Ok(())
    }
}

/// The operand is contiguous and of one of `dtypes`.
pub fn require_contiguous(op: &Operand, what: &str, dtypes: &[DType]) -> Result<(), String> {
    if !op.is_contiguous() {
        return Err(format!("{what}: operand must be contiguous"));
    }
    if !dtypes.contains(&op.dtype) {
        return Err(format!("{what}: dtype {:?} not in {dtypes:?}", op.dtype));
    }
    Ok(())
}
