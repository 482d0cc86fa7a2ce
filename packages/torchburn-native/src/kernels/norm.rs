//! Normalisations: layer norm, RMS norm and group norm over contiguous rows / groups.
//!
//! Statistics come from one read of the data in memory: each row (or group) is walked in blocks of
//! `BLOCK` elements that stay in L1, each block gets an exact two-pass mean and centred sum of
//! squares (one pass around its first element when that loses no precision, else two around its
//! mean; accumulated in `LANES` independent f32 lanes so it vectorizes), and blocks are merged
//! in f64 with Chan's parallel update. That is as accurate as a two-pass over the whole row (no
//! `E[x²] - E[x]²` cancellation when the mean is large) yet touches memory once; the output pass
//! then re-reads a row that is still cache-resident for typical widths.
//!
//! Outputs compute `(x - mean) · rstd`, not `x · rstd - mean · rstd`, so a large common offset does
//! not cost precision. Variance is biased (divide by the count) and `rstd = 1 / sqrt(var + eps)`,
//! both as PyTorch's `native_layer_norm` / `native_group_norm` define them; statistics are returned
//! in the input's dtype. An empty row gives mean 0 and rstd NaN (what PyTorch returns for a
//! zero-width layer norm). NaN or ±inf in a row makes that row's statistics and outputs NaN.
//!
//! Work is split over the thread pool by rows (groups), on the calling thread when small.

use crate::kernels::lanes;
use crate::threads;
use std::ops::{Add, Mul, Sub};

use torchburn_native_macros::isa_versions;

/// Independent accumulators per sum (four AVX2 registers of f32): hides the add latency without
/// relying on reassociation, which the compiler does not do for floating point.
const LANES: usize = 32;
/// Elements per statistics block (8 KiB of f32: L1-resident between its two passes).
const BLOCK: usize = 2048;
/// Below this many elements a call runs on the calling thread: waking the pool costs microseconds.
const SERIAL_MAX: usize = 32 * 1024;

/// The element operations the kernels need; implemented for `f32` and `f64` only.
trait Elem: Copy + Send + Sync + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> {
    const ZERO: Self;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn fma(self, a: Self, b: Self) -> Self;
}

impl Elem for f32 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn fma(self, a: Self, b: Self) -> Self {
        self.mul_add(a, b)
    }
}

impl Elem for f64 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn fma(self, a: Self, b: Self) -> Self {
        self.mul_add(a, b)
    }
}

/// Sum of the lanes (see [`lanes::halve`]).
#[inline(always)]
fn reduce_lanes<T: Elem>(acc: [T; LANES]) -> T {
    lanes::halve(acc, |a, b| a + b)
}

// The sums below walk `as_chunks` (compile-time-sized chunks) zipped with the accumulator array.
// Indexed `acc[i] = acc[i] + xs[i]` loops get fully unrolled into 32 scalar accumulators that
// LLVM's SLP vectorizer then packs two at a time; the zipped form is vectorized by the loop
// vectorizer into full-width registers (`chunks_exact` also fails: its run-time chunk size keeps
// bounds checks). Hot code uses plain `for` loops, not closures passed to iterator adaptors: an
// adaptor that is not inlined is compiled without the caller's target features, and `mul_add` there
// becomes a libm call.

#[inline(always)]
fn lane_sum<T: Elem>(x: &[T]) -> T {
    let (chunks, tail) = x.as_chunks::<LANES>();
    let mut acc = [T::ZERO; LANES];
    for xs in chunks {
        for (a, &v) in acc.iter_mut().zip(xs) {
            *a = *a + v;
        }
    }
    let mut s = reduce_lanes(acc);
    for &v in tail {
        s = s + v;
    }
    s
}

/// `(Σ (x - c), Σ (x - c)²)`.
#[inline(always)]
fn lane_dev<T: Elem>(x: &[T], c: T) -> (T, T) {
    let (chunks, tail) = x.as_chunks::<LANES>();
    let mut a1 = [T::ZERO; LANES];
    let mut a2 = [T::ZERO; LANES];
    for xs in chunks {
        for ((s1, s2), &v) in a1.iter_mut().zip(a2.iter_mut()).zip(xs) {
            let d = v - c;
            *s1 = *s1 + d;
            *s2 = d.fma(d, *s2);
        }
    }
    let (mut s1, mut s2) = (reduce_lanes(a1), reduce_lanes(a2));
    for &v in tail {
        let d = v - c;
        s1 = s1 + d;
        s2 = d.fma(d, s2);
    }
    (s1, s2)
}

#[inline(always)]
fn lane_sumsq<T: Elem>(x: &[T]) -> T {
    let (chunks, tail) = x.as_chunks::<LANES>();
    let mut acc = [T::ZERO; LANES];
    for xs in chunks {
        for (a, &v) in acc.iter_mut().zip(xs) {
            *a = v.fma(v, *a);
        }
    }
    let mut s = reduce_lanes(acc);
    for &v in tail {
        s = v.fma(v, s);
    }
    s
}

