//! Softmax and log-softmax over one axis of a contiguous tensor viewed as `[outer, n, inner]`.
//!
//! The reduced axis is the middle one, so `dim=-1` is `inner == 1` (rows contiguous: the hot path)
//! and any other `dim` is `inner > 1` (the reduced elements are `inner` apart).
//!
//! Each softmax row takes three passes: max, `exp(x - max)` stored and summed, scale by `1 / sum`.
//! A row of a few thousand elements stays in L1 after the first pass, so the later passes cost no
//! memory traffic, and `exp` is evaluated once per element (an online max/sum pass would evaluate
//! it twice). The `inner > 1` path does the same passes over wide tiles of columns, with per-column
//! max/sum buffers, so every inner loop still runs over contiguous memory and vectorizes across
//! columns.
//!
//! Special values follow PyTorch: a NaN anywhere in a row, a `+inf`, or a row of only `-inf` makes
//! the whole row NaN (the max ignores NaN, but `exp(NaN)` / `inf - inf` poison the sum); a `-inf`
//! entry in an otherwise finite row gives probability 0 (log-probability `-inf`).
//!
//! The f32 path uses a branch-free `exp` (`exp_nonpos_f32`, the polynomial of
//! [`crate::kernels::math::exp_f32`] specialised to `x <= 0`) and [`ln_f32`], and is compiled per
//! instruction-set level with `#[isa_versions]`; the f64 path shares the code with `std`'s libm `exp`/`ln`.

use crate::kernels::lanes;
use crate::threads;
use std::ops::{Add, Div, Mul, Sub};

use torchburn_native_macros::isa_versions;

use crate::kernels::math::ln_f32;

/// Independent accumulators per reduction (four AVX2 registers of f32): enough to hide the add
/// latency, which the compiler cannot do itself since it does not reassociate floating-point sums.
const LANES: usize = 32;
/// Below this many elements a call runs on the calling thread: waking the pool costs microseconds.
const SERIAL_MAX: usize = 32 * 1024;
/// Widest column tile of the `inner > 1` path (its per-column max/sum buffers live on the stack).
const TILE_MAX: usize = 2048;

/// `exp(x)` for `x <= 0`, NaN or `-inf` (what softmax feeds it: `x - max`); within 2 ULP like
/// [`crate::kernels::math::exp_f32`], including subnormal results, but cheaper in a vector loop:
/// the overflow branch is gone and the exponent `n` is read from the bits of the rounding sum
/// instead of a saturating `f32 as i32` cast, which LLVM scalarizes lane by lane on AVX2.
#[inline(always)]
fn exp_nonpos_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    /// `t = v + 1.5·2^23` rounds `v` to an integer `n` held in t's low mantissa bits (|n| < 2^22).
    const ROUND_MAGIC: f32 = 12_582_912.0;
    // NaN compares false, takes -104 here, and is restored at the end
    let xc = if x > -104.0 { x } else { -104.0 };
    let t = xc.mul_add(LOG2E, ROUND_MAGIC);
    let n = t - ROUND_MAGIC;
    let ni = t.to_bits() as i32 - ROUND_MAGIC.to_bits() as i32;
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    let p = 1.987_569_1e-4_f32;
    let p = p.mul_add(r, 1.398_199_9e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 0.5);
    let p = (p * r).mul_add(r, r) + 1.0;
    // 2^n in two factors (n >= -150) so subnormal results come out exact
    let n1 = ni >> 1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((ni - n1 + 127) as u32) << 23);
    let y = p * s1 * s2;
    let y = if x < -103.972_08 { 0.0 } else { y };
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// The element operations the kernels need; implemented for `f32` and `f64` only.
trait Elem:
    Copy
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INF: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    /// IEEE `maxNum` (a NaN operand loses). Used where the running max lives in memory: there the
    /// select form `if v > m { v } else { m }` becomes a masked store, which is microcoded on AMD.
    fn fmax(self, rhs: Self) -> Self;
}

