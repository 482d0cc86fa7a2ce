//! 2-D max, average and adaptive-average pooling over contiguous `[planes, h, w]` memory
//! (`planes = n·c`), with PyTorch's semantics: max pooling lets NaN win and reports flat `h·w`
//! indices, average pooling follows PyTorch's divisor rules for padding and for windows that hang
//! past the padded edge (`ceil_mode`).
//!
//! Max and average pooling are separable: a row pass reduces every input row over each output
//! column's window, then a column pass reduces those row results over each output row's window. The
//! row pass splits the padded row into `stride` phases so that every tap is a contiguous slice (as
//! the depthwise convolution does), which makes both passes branch-free elementwise loops that LLVM
//! vectorizes. For max pooling the split is exact, indices included: folding PyTorch's update
//! (`v > m || isnan(v)`, in window order) over a row and then merging the row results with the same
//! rule gives the same value and index as one scan over the window. Planes are independent rayon
//! tasks.

use crate::threads;
use torchburn_native_macros::isa_versions;

use crate::kernels::conv::{deinterleave2, numel, ConvScalar};

/// Shape of a 2-D pooling; `h_out`/`w_out` are the caller's (they encode `ceil_mode`).
#[derive(Clone, Copy, Debug)]
pub struct Pool2dShape {
    /// `n · c`
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub h_out: usize,
    pub w_out: usize,
}

/// Roughly the element visits worth one rayon task.
const TASK_MIN_WORK: usize = 1 << 14;

fn check(what: &str, s: &Pool2dShape, input_len: usize, out_len: usize) {
    assert!(
        s.kh > 0 && s.kw > 0,
        "{what}: kernel size must be positive, got {}x{}",
        s.kh,
        s.kw
    );
    assert!(
        s.stride[0] > 0 && s.stride[1] > 0,
        "{what}: stride must be positive, got {:?}",
        s.stride
    );
    assert!(
        s.dilation[0] > 0 && s.dilation[1] > 0,
        "{what}: dilation must be positive, got {:?}",
        s.dilation
    );
    let want_in = numel(what, &[s.planes, s.h, s.w]);
    let want_out = numel(what, &[s.planes, s.h_out, s.w_out]);
    assert!(
        input_len == want_in,
        "{what}: input has {input_len} elements, the shape needs {want_in}"
    );
    assert!(
        out_len == want_out,
        "{what}: out has {out_len} elements, the shape needs {want_out}"
    );
}

/// Planes per rayon task.
fn planes_per_task(s: &Pool2dShape) -> usize {
    TASK_MIN_WORK / (s.h * s.w + s.h_out * s.w_out * s.kh).max(1) + 1
}

/// The row pass's view of one padded input row: `stride` phases of `wq` elements, phase `p` holding
/// padded columns `p, p + stride, …`, so that tap `kj` of every output column is the contiguous
/// slice `phase[shift[kj]..][..w_out]`.
#[derive(Clone, Debug)]
struct RowPhases {
    w: usize,
    sw: usize,
    pw: usize,
    wq: usize,
    shifts: Vec<usize>,
}

impl RowPhases {
    fn new(w: usize, w_out: usize, k: usize, stride: usize, pad: usize, dil: usize) -> Self {
        let wq = w_out + (k - 1) * dil / stride;
        let shifts = (0..k)
            .map(|kj| (kj * dil % stride) * wq + kj * dil / stride)
            .collect();
        RowPhases {
            w,
            sw: stride,
            pw: pad,
            wq,
            shifts,
        }
    }

    fn buf_len(&self) -> usize {
        self.sw * self.wq
    }

    /// Lays `row` out in `buf` with `fill` in the padding (and wherever a phase runs past the row).
    #[inline(always)]
    fn load<T: ConvScalar>(&self, row: &[T], fill: T, buf: &mut [T]) {
        buf.fill(fill);
        let (sw, wq, pw) = (self.sw, self.wq, self.pw);
        if sw == 1 {
            let n = self.w.min(wq.saturating_sub(pw));
            buf[pw.min(wq)..][..n].copy_from_slice(&row[..n]);
        } else if sw == 2 {
            // input column ix is padded column ix + pw: even ix go to phase pw % 2 from q = pw / 2,
            // odd ix to the other phase from q = (pw + 1) / 2
            let (qa, qb) = (pw / 2, pw.div_ceil(2));
            let na = self.w.div_ceil(2).min(wq.saturating_sub(qa));
            let nb = (self.w / 2).min(wq.saturating_sub(qb));
            let (p0, p1) = buf.split_at_mut(wq);
            let (ra, rb) = if pw.is_multiple_of(2) {
                (p0, p1)
            } else {
                (p1, p0)
            };
            let n2 = na.min(nb);
            deinterleave2(&row[..2 * n2], &mut ra[qa..qa + n2], &mut rb[qb..qb + n2]);
            for j in n2..na {
                ra[qa + j] = row[2 * j];
            }
            for j in n2..nb {
                rb[qb + j] = row[2 * j + 1];
            }
        } else {
            for (ix, &v) in row.iter().enumerate() {
                let c = ix + pw;
                if c / sw < wq {
                    buf[(c % sw) * wq + c / sw] = v;
                }
            }
        }
    }
}

