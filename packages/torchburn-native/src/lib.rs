//! TorchBurn's native CPU engine.
//!
//! Python plans a compiled region into a flat program (JSON); [`program::Program`] runs it with one
//! foreign call, on the caller's tensors' memory and a reusable scratch arena.

pub mod kernels;
pub mod plan;
pub mod program;
pub mod threads;

#[cfg(feature = "python")]
mod python;

/// The best instruction set the runtime dispatch picks on this CPU.
pub fn isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "avx2+fma";
        }
        "x86-64 baseline (sse2)"
    }
    #[cfg(target_arch = "aarch64")]
    {
        "neon"
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        "portable"
    }
}