impl Elem for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INF: Self = f32::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> Self {
        // every exponent here is x - max <= 0 (or NaN)
        exp_nonpos_f32(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        ln_f32(self)
    }
    #[inline(always)]
    fn fmax(self, rhs: Self) -> Self {
        self.max(rhs)
    }
}

impl Elem for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INF: Self = f64::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> Self {
        f64::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        f64::ln(self)
    }
    #[inline(always)]
    fn fmax(self, rhs: Self) -> Self {
        self.max(rhs)
    }
}

/// `a > b ? a : b`: ignores a NaN `a` (the accumulator never becomes NaN) and maps to one `maxps`.
#[inline(always)]
fn max_keep<T: Elem>(acc: T, v: T) -> T {
    if v > acc {
        v
    } else {
        acc
    }
}

/// Sum of the lanes (see [`lanes::halve`]).
#[inline(always)]
fn reduce_lanes<T: Elem>(acc: [T; LANES]) -> T {
    lanes::halve(acc, |a, b| a + b)
}

/// Largest non-NaN element (`-inf` for an empty or all-NaN row).
#[inline(always)]
fn row_max<T: Elem>(x: &[T]) -> T {
    // Lane loops: `as_chunks` (compile-time-sized chunks) zipped with the accumulator array.
    // Indexed `acc[i] = acc[i] + c[i]` loops get fully unrolled into 32 scalar accumulators that
    // LLVM's SLP vectorizer then packs two at a time; the zipped form is vectorized by the loop
    // vectorizer into full-width registers.
    let (chunks, tail) = x.as_chunks::<LANES>();
    let mut acc = [T::NEG_INF; LANES];
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = max_keep(*a, v);
        }
    }
    // the lanes hold no NaN (max_keep drops it), so the order they are combined in cannot matter
    let mut m = lanes::halve(acc, max_keep);
    for &v in tail {
        m = max_keep(m, v);
    }
    m
}

/// `out = exp(x - m)`, returning the sum of `out`.
#[inline(always)]
fn exp_store_sum<T: Elem>(x: &[T], m: T, out: &mut [T]) -> T {
    let (xc, xt) = x.as_chunks::<LANES>();
    let (oc, ot) = out[..x.len()].as_chunks_mut::<LANES>();
    let mut acc = [T::ZERO; LANES];
    for (xs, os) in xc.iter().zip(oc) {
        for ((a, &v), o) in acc.iter_mut().zip(xs).zip(os.iter_mut()) {
            let e = (v - m).exp();
            *o = e;
            *a = *a + e;
        }
    }
    let mut s = T::ZERO;
    for (&v, o) in xt.iter().zip(ot) {
        let e = (v - m).exp();
        *o = e;
        s = s + e;
    }
    reduce_lanes(acc) + s
}

/// Sum of `exp(x - m)` without storing it (log-softmax needs only the sum).
#[inline(always)]
fn exp_sum<T: Elem>(x: &[T], m: T) -> T {
    let (xc, xt) = x.as_chunks::<LANES>();
    let mut acc = [T::ZERO; LANES];
    for xs in xc {
        for (a, &v) in acc.iter_mut().zip(xs) {
            *a = *a + (v - m).exp();
        }
    }
    let mut s = T::ZERO;
    for &v in xt {
        s = s + (v - m).exp();
    }
    reduce_lanes(acc) + s
}

/// Softmax of each length-`n` row of `x` (contiguous rows) into `out`.
#[inline(always)]
fn rows_lastdim<T: Elem>(x: &[T], out: &mut [T], n: usize, log: bool) {
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let m = row_max(xr);
        if log {
            // (x - max) - ln(sum), as PyTorch rounds it
            let ls = exp_sum(xr, m).ln();
            for (o, &v) in or.iter_mut().zip(xr) {
                *o = (v - m) - ls;
            }
        } else {
            let inv = T::ONE / exp_store_sum(xr, m, or);
            for o in or.iter_mut() {
                *o = *o * inv;
            }
        }
    }
}