/// Max pooling, as PyTorch's `max_pool2d_with_indices`: each output is the maximum of its (dilated)
/// window clipped to the image; a NaN in the window wins (the last NaN, for the index); an
/// all-`-inf` window reports its first element. `indices`, when given, receives the flat
/// `ih·w + iw` offset of each maximum within its plane.
pub fn max_pool2d<T: ConvScalar>(
    s: &Pool2dShape,
    input: &[T],
    out: &mut [T],
    indices: Option<&mut [i64]>,
) {
    check("max_pool2d", s, input.len(), out.len());
    if out.is_empty() {
        return;
    }
    let (plane_in, plane_out) = (s.h * s.w, s.h_out * s.w_out);
    let per_task = planes_per_task(s);
    let rp = RowPhases::new(s.w, s.w_out, s.kw, s.stride[1], s.padding[1], s.dilation[1]);
    // PyTorch's initial index column: the window's first in-image column
    let first_col: Vec<Idx> = (0..s.w_out)
        .map(|ox| window_start(ox, s.stride[1], s.padding[1], s.dilation[1]) as Idx)
        .collect();
    let job = MaxJob {
        s: *s,
        rp: &rp,
        first_col: &first_col,
    };
    let chunk = plane_out * per_task;
    match indices {
        Some(idx) => {
            assert!(
                idx.len() == out.len(),
                "max_pool2d: indices has {} elements, out has {}",
                idx.len(),
                out.len()
            );
            // every index (even of a window past the input, which PyTorch's shapes never have) is
            // below this
            let reach = (s.h + s.h_out * s.stride[0] + s.kh * s.dilation[0]) as u128
                * (s.w + s.w_out * s.stride[1] + s.kw * s.dilation[1]) as u128;
            assert!(
                reach < Idx::MAX as u128,
                "max_pool2d: indices within a plane must fit in 32 bits"
            );
            let items: Vec<_> = out
                .chunks_mut(chunk)
                .zip(idx.chunks_mut(chunk))
                .enumerate()
                .collect();
            threads::par_each(items, |(t, (o, i))| {
                let x = &input[t * per_task * plane_in..][..o.len() / plane_out * plane_in];
                max_planes(&job, x, o, Some(i));
            });
        }
        None => {
            threads::par_chunks_mut(out, chunk, |t, o| {
                let x = &input[t * per_task * plane_in..][..o.len() / plane_out * plane_in];
                max_planes(&job, x, o, None);
            });
        }
    }
}

struct MaxJob<'a> {
    s: Pool2dShape,
    rp: &'a RowPhases,
    first_col: &'a [Idx],
}

/// PyTorch's max-pool window start along one axis, moved past the padding by whole dilations
/// (`while (ih0 < 0) ih0 += dilation`): the first tap inside the input, if any tap is.
#[inline(always)]
fn window_start(o: usize, stride: usize, pad: usize, dil: usize) -> usize {
    let start = (o * stride) as isize - pad as isize;
    let d = dil as isize;
    (if start < 0 {
        start + (-start + d - 1) / d * d
    } else {
        start
    }) as usize
}

#[inline(always)]
fn wins<T: ConvScalar>(v: T, m: T) -> bool {
    // non-short-circuit `|`: both sides are cheap, and a branch-free condition vectorizes
    (v > m) | v.is_nan()
}

