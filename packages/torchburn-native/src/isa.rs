//! The instruction-set level the kernels run at: the CPU's best, capped by `TORCHBURN_ISA`.
//!
//! Hot kernels carry `#[isa_versions]` (the `torchburn-native-macros` crate): each is compiled once
//! per level and asks [`level`] on every call which copy to run. Hand-written intrinsics paths ask
//! [`avx512`] / [`avx2`] instead of detecting features themselves, and the `gemm` crate's products go
//! through [`crate::kernels::gemm`], which picks its micro-kernels by the same level. So setting
//! `TORCHBURN_ISA=avx2` on an AVX-512 machine runs exactly the code an AVX2-only machine runs, and
//! `baseline` the portable code, which is how CI proves every path on whatever CPU it gets.
//!
//! Levels, lowest first: `baseline` (x86-64 SSE2), `avx2` (AVX2 + FMA + F16C), `avx512` (AVX-512
//! F/BW/DQ/VL on top of those). On aarch64 `neon` is the only level (the target's baseline includes
//! it). The variable is read once, at the first kernel call; an unknown name or a level this CPU
//! lacks leaves the CPU's own level, and [`status`] says why.

use std::sync::OnceLock;

/// An instruction-set level; later variants are wider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Baseline,
    Neon,
    Avx2,
    Avx512,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Baseline => "baseline",
            Level::Neon => "neon",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    fn parse(name: &str) -> Option<Level> {
        match name.trim().to_ascii_lowercase().as_str() {
            "baseline" => Some(Level::Baseline),
            "neon" => Some(Level::Neon),
            "avx2" => Some(Level::Avx2),
            "avx512" => Some(Level::Avx512),
            _ => None,
        }
    }
}

/// The environment variable that caps the level.
pub const VARIABLE: &str = "TORCHBURN_ISA";

/// How the running level was chosen.
#[derive(Clone, Debug)]
pub struct Status {
    /// The level the kernels run at.
    pub level: Level,
    /// The CPU's best level.
    pub detected: Level,
    /// `TORCHBURN_ISA` as set (None: unset or empty).
    pub requested: Option<String>,
    /// Why the request was not followed (None: followed, or nothing requested).
    pub ignored: Option<String>,
}

/// Every level this CPU runs, lowest first.
pub fn supported() -> Vec<Level> {
    let candidates: &[Level] = if cfg!(target_arch = "aarch64") {
        &[Level::Neon]
    } else {
        &[Level::Baseline, Level::Avx2, Level::Avx512]
    };
    let best = detect();
    candidates.iter().copied().filter(|&l| l <= best).collect()
}

/// The CPU's best level.
pub fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        if avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
            return Level::Avx512;
        }
        if avx2 {
            return Level::Avx2;
        }
        Level::Baseline
    }
    #[cfg(target_arch = "aarch64")]
    {
        Level::Neon
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Level::Baseline
    }
}

fn decide(requested: Option<String>, detected: Level) -> Status {
    let mut status = Status {
        level: detected,
        detected,
        requested: requested.clone(),
        ignored: None,
    };
    let Some(name) = requested else {
        return status;
    };
    let allowed: Vec<_> = supported().iter().map(|l| l.name()).collect();
    let allowed = allowed.join(", ");
    match Level::parse(&name) {
        None => {
            status.ignored = Some(format!(
                "{VARIABLE}={name:?} is not an instruction-set level; this CPU runs {allowed}"
            ))
        }
        Some(level) if level > detected || !supported().contains(&level) => {
            status.ignored = Some(format!(
                "{VARIABLE}={name:?} is not supported by this CPU, which runs {allowed}"
            ))
        }
        Some(level) => status.level = level,
    }
    status
}

fn state() -> &'static Status {
    static STATE: OnceLock<Status> = OnceLock::new();
    STATE.get_or_init(|| {
        let requested = std::env::var(VARIABLE)
            .ok()
            .filter(|v| !v.trim().is_empty());
        decide(requested, detect())
    })
}

/// How the running level was chosen.
pub fn status() -> Status {
    state().clone()
}

/// The level the kernels run at.
#[inline]
pub fn level() -> Level {
    state().level
}

/// True when `TORCHBURN_ISA` holds the kernels below the CPU's best level.
#[inline]
pub fn capped() -> bool {
    level() < state().detected
}

/// True when the AVX-512 copies may run.
#[inline]
pub fn avx512() -> bool {
    level() >= Level::Avx512
}

/// True when the AVX2 + FMA + F16C copies may run.
#[inline]
pub fn avx2() -> bool {
    level() >= Level::Avx2
}

/// The running level's name, for `torchburn info` and the bench's header.
pub fn name() -> &'static str {
    level().name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_caps_the_level_only_downwards() {
        let best = detect();
        assert_eq!(decide(None, best).level, best);
        let lowest = supported()[0];
        let forced = decide(Some(lowest.name().to_string()), best);
        assert_eq!(forced.level, lowest);
        assert!(forced.ignored.is_none());
        let bogus = decide(Some("avx1024".into()), best);
        assert_eq!(bogus.level, best);
        assert!(bogus
            .ignored
            .unwrap()
            .contains("is not an instruction-set level"));
        if best < Level::Avx512 && cfg!(target_arch = "x86_64") {
            let above = decide(Some("AVX512".into()), best);
            assert_eq!(above.level, best);
            assert!(above.ignored.unwrap().contains("not supported"));
        }
    }

    #[test]
    fn supported_levels_end_at_the_detected_one() {
        let levels = supported();
        assert_eq!(levels.last(), Some(&detect()));
        assert!(levels.windows(2).all(|w| w[0] < w[1]));
    }
}
