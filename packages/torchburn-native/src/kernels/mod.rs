//! Kernels: pure functions over raw memory, one module per family.

pub mod gemm;
pub mod math;
pub mod elementwise;
pub mod strided;
pub mod reduce;
pub mod index;
pub mod conv;
pub mod pool;
pub mod softmax;
pub mod norm;
pub mod attention;