#[isa_versions]
fn max_planes<T: ConvScalar>(job: &MaxJob, x: &[T], out: &mut [T], mut idx: Option<&mut [i64]>) {
    let s = &job.s;
    let rp = job.rp;
    let (plane_in, plane_out, w_out) = (s.h * s.w, s.h_out * s.w_out, s.w_out);
    let mut buf = vec![T::ZERO; rp.buf_len()];
    let mut hval = vec![T::ZERO; s.h * w_out];
    let mut hcol: Vec<Idx> = vec![0; if idx.is_some() { s.h * w_out } else { 0 }];
    let mut orow_idx: Vec<Idx> = vec![0; w_out];
    let mut row_shifts = Vec::with_capacity(s.kh);
    let mut row_bases = Vec::with_capacity(s.kh);
    let mut init = Vec::with_capacity(w_out);
    // tap kj of output column ox reads input column col0[kj] + col_pos[ox]
    let col0: Vec<Idx> = (0..s.kw)
        .map(|kj| (kj * s.dilation[1]) as Idx - s.padding[1] as Idx)
        .collect();
    let col_pos: Vec<Idx> = (0..w_out).map(|ox| (ox * s.stride[1]) as Idx).collect();
    let no_shifts = vec![0usize; s.kw];
    for (p, o) in out.chunks_exact_mut(plane_out).enumerate() {
        let x = &x[p * plane_in..][..plane_in];
        // row pass: max over each output column's window, and the winning column
        for (ih, hv) in hval.chunks_exact_mut(w_out).enumerate() {
            rp.load(&x[ih * s.w..][..s.w], T::NEG_INFINITY, &mut buf);
            if idx.is_some() {
                let hc = &mut hcol[ih * w_out..][..w_out];
                let at = IdxSource {
                    src: &col_pos,
                    shifts: &no_shifts,
                    add: &col0,
                };
                fold_max_idx((hv, hc), job.first_col, &buf, &rp.shifts, at);
            } else {
                fold_max(hv, &buf, &rp.shifts);
            }
        }
        // column pass: merge the row results of each output row's window, in window order.
        // PyTorch's rows run from the first in-image tap while below min(start + (kh-1)·dil + 1,
        // h).
        let mut irows = idx
            .as_deref_mut()
            .map(|i| i[p * plane_out..][..plane_out].chunks_exact_mut(w_out));
        for (oy, orow) in o.chunks_exact_mut(w_out).enumerate() {
            let ih0 = window_start(oy, s.stride[0], s.padding[0], s.dilation[0]);
            let ih1 = (oy * s.stride[0] + (s.kh - 1) * s.dilation[0] + 1)
                .saturating_sub(s.padding[0])
                .min(s.h);
            row_shifts.clear();
            row_shifts.extend(
                (ih0..ih1.max(ih0))
                    .step_by(s.dilation[0])
                    .map(|ih| ih * w_out),
            );
            match irows.as_mut().and_then(|it| it.next()) {
                Some(irow) => {
                    init.clear();
                    init.extend(job.first_col.iter().map(|&c| (ih0 * s.w) as Idx + c));
                    row_bases.clear();
                    row_bases.extend(row_shifts.iter().map(|&sh| (sh / w_out * s.w) as Idx));
                    let at = IdxSource {
                        src: &hcol,
                        shifts: &row_shifts,
                        add: &row_bases,
                    };
                    fold_max_idx((orow, &mut orow_idx), &init, &hval, &row_shifts, at);
                    for (i, &v) in irow.iter_mut().zip(&orow_idx) {
                        *i = i64::from(v);
                    }
                }
                None => fold_max(orow, &hval, &row_shifts),
            }
        }
    }
}

/// Index type while tracking maxima: `i32` has the width of `f32`, so value and index selects
/// vectorize together (with `i64` LLVM leaves the loop scalar); widened on store.
type Idx = i32;

/// Register block of the pooling folds.
const POOL_LANES: usize = 16;

/// Starts of the register blocks covering `0..n`: whole blocks, then one last block flush with the
/// end that overlaps its predecessor (the folds recompute from their sources, so overlap is
/// harmless). Rows narrower than a block take the scalar tail.
#[inline(always)]
fn block_starts(n: usize) -> impl Iterator<Item = usize> {
    let whole = n / POOL_LANES;
    let last = (n >= POOL_LANES && !n.is_multiple_of(POOL_LANES)).then_some(n - POOL_LANES);
    (0..whole).map(|b| b * POOL_LANES).chain(last)
}

/// `dst[i]` = PyTorch's running max (NaN wins) over `src[shifts[k] + i]` for `k` in order, from
/// `-inf`. Blocks of [`POOL_LANES`] keep the running values in registers, so the select compiles to
/// a blend rather than a masked store.
#[inline(always)]
fn fold_max<T: ConvScalar>(dst: &mut [T], src: &[T], shifts: &[usize]) {
    let n = dst.len();
    for i0 in block_starts(n) {
        let mut acc = [T::NEG_INFINITY; POOL_LANES];
        for &sh in shifts {
            let v: &[T; POOL_LANES] = src[sh + i0..][..POOL_LANES]
                .try_into()
                .expect("POOL_LANES elements");
            for (a, &v) in acc.iter_mut().zip(v) {
                *a = if wins(v, *a) { v } else { *a };
            }
        }
        dst[i0..i0 + POOL_LANES].copy_from_slice(&acc);
    }
    if n < POOL_LANES {
        for (i, d) in dst.iter_mut().enumerate() {
            let mut acc = T::NEG_INFINITY;
            for &sh in shifts {
                let v = src[sh + i];
                acc = if wins(v, acc) { v } else { acc };
            }
            *d = acc;
        }
    }
}

/// Where source `k` of [`fold_max_idx`] found its value at position `i`:
/// `add[k] + src[shifts[k] + i]`.
struct IdxSource<'a> {
    src: &'a [Idx],
    shifts: &'a [usize],
    add: &'a [Idx],
}