/// Softmax over the `n` rows of one `[n, inner]` slab, for the columns `c0 .. c0 + tw` only.
///
/// # Safety
/// `out` must point to a writable `[n, inner]` slab that no one else accesses in those columns
/// meanwhile.
#[inline(always)]
unsafe fn cols_tile<T: Elem>(
    x: &[T],
    out: *mut T,
    n: usize,
    inner: usize,
    c0: usize,
    tw: usize,
    log: bool,
) {
    let mut mx = [T::NEG_INF; TILE_MAX];
    let mx = &mut mx[..tw];
    for j in 0..n {
        let xr = &x[j * inner + c0..][..tw];
        for (m, &v) in mx.iter_mut().zip(xr) {
            *m = m.fmax(v);
        }
    }
    let mut sm = [T::ZERO; TILE_MAX];
    let sm = &mut sm[..tw];
    // SAFETY (both row views below): row j's columns c0..c0+tw lie inside the slab the caller owns.
    let out_row = |j: usize| unsafe { std::slice::from_raw_parts_mut(out.add(j * inner + c0), tw) };
    if log {
        for j in 0..n {
            let xr = &x[j * inner + c0..][..tw];
            for ((s, &m), &v) in sm.iter_mut().zip(mx.iter()).zip(xr) {
                *s = *s + (v - m).exp();
            }
        }
        for s in sm.iter_mut() {
            *s = s.ln();
        }
        for j in 0..n {
            let xr = &x[j * inner + c0..][..tw];
            for (((o, &v), &m), &ls) in out_row(j).iter_mut().zip(xr).zip(mx.iter()).zip(sm.iter())
            {
                *o = (v - m) - ls;
            }
        }
    } else {
        for j in 0..n {
            let xr = &x[j * inner + c0..][..tw];
            for (((o, &v), &m), s) in out_row(j)
                .iter_mut()
                .zip(xr)
                .zip(mx.iter())
                .zip(sm.iter_mut())
            {
                let e = (v - m).exp();
                *o = e;
                *s = *s + e;
            }
        }
        for s in sm.iter_mut() {
            *s = T::ONE / *s;
        }
        for j in 0..n {
            for (o, &inv) in out_row(j).iter_mut().zip(sm.iter()) {
                *o = *o * inv;
            }
        }
    }
}

#[isa_versions]
fn rows_lastdim_f32_portable(x: &[f32], out: &mut [f32], n: usize, log: bool) {
    rows_lastdim(x, out, n, log)
}

/// The rows in AVX-512 instructions where the CPU has them ([`super::softmax_x86`]), else portably.
fn rows_lastdim_f32(x: &[f32], out: &mut [f32], n: usize, log: bool) {
    #[cfg(target_arch = "x86_64")]
    if super::softmax_x86::rows_f32(x, out, n, log) {
        return;
    }
    rows_lastdim_f32_portable(x, out, n, log)
}

#[isa_versions]
fn rows_lastdim_f64(x: &[f64], out: &mut [f64], n: usize, log: bool) {
    rows_lastdim(x, out, n, log)
}

/// # Safety
/// As `cols_tile`.
#[isa_versions]
unsafe fn cols_tile_f32(
    x: &[f32],
    out: *mut f32,
    n: usize,
    inner: usize,
    c0: usize,
    tw: usize,
    log: bool,
) {
    cols_tile(x, out, n, inner, c0, tw, log)
}

/// # Safety
/// As `cols_tile`.
#[isa_versions]
unsafe fn cols_tile_f64(
    x: &[f64],
    out: *mut f64,
    n: usize,
    inner: usize,
    c0: usize,
    tw: usize,
    log: bool,
) {
    cols_tile(x, out, n, inner, c0, tw, log)
}

/// A raw output pointer that parallel tasks share, each writing a disjoint part.
#[derive(Clone, Copy)]
struct SharedMut<T>(*mut T);
// SAFETY: only used to hand disjoint regions of one `&mut [T]` to tasks (see `softmax_impl`).
unsafe impl<T: Send> Send for SharedMut<T> {}
unsafe impl<T: Send> Sync for SharedMut<T> {}
impl<T> SharedMut<T> {
    /// A method (not field access) so closures capture the whole `Send` wrapper.
    fn get(self) -> *mut T {
        self.0
    }
}

