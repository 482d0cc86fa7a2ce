//! Kernels: pure functions over raw memory, one module per family.

pub mod gemm;
pub mod math;