/// [`fold_max`] that also tracks where the maximum came from: `dst_idx[i]` starts at `init[i]` and
/// takes the [`IdxSource`] index of source `k` whenever that source wins.
#[inline(always)]
fn fold_max_idx<T: ConvScalar>(
    (dst, dst_idx): (&mut [T], &mut [Idx]),
    init: &[Idx],
    src: &[T],
    shifts: &[usize],
    idx: IdxSource,
) {
    let IdxSource {
        src: idx_src,
        shifts: idx_shifts,
        add: idx_add,
    } = idx;
    let n = dst.len();
    for i0 in block_starts(n) {
        let mut acc = [T::NEG_INFINITY; POOL_LANES];
        let mut at: [Idx; POOL_LANES] = init[i0..][..POOL_LANES]
            .try_into()
            .expect("POOL_LANES elements");
        for ((&sh, &ish), &add) in shifts.iter().zip(idx_shifts).zip(idx_add) {
            let v: &[T; POOL_LANES] = src[sh + i0..][..POOL_LANES]
                .try_into()
                .expect("POOL_LANES elements");
            let c: &[Idx; POOL_LANES] = idx_src[ish + i0..][..POOL_LANES]
                .try_into()
                .expect("POOL_LANES elements");
            for ((a, t), (&v, &c)) in acc.iter_mut().zip(at.iter_mut()).zip(v.iter().zip(c)) {
                // the index select as bit masks: SLP vectorizes that next to the value blend, not a
                // bool select
                let mask = -Idx::from(wins(v, *a));
                *a = if wins(v, *a) { v } else { *a };
                *t = (*t & !mask) | ((add + c) & mask);
            }
        }
        dst[i0..i0 + POOL_LANES].copy_from_slice(&acc);
        dst_idx[i0..i0 + POOL_LANES].copy_from_slice(&at);
    }
    if n < POOL_LANES {
        for i in 0..n {
            let (mut acc, mut at) = (T::NEG_INFINITY, init[i]);
            for ((&sh, &ish), &add) in shifts.iter().zip(idx_shifts).zip(idx_add) {
                let v = src[sh + i];
                if wins(v, acc) {
                    acc = v;
                    at = add + idx_src[ish + i];
                }
            }
            dst[i] = acc;
            dst_idx[i] = at;
        }
    }
}

/// `dst[i] = Σ_k src[shifts[k] + i]`, in order of `k`, blocked like [`fold_max`].
#[inline(always)]
fn fold_sum<T: ConvScalar>(dst: &mut [T], src: &[T], shifts: &[usize]) {
    let n = dst.len();
    for i0 in block_starts(n) {
        let mut acc = [T::ZERO; POOL_LANES];
        for &sh in shifts {
            let v: &[T; POOL_LANES] = src[sh + i0..][..POOL_LANES]
                .try_into()
                .expect("POOL_LANES elements");
            for (a, &v) in acc.iter_mut().zip(v) {
                *a += v;
            }
        }
        dst[i0..i0 + POOL_LANES].copy_from_slice(&acc);
    }
    if n < POOL_LANES {
        for (i, d) in dst.iter_mut().enumerate() {
            let mut acc = T::ZERO;
            for &sh in shifts {
                acc += src[sh + i];
            }
            *d = acc;
        }
    }
}

/// Average pooling, as PyTorch's `avg_pool2d` (dilation must be 1). A window is clipped to the
/// padded image (`pool_size`, the `count_include_pad` divisor) and then to the image itself (the
/// element count, the divisor otherwise); `divisor_override` replaces both. A window with no
/// element inside the image gives 0.
pub fn avg_pool2d<T: ConvScalar>(
    s: &Pool2dShape,
    count_include_pad: bool,
    divisor_override: Option<i64>,
    input: &[T],
    out: &mut [T],
) {
    check("avg_pool2d", s, input.len(), out.len());
    assert!(
        s.dilation == [1, 1],
        "avg_pool2d: dilation must be [1, 1], got {:?}",
        s.dilation
    );
    assert!(
        divisor_override != Some(0),
        "avg_pool2d: divisor_override must not be zero"
    );
    if out.is_empty() {
        return;
    }
    let (plane_in, plane_out) = (s.h * s.w, s.h_out * s.w_out);
    let per_task = planes_per_task(s);
    let rp = RowPhases::new(s.w, s.w_out, s.kw, s.stride[1], s.padding[1], 1);
    // per output column: window length clipped to the padded row, and the count of in-image columns
    let cols: Vec<(usize, usize)> = (0..s.w_out)
        .map(|ox| {
            let (a, b, padded) = avg_window(ox, s.stride[1], s.padding[1], s.kw, s.w);
            (padded, b - a)
        })
        .collect();
    let job = AvgJob {
        s: *s,
        rp: &rp,
        cols: &cols,
        include_pad: count_include_pad,
        divisor: divisor_override,
    };
    threads::par_chunks_mut(out, plane_out * per_task, |t, o| {
        let x = &input[t * per_task * plane_in..][..o.len() / plane_out * plane_in];
        avg_planes(&job, x, o);
    });
}

