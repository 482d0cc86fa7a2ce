//! Software prefetch for kernels that stream operands through memory.
//!
//! The L2 streamer on the development machine's Xeon stops at every 4 KiB page boundary and runs too
//! few lines ahead to cover the L3's latency at an elementwise kernel's rate; a prefetch one KiB ahead,
//! issued once per cache line, keeps enough misses in flight. Issued in bursts (a whole chunk's lines
//! at once) the same prefetches fill the line-fill buffers and stall the loads they were meant to help.

/// How far ahead of the element being processed a stream is prefetched.
pub const DISTANCE_BYTES: usize = 1024;
/// Bytes per cache line: one prefetch per line.
pub const LINE_BYTES: usize = 64;

/// Prefetches the line `DISTANCE_BYTES` past `p` for reading. Never faults, whatever the address.
#[inline(always)]
pub fn read_ahead<T>(p: *const T) {
    line_ahead::<false, T>(p)
}

/// Prefetches the line `DISTANCE_BYTES` past `p` for writing (in exclusive state where the CPU can).
#[inline(always)]
pub fn write_ahead<T>(p: *const T) {
    line_ahead::<true, T>(p)
}

/// The prefetch instruction itself: x86 only for now (other targets rely on their hardware
/// prefetchers; nothing was measured there).
#[inline(always)]
fn line_ahead<const WRITE: bool, T>(p: *const T) {
    let at = (p as *const i8).wrapping_add(DISTANCE_BYTES);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0};
        if WRITE {
            _mm_prefetch::<_MM_HINT_ET0>(at)
        } else {
            _mm_prefetch::<_MM_HINT_T0>(at)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Elements of `slice`'s type per cache line (at least one).
#[inline(always)]
pub fn elems_per_line<T>(_slice: &[T]) -> usize {
    (LINE_BYTES / std::mem::size_of::<T>().max(1)).max(1)
}
