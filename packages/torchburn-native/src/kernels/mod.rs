//! Kernels: pure functions over raw memory, one module per family.

pub mod attention;
pub mod conv;
pub mod conv_shifted;
pub mod conv_weight_grad;
pub mod elementwise;
#[cfg(target_arch = "x86_64")]
pub mod gelu_x86;
pub mod gemm;
pub mod gemm_packed;
pub mod ggml;
pub mod index;
pub mod lanes;
pub mod math;
pub mod norm;
#[cfg(target_arch = "x86_64")]
pub mod norm_x86;
pub mod polynomials;
pub mod pool;
pub mod prefetch;
pub mod qprefill;
pub mod quant;
pub mod reduce;
pub mod resample;
pub mod row_blocks;
pub mod scan;
#[cfg(target_arch = "x86_64")]
pub mod scan_x86;
pub mod softmax;
#[cfg(target_arch = "x86_64")]
pub mod softmax_x86;
pub mod strided;
#[cfg(test)]
pub mod testing;
