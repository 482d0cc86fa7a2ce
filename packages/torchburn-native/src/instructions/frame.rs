//! What an instruction sees when it runs: the base pointers of one run, and its operands resolved
//! against them.

use crate::kernels::elementwise::View;
use crate::plan::{Buf, Operand};

/// Base pointers of one run: the caller's inputs and outputs and this run's scratch arena.
pub struct Frame<'a> {
    pub ins: &'a [usize],
    pub outs: &'a [usize],
    pub arena: *mut u8,
}

impl Frame<'_> {
    pub fn ptr(&self, op: &Operand) -> *mut u8 {
        let base = match op.buf {
            Buf::In(i) => self.ins[i] as *mut u8,
            Buf::Out(i) => self.outs[i] as *mut u8,
            // SAFETY: validated against arena_bytes in Program::new
            Buf::Tmp(off) => unsafe { self.arena.add(off) },
        };
        // SAFETY: offset validated against the buffer's size in Program::new
        unsafe { base.offset(op.offset * op.dtype.size() as isize) }
    }

    pub fn view(&self, op: &Operand) -> View {
        View::new(self.ptr(op), op.dtype, &op.shape, &op.strides)
    }

    /// The operand as a typed slice; only for operands validated contiguous.
    ///
    /// # Safety
    /// The operand was validated in this frame's program, contiguous and of type `T`.
    pub unsafe fn slice<T>(&self, op: &Operand) -> &[T] {
        std::slice::from_raw_parts(self.ptr(op) as *const T, op.numel())
    }

    /// # Safety
    /// As [`Frame::slice`], and no other live slice overlaps it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut<T>(&self, op: &Operand) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.ptr(op) as *mut T, op.numel())
    }

    /// The `len` elements from `op`'s first: a strided operand's whole span (validated against its
    /// buffer in Program::new).
    ///
    /// # Safety
    /// `len` is at most the span the operand's validated strides reach.
    pub unsafe fn span<T>(&self, op: &Operand, len: usize) -> &[T] {
        std::slice::from_raw_parts(self.ptr(op) as *const T, len)
    }

    /// # Safety
    /// As [`Frame::span`], and no other live slice overlaps it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn span_mut<T>(&self, op: &Operand, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.ptr(op) as *mut T, len)
    }
}