/// Mean and biased variance of `x`, in f64 (mean 0, variance NaN when `x` is empty).
#[inline(always)]
fn moments<T: Elem>(x: &[T]) -> (f64, f64) {
    // a row of one block (the common case) needs no merge; divisions by the count, which does not
    // depend on the data, become products with its reciprocal, off the row's chain of dependent
    // operations (layer norm over 1024-wide rows, in cache: 170 -> 159 ns per row)
    let (mean, m2, count) = if x.len() <= BLOCK {
        let nb = x.len() as f64;
        let (mean, m2) = block_moments(x, nb, 1.0 / nb);
        (mean, m2, nb)
    } else {
        let (mut count, mut mean, mut m2) = (0.0f64, 0.0f64, 0.0f64);
        for blk in x.chunks(BLOCK) {
            let nb = blk.len() as f64;
            let (bmean, bm2) = block_moments(blk, nb, 1.0 / nb);
            // Chan et al.'s merge of (count, mean, m2) with the block's
            let tot = count + nb;
            let delta = bmean - mean;
            mean += delta * (nb / tot);
            m2 += bm2 + delta * delta * (count * nb / tot);
            count = tot;
        }
        (mean, m2, count)
    };
    let var = m2 * (1.0 / count);
    // rounding can leave a hair below zero; `max` would also swallow NaN, so compare instead
    (mean, if var < 0.0 { 0.0 } else { var })
}

/// A block's mean and centred sum of squares, `(mean, Σ (x - mean)²)`.
///
/// One pass first: sums of deviations `d = x - c` from `c`, the mean of the block's first `LANES`
/// elements, give `m2 = Σd² - (Σd)²/n`. Its rounding error is about `eps · Σd²`, so it is trusted
/// while `Σd² <= 2 · m2` (`c` within one standard deviation of the mean, as it is unless the row is
/// ordered or patterned): at most twice the error of the two-pass result. Otherwise the block is
/// redone in two passes around its own rounded mean. NaN or inf make both statistics NaN, as
/// PyTorch's running update does.
#[inline(always)]
fn block_moments<T: Elem>(blk: &[T], nb: f64, inv_nb: f64) -> (f64, f64) {
    let head = &blk[..blk.len().min(LANES)];
    let inv_head = if head.len() == LANES {
        1.0 / LANES as f64
    } else {
        1.0 / head.len() as f64
    };
    let c = T::from_f64(lane_sum(head).to_f64() * inv_head);
    let (d1, d2) = lane_dev(blk, c);
    let (d1, d2) = (d1.to_f64(), d2.to_f64());
    let m2 = d2 - d1 * d1 * inv_nb;
    if m2.is_nan() {
        return (f64::NAN, f64::NAN);
    }
    if d2 > 2.0 * m2 {
        let c = T::from_f64(lane_sum(blk).to_f64() / nb);
        let (d1, d2) = lane_dev(blk, c);
        let (d1, d2) = (d1.to_f64(), d2.to_f64());
        return (c.to_f64() + d1 * inv_nb, d2 - d1 * d1 * inv_nb);
    }
    (c.to_f64() + d1 * inv_nb, m2)
}

/// Mean of `x²` in f64 (NaN when `x` is empty).
#[inline(always)]
fn mean_square<T: Elem>(x: &[T]) -> f64 {
    let mut s = 0.0;
    for b in x.chunks(BLOCK) {
        s += lane_sumsq(b).to_f64();
    }
    s / x.len() as f64
}

/// `(x - mean) · scale` for a mean held as an unevaluated sum `hi + lo` of two `T`s, computed as
/// `(x - hi) · scale + (-lo · scale)`: one subtraction and one FMA, yet as if the mean were exact.
/// (It usually is not representable: with a mean of 1000, f32's half-ulp alone is 3e-5, which
/// `rstd` would scale into every output.)
#[derive(Clone, Copy)]
struct Centre<T> {
    hi: T,
    scale: T,
    shift: T,
}

impl<T: Elem> Centre<T> {
    #[inline(always)]
    fn new(mean: f64, scale: f64) -> Self {
        Self::with_offset(mean, scale, 0.0)
    }
    /// `(x - mean) · scale + offset`.
    #[inline(always)]
    fn with_offset(mean: f64, scale: f64, offset: f64) -> Self {
        let hi = T::from_f64(mean);
        let lo = mean - hi.to_f64();
        Centre {
            hi,
            scale: T::from_f64(scale),
            shift: T::from_f64(offset - lo * scale),
        }
    }
    #[inline(always)]
    fn apply(self, x: T) -> T {
        (x - self.hi).fma(self.scale, self.shift)
    }
}

/// `out = ((x - mean) · rstd) · w + b` with `w`/`b` present as `W`/`B` say (else 1 / 0).
#[inline(always)]
fn affine_row<T: Elem, const W: bool, const B: bool>(
    x: &[T],
    out: &mut [T],
    w: &[T],
    b: &[T],
    centre: Centre<T>,
) {
    let n = x.len();
    let out = &mut out[..n];
    let w = if W { &w[..n] } else { w };
    let b = if B { &b[..n] } else { b };
    for i in 0..n {
        let t = centre.apply(x[i]);
        out[i] = match (W, B) {
            (true, true) => t.fma(w[i], b[i]),
            (true, false) => t * w[i],
            (false, true) => t + b[i],
            (false, false) => t,
        };
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn layer_norm_rows<T: Elem>(
    n: usize,
    x: &[T],
    w: Option<&[T]>,
    b: Option<&[T]>,
    eps: f64,
    out: &mut [T],
    mut mean: Option<&mut [T]>,
    mut rstd: Option<&mut [T]>,
) {
    for (r, (xr, or)) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)).enumerate() {
        let (mu, var) = moments(xr);
        let rs = 1.0 / (var + eps).sqrt();
        let c = Centre::new(mu, rs);
        match (w, b) {
            (Some(w), Some(b)) => affine_row::<T, true, true>(xr, or, w, b, c),
            (Some(w), None) => affine_row::<T, true, false>(xr, or, w, &[], c),
            (None, Some(b)) => affine_row::<T, false, true>(xr, or, &[], b, c),
            (None, None) => affine_row::<T, false, false>(xr, or, &[], &[], c),
        }
        if let Some(m) = mean.as_deref_mut() {
            m[r] = c.hi;
        }
        if let Some(s) = rstd.as_deref_mut() {
            s[r] = c.scale;
        }
    }
}