type RowsFn<T> = fn(&[T], &mut [T], usize, bool);
type TileFn<T> = unsafe fn(&[T], *mut T, usize, usize, usize, usize, bool);

#[allow(clippy::too_many_arguments)]
fn softmax_impl<T: Elem>(
    outer: usize,
    n: usize,
    inner: usize,
    input: &[T],
    out: &mut [T],
    log: bool,
    rows: RowsFn<T>,
    tile: TileFn<T>,
) {
    let total = outer
        .checked_mul(n)
        .and_then(|v| v.checked_mul(inner))
        .expect("softmax: shape overflows usize");
    assert_eq!(
        input.len(),
        total,
        "softmax: input has {} elements, shape [{outer}, {n}, {inner}] needs {total}",
        input.len()
    );
    assert_eq!(
        out.len(),
        total,
        "softmax: out has {} elements, shape [{outer}, {n}, {inner}] needs {total}",
        out.len()
    );
    if total == 0 {
        return;
    }
    if inner == 1 {
        if total < SERIAL_MAX {
            rows(input, out, n, log);
        } else {
            // one contiguous block of rows per thread, as in `norm::for_row_chunks`
            let chunk = (total / n).div_ceil(threads::current().max(1)) * n;
            let items: Vec<_> = input.chunks(chunk).zip(out.chunks_mut(chunk)).collect();
            threads::par_each(items, |(x, o)| rows(x, o, n, log));
        }
        return;
    }
    // Wide tiles: each pass then streams long contiguous runs of every row, which the prefetchers
    // follow (narrow, cache-sized tiles measured 2-3x slower: a new page every few dozen bytes).
    // Split narrower only as far as needed to give every thread a couple of tiles.
    let tasks_wanted = if total < SERIAL_MAX {
        1
    } else {
        2 * threads::current()
    };
    let tiles_wanted = tasks_wanted.div_ceil(outer);
    let tw = inner
        .div_ceil(tiles_wanted)
        .next_multiple_of(LANES)
        .clamp(LANES, TILE_MAX)
        .min(inner);
    let tiles = inner.div_ceil(tw);
    let slab = n * inner;
    let dst = SharedMut(out.as_mut_ptr());
    let run = |item: usize| {
        let (o, t) = (item / tiles, item % tiles);
        let c0 = t * tw;
        // SAFETY: item (o, t) alone touches columns c0..c0+tw of slab o, inside `out` (length
        // asserted).
        unsafe {
            tile(
                &input[o * slab..][..slab],
                dst.get().add(o * slab),
                n,
                inner,
                c0,
                tw.min(inner - c0),
                log,
            )
        }
    };
    if total < SERIAL_MAX {
        (0..outer * tiles).for_each(run);
    } else {
        threads::parallel_for(outer * tiles, run);
    }
}

/// Softmax (or, with `log`, log-softmax) over the middle axis of a contiguous `[outer, n, inner]`
/// f32 tensor; `dim=-1` is `inner == 1`. `input` and `out` must not overlap (they are distinct
/// slices).
///
/// Panics if either slice's length is not `outer * n * inner`.
pub fn softmax_f32(
    outer: usize,
    n: usize,
    inner: usize,
    input: &[f32],
    out: &mut [f32],
    log: bool,
) {
    softmax_impl(
        outer,
        n,
        inner,
        input,
        out,
        log,
        rows_lastdim_f32,
        cols_tile_f32,
    )
}