struct AvgJob<'a> {
    s: Pool2dShape,
    rp: &'a RowPhases,
    cols: &'a [(usize, usize)],
    include_pad: bool,
    divisor: Option<i64>,
}

/// PyTorch's average-pool window along one axis: `(start, end)` clipped to the image, and the
/// window length clipped only to the padded image.
#[inline(always)]
fn avg_window(o: usize, stride: usize, pad: usize, k: usize, len: usize) -> (usize, usize, usize) {
    let start = (o * stride) as isize - pad as isize;
    let end = (start + k as isize).min((len + pad) as isize);
    let padded = (end - start).max(0) as usize;
    let (start, end) = (
        start.clamp(0, len as isize) as usize,
        end.clamp(0, len as isize) as usize,
    );
    (start, end.max(start), padded)
}

#[isa_versions]
fn avg_planes<T: ConvScalar>(job: &AvgJob, x: &[T], out: &mut [T]) {
    let s = &job.s;
    let rp = job.rp;
    let (plane_in, plane_out, w_out) = (s.h * s.w, s.h_out * s.w_out, s.w_out);
    let mut buf = vec![T::ZERO; rp.buf_len()];
    let mut hsum = vec![T::ZERO; s.h * w_out];
    let mut row_shifts = Vec::with_capacity(s.kh);
    for (p, o) in out.chunks_exact_mut(plane_out).enumerate() {
        let x = &x[p * plane_in..][..plane_in];
        // row pass: sum over each output column's window (zeros in the padding)
        for (ih, hs) in hsum.chunks_exact_mut(w_out).enumerate() {
            rp.load(&x[ih * s.w..][..s.w], T::ZERO, &mut buf);
            fold_sum(hs, &buf, &rp.shifts);
        }
        // column pass: add the rows of each output row's window, then divide
        for (oy, orow) in o.chunks_exact_mut(w_out).enumerate() {
            let (ih0, ih1, pool_h) = avg_window(oy, s.stride[0], s.padding[0], s.kh, s.h);
            row_shifts.clear();
            row_shifts.extend((ih0..ih1).map(|ih| ih * w_out));
            fold_sum(orow, &hsum, &row_shifts);
            for (a, &(pool_w, count_w)) in orow.iter_mut().zip(job.cols) {
                let n = match job.divisor {
                    Some(n) => n,
                    None if job.include_pad => (pool_h * pool_w) as i64,
                    None => ((ih1 - ih0) * count_w) as i64,
                };
                // a window with no in-image element stays 0, as in PyTorch
                *a = if ih0 == ih1 || count_w == 0 {
                    T::ZERO
                } else {
                    *a / T::from_i64(n)
                };
            }
        }
    }
}

/// Adaptive average pooling, as PyTorch's `adaptive_avg_pool2d`: output `(oy, ox)` averages rows
/// `floor(oy·h/h_out) .. ceil((oy+1)·h/h_out)` and the same for columns. Input `[planes, h, w]`,
/// out `[planes, h_out, w_out]`.
pub fn adaptive_avg_pool2d<T: ConvScalar>(
    planes: usize,
    h: usize,
    w: usize,
    h_out: usize,
    w_out: usize,
    input: &[T],
    out: &mut [T],
) {
    const WHAT: &str = "adaptive_avg_pool2d";
    let want_in = numel(WHAT, &[planes, h, w]);
    let want_out = numel(WHAT, &[planes, h_out, w_out]);
    assert!(
        input.len() == want_in,
        "{WHAT}: input has {} elements, the shape needs {want_in}",
        input.len()
    );
    assert!(
        out.len() == want_out,
        "{WHAT}: out has {} elements, the shape needs {want_out}",
        out.len()
    );
    if out.is_empty() {
        return;
    }
    assert!(
        h > 0 && w > 0,
        "{WHAT}: input planes must not be empty, got {h}x{w}"
    );
    let (plane_in, plane_out) = (h * w, h_out * w_out);
    // each output reads about plane_in / plane_out elements: a plane costs about max(plane_in,
    // plane_out)
    let per_task = TASK_MIN_WORK / plane_in.max(plane_out) + 1;
    threads::par_chunks_mut(out, plane_out * per_task, |t, o| {
        let x = &input[t * per_task * plane_in..][..o.len() / plane_out * plane_in];
        if plane_out == 1 {
            // global pooling (ResNet, MobileNet heads): one contiguous sum per plane
            let (kh, kw) = (T::from_i64(h as i64), T::from_i64(w as i64));
            for (o, x) in o.iter_mut().zip(x.chunks_exact(plane_in)) {
                *o = sum_row(x) / kh / kw;
            }
        } else {
            for (o, x) in o.chunks_exact_mut(plane_out).zip(x.chunks_exact(plane_in)) {
                adaptive_plane(h, w, h_out, w_out, x, o);
            }
        }
    });
}