#[inline(always)]
fn rms_norm_rows<T: Elem>(n: usize, x: &[T], w: Option<&[T]>, eps: f64, out: &mut [T]) {
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let r = T::from_f64(1.0 / (mean_square(xr) + eps).sqrt());
        match w {
            Some(w) => {
                for ((o, &v), &wv) in or.iter_mut().zip(xr).zip(&w[..n]) {
                    *o = v * r * wv;
                }
            }
            None => {
                for (o, &v) in or.iter_mut().zip(xr) {
                    *o = v * r;
                }
            }
        }
    }
}

/// Group norm for the groups `g0 ..` held in `x`/`out` (each `cpg · hw` elements: `cpg` channels).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn group_norm_groups<T: Elem>(
    g0: usize,
    groups: usize,
    cpg: usize,
    hw: usize,
    x: &[T],
    w: Option<&[T]>,
    b: Option<&[T]>,
    eps: f64,
    out: &mut [T],
    mut mean: Option<&mut [T]>,
    mut rstd: Option<&mut [T]>,
) {
    let glen = cpg * hw;
    for (k, (xg, og)) in x
        .chunks_exact(glen)
        .zip(out.chunks_exact_mut(glen))
        .enumerate()
    {
        let (mu, var) = moments(xg);
        let rs = 1.0 / (var + eps).sqrt();
        let ch0 = ((g0 + k) % groups) * cpg;
        for (ci, (xc, oc)) in xg.chunks_exact(hw).zip(og.chunks_exact_mut(hw)).enumerate() {
            // y = (x - mean) · (rstd · w) + b, the per-channel scale and shift folded once, in f64
            let scale = rs * w.map_or(1.0, |w| w[ch0 + ci].to_f64());
            let c = Centre::<T>::with_offset(mu, scale, b.map_or(0.0, |b| b[ch0 + ci].to_f64()));
            for (o, &v) in oc.iter_mut().zip(xc) {
                *o = c.apply(v);
            }
        }
        if let Some(m) = mean.as_deref_mut() {
            m[k] = T::from_f64(mu);
        }
        if let Some(s) = rstd.as_deref_mut() {
            s[k] = T::from_f64(rs);
        }
    }
}

macro_rules! instantiate {
    ($t:ty, $ln:ident, $rms:ident, $gn:ident) => {
        #[allow(clippy::too_many_arguments)]
        #[isa_versions]
        fn $ln(
            n: usize,
            x: &[$t],
            w: Option<&[$t]>,
            b: Option<&[$t]>,
            eps: f64,
            out: &mut [$t],
            mean: Option<&mut [$t]>,
            rstd: Option<&mut [$t]>,
        ) {
            layer_norm_rows(n, x, w, b, eps, out, mean, rstd)
        }

        #[isa_versions]
        fn $rms(n: usize, x: &[$t], w: Option<&[$t]>, eps: f64, out: &mut [$t]) {
            rms_norm_rows(n, x, w, eps, out)
        }

        #[allow(clippy::too_many_arguments)]
        #[isa_versions]
        fn $gn(
            g0: usize,
            groups: usize,
            cpg: usize,
            hw: usize,
            x: &[$t],
            w: Option<&[$t]>,
            b: Option<&[$t]>,
            eps: f64,
            out: &mut [$t],
            mean: Option<&mut [$t]>,
            rstd: Option<&mut [$t]>,
        ) {
            group_norm_groups(g0, groups, cpg, hw, x, w, b, eps, out, mean, rstd)
        }
    };
}

instantiate!(
    f32,
    layer_norm_rows_f32,
    rms_norm_rows_f32,
    group_norm_groups_f32
);
instantiate!(
    f64,
    layer_norm_rows_f64,
    rms_norm_rows_f64,
    group_norm_groups_f64
);

/// Splits an optional per-row output into per-task chunks (or `None`s) in step with the rows.
fn opt_chunks<T>(s: Option<&mut [T]>, rows_per_task: usize, tasks: usize) -> Vec<Option<&mut [T]>> {
    match s {
        Some(s) => s.chunks_mut(rows_per_task).map(Some).collect(),
        None => (0..tasks).map(|_| None).collect(),
    }
}

