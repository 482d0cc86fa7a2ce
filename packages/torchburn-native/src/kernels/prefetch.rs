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

/// How far ahead a decode product's regrouped weights are prefetched. Such a product spends a few
/// nanoseconds per 64-byte line, so covering the memory's latency (well over 100 ns on a shared
/// server) takes many lines in flight; eight KiB ahead keeps them while staying a small part of any
/// x86 core's L2. On the development machine the decode step took 20-30% less time with it than
/// with [`DISTANCE_BYTES`] or none, and distances from 8 to 16 KiB did equally well.
pub const WEIGHTS_DISTANCE_BYTES: usize = 8192;

/// Prefetches the line `DISTANCE_BYTES` past `p` for reading. Never faults, whatever the address.
#[inline(always)]
pub fn read_ahead<T>(p: *const T) {
    line_ahead::<false>(p.cast::<i8>().wrapping_add(DISTANCE_BYTES))
}

/// Prefetches `lines` consecutive lines from [`WEIGHTS_DISTANCE_BYTES`] past `p` for reading.
#[inline(always)]
pub fn weights_ahead<T>(p: *const T, lines: usize) {
    let at = p.cast::<i8>().wrapping_add(WEIGHTS_DISTANCE_BYTES);
    for l in 0..lines {
        line_ahead::<false>(at.wrapping_add(l * LINE_BYTES))
    }
}

/// Prefetches the `bytes` (rounded up to whole lines) from `p` on, for reading: a row that a kernel
/// reads a little later, asked for one row at a time between its products.
#[inline(always)]
pub fn row_ahead<T>(p: *const T, bytes: usize) {
    let at = p.cast::<i8>();
    for l in 0..bytes.div_ceil(LINE_BYTES) {
        line_ahead::<false>(at.wrapping_add(l * LINE_BYTES))
    }
}

/// Prefetches the line `DISTANCE_BYTES` past `p` for writing (in exclusive state where the CPU can).
#[inline(always)]
pub fn write_ahead<T>(p: *const T) {
    line_ahead::<true>(p.cast::<i8>().wrapping_add(DISTANCE_BYTES))
}

/// The prefetch instruction itself, for the line holding `at`: x86 only for now (other targets rely
/// on their hardware prefetchers; nothing was measured there).
#[inline(always)]
fn line_ahead<const WRITE: bool>(at: *const i8) {
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