fn adaptive_plane<T: ConvScalar>(
    h: usize,
    w: usize,
    h_out: usize,
    w_out: usize,
    x: &[T],
    out: &mut [T],
) {
    for (oy, orow) in out.chunks_exact_mut(w_out).enumerate() {
        let (ih0, ih1) = (oy * h / h_out, ((oy + 1) * h).div_ceil(h_out));
        for (ox, o) in orow.iter_mut().enumerate() {
            let (iw0, iw1) = (ox * w / w_out, ((ox + 1) * w).div_ceil(w_out));
            let mut sum = T::ZERO;
            for ih in ih0..ih1 {
                sum += sum_row(&x[ih * w + iw0..ih * w + iw1]);
            }
            // PyTorch divides twice: sum / kh / kw
            *o = sum / T::from_i64((ih1 - ih0) as i64) / T::from_i64((iw1 - iw0) as i64);
        }
    }
}

/// Sum of a row in eight interleaved partial sums (vectorizable, and more accurate than one running
/// sum on the long rows of a global pool).
#[isa_versions]
fn sum_row<T: ConvScalar>(row: &[T]) -> T {
    if row.len() < 16 {
        return row.iter().fold(T::ZERO, |a, &v| a + v);
    }
    let mut lanes = [T::ZERO; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += v;
        }
    }
    let mut sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for &v in tail {
        sum += v;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv::tests::{assert_close, data};

    /// Straight from PyTorch's CPU max-pool loop.
    fn naive_max(s: &Pool2dShape, x: &[f64]) -> (Vec<f64>, Vec<i64>) {
        let mut out = vec![0.0; s.planes * s.h_out * s.w_out];
        let mut idx = vec![0i64; out.len()];
        for p in 0..s.planes {
            for oy in 0..s.h_out {
                for ox in 0..s.w_out {
                    let mut ih0 = (oy * s.stride[0]) as i64 - s.padding[0] as i64;
                    let mut iw0 = (ox * s.stride[1]) as i64 - s.padding[1] as i64;
                    let ih1 = (ih0 + ((s.kh - 1) * s.dilation[0]) as i64 + 1).min(s.h as i64);
                    let iw1 = (iw0 + ((s.kw - 1) * s.dilation[1]) as i64 + 1).min(s.w as i64);
                    while ih0 < 0 {
                        ih0 += s.dilation[0] as i64;
                    }
                    while iw0 < 0 {
                        iw0 += s.dilation[1] as i64;
                    }
                    let mut mi = ih0 * s.w as i64 + iw0;
                    let mut mv = f64::NEG_INFINITY;
                    let mut ih = ih0;
                    while ih < ih1 {
                        let mut iw = iw0;
                        while iw < iw1 {
                            let at = ih * s.w as i64 + iw;
                            let v = x[p * s.h * s.w + at as usize];
                            if v > mv || v.is_nan() {
                                mv = v;
                                mi = at;
                            }
                            iw += s.dilation[1] as i64;
                        }
                        ih += s.dilation[0] as i64;
                    }
                    out[(p * s.h_out + oy) * s.w_out + ox] = mv;
                    idx[(p * s.h_out + oy) * s.w_out + ox] = mi;
                }
            }
        }
        (out, idx)
    }

    /// Straight from PyTorch's CPU avg-pool loop.
    fn naive_avg(s: &Pool2dShape, include_pad: bool, divisor: Option<i64>, x: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; s.planes * s.h_out * s.w_out];
        for p in 0..s.planes {
            for oy in 0..s.h_out {
                for ox in 0..s.w_out {
                    let mut ih0 = (oy * s.stride[0]) as i64 - s.padding[0] as i64;
                    let mut iw0 = (ox * s.stride[1]) as i64 - s.padding[1] as i64;
                    let mut ih1 = (ih0 + s.kh as i64).min((s.h + s.padding[0]) as i64);
                    let mut iw1 = (iw0 + s.kw as i64).min((s.w + s.padding[1]) as i64);
                    let pool_size = (ih1 - ih0) * (iw1 - iw0);
                    ih0 = ih0.max(0);
                    iw0 = iw0.max(0);
                    ih1 = ih1.min(s.h as i64);
                    iw1 = iw1.min(s.w as i64);
                    if ih0 >= ih1 || iw0 >= iw1 {
                        continue;
                    }
                    let d = divisor.unwrap_or(if include_pad {
                        pool_size
                    } else {
                        (ih1 - ih0) * (iw1 - iw0)
                    });
                    let mut sum = 0.0;
                    for ih in ih0..ih1 {
                        for iw in iw0..iw1 {
                            sum += x[p * s.h * s.w + (ih * s.w as i64 + iw) as usize];
                        }
                    }
                    out[(p * s.h_out + oy) * s.w_out + ox] = sum / d as f64;
                }
            }
        }
        out
    }

    /// (planes, h, w, kh, kw, stride, padding, dilation, ceil_mode)
    type Case = (
        usize,
        usize,
        usize,
        usize,
        usize,
        [usize; 2],
        [usize; 2],
        [usize; 2],
        bool,
    );

    /// PyTorch's `pooling_output_shape`, including the rule that the last window must start inside
    /// the image or its left padding.
    fn out_size(len: usize, k: usize, pad: usize, stride: usize, dil: usize, ceil: bool) -> usize {
        let num = (len + 2 * pad) as i64 - (dil * (k - 1)) as i64 - 1
            + if ceil { stride as i64 - 1 } else { 0 };
        let mut o = num.div_euclid(stride as i64) + 1;
        if ceil && (o - 1) * stride as i64 >= (len + pad) as i64 {
            o -= 1;
        }
        o as usize
    }

    fn shape(c: Case) -> Pool2dShape {
        let (planes, h, w, kh, kw, stride, padding, dilation, ceil) = c;
        Pool2dShape {
            planes,
            h,
            w,
            kh,
            kw,
            stride,
            padding,
            dilation,
            h_out: out_size(h, kh, padding[0], stride[0], dilation[0], ceil),
            w_out: out_size(w, kw, padding[1], stride[1], dilation[1], ceil),
        }
    }

    const CASES: &[Case] = &[
        (3, 12, 12, 3, 3, [2, 2], [1, 1], [1, 1], false),
        (2, 13, 11, 3, 3, [2, 2], [1, 1], [1, 1], true),
        (4, 9, 10, 2, 2, [2, 2], [0, 0], [1, 1], false),
        (2, 9, 10, 2, 2, [2, 2], [0, 0], [1, 1], true),
        (2, 17, 19, 3, 2, [1, 2], [1, 1], [1, 1], true),
        (1, 20, 21, 5, 5, [3, 3], [2, 2], [1, 1], true),
        (2, 7, 8, 3, 3, [1, 1], [1, 1], [1, 1], false),
        (1, 1, 31, 1, 4, [1, 3], [0, 2], [1, 1], true), // 1-d
        (1, 5, 5, 5, 5, [1, 1], [2, 2], [1, 1], false),
        (1, 3, 3, 2, 2, [2, 2], [1, 1], [1, 1], true),
        (0, 5, 5, 3, 3, [2, 2], [1, 1], [1, 1], false),
        (200, 8, 8, 3, 3, [2, 2], [1, 1], [1, 1], false), // enough planes for several tasks
        (2, 9, 40, 3, 3, [2, 1], [1, 1], [1, 1], true),   // rows wider than the register block
        (1, 8, 71, 3, 3, [2, 2], [1, 1], [1, 1], true),
        (1, 6, 53, 4, 5, [1, 3], [2, 2], [1, 1], true),
    ];

    const DILATED: &[Case] = &[
        (2, 15, 14, 3, 3, [1, 1], [1, 1], [2, 2], false),
        (2, 16, 17, 3, 2, [2, 1], [1, 1], [2, 3], true),
        (1, 9, 9, 2, 2, [3, 3], [1, 1], [3, 3], true),
        (1, 7, 50, 3, 3, [1, 1], [1, 1], [2, 2], false),
        (2, 6, 61, 2, 3, [1, 2], [1, 1], [1, 3], true),
    ];

    #[test]
    fn max_pool2d_matches_pytorch_loop() {
        for &c in CASES.iter().chain(DILATED) {
            let s = shape(c);
            let mut x = data(s.planes * s.h * s.w, 11);
            // ties, NaN and -inf exercise PyTorch's first-max / last-NaN rules
            for (i, v) in x.iter_mut().enumerate() {
                match i % 23 {
                    3 | 4 => *v = 0.5,
                    7 if i % 3 == 0 => *v = f64::NAN,
                    9 => *v = f64::NEG_INFINITY,
                    _ => {}
                }
            }
            let (want, want_idx) = naive_max(&s, &x);
            let mut got = vec![0.0; want.len()];
            let mut idx = vec![-1i64; want.len()];
            max_pool2d(&s, &x, &mut got, Some(&mut idx));
            let ctx = format!("{s:?}");
            let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
            for i in 0..want.len() {
                assert!(
                    same(got[i], want[i]),
                    "{ctx}: value {i}: got {} want {}",
                    got[i],
                    want[i]
                );
            }
            assert_eq!(idx, want_idx, "{ctx}: indices");
            let mut got2 = vec![0.0; want.len()];
            max_pool2d(&s, &x, &mut got2, None);
            assert!(
                got2.iter().zip(&want).all(|(&a, &b)| same(a, b)),
                "{ctx}: without indices"
            );
            let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let mut got32 = vec![0.0f32; want.len()];
            let mut idx32 = vec![0i64; want.len()];
            max_pool2d(&s, &x32, &mut got32, Some(&mut idx32));
            assert_eq!(idx32, want_idx, "{ctx}: f32 indices");
            assert!(
                got32
                    .iter()
                    .zip(&want)
                    .all(|(&a, &b)| same(a as f64, (b as f32) as f64)),
                "{ctx}: f32"
            );
        }
    }

    #[test]
    fn max_pool2d_all_neg_inf_reports_first_element() {
        let s = shape((1, 4, 4, 2, 2, [2, 2], [1, 1], [1, 1], false));
        let x = vec![f32::NEG_INFINITY; 16];
        let mut out = vec![0.0; 9];
        let mut idx = vec![0; 9];
        max_pool2d(&s, &x, &mut out, Some(&mut idx));
        assert!(out.iter().all(|v| *v == f32::NEG_INFINITY));
        assert_eq!(idx, vec![0, 1, 3, 4, 5, 7, 12, 13, 15]);
    }

    #[test]
    fn avg_pool2d_matches_pytorch_loop() {
        for &c in CASES {
            let s = shape(c);
            let x = data(s.planes * s.h * s.w, 12);
            for include_pad in [true, false] {
                for divisor in [None, Some(3)] {
                    let want = naive_avg(&s, include_pad, divisor, &x);
                    let ctx = format!("{s:?} include_pad={include_pad} divisor={divisor:?}");
                    let mut got = vec![f64::NAN; want.len()];
                    avg_pool2d(&s, include_pad, divisor, &x, &mut got);
                    assert_close(&got, &want, 1e-14, &ctx);
                    let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                    let mut got32 = vec![f32::NAN; want.len()];
                    avg_pool2d(&s, include_pad, divisor, &x32, &mut got32);
                    let got32: Vec<f64> = got32.iter().map(|&v| v as f64).collect();
                    assert_close(&got32, &want, 1e-6, &format!("f32 {ctx}"));
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "dilation")]
    fn avg_pool2d_rejects_dilation() {
        let s = shape(DILATED[0]);
        let mut out = vec![0.0f32; s.planes * s.h_out * s.w_out];
        avg_pool2d(&s, true, None, &vec![0.0; s.planes * s.h * s.w], &mut out);
    }

    fn naive_adaptive(
        planes: usize,
        h: usize,
        w: usize,
        h_out: usize,
        w_out: usize,
        x: &[f64],
    ) -> Vec<f64> {
        let mut out = vec![0.0; planes * h_out * w_out];
        for p in 0..planes {
            for oy in 0..h_out {
                let (ih0, ih1) = ((oy * h) / h_out, ((oy + 1) * h).div_ceil(h_out));
                for ox in 0..w_out {
                    let (iw0, iw1) = ((ox * w) / w_out, ((ox + 1) * w).div_ceil(w_out));
                    let mut sum = 0.0;
                    for ih in ih0..ih1 {
                        for iw in iw0..iw1 {
                            sum += x[(p * h + ih) * w + iw];
                        }
                    }
                    out[(p * h_out + oy) * w_out + ox] = sum / ((ih1 - ih0) * (iw1 - iw0)) as f64;
                }
            }
        }
        out
    }

    #[test]
    fn adaptive_avg_pool2d_matches_naive() {
        for &(planes, h, w, h_out, w_out) in &[
            (3, 7, 7, 1, 1),
            (2, 56, 57, 1, 1),
            (2, 10, 9, 3, 4),
            (2, 5, 7, 7, 9), // upsampling: windows overlap
            (1, 1, 30, 1, 7),
            (1, 13, 13, 13, 13),
            (0, 4, 4, 2, 2),
            (300, 6, 6, 1, 1),
        ] {
            let x = data(planes * h * w, 13);
            let want = naive_adaptive(planes, h, w, h_out, w_out, &x);
            let ctx = format!("{planes}x{h}x{w} -> {h_out}x{w_out}");
            let mut got = vec![f64::NAN; want.len()];
            adaptive_avg_pool2d(planes, h, w, h_out, w_out, &x, &mut got);
            assert_close(&got, &want, 1e-13, &ctx);
            let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let mut got32 = vec![f32::NAN; want.len()];
            adaptive_avg_pool2d(planes, h, w, h_out, w_out, &x32, &mut got32);
            let got32: Vec<f64> = got32.iter().map(|&v| v as f64).collect();
            assert_close(&got32, &want, 1e-6, &format!("f32 {ctx}"));
        }
    }
}