/// Runs `f(first_row, input_rows, out_rows, mean_rows, rstd_rows)` over `rows` rows of `row_len`
/// elements: once on the calling thread when small, else once per thread on a contiguous block of
/// rows. Each thread then streams through memory of its own; small tasks claimed in turn interleave
/// the threads' streams, and layer norm 4096×1024 took 7% longer that way (751-779 against 707-721
/// µs on 2 threads).
fn for_row_chunks<T: Send + Sync, F>(
    rows: usize,
    row_len: usize,
    input: &[T],
    out: &mut [T],
    mean: Option<&mut [T]>,
    rstd: Option<&mut [T]>,
    f: F,
) where
    F: Fn(usize, &[T], &mut [T], Option<&mut [T]>, Option<&mut [T]>) + Sync,
{
    if rows == 0 {
        return;
    }
    if rows * row_len < SERIAL_MAX || rows == 1 {
        f(0, input, out, mean, rstd);
        return;
    }
    let rpt = rows.div_ceil(threads::current().max(1));
    let tasks = rows.div_ceil(rpt);
    let items: Vec<_> = input
        .chunks(rpt * row_len)
        .zip(out.chunks_mut(rpt * row_len))
        .zip(
            opt_chunks(mean, rpt, tasks)
                .into_iter()
                .zip(opt_chunks(rstd, rpt, tasks)),
        )
        .enumerate()
        .collect();
    threads::par_each(items, |(t, ((x, o), (m, s)))| f(t * rpt, x, o, m, s));
}

/// Statistics of empty rows/groups: mean 0, rstd NaN (PyTorch's for a zero-width layer norm).
fn fill_empty_stats<T: Elem>(mean: Option<&mut [T]>, rstd: Option<&mut [T]>) {
    if let Some(m) = mean {
        m.fill(T::ZERO);
    }
    if let Some(r) = rstd {
        r.fill(T::from_f64(f64::NAN));
    }
}

fn check_len<T>(what: &str, s: &[T], want: usize) {
    assert_eq!(
        s.len(),
        want,
        "{what} has {} elements, expected {want}",
        s.len()
    );
}

#[allow(clippy::too_many_arguments)]
fn layer_norm_impl<T: Elem>(
    rows: usize,
    n: usize,
    input: &[T],
    weight: Option<&[T]>,
    bias: Option<&[T]>,
    eps: f64,
    out: &mut [T],
    mean: Option<&mut [T]>,
    rstd: Option<&mut [T]>,
    kernel: LayerKernel<T>,
) {
    let total = rows
        .checked_mul(n)
        .expect("layer_norm: shape overflows usize");
    check_len("layer_norm: input", input, total);
    check_len("layer_norm: out", out, total);
    weight.inspect(|w| check_len("layer_norm: weight", w, n));
    bias.inspect(|b| check_len("layer_norm: bias", b, n));
    mean.as_deref()
        .inspect(|m| check_len("layer_norm: mean", m, rows));
    rstd.as_deref()
        .inspect(|r| check_len("layer_norm: rstd", r, rows));
    if n == 0 {
        // nothing to normalise; statistics as PyTorch reports them for an empty row
        fill_empty_stats(mean, rstd);
        return;
    }
    for_row_chunks(rows, n, input, out, mean, rstd, |_, x, o, m, s| {
        kernel(n, x, weight, bias, eps, o, m, s)
    });
}

/// Layer norm of each of `rows` contiguous rows of `n` f32 elements (PyTorch's `native_layer_norm`
/// with `normalized_shape` flattened to `n`): `out = (x - mean) · rstd · weight + bias`,
/// `weight`/`bias` of length `n` and optional. `mean`/`rstd`, if given, receive the per-row
/// statistics (`[rows]`), biased variance, `rstd = 1 / sqrt(var + eps)`.
///
/// Panics if a slice's length does not match the shape.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_f32(
    rows: usize,
    n: usize,
    input: &[f32],
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    eps: f64,
    out: &mut [f32],
    mean: Option<&mut [f32]>,
    rstd: Option<&mut [f32]>,
) {
    layer_norm_impl(
        rows,
        n,
        input,
        weight,
        bias,
        eps,
        out,
        mean,
        rstd,
        layer_norm_rows_f32_dispatch,
    )
}

/// The rows in AVX-512 instructions where the CPU has them and they fit ([`super::norm_x86`]),
/// else portably.
#[allow(clippy::too_many_arguments)]
fn layer_norm_rows_f32_dispatch(
    n: usize,
    x: &[f32],
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    eps: f64,
    out: &mut [f32],
    mean: Option<&mut [f32]>,
    rstd: Option<&mut [f32]>,
) {
    #[cfg(target_arch = "x86_64")]
    let (mean, rstd) = {
        let (mut mean, mut rstd) = (mean, rstd);
        if super::norm_x86::layer_norm_rows_f32(
            n,
            x,
            w,
            b,
            eps,
            out,
            mean.as_deref_mut(),
            rstd.as_deref_mut(),
        ) {
            return;
        }
        (mean, rstd)
    };
    layer_norm_rows_f32(n, x, w, b, eps, out, mean, rstd)
}

/// [`layer_norm_f32`] for f64.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_f64(
    rows: usize,
    n: usize,
    input: &[f64],
    weight: Option<&[f64]>,
    bias: Option<&[f64]>,
    eps: f64,
    out: &mut [f64],
    mean: Option<&mut [f64]>,
    rstd: Option<&mut [f64]>,
) {
    layer_norm_impl(
        rows,
        n,
        input,
        weight,
        bias,
        eps,
        out,
        mean,
        rstd,
        layer_norm_rows_f64,
    )
}

