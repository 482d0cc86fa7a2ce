//! Which instruction set the kernels' runtime dispatch picks on this CPU, for `torchburn info`.
//!
//! Hot kernels are compiled several times with `#[multiversion(targets(...))]` and picked at run time.
//! The dispatcher takes the first target the CPU supports, so every list names the widest ISA first:
//! `"x86_64+avx512f+avx512bw+avx512dq+avx512vl+fma"`, then `"x86_64+avx2+fma"`, then `"aarch64+neon"`;
//! the wheel itself is built for the portable baseline.

/// The best instruction set the runtime dispatch picks on this CPU.
pub fn name() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("fma")
        {
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