/// [`softmax_f32`] for f64 (libm `exp`/`ln`, same passes).
pub fn softmax_f64(
    outer: usize,
    n: usize,
    inner: usize,
    input: &[f64],
    out: &mut [f64],
    log: bool,
) {
    softmax_impl(
        outer,
        n,
        inner,
        input,
        out,
        log,
        rows_lastdim_f64,
        cols_tile_f64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::uniform;

    fn reference(outer: usize, n: usize, inner: usize, x: &[f64], log: bool) -> Vec<f64> {
        let mut out = vec![0.0; x.len()];
        for o in 0..outer {
            for c in 0..inner {
                let at = |j: usize| o * n * inner + j * inner + c;
                let m = (0..n).map(|j| x[at(j)]).fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = (0..n).map(|j| (x[at(j)] - m).exp()).sum();
                for j in 0..n {
                    out[at(j)] = if log {
                        x[at(j)] - m - s.ln()
                    } else {
                        (x[at(j)] - m).exp() / s
                    };
                }
            }
        }
        out
    }

    fn data(len: usize, seed: u64) -> Vec<f64> {
        uniform(len, seed).map(|u| (u - 0.5) * 16.0).collect()
    }

    fn check_f32(outer: usize, n: usize, inner: usize, log: bool) {
        let x64 = data(outer * n * inner, (outer * 31 + n * 7 + inner) as u64);
        let x: Vec<f32> = x64.iter().map(|&v| v as f32).collect();
        let want = reference(
            outer,
            n,
            inner,
            &x.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            log,
        );
        let mut out = vec![f32::NAN; x.len()];
        softmax_f32(outer, n, inner, &x, &mut out, log);
        for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
            // the strided path sums each column sequentially (as PyTorch does): error grows with n
            let rel = if inner == 1 {
                1e-6
            } else {
                1e-6 + 1e-7 * (n as f64).sqrt()
            };
            let tol = if log {
                2e-6 * (1.0 + w.abs())
            } else {
                rel * w + 1e-9
            };
            assert!(
                (g as f64 - w).abs() <= tol,
                "[{outer},{n},{inner}] log={log} at {i}: {g} vs {w}"
            );
        }
    }

    fn check_f64(outer: usize, n: usize, inner: usize, log: bool) {
        let x = data(outer * n * inner, (outer * 17 + n * 3 + inner) as u64);
        let want = reference(outer, n, inner, &x, log);
        let mut out = vec![f64::NAN; x.len()];
        softmax_f64(outer, n, inner, &x, &mut out, log);
        for (&g, &w) in out.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-13 * (1.0 + w.abs()),
                "[{outer},{n},{inner}] log={log}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn lastdim_odd_sizes() {
        for &n in &[1, 3, 15, 16, 17, 1000, 1025] {
            for &outer in &[1, 5] {
                for log in [false, true] {
                    check_f32(outer, n, 1, log);
                    check_f64(outer, n, 1, log);
                }
            }
        }
    }

    #[test]
    fn lastdim_parallel_path() {
        for log in [false, true] {
            check_f32(97, 1025, 1, log);
            check_f32(3000, 20, 1, log);
            check_f64(40, 1000, 1, log);
        }
    }

    #[test]
    fn inner_axis() {
        for &(outer, n, inner) in &[
            (2, 5, 3),
            (1, 1, 7),
            (3, 17, 40),
            (2, 3, 1000),
            (1, 300, 600),
            (4, 1025, 33),
            (1, 3, 5000),
        ] {
            for log in [false, true] {
                check_f32(outer, n, inner, log);
                check_f64(outer, n, inner, log);
            }
        }
    }

    #[test]
    fn special_values_like_pytorch() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let rows: [[f32; 3]; 5] = [
            [1.0, inf, 2.0],
            [-inf, -inf, -inf],
            [1.0, nan, 2.0],
            [-inf, 0.0, 1.0],
            [inf, inf, 0.0],
        ];
        let x: Vec<f32> = rows.iter().flatten().copied().collect();
        for log in [false, true] {
            let mut out = vec![0.0; 15];
            softmax_f32(5, 3, 1, &x, &mut out, log);
            for r in [0, 1, 2, 4] {
                assert!(
                    out[r * 3..r * 3 + 3].iter().all(|v| v.is_nan()),
                    "row {r} log={log}: {:?}",
                    &out[r * 3..]
                );
            }
            let want = reference(1, 3, 1, &[f64::NEG_INFINITY, 0.0, 1.0], log);
            for (g, w) in out[9..12].iter().zip(&want) {
                assert!(
                    *g as f64 == *w || (*g as f64 - w).abs() < 1e-6,
                    "{g} vs {w}"
                );
            }
            // same through the strided path: the rows become columns
            let xt: Vec<f32> = (0..15).map(|i| x[(i % 5) * 3 + i / 5]).collect();
            let mut outt = vec![0.0; 15];
            softmax_f32(1, 3, 5, &xt, &mut outt, log);
            for i in 0..15 {
                let (a, b) = (outt[i], out[(i % 5) * 3 + i / 5]);
                assert!(
                    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() < 1e-6,
                    "strided {i}: {a} vs {b}"
                );
            }
        }
        // a NaN in a long row (vector lanes, not the tail) poisons the whole row
        let mut x = vec![0.5f32; 64];
        x[21] = nan;
        let mut out = vec![0.0; 64];
        softmax_f32(1, 64, 1, &x, &mut out, false);
        assert!(out.iter().all(|v| v.is_nan()));
        let mut x = vec![0.5f64; 64];
        x[3] = f64::NEG_INFINITY;
        let mut out = vec![0.0; 64];
        softmax_f64(1, 64, 1, &x, &mut out, true);
        assert_eq!(out[3], f64::NEG_INFINITY);
        assert!((out[0] - (1.0f64 / 63.0).ln()).abs() < 1e-14);
    }

    /// The rows kernel of every path this CPU can run (the AVX-512 one is what `softmax_f32` takes
    /// where it exists), on row lengths around the vector widths, with a `-inf` in one row and a NaN
    /// in another.
    #[test]
    fn every_rows_path_matches_the_reference() {
        let rows_fns: [(&str, RowsFn<f32>); 2] = [
            ("portable", rows_lastdim_f32_portable),
            ("dispatched", rows_lastdim_f32),
        ];
        for &n in &[1, 3, 15, 16, 17, 63, 64, 65, 100, 1025] {
            let mut x: Vec<f32> = data(3 * n, n as u64).iter().map(|&v| v as f32).collect();
            x[n + n / 2] = f32::NEG_INFINITY;
            x[2 * n + n - 1] = f32::NAN;
            let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            for log in [false, true] {
                let want = reference(3, n, 1, &x64, log);
                for (name, rows) in rows_fns {
                    let mut out = vec![0.5f32; x.len()];
                    rows(&x, &mut out, n, log);
                    for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
                        let close = if w.is_nan() || w.is_infinite() {
                            g as f64 == w || (g.is_nan() && w.is_nan())
                        } else if log {
                            (g as f64 - w).abs() <= 2e-6 * (1.0 + w.abs())
                        } else {
                            (g as f64 - w).abs() <= 1e-6 * w + 1e-9
                        };
                        assert!(close, "{name} n={n} log={log} at {i}: {g} vs {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn exp_nonpos_matches_libm() {
        for i in 0..=2_100_000 {
            let x = -(i as f32) * 5e-5;
            let (got, want) = (exp_nonpos_f32(x) as f64, (x as f64).exp());
            if want < f32::MIN_POSITIVE as f64 {
                // subnormal: within one unit of 2^-149
                assert!(
                    (got - want).abs() <= 1.5e-45,
                    "exp({x}) = {got} want {want}"
                );
            } else {
                assert!(
                    (got - want).abs() <= 3e-7 * want,
                    "exp({x}) = {got} want {want}"
                );
            }
        }
        assert_eq!(exp_nonpos_f32(0.0), 1.0);
        assert_eq!(exp_nonpos_f32(-0.0), 1.0);
        assert_eq!(exp_nonpos_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpos_f32(-200.0), 0.0);
        assert!(exp_nonpos_f32(f32::NAN).is_nan());
    }

    #[test]
    fn empty_shapes() {
        softmax_f32(0, 5, 1, &[], &mut [], false);
        softmax_f32(3, 0, 2, &[], &mut [], true);
    }

    #[test]
    #[should_panic(expected = "softmax: out has")]
    fn wrong_length_panics() {
        softmax_f32(2, 3, 1, &[0.0; 6], &mut [0.0; 5], false);
    }
}