fn rms_norm_impl<T: Elem>(
    rows: usize,
    n: usize,
    input: &[T],
    weight: Option<&[T]>,
    eps: f64,
    out: &mut [T],
    kernel: RmsKernel<T>,
) {
    let total = rows
        .checked_mul(n)
        .expect("rms_norm: shape overflows usize");
    check_len("rms_norm: input", input, total);
    check_len("rms_norm: out", out, total);
    weight.inspect(|w| check_len("rms_norm: weight", w, n));
    if n == 0 {
        return;
    }
    for_row_chunks(rows, n, input, out, None, None, |_, x, o, _, _| {
        kernel(n, x, weight, eps, o)
    });
}

/// RMS norm of each of `rows` contiguous rows of `n` f32 elements:
/// `out = x / sqrt(mean(x²) + eps) · weight` (`weight` of length `n`, optional), as
/// `torch.rms_norm`.
///
/// Panics if a slice's length does not match the shape.
pub fn rms_norm_f32(
    rows: usize,
    n: usize,
    input: &[f32],
    weight: Option<&[f32]>,
    eps: f64,
    out: &mut [f32],
) {
    rms_norm_impl(rows, n, input, weight, eps, out, rms_norm_rows_f32)
}

/// [`rms_norm_f32`] for f64.
pub fn rms_norm_f64(
    rows: usize,
    n: usize,
    input: &[f64],
    weight: Option<&[f64]>,
    eps: f64,
    out: &mut [f64],
) {
    rms_norm_impl(rows, n, input, weight, eps, out, rms_norm_rows_f64)
}

/// `(n, x, weight, bias, eps, out, mean, rstd)`
type LayerKernel<T> =
    fn(usize, &[T], Option<&[T]>, Option<&[T]>, f64, &mut [T], Option<&mut [T]>, Option<&mut [T]>);
/// `(n, x, weight, eps, out)`
type RmsKernel<T> = fn(usize, &[T], Option<&[T]>, f64, &mut [T]);
/// `(first group, groups, channels per group, hw, x, weight, bias, eps, out, mean, rstd)`
type GroupKernel<T> = fn(
    usize,
    usize,
    usize,
    usize,
    &[T],
    Option<&[T]>,
    Option<&[T]>,
    f64,
    &mut [T],
    Option<&mut [T]>,
    Option<&mut [T]>,
);

#[allow(clippy::too_many_arguments)]
fn group_norm_impl<T: Elem>(
    n: usize,
    c: usize,
    hw: usize,
    groups: usize,
    input: &[T],
    weight: Option<&[T]>,
    bias: Option<&[T]>,
    eps: f64,
    out: &mut [T],
    mean: Option<&mut [T]>,
    rstd: Option<&mut [T]>,
    kernel: GroupKernel<T>,
) {
    assert!(
        groups > 0 && c.is_multiple_of(groups),
        "group_norm: {c} channels do not split into {groups} groups"
    );
    let total = n
        .checked_mul(c)
        .and_then(|v| v.checked_mul(hw))
        .expect("group_norm: shape overflows usize");
    check_len("group_norm: input", input, total);
    check_len("group_norm: out", out, total);
    weight.inspect(|w| check_len("group_norm: weight", w, c));
    bias.inspect(|b| check_len("group_norm: bias", b, c));
    mean.as_deref()
        .inspect(|m| check_len("group_norm: mean", m, n * groups));
    rstd.as_deref()
        .inspect(|r| check_len("group_norm: rstd", r, n * groups));
    let cpg = c / groups;
    if cpg * hw == 0 {
        fill_empty_stats(mean, rstd);
        return;
    }
    for_row_chunks(
        n * groups,
        cpg * hw,
        input,
        out,
        mean,
        rstd,
        |g0, x, o, m, s| kernel(g0, groups, cpg, hw, x, weight, bias, eps, o, m, s),
    );
}

/// Group norm of an NCHW-contiguous f32 tensor viewed as `[n, c, hw]`, `c` channels split into
/// `groups` consecutive groups (PyTorch's `native_group_norm`): each group's `c / groups · hw`
/// elements are normalised by their own mean and biased variance, then scaled and shifted per
/// channel by `weight`/`bias` (length `c`, optional). `mean`/`rstd`, if given, receive
/// `[n, groups]` statistics.
///
/// Panics if `groups` does not divide `c` or a slice's length does not match the shape.
#[allow(clippy::too_many_arguments)]
pub fn group_norm_f32(
    n: usize,
    c: usize,
    hw: usize,
    groups: usize,
    input: &[f32],
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    eps: f64,
    out: &mut [f32],
    mean: Option<&mut [f32]>,
    rstd: Option<&mut [f32]>,
) {
    group_norm_impl(
        n,
        c,
        hw,
        groups,
        input,
        weight,
        bias,
        eps,
        out,
        mean,
        rstd,
        group_norm_groups_f32,
    )
}

