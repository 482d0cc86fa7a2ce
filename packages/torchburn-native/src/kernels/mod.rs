//! Kernels: pure functions over raw memory, one module per family.

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod gemm;
pub mod index;
pub mod math;
pub mod norm;
pub mod pool;
pub mod qprefill;
pub mod quant;
pub mod reduce;
pub mod softmax;
pub mod strided;
#[cfg(test)]
pub mod testing;