/// [`group_norm_f32`] for f64.
#[allow(clippy::too_many_arguments)]
pub fn group_norm_f64(
    n: usize,
    c: usize,
    hw: usize,
    groups: usize,
    input: &[f64],
    weight: Option<&[f64]>,
    bias: Option<&[f64]>,
    eps: f64,
    out: &mut [f64],
    mean: Option<&mut [f64]>,
    rstd: Option<&mut [f64]>,
) {
    group_norm_impl(
        n,
        c,
        hw,
        groups,
        input,
        weight,
        bias,
        eps,
        out,
        mean,
        rstd,
        group_norm_groups_f64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::uniform;

    fn data(len: usize, seed: u64, offset: f64) -> Vec<f64> {
        uniform(len, seed)
            .map(|u| offset + (u - 0.5) * 6.0)
            .collect()
    }

    fn f32s(v: &[f64]) -> Vec<f32> {
        v.iter().map(|&x| x as f32).collect()
    }

    fn f64s(v: &[f32]) -> Vec<f64> {
        v.iter().map(|&x| x as f64).collect()
    }

    /// Naive two-pass layer norm over `rows` rows: (out, mean, rstd).
    fn ln_ref(
        rows: usize,
        n: usize,
        x: &[f64],
        w: Option<&[f64]>,
        b: Option<&[f64]>,
        eps: f64,
    ) -> [Vec<f64>; 3] {
        let (mut out, mut mean, mut rstd) = (vec![0.0; rows * n], vec![0.0; rows], vec![0.0; rows]);
        for r in 0..rows {
            let row = &x[r * n..][..n];
            let mu = row.iter().sum::<f64>() / n as f64;
            let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n as f64;
            let rs = 1.0 / (var + eps).sqrt();
            for j in 0..n {
                out[r * n + j] =
                    (row[j] - mu) * rs * w.map_or(1.0, |w| w[j]) + b.map_or(0.0, |b| b[j]);
            }
            (mean[r], rstd[r]) = (mu, rs);
        }
        [out, mean, rstd]
    }

    fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "{what} at {i}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn layer_norm_of_rows_with_an_unrepresentative_head() {
        // a sorted ramp and a row whose first elements are outliers: the one-pass shift (the head's
        // mean) sits far from the row's mean, so the block must take the two-pass route
        let n = 3000;
        let ramp: Vec<f64> = (0..n).map(|i| 1000.0 + i as f64 * 0.37).collect();
        let spike: Vec<f64> = (0..n)
            .map(|i| if i < 40 { 5e4 } else { (i % 7) as f64 })
            .collect();
        for row in [ramp, spike] {
            let x32 = f32s(&row);
            let x = f64s(&x32);
            let mut out = vec![0f32; n];
            let (mut mean, mut rstd) = ([0f32; 1], [0f32; 1]);
            layer_norm_f32(
                1,
                n,
                &x32,
                None,
                None,
                1e-5,
                &mut out,
                Some(&mut mean),
                Some(&mut rstd),
            );
            let [ro, rm, rr] = ln_ref(1, n, &x, None, None, 1e-5);
            close("ordered row out", &f64s(&out), &ro, 2e-6);
            close("ordered row mean", &f64s(&mean), &rm, 1e-6);
            close("ordered row rstd", &f64s(&rstd), &rr, 1e-6);
        }
    }

    /// Every rows kernel this CPU can run (the portable one, and the one `layer_norm_f32` picks here)
    /// on widths around the vector width up to the widest one-block row: a row far from zero, a
    /// sorted ramp (the two-pass route), and rows holding NaN or inf.
    #[test]
    fn every_layer_norm_rows_path_matches_the_reference() {
        type Rows = fn(
            usize,
            &[f32],
            Option<&[f32]>,
            Option<&[f32]>,
            f64,
            &mut [f32],
            Option<&mut [f32]>,
            Option<&mut [f32]>,
        );
        let paths: [(&str, Rows); 2] = [
            ("portable", layer_norm_rows_f32),
            ("dispatched", layer_norm_rows_f32_dispatch),
        ];
        for &n in &[1, 15, 16, 17, 33, 64, 100, 1024, 2048] {
            let mut x = data(n, n as u64, 1000.0);
            x.extend((0..n).map(|i| i as f64 * 0.37 - 50.0));
            x.extend(data(n, 7, 0.0));
            x.extend(data(n, 8, 0.0));
            let x32 = f32s(&x);
            let (w, b) = (f32s(&data(n, 1, 1.0)), f32s(&data(n, 2, 0.0)));
            let [ro, rm, rr] = ln_ref(4, n, &f64s(&x32), Some(&f64s(&w)), Some(&f64s(&b)), 1e-5);
            let mut special = x32.clone();
            special[2 * n + n / 2] = f32::NAN;
            special[3 * n] = f32::INFINITY;
            for (name, rows) in paths {
                let (mut out, mut mean, mut rstd) = (vec![0f32; 4 * n], [0f32; 4], [0f32; 4]);
                rows(
                    n,
                    &x32,
                    Some(&w),
                    Some(&b),
                    1e-5,
                    &mut out,
                    Some(&mut mean),
                    Some(&mut rstd),
                );
                close(&format!("{name} n={n} out"), &f64s(&out), &ro, 2e-5);
                close(&format!("{name} n={n} mean"), &f64s(&mean), &rm, 1e-6);
                close(&format!("{name} n={n} rstd"), &f64s(&rstd), &rr, 1e-5);
                rows(n, &special, None, None, 1e-5, &mut out, None, None);
                assert!(out[..2 * n].iter().all(|v| v.is_finite()), "{name} n={n}");
                assert!(out[2 * n..].iter().all(|v| v.is_nan()), "{name} n={n}");
            }
        }
    }

    #[test]
    fn layer_norm_matches_reference() {
        for &(rows, n) in &[
            (1, 1),
            (3, 3),
            (4, 1000),
            (2, 1025),
            (2, 5000),
            (70, 1025),
            (2000, 17),
        ] {
            for (wi, bi) in [(true, true), (true, false), (false, true), (false, false)] {
                for offset in [0.0, 1000.0] {
                    let x = data(rows * n, (rows * 13 + n) as u64, offset);
                    let w = data(n, 5, 1.0);
                    let b = data(n, 6, 0.0);
                    let (w, b) = (wi.then_some(&w[..]), bi.then_some(&b[..]));
                    let eps = 1e-5;
                    let x32 = f32s(&x);
                    let (w32, b32) = (w.map(f32s), b.map(f32s));
                    let mut out = vec![0f32; rows * n];
                    let (mut mean, mut rstd) = (vec![0f32; rows], vec![0f32; rows]);
                    layer_norm_f32(
                        rows,
                        n,
                        &x32,
                        w32.as_deref(),
                        b32.as_deref(),
                        eps,
                        &mut out,
                        Some(&mut mean),
                        Some(&mut rstd),
                    );
                    let w64 = w32.as_deref().map(f64s);
                    let b64 = b32.as_deref().map(f64s);
                    let [ro, rm, rr] =
                        ln_ref(rows, n, &f64s(&x32), w64.as_deref(), b64.as_deref(), eps);
                    let what = format!("ln f32 [{rows},{n}] w={wi} b={bi} off={offset}");
                    // the mean is carried as hi + lo, so a large offset costs no output precision
                    let tol = 2e-6;
                    close(&what, &f64s(&out), &ro, tol);
                    close(&what, &f64s(&mean), &rm, 1e-6);
                    close(&what, &f64s(&rstd), &rr, 1e-6);

                    let mut out = vec![0f64; rows * n];
                    let (mut mean, mut rstd) = (vec![0f64; rows], vec![0f64; rows]);
                    layer_norm_f64(
                        rows,
                        n,
                        &x,
                        w,
                        b,
                        eps,
                        &mut out,
                        Some(&mut mean),
                        Some(&mut rstd),
                    );
                    let [ro, rm, rr] = ln_ref(rows, n, &x, w, b, eps);
                    close(&format!("ln f64 [{rows},{n}]"), &out, &ro, 1e-11);
                    close("ln f64 mean", &mean, &rm, 1e-13);
                    close("ln f64 rstd", &rstd, &rr, 1e-11);
                }
            }
        }
    }

    #[test]
    fn layer_norm_without_stats_and_special_values() {
        let x = [
            1.0f32,
            f32::INFINITY,
            2.0,
            1.0,
            f32::NAN,
            0.0,
            1.0,
            2.0,
            3.0,
        ];
        let mut out = [0f32; 9];
        let (mut mean, mut rstd) = ([0f32; 3], [0f32; 3]);
        layer_norm_f32(
            3,
            3,
            &x,
            None,
            None,
            0.0,
            &mut out,
            Some(&mut mean),
            Some(&mut rstd),
        );
        assert!(out[..6].iter().all(|v| v.is_nan()) && mean[..2].iter().all(|v| v.is_nan()));
        assert!(rstd[..2].iter().all(|v| v.is_nan()));
        assert_eq!(mean[2], 2.0);
        assert!((out[8] - 1.224_744_9).abs() < 1e-6);
        let mut out2 = [0f32; 9];
        layer_norm_f32(3, 3, &x, None, None, 0.0, &mut out2, None, None);
        assert_eq!(out2[6..], out[6..]);
        // constant rows: variance exactly 0, rstd = 1/sqrt(eps), output 0
        let x = vec![3.3f32; 4 * 100];
        let mut out = vec![1f32; 400];
        let mut rstd = [0f32; 4];
        layer_norm_f32(
            4,
            100,
            &x,
            None,
            None,
            1e-5,
            &mut out,
            None,
            Some(&mut rstd),
        );
        assert!(out.iter().all(|&v| v.abs() < 1e-2), "{:?}", &out[..4]);
        assert!((rstd[0] - 316.227_77).abs() < 0.5);
        // empty rows
        let (mut mean, mut rstd) = ([9f32; 2], [9f32; 2]);
        layer_norm_f32(
            2,
            0,
            &[],
            None,
            None,
            1e-5,
            &mut [],
            Some(&mut mean),
            Some(&mut rstd),
        );
        assert_eq!(mean, [0.0; 2]);
        assert!(rstd.iter().all(|v| v.is_nan()));
    }

    #[test]
    #[should_panic(expected = "layer_norm: weight has 3 elements, expected 4")]
    fn layer_norm_checks_lengths() {
        layer_norm_f32(
            2,
            4,
            &[0.0; 8],
            Some(&[1.0; 3]),
            None,
            1e-5,
            &mut [0.0; 8],
            None,
            None,
        );
    }

    #[test]
    fn rms_norm_matches_reference() {
        for &(rows, n) in &[(1, 1), (3, 3), (4, 1000), (2, 1025), (70, 1025), (3000, 11)] {
            for wi in [true, false] {
                let x = data(rows * n, n as u64, 0.5);
                let w = data(n, 9, 1.0);
                let w = wi.then_some(&w[..]);
                let reference = |x: &[f64], w: Option<&[f64]>| -> Vec<f64> {
                    let mut out = vec![0.0; rows * n];
                    for r in 0..rows {
                        let row = &x[r * n..][..n];
                        let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
                        for j in 0..n {
                            out[r * n + j] = row[j] / (ms + 1e-6).sqrt() * w.map_or(1.0, |w| w[j]);
                        }
                    }
                    out
                };
                let (x32, w32) = (f32s(&x), w.map(f32s));
                let mut out = vec![0f32; rows * n];
                rms_norm_f32(rows, n, &x32, w32.as_deref(), 1e-6, &mut out);
                let want = reference(&f64s(&x32), w32.as_deref().map(f64s).as_deref());
                close(
                    &format!("rms f32 [{rows},{n}] w={wi}"),
                    &f64s(&out),
                    &want,
                    2e-6,
                );
                let mut out = vec![0f64; rows * n];
                rms_norm_f64(rows, n, &x, w, 1e-6, &mut out);
                close(
                    &format!("rms f64 [{rows},{n}]"),
                    &out,
                    &reference(&x, w),
                    1e-13,
                );
            }
        }
        let mut out = [0f32; 3];
        rms_norm_f32(1, 3, &[0.0, 0.0, 0.0], None, 1e-5, &mut out);
        assert_eq!(out, [0.0; 3]);
        rms_norm_f32(1, 3, &[1.0, f32::INFINITY, 0.0], None, 1e-5, &mut out);
        assert!(out[0] == 0.0 && out[1].is_nan());
    }

    #[test]
    fn group_norm_matches_reference() {
        // (n, c, hw, groups)
        for &(n, c, hw, groups) in &[
            (1, 1, 1, 1),
            (2, 6, 5, 3),
            (2, 6, 5, 6),
            (3, 4, 1000, 2),
            (4, 32, 49, 8),
            (2, 8, 3000, 1),
        ] {
            for affine in [true, false] {
                let x = data(n * c * hw, (n + c + hw) as u64, 2.0);
                let w = data(c, 3, 1.0);
                let b = data(c, 4, 0.0);
                let (w, b) = (affine.then_some(&w[..]), affine.then_some(&b[..]));
                let eps = 1e-5;
                let cpg = c / groups;
                // reference: group norm is layer norm over each group's block, then per-channel
                // affine
                let reference = |x: &[f64], w: Option<&[f64]>, b: Option<&[f64]>| {
                    let [mut out, mean, rstd] = ln_ref(n * groups, cpg * hw, x, None, None, eps);
                    for (i, o) in out.iter_mut().enumerate() {
                        let ch = i / hw % c;
                        *o = *o * w.map_or(1.0, |w| w[ch]) + b.map_or(0.0, |b| b[ch]);
                    }
                    [out, mean, rstd]
                };
                let (x32, w32, b32) = (f32s(&x), w.map(f32s), b.map(f32s));
                let mut out = vec![0f32; x.len()];
                let (mut mean, mut rstd) = (vec![0f32; n * groups], vec![0f32; n * groups]);
                group_norm_f32(
                    n,
                    c,
                    hw,
                    groups,
                    &x32,
                    w32.as_deref(),
                    b32.as_deref(),
                    eps,
                    &mut out,
                    Some(&mut mean),
                    Some(&mut rstd),
                );
                let (w64, b64) = (w32.as_deref().map(f64s), b32.as_deref().map(f64s));
                let [ro, rm, rr] = reference(&f64s(&x32), w64.as_deref(), b64.as_deref());
                let what = format!("gn f32 [{n},{c},{hw}] g={groups} affine={affine}");
                close(&what, &f64s(&out), &ro, 4e-6);
                close(&what, &f64s(&mean), &rm, 1e-6);
                close(&what, &f64s(&rstd), &rr, 1e-6);

                let mut out = vec![0f64; x.len()];
                let (mut mean, mut rstd) = (vec![0f64; n * groups], vec![0f64; n * groups]);
                group_norm_f64(
                    n,
                    c,
                    hw,
                    groups,
                    &x,
                    w,
                    b,
                    eps,
                    &mut out,
                    Some(&mut mean),
                    Some(&mut rstd),
                );
                let [ro, rm, rr] = reference(&x, w, b);
                close(&format!("gn f64 [{n},{c},{hw}]"), &out, &ro, 1e-11);
                close("gn f64 mean", &mean, &rm, 1e-13);
                close("gn f64 rstd", &rstd, &rr, 1e-11);
            }
        }
        let mut out = vec![0f32; 12];
        group_norm_f32(
            2, 2, 3, 2, &[1.0; 12], None, None, 1e-5, &mut out, None, None,
        );
        assert!(out.iter().all(|&v| v == 0.0));
    }

    #[test]
    #[should_panic(expected = "do not split")]
    fn group_norm_checks_groups() {
        group_norm_f32(
            1,
            6,
            1,
            4,
            &[0.0; 6],
            None,
            None,
            1e-5,
            &mut [0.0; 6],
            None,
            None,
        );
    }
}
