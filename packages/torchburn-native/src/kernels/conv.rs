//! 2-D convolution and transposed convolution over contiguous NCHW memory (conv1d is the `h = 1`
//! case).
//!
//! Three strategies, picked per call from the shape:
//! * **pointwise** (1×1, stride 1, no padding): the input planes already are the `[c_in/g, h·w]`
//!   matrix, so GEMMs write the output in place, with no unfolding;
//! * **direct depthwise** (one input channel per group: MobileNet's depthwise layers, `c_in == 1`
//!   stems): a GEMM with `k = kh·kw` would spend its time packing, so a direct kernel runs over
//!   output planes in parallel. It splits the zero-padded plane into stride phases so that every
//!   tap, for any stride, dilation and padding, is a contiguous shifted slice, and accumulates 32
//!   outputs per step in registers (see `PhaseLayout`);
//! * **im2col + GEMM** for everything else: the receptive fields of a tile of output positions are
//!   unfolded into a `[c_in/g·kh·kw, cols]` scratch matrix and the weight `[c_out/g, c_in/g·kh·kw]`
//!   multiplies it from the left, so the product lands directly in NCHW rows (bias pre-filled, GEMM
//!   accumulating). Tiles are bounded by [`SCRATCH_BYTES`]; the scratch is kept per thread between
//!   calls, so large layers neither allocate nor re-fault pages.
//!
//! Transposed convolution is the adjoint: `weightᵀ · input` into a column buffer, then a col2im
//! scatter-add.
//!
//! Threads: the GEMM paths run (image, group, column tile) items in parallel with single-threaded
//! GEMMs (see `conv_gemm`); the direct kernels run planes in parallel. Everything is called from
//! the current thread and uses rayon's current pool.

use crate::threads;
use std::cell::RefCell;
use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, Sub};

use torchburn_native_macros::isa_versions;

use crate::kernels::gemm::{gemm, GemmScalar, Mat, MatMut};

/// Upper bound on a column (im2col / col2im) tile, in bytes. Measured on Zen 3 (ResNet 3×3 and 7×7
/// layers): 1–2 MiB tiles run the GEMM ~10% faster than 8 MiB ones (the unfolded tile stays in
/// cache between im2col and the GEMM's packing), while 128 KiB tiles make the GEMMs too narrow.
pub const SCRATCH_BYTES: usize = 2 << 20;

/// Transposed convolution: below this many multiply-adds per (image, group) GEMM, images and groups
/// run in parallel instead of splitting each GEMM across threads.
const OUTER_PARALLEL_MAX_FLOPS: usize = 1 << 22;

/// Below this many multiply-adds a convolution runs on the calling thread.
const PARALLEL_MIN_FLOPS: usize = 1 << 20;

/// Output planes smaller than this fold the batch's images into one GEMM's columns: one product
/// per image would have only a few columns and stream the whole weight for each (ResNet's last
/// stage on small inputs, and the weight gradients core writes as convolutions, whose outputs are
/// kernel-sized).
const FOLD_PLANE_MAX: usize = 16;

/// Narrowest column tile worth its own GEMM when splitting work across threads.
const MIN_TILE_COLS: usize = 32;

/// Roughly the multiply-adds worth one rayon task in the direct kernels.
const TASK_MIN_WORK: usize = 1 << 14;

/// Element types the convolution and pooling kernels run on (`f32`, `f64`).
pub trait ConvScalar:
    GemmScalar
    + PartialOrd
    + Debug
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + AddAssign
{
    const NEG_INFINITY: Self;
    /// Exact for the small integers it is used for (window sizes, divisors).
    fn from_i64(v: i64) -> Self;
    fn is_nan(self) -> bool;
    /// Runs `f` on a scratch slice of `len` elements (contents unspecified) that is kept per thread
    /// and reused across calls. Re-entrant: a nested call on the same thread (e.g. a rayon task
    /// stolen while waiting) gets a fresh allocation instead of panicking.
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R;

    /// The same with a second per-thread buffer, for a scratch that a caller holds while it runs
    /// tasks on its own thread that need [`ConvScalar::with_scratch`] (the shifted convolution's
    /// padded input, shared by its tasks).
    fn with_shared_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R;
}

macro_rules! impl_conv_scalar {
    ($t:ty, $tls:ident, $shared:ident) => {
        thread_local! {
            static $tls: RefCell<Vec<$t>> = const { RefCell::new(Vec::new()) };
            static $shared: RefCell<Vec<$t>> = const { RefCell::new(Vec::new()) };
        }

        impl ConvScalar for $t {
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;

            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                v as $t
            }

            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }

            fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
                scratch_in(&$tls, len, f)
            }

            fn with_shared_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
                scratch_in(&$shared, len, f)
            }
        }
    };
}

/// `f` on the first `len` elements of the thread-local buffer `tls`, grown as needed; a fresh
/// allocation when the buffer is already borrowed further up this thread's stack.
fn scratch_in<T: Copy + Default + 'static, R>(
    tls: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    tls.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < len {
                // grow without copying the stale contents
                buf.clear();
                buf.resize(len, T::default());
            }
            f(&mut buf[..len])
        }
        Err(_) => f(&mut vec![T::default(); len]),
    })
}

impl_conv_scalar!(f32, SCRATCH_F32, SHARED_F32);
impl_conv_scalar!(f64, SCRATCH_F64, SHARED_F64);

/// Shape of a 2-D convolution. `h_out`/`w_out` must equal
/// `(h + 2·pad - dil·(k-1) - 1) / stride + 1`.
#[derive(Clone, Copy, Debug)]
pub struct Conv2dShape {
    pub n: usize,
    pub c_in: usize,
    pub h: usize,
    pub w: usize,
    pub c_out: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub h_out: usize,
    pub w_out: usize,
}

/// Shape of a 2-D transposed convolution. `h_out`/`w_out` must equal
/// `(h - 1)·stride - 2·pad + dil·(k-1) + output_padding + 1`.
#[derive(Clone, Copy, Debug)]
pub struct ConvTranspose2dShape {
    pub n: usize,
    pub c_in: usize,
    pub h: usize,
    pub w: usize,
    pub c_out: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub output_padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub h_out: usize,
    pub w_out: usize,
}

/// Spatial geometry of a forward convolution: `h`/`w` is its input plane (the padded side the
/// windows stride over), `w_out` its output width. Transposed convolution uses the geometry of its
/// forward adjoint, so there `h`/`w` is the plane it writes and `w_out` the width of the plane it
/// reads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geom {
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) sh: usize,
    pub(crate) sw: usize,
    pub(crate) ph: usize,
    pub(crate) pw: usize,
    pub(crate) dh: usize,
    pub(crate) dw: usize,
    pub(crate) w_out: usize,
}

/// Tuning knobs; tests shrink them to reach every tiling and scheduling path on small shapes.
#[derive(Clone, Copy, Debug)]
struct Plan {
    scratch_bytes: usize,
    /// `Some(true)`: work items (convolution: image, group, column tile; transposed: image, group)
    /// in parallel with single-threaded GEMMs; `Some(false)`: items in order, GEMMs split across
    /// threads; `None`: decide.
    outer: Option<bool>,
}

const DEFAULT_PLAN: Plan = Plan {
    scratch_bytes: SCRATCH_BYTES,
    outer: None,
};

/// Output indices `o ∈ [0, n_out)` whose input coordinate `o·stride + off` lies in `[0, n_in)`, as
/// `lo..hi` (`lo == hi` when there are none). The coordinate is increasing in `o`, so the set is
/// one interval.
#[inline]
pub(crate) fn valid_range(off: isize, stride: usize, n_in: usize, n_out: usize) -> (usize, usize) {
    let s = stride as isize;
    let lo = if off >= 0 { 0 } else { (-off + s - 1) / s };
    let lim = n_in as isize - off; // need o·s < lim
    let hi = if lim <= 0 { 0 } else { (lim + s - 1) / s };
    let hi = (hi as usize).min(n_out);
    ((lo as usize).min(hi), hi)
}

/// Product of dimensions, panicking (instead of wrapping) on overflow.
pub(crate) fn numel(what: &str, dims: &[usize]) -> usize {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .unwrap_or_else(|| panic!("{what}: size overflows usize"))
}

fn check_common(
    what: &str,
    kh: usize,
    kw: usize,
    stride: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) {
    assert!(
        kh > 0 && kw > 0,
        "{what}: kernel size must be positive, got {kh}x{kw}"
    );
    assert!(
        stride[0] > 0 && stride[1] > 0,
        "{what}: stride must be positive, got {stride:?}"
    );
    assert!(
        dilation[0] > 0 && dilation[1] > 0,
        "{what}: dilation must be positive, got {dilation:?}"
    );
    assert!(groups > 0, "{what}: groups must be positive");
}

fn check_len<T>(what: &str, name: &str, slice: &[T], want: usize) {
    assert!(
        slice.len() == want,
        "{what}: {name} has {} elements, the shape needs {want}",
        slice.len()
    );
}

fn conv_out_size(input: usize, pad: usize, dil: usize, k: usize, stride: usize) -> Option<usize> {
    let span = dil * (k - 1) + 1;
    (input + 2 * pad).checked_sub(span).map(|v| v / stride + 1)
}

/// What a convolution does to its output as it writes it, each step optional, in this order:
/// batch norm in eval mode (`y·scale[c] + shift[c]`), a residual of the output's shape added, relu.
/// Applied to each tile right after its product, while the tile is in cache, instead of by a pass of
/// its own over memory.
#[derive(Clone, Copy, Debug)]
pub struct Epilogue<'a, T> {
    pub scale_shift: Option<(&'a [T], &'a [T])>,
    pub residual: Option<&'a [T]>,
    pub relu: bool,
}

impl<'a, T: ConvScalar> Epilogue<'a, T> {
    pub const NONE: Self = Epilogue {
        scale_shift: None,
        residual: None,
        relu: false,
    };

    pub fn is_none(&self) -> bool {
        self.scale_shift.is_none() && self.residual.is_none() && !self.relu
    }

    /// Applies the steps to `dst`: elements of channel `c` starting at flat offset `at` of the output,
    /// in one pass (every element stored unconditionally, so the loop vectorizes; a relu written as
    /// a conditional store ran branchy and cost some 3 ns per element).
    #[inline]
    pub fn apply(&self, c: usize, at: usize, dst: &mut [T]) {
        let (a, b) = self
            .scale_shift
            .map_or((T::ONE, T::ZERO), |(scale, shift)| (scale[c], shift[c]));
        let norm = self.scale_shift.is_some();
        let relu = |v: T| if v < T::ZERO { T::ZERO } else { v };
        match (norm, self.residual, self.relu) {
            (_, Some(r), relu_too) => {
                let r = &r[at..at + dst.len()];
                for (d, &r) in dst.iter_mut().zip(r) {
                    let v = if norm { *d * a + b } else { *d } + r;
                    *d = if relu_too { relu(v) } else { v };
                }
            }
            (true, None, true) => dst.iter_mut().for_each(|d| *d = relu(*d * a + b)),
            (true, None, false) => dst.iter_mut().for_each(|d| *d = *d * a + b),
            (false, None, true) => dst.iter_mut().for_each(|d| *d = relu(*d)),
            (false, None, false) => {}
        }
    }

    /// Applies the steps to a whole NCHW output of `channels` planes of `plane` elements.
    pub fn apply_all(&self, out: &mut [T], plane: usize, channels: usize) {
        if self.is_none() || plane == 0 {
            return;
        }
        for (i, row) in out.chunks_mut(plane).enumerate() {
            self.apply(i % channels, i * plane, row);
        }
    }

    /// Panics unless the operands fit an output of `channels` channels and `len` elements.
    pub fn check(&self, channels: usize, len: usize) {
        if let Some((scale, shift)) = self.scale_shift {
            assert!(
                scale.len() == channels && shift.len() == channels,
                "conv epilogue: scale and shift need {channels} elements, got {} and {}",
                scale.len(),
                shift.len()
            );
        }
        if let Some(r) = self.residual {
            assert_eq!(r.len(), len, "conv epilogue: residual needs {len} elements");
        }
    }
}

/// Fills every `plane`-sized row of `out` with its channel's bias (the GEMMs then accumulate onto
/// it), or zero.
fn prefill_bias<T: ConvScalar>(out: &mut [T], plane: usize, channels: usize, bias: Option<&[T]>) {
    if plane == 0 {
        return;
    }
    for (i, row) in out.chunks_mut(plane).enumerate() {
        row.fill(bias.map_or(T::ZERO, |b| b[i % channels]));
    }
}

fn decide_outer(plan: Plan, tasks: usize, flops_per_task: usize) -> bool {
    plan.outer.unwrap_or_else(|| {
        let threads = threads::current();
        threads > 1
            && tasks >= 2
            && (tasks >= 4 * threads || flops_per_task < OUTER_PARALLEL_MAX_FLOPS)
    })
}

/// Columns per tile so that a `rows × cols` scratch fits in `bytes`; tiles are balanced so the last
/// one is not a sliver.
fn tile_cols<T>(rows: usize, total: usize, bytes: usize) -> usize {
    let max_cols = (bytes / std::mem::size_of::<T>() / rows.max(1)).max(1);
    let tiles = total.div_ceil(max_cols).max(1);
    total.div_ceil(tiles).max(1)
}

/// 2-D convolution (cross-correlation, as PyTorch): input NCHW `[n, c_in, h, w]`, weight
/// `[c_out, c_in/groups, kh, kw]`, bias `[c_out]`, out NCHW `[n, c_out, h_out, w_out]`; every slice
/// contiguous and exactly as long as its shape.
pub fn conv2d<T: ConvScalar>(
    s: &Conv2dShape,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) {
    conv2d_planned(s, input, weight, bias, out, &Epilogue::NONE, DEFAULT_PLAN)
}

/// [`conv2d`] followed by `epi` on every output tile as it is written.
pub fn conv2d_with<T: ConvScalar>(
    s: &Conv2dShape,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epi: &Epilogue<'_, T>,
) {
    conv2d_planned(s, input, weight, bias, out, epi, DEFAULT_PLAN)
}

fn conv2d_planned<T: ConvScalar>(
    s: &Conv2dShape,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epi: &Epilogue<'_, T>,
    plan: Plan,
) {
    const WHAT: &str = "conv2d";
    check_common(WHAT, s.kh, s.kw, s.stride, s.dilation, s.groups);
    assert!(
        s.c_in.is_multiple_of(s.groups) && s.c_out.is_multiple_of(s.groups),
        "conv2d: groups={} must divide c_in={} and c_out={}",
        s.groups,
        s.c_in,
        s.c_out
    );
    let want_h = conv_out_size(s.h, s.padding[0], s.dilation[0], s.kh, s.stride[0]);
    let want_w = conv_out_size(s.w, s.padding[1], s.dilation[1], s.kw, s.stride[1]);
    assert!(
        want_h == Some(s.h_out) && want_w == Some(s.w_out),
        "conv2d: output {}x{} does not match input {}x{}, kernel {}x{}, stride {:?}, \
         padding {:?}, dilation {:?} (expected {want_h:?}x{want_w:?})",
        s.h_out,
        s.w_out,
        s.h,
        s.w,
        s.kh,
        s.kw,
        s.stride,
        s.padding,
        s.dilation
    );
    let cin_g = s.c_in / s.groups;
    check_len(WHAT, "input", input, numel(WHAT, &[s.n, s.c_in, s.h, s.w]));
    check_len(
        WHAT,
        "weight",
        weight,
        numel(WHAT, &[s.c_out, cin_g, s.kh, s.kw]),
    );
    if let Some(b) = bias {
        check_len(WHAT, "bias", b, s.c_out);
    }
    check_len(
        WHAT,
        "out",
        out,
        numel(WHAT, &[s.n, s.c_out, s.h_out, s.w_out]),
    );
    epi.check(s.c_out, out.len());
    if out.is_empty() {
        return;
    }
    let g = Geom {
        h: s.h,
        w: s.w,
        kh: s.kh,
        kw: s.kw,
        sh: s.stride[0],
        sw: s.stride[1],
        ph: s.padding[0],
        pw: s.padding[1],
        dh: s.dilation[0],
        dw: s.dilation[1],
        w_out: s.w_out,
    };
    if cin_g == 1 {
        depthwise(s, &g, input, weight, bias, out);
        epi.apply_all(out, s.h_out * s.w_out, s.c_out);
    } else {
        conv_gemm(s, &g, input, weight, bias, out, epi, plan);
    }
}

/// Pointwise and im2col + GEMM convolution: one GEMM per work item (image, group, column tile).
///
/// With several threads the items run in parallel, each unfolding its own tile and running a
/// single-threaded GEMM: for the short, wide GEMMs of convolutions (`c_out/g` rows) that scales
/// much better than splitting each GEMM (the `gemm` crate speeds a 64×3136×576 product up only 1.4×
/// on two threads), and the im2col runs in parallel for free. Items are cut so that there are at
/// least as many as threads; outputs too narrow to split that way (late ResNet layers: 7×7 planes,
/// 512 channels) run their items in order with the GEMMs split across threads instead.
#[allow(clippy::too_many_arguments)]
fn conv_gemm<T: ConvScalar>(
    s: &Conv2dShape,
    g: &Geom,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epi: &Epilogue<'_, T>,
    plan: Plan,
) {
    let (cin_g, cout_g) = (s.c_in / s.groups, s.c_out / s.groups);
    let k = cin_g * s.kh * s.kw;
    let (plane_in, plane_out) = (s.h * s.w, s.h_out * s.w_out);
    let pointwise = s.kh == 1 && s.kw == 1 && s.stride == [1, 1] && s.padding == [0, 0];
    // each output element comes from one product: without a bias it simply writes it, with no
    // pass of zeros before
    let accumulate = bias.is_some();
    if accumulate {
        prefill_bias(out, plane_out, s.c_out, bias);
    }
    let block = cout_g * plane_out;
    if block == 0 {
        return;
    }
    if s.n > 1 && plane_out < FOLD_PLANE_MAX && plan.outer.is_none() {
        conv_gemm_folded(s, g, input, weight, bias, out, plan.scratch_bytes);
        epi.apply_all(out, plane_out, s.c_out);
        return;
    }
    let tasks = s.n * s.groups;
    let threads = threads::current();
    let mut tiles = if pointwise {
        1
    } else {
        plane_out.div_ceil(tile_cols::<T>(k, plane_out, plan.scratch_bytes))
    };
    let split = plan.outer.unwrap_or_else(|| {
        let flops = tasks.saturating_mul(block).saturating_mul(k);
        threads > 1
            && flops >= PARALLEL_MIN_FLOPS
            && (tasks >= threads || plane_out >= threads * MIN_TILE_COLS)
    });
    if split && tasks * tiles < 4 * threads {
        // few items: cut tiles so that the item count is a multiple of the thread count
        let wanted = (tasks * tiles).div_ceil(threads) * threads;
        tiles = tiles.max(wanted.div_ceil(tasks).min(plane_out / MIN_TILE_COLS));
    }
    let cols = plane_out.div_ceil(tiles);
    let tiles = plane_out.div_ceil(cols);
    let out_ptr = SyncPtr(out.as_mut_ptr());
    // the epilogue over an item's tile: channels of its group, columns n0..n1 of each plane
    let finish = |task: usize, grp: usize, n0: usize, n1: usize| {
        if epi.is_none() {
            return;
        }
        for oc in 0..cout_g {
            let at = task * block + oc * plane_out + n0;
            // SAFETY: the item's own tile, as for its product
            let row = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(at), n1 - n0) };
            epi.apply(grp * cout_g + oc, at, row);
        }
    };
    let item = |i: usize, parallel: bool| {
        let (task, tile) = (i / tiles, i % tiles);
        let (b, grp) = (task / s.groups, task % s.groups);
        let (n0, n1) = (tile * cols, ((tile + 1) * cols).min(plane_out));
        let x = &input[(b * s.c_in + grp * cin_g) * plane_in..][..cin_g * plane_in];
        let wg = &weight[grp * cout_g * k..][..cout_g * k];
        let a = Mat {
            ptr: wg.as_ptr(),
            rs: k as isize,
            cs: 1,
        };
        // SAFETY: item `i` owns columns n0..n1 of the cout_g×plane_out output block of `task`; no
        // other item touches them, and `out` outlives every item.
        let c = MatMut {
            ptr: unsafe { out_ptr.get().add(task * block + n0) },
            rs: plane_out as isize,
            cs: 1,
        };
        if pointwise {
            // SAFETY: `wg` is cout_g×k and `x` is k×plane_in with plane_in == plane_out, so columns
            // n0..n1 are in bounds; `c` is this item's own output tile.
            unsafe {
                let b = Mat {
                    ptr: x.as_ptr().add(n0),
                    rs: plane_in as isize,
                    cs: 1,
                };
                gemm(cout_g, n1 - n0, k, a, b, c, accumulate, T::ONE, parallel)
            };
            finish(task, grp, n0, n1);
            return;
        }
        T::with_scratch(k * (n1 - n0), |col| {
            im2col(g, x, n0, n1, col, parallel);
            // SAFETY: `wg` is cout_g×k, `col` is k×(n1-n0) row-major; `c` is this item's own output
            // tile.
            unsafe {
                let b = Mat {
                    ptr: col.as_ptr(),
                    rs: (n1 - n0) as isize,
                    cs: 1,
                };
                gemm(cout_g, n1 - n0, k, a, b, c, accumulate, T::ONE, parallel)
            };
        });
        finish(task, grp, n0, n1);
    };
    if split {
        threads::parallel_for(tasks * tiles, |i| item(i, false));
    } else {
        (0..tasks * tiles).for_each(|i| item(i, true));
    }
}

/// [`conv_gemm`] for small output planes: the unfolded columns of several images side by side, one
/// GEMM per (group, run of images), then each product row scattered to its images' NCHW planes
/// (with the bias). Any bias prefill in `out` is overwritten.
fn conv_gemm_folded<T: ConvScalar>(
    s: &Conv2dShape,
    g: &Geom,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    scratch_bytes: usize,
) {
    let (cin_g, cout_g) = (s.c_in / s.groups, s.c_out / s.groups);
    let taps = s.kh * s.kw;
    let k = cin_g * taps;
    let (plane_in, plane_out) = (s.h * s.w, s.h_out * s.w_out);
    let max_cols = (scratch_bytes / std::mem::size_of::<T>() / k.max(1)).max(plane_out);
    let threads = threads::current();
    // runs of images in a multiple of the thread count where the batch allows, each a single-threaded
    // product; else one product at a time, split across threads. A weight larger than the whole
    // batch's unfolded input is better streamed once, its rows split between threads, than once
    // per thread.
    let fewest = s.n.div_ceil((max_cols / plane_out).clamp(1, s.n));
    let weight_heavy = cout_g * k > k * s.n * plane_out;
    let runs = if s.groups * s.n >= threads && !weight_heavy {
        fewest.div_ceil(threads) * threads
    } else {
        fewest
    }
    .min(s.n);
    let images = s.n.div_ceil(runs);
    let runs = s.n.div_ceil(images);
    let items = s.groups * runs;
    let outer = threads > 1 && items >= threads;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let item = |i: usize, parallel: bool| {
        let (grp, run) = (i / runs, i % runs);
        let (b0, b1) = (run * images, ((run + 1) * images).min(s.n));
        let cols = (b1 - b0) * plane_out;
        T::with_scratch(k * cols + cout_g * cols, |buf| {
            let (col, prod) = buf.split_at_mut(k * cols);
            for (r, row) in col.chunks_exact_mut(cols).enumerate() {
                let (c, tap) = (r / taps, r % taps);
                for (b, dst) in (b0..b1).zip(row.chunks_exact_mut(plane_out)) {
                    let x = &input[(b * s.c_in + grp * cin_g + c) * plane_in..][..plane_in];
                    im2col_row(g, x, tap / s.kw, tap % s.kw, 0, dst);
                }
            }
            // SAFETY: the group's weight is cout_g×k row-major, `col` k×cols and `prod`
            // cout_g×cols, both row-major parts of this call's scratch; all in bounds.
            unsafe {
                gemm(
                    cout_g,
                    cols,
                    k,
                    Mat {
                        ptr: weight[grp * cout_g * k..].as_ptr(),
                        rs: k as isize,
                        cs: 1,
                    },
                    Mat {
                        ptr: col.as_ptr(),
                        rs: cols as isize,
                        cs: 1,
                    },
                    MatMut {
                        ptr: prod.as_mut_ptr(),
                        rs: cols as isize,
                        cs: 1,
                    },
                    false,
                    T::ONE,
                    parallel,
                )
            };
            for (oc, row) in prod.chunks_exact(cols).enumerate() {
                let channel = grp * cout_g + oc;
                let shift = bias.map_or(T::ZERO, |bias| bias[channel]);
                for (b, src) in (b0..b1).zip(row.chunks_exact(plane_out)) {
                    // SAFETY: plane (b, channel) belongs to this item alone (its group, its images)
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            out_ptr.get().add((b * s.c_out + channel) * plane_out),
                            plane_out,
                        )
                    };
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = v + shift;
                    }
                }
            }
        });
    };
    if outer {
        threads::parallel_for(items, |i| item(i, false));
    } else {
        (0..items).for_each(|i| item(i, true));
    }
}

/// A raw output pointer shared by rayon tasks that write disjoint parts of it.
#[derive(Clone, Copy)]
struct SyncPtr<T>(*mut T);

// SAFETY: only used to hand disjoint regions of one `&mut [T]` to tasks that run while it is
// borrowed.
unsafe impl<T: Send> Send for SyncPtr<T> {}
// SAFETY: as above; tasks never touch the same element.
unsafe impl<T: Send> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// A method, so closures capture the whole (Sync) wrapper rather than the raw pointer field.
    fn get(self) -> *mut T {
        self.0
    }
}

/// Unfolds output positions `n0..n1` (flattened `oy·w_out + ox`) of one group's input planes `x`
/// into `col`, row `(c·kh + ki)·kw + kj` holding the input value each position sees through tap
/// `(ki, kj)` of channel `c` (zero in the padding). Rows are independent, so large tiles fill in
/// parallel.
fn im2col<T: ConvScalar>(g: &Geom, x: &[T], n0: usize, n1: usize, col: &mut [T], parallel: bool) {
    let cols = n1 - n0;
    let fill = |r: usize, dst: &mut [T]| {
        let (c, kk) = (r / (g.kh * g.kw), r % (g.kh * g.kw));
        im2col_row(
            g,
            &x[c * g.h * g.w..][..g.h * g.w],
            kk / g.kw,
            kk % g.kw,
            n0,
            dst,
        );
    };
    if parallel && col.len() >= 1 << 16 {
        let min_rows = (1 << 13) / cols + 1;
        threads::par_chunks_mut_min(col, cols, min_rows, fill);
    } else {
        col.chunks_mut(cols)
            .enumerate()
            .for_each(|(r, dst)| fill(r, dst));
    }
}

pub(crate) fn im2col_row<T: ConvScalar>(
    g: &Geom,
    plane: &[T],
    ki: usize,
    kj: usize,
    n0: usize,
    dst: &mut [T],
) {
    let off = (kj * g.dw) as isize - g.pw as isize;
    let (lo, hi) = valid_range(off, g.sw, g.w, g.w_out);
    if g.sh == 1 && g.sw == 1 && g.w_out == g.w {
        // unit stride, output as wide as the input (the usual "same" 3×3): the row is the flat
        // input plane shifted by one constant — one copy, then zero the columns that wrapped into a
        // neighbouring row
        let shift = ((ki * g.dh) as isize - g.ph as isize) * g.w as isize + off;
        let (a, b) = valid_range(n0 as isize + shift, 1, plane.len(), dst.len());
        dst[..a].fill(T::ZERO);
        dst[b..].fill(T::ZERO);
        if a < b {
            let start = (n0 as isize + shift) as usize + a;
            dst[a..b].copy_from_slice(&plane[start..start + (b - a)]);
        }
        if lo > 0 || hi < g.w {
            let mut row_start = n0 - n0 % g.w;
            while row_start < n0 + dst.len() {
                for ox in (0..lo).chain(hi..g.w) {
                    if let Some(j) = (row_start + ox).checked_sub(n0) {
                        if let Some(d) = dst.get_mut(j) {
                            *d = T::ZERO;
                        }
                    }
                }
                row_start += g.w;
            }
        }
        return;
    }
    let mut pos = n0;
    let mut rest = dst;
    while !rest.is_empty() {
        let (oy, ox_a) = (pos / g.w_out, pos % g.w_out);
        let len = (g.w_out - ox_a).min(rest.len());
        let (seg, tail) = rest.split_at_mut(len);
        let iy = (oy * g.sh + ki * g.dh) as isize - g.ph as isize;
        if iy < 0 || iy >= g.h as isize {
            seg.fill(T::ZERO);
        } else {
            let xrow = &plane[iy as usize * g.w..][..g.w];
            let ox_b = ox_a + len;
            let (a, b) = (
                lo.clamp(ox_a, ox_b),
                hi.clamp(ox_a, ox_b).max(lo.clamp(ox_a, ox_b)),
            );
            seg[..a - ox_a].fill(T::ZERO);
            seg[b - ox_a..].fill(T::ZERO);
            let mid = &mut seg[a - ox_a..b - ox_a];
            if !mid.is_empty() {
                let start = (a * g.sw) as isize + off;
                let src = &xrow[start as usize..];
                let n = mid.len();
                if g.sw == 1 {
                    mid.copy_from_slice(&src[..n]);
                } else if g.sw == 2 {
                    // stride 2 over [T; 2] pairs: LLVM vectorizes that gather with shuffles
                    let (pairs, _) = src[..2 * (n - 1)].as_chunks::<2>();
                    for (d, &[v, _]) in mid.iter_mut().zip(pairs) {
                        *d = v;
                    }
                    mid[n - 1] = src[2 * (n - 1)];
                } else {
                    for (d, v) in mid.iter_mut().zip(src.iter().step_by(g.sw)) {
                        *d = *v;
                    }
                }
            }
        }
        pos += len;
        rest = tail;
    }
}

/// Output positions the depthwise kernel computes per step: 32 accumulators are four AVX registers
/// of `f32` (eight of `f64`), enough independent add chains to hide the adder's latency.
const DW_LANES: usize = 32;

/// Direct convolution for one input channel per group (depthwise, and `c_in == 1` stems): each
/// output plane reads a single input plane, so planes are independent rayon tasks.
fn depthwise<T: ConvScalar>(
    s: &Conv2dShape,
    g: &Geom,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) {
    let plane_in = s.h * s.w;
    let plane_out = s.h_out * s.w_out;
    let cout_g = s.c_out / s.groups;
    let taps = s.kh * s.kw;
    let layout = PhaseLayout::new(g, s.h_out);
    let job = DwJob {
        c_in: s.c_in,
        c_out: s.c_out,
        cout_g,
        plane_in,
        plane_out,
        taps,
    };
    // a task is a run of planes sharing one scratch: its zero padding is written once per task
    let per_task = TASK_MIN_WORK / (layout.n_ext * taps).max(1) + 1;
    threads::par_chunks_mut(out, plane_out * per_task, |t, o| {
        T::with_scratch(layout.scratch_len(), |scratch| {
            dw_planes(
                g,
                &layout,
                &job,
                input,
                weight,
                bias,
                t * per_task,
                o,
                scratch,
            )
        });
    });
}

/// Indexing of a depthwise call, shared by its tasks.
#[derive(Clone, Copy, Debug)]
struct DwJob {
    c_in: usize,
    c_out: usize,
    cout_g: usize,
    plane_in: usize,
    plane_out: usize,
    taps: usize,
}

/// The zero-padded input plane split into `sh·sw` phase sub-planes, phase `(rp, cp)` holding padded
/// rows `rp, rp + sh, …` and columns `cp, cp + sw, …`. Tap `(ki, kj)` of output `(oy, ox)` reads
/// padded `(oy·sh + ki·dh, ox·sw + kj·dw)`, which is element `(oy + ki·dh / sh, ox + kj·dw / sw)`
/// of phase `(ki·dh % sh, kj·dw % sw)`. With every phase row `wq` long, a tap is the same flat
/// array shifted by a constant, so the flat output `oy·wq + ox` is a 1-D convolution over
/// contiguous memory — for any stride, dilation and padding, with no border cases. The `wq - w_out`
/// extra columns of each row are computed and dropped; the phases cost one copy of the padded
/// plane, small next to `kh·kw` multiply-adds per output.
#[derive(Clone, Debug)]
struct PhaseLayout {
    /// rows and row length of a phase
    hq: usize,
    wq: usize,
    /// flat outputs computed: `h_out·wq` rounded up to whole steps
    n_ext: usize,
    /// elements per phase, including the zero tail the last step may read
    phase_len: usize,
    phases: usize,
    /// the phases some tap reads, as `(rp, cp)`
    used: Vec<(usize, usize)>,
    /// per tap, in `(ki, kj)` order: offset of its shifted view in the phase buffer
    shifts: Vec<usize>,
}

impl PhaseLayout {
    fn new(g: &Geom, h_out: usize) -> Self {
        let hq = h_out + (g.kh - 1) * g.dh / g.sh;
        let wq = g.w_out + (g.kw - 1) * g.dw / g.sw;
        let n_ext = (h_out * wq).div_ceil(DW_LANES) * DW_LANES;
        let max_shift = (g.kh - 1) * g.dh / g.sh * wq + (g.kw - 1) * g.dw / g.sw;
        let phase_len = (n_ext + max_shift).max(hq * wq);
        let mut used = Vec::new();
        let mut shifts = Vec::with_capacity(g.kh * g.kw);
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let (ry, cx) = (ki * g.dh, kj * g.dw);
                let (rp, cp) = (ry % g.sh, cx % g.sw);
                if !used.contains(&(rp, cp)) {
                    used.push((rp, cp));
                }
                shifts.push((rp * g.sw + cp) * phase_len + ry / g.sh * wq + cx / g.sw);
            }
        }
        PhaseLayout {
            hq,
            wq,
            n_ext,
            phase_len,
            phases: g.sh * g.sw,
            used,
            shifts,
        }
    }

    /// Phases, then the flat output, then one padded input row (for strided deinterleaving).
    fn scratch_len(&self) -> usize {
        self.phases * self.phase_len + self.n_ext + self.wq * self.phases
    }
}

/// Writes the in-image part of the phases some tap reads (see [`PhaseLayout`]) from the input plane
/// `x`; the padding must already be zero in `phase_buf` and `row_buf`. With column stride 1 a phase
/// row is a copy of the input row; with stride `sw > 1` the padded row is built in `row_buf` and
/// split into its column phases.
#[inline(always)]
fn fill_phases<T: ConvScalar>(
    g: &Geom,
    l: &PhaseLayout,
    x: &[T],
    phase_buf: &mut [T],
    row_buf: &mut [T],
) {
    let col_used = |cp: usize| l.used.iter().any(|&(_, c)| c == cp);
    let prow = &mut row_buf[..l.wq * g.sw];
    let (lo, hi) = valid_range(-(g.pw as isize), 1, g.w, prow.len());
    if lo == hi {
        return;
    }
    let split2 = g.sw == 2 && col_used(0) && col_used(1);
    for rp in (0..g.sh).filter(|&rp| l.used.iter().any(|&(r, _)| r == rp)) {
        let (r0, r1) = valid_range(rp as isize - g.ph as isize, g.sh, g.h, l.hq);
        for r in r0..r1 {
            let src = &x[(r * g.sh + rp - g.ph) * g.w..][..g.w];
            let at = |cp: usize| (rp * g.sw + cp) * l.phase_len + r * l.wq;
            if g.sw == 1 {
                phase_buf[at(0) + lo..at(0) + hi].copy_from_slice(&src[lo - g.pw..hi - g.pw]);
                continue;
            }
            if split2 {
                // input column ix is padded column ix + pw: even ix go to phase pw % 2 from q = pw
                // / 2, odd ix to the other phase from q = (pw + 1) / 2; columns past the phase row
                // are never read
                let (qa, qb) = (g.pw / 2, g.pw.div_ceil(2));
                let (na, nb) = (
                    g.w.div_ceil(2).min(l.wq - qa.min(l.wq)),
                    (g.w / 2).min(l.wq - qb.min(l.wq)),
                );
                let (p0, p1) = phase_buf.split_at_mut(at(1));
                let (r0, r1) = (&mut p0[at(0)..][..l.wq], &mut p1[..l.wq]);
                let (ra, rb) = if g.pw.is_multiple_of(2) {
                    (r0, r1)
                } else {
                    (r1, r0)
                };
                let n2 = na.min(nb);
                deinterleave2(&src[..2 * n2], &mut ra[qa..qa + n2], &mut rb[qb..qb + n2]);
                for j in n2..na {
                    ra[qa + j] = src[2 * j];
                }
                for j in n2..nb {
                    rb[qb + j] = src[2 * j + 1];
                }
                continue;
            }
            prow[lo..hi].copy_from_slice(&src[lo - g.pw..hi - g.pw]);
            {
                for cp in (0..g.sw).filter(|&cp| col_used(cp)) {
                    for (q, d) in phase_buf[at(cp)..][..l.wq].iter_mut().enumerate() {
                        *d = prow[q * g.sw + cp];
                    }
                }
            }
        }
    }
}

/// `even[i] = src[2i]`, `odd[i] = src[2i + 1]`; over `[T; 2]` pairs LLVM vectorizes it with
/// shuffles.
#[inline(always)]
pub(crate) fn deinterleave2<T: Copy>(src: &[T], even: &mut [T], odd: &mut [T]) {
    let (pairs, _) = src.as_chunks::<2>();
    for ((e, o), &[a, b]) in even.iter_mut().zip(odd.iter_mut()).zip(pairs) {
        *e = a;
        *o = b;
    }
}

/// Output planes `first..` of a depthwise convolution into `out` (whole planes).
#[isa_versions]
#[allow(clippy::too_many_arguments)]
fn dw_planes<T: ConvScalar>(
    g: &Geom,
    l: &PhaseLayout,
    job: &DwJob,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    first: usize,
    out: &mut [T],
    scratch: &mut [T],
) {
    let (phase_buf, rest) = scratch.split_at_mut(l.phases * l.phase_len);
    let (ext, row_buf) = rest.split_at_mut(l.n_ext);
    // padding stays zero across planes: each plane only rewrites the in-image part of the phases
    phase_buf.fill(T::ZERO);
    row_buf.fill(T::ZERO);
    for (p, o) in (first..).zip(out.chunks_exact_mut(job.plane_out)) {
        let (b, oc) = (p / job.c_out, p % job.c_out);
        let x = &input[(b * job.c_in + oc / job.cout_g) * job.plane_in..][..job.plane_in];
        let wk = &weight[oc * job.taps..][..job.taps];
        let bias = bias.map_or(T::ZERO, |b| b[oc]);
        fill_phases(g, l, x, phase_buf, row_buf);
        let phases = &*phase_buf;
        for (step, dst) in ext.chunks_exact_mut(DW_LANES).enumerate() {
            let i0 = step * DW_LANES;
            let mut acc = [bias; DW_LANES];
            for (&shift, &wv) in l.shifts.iter().zip(wk) {
                let src: &[T; DW_LANES] = phases[shift + i0..][..DW_LANES]
                    .try_into()
                    .expect("slice of DW_LANES elements");
                for (a, &v) in acc.iter_mut().zip(src) {
                    *a += wv * v;
                }
            }
            dst.copy_from_slice(&acc);
        }
        for (orow, erow) in o.chunks_exact_mut(g.w_out).zip(ext.chunks(l.wq)) {
            orow.copy_from_slice(&erow[..g.w_out]);
        }
    }
}

/// Transposed 2-D convolution (the adjoint of [`conv2d`], as PyTorch's `conv_transpose2d`): input
/// NCHW `[n, c_in, h, w]`, weight `[c_in, c_out/groups, kh, kw]`, bias `[c_out]`, out NCHW
/// `[n, c_out, h_out, w_out]`.
pub fn conv_transpose2d<T: ConvScalar>(
    s: &ConvTranspose2dShape,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) {
    conv_transpose2d_planned(s, input, weight, bias, out, DEFAULT_PLAN)
}

fn conv_transpose2d_planned<T: ConvScalar>(
    s: &ConvTranspose2dShape,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    plan: Plan,
) {
    const WHAT: &str = "conv_transpose2d";
    check_common(WHAT, s.kh, s.kw, s.stride, s.dilation, s.groups);
    assert!(
        s.c_in.is_multiple_of(s.groups) && s.c_out.is_multiple_of(s.groups),
        "conv_transpose2d: groups={} must divide c_in={} and c_out={}",
        s.groups,
        s.c_in,
        s.c_out
    );
    let size = |input: usize, d: usize, k: usize| {
        (input as isize - 1) * s.stride[d] as isize - 2 * s.padding[d] as isize
            + (s.dilation[d] * (k - 1)) as isize
            + s.output_padding[d] as isize
            + 1
    };
    let (want_h, want_w) = (size(s.h, 0, s.kh), size(s.w, 1, s.kw));
    assert!(
        s.h > 0 && s.w > 0 && want_h == s.h_out as isize && want_w == s.w_out as isize,
        "conv_transpose2d: output {}x{} does not match input {}x{}, kernel {}x{}, \
         stride {:?}, padding {:?}, output_padding {:?}, dilation {:?} \
         (expected {want_h}x{want_w})",
        s.h_out,
        s.w_out,
        s.h,
        s.w,
        s.kh,
        s.kw,
        s.stride,
        s.padding,
        s.output_padding,
        s.dilation
    );
    let (cin_g, cout_g) = (s.c_in / s.groups, s.c_out / s.groups);
    check_len(WHAT, "input", input, numel(WHAT, &[s.n, s.c_in, s.h, s.w]));
    check_len(
        WHAT,
        "weight",
        weight,
        numel(WHAT, &[s.c_in, cout_g, s.kh, s.kw]),
    );
    if let Some(b) = bias {
        check_len(WHAT, "bias", b, s.c_out);
    }
    check_len(
        WHAT,
        "out",
        out,
        numel(WHAT, &[s.n, s.c_out, s.h_out, s.w_out]),
    );
    if out.is_empty() {
        return;
    }
    // the forward convolution's geometry: its input is our output
    let g = Geom {
        h: s.h_out,
        w: s.w_out,
        kh: s.kh,
        kw: s.kw,
        sh: s.stride[0],
        sw: s.stride[1],
        ph: s.padding[0],
        pw: s.padding[1],
        dh: s.dilation[0],
        dw: s.dilation[1],
        w_out: s.w,
    };
    let (plane_in, plane_out) = (s.h * s.w, s.h_out * s.w_out);
    let m = cout_g * s.kh * s.kw;
    let unit = s.kh == 1
        && s.kw == 1
        && s.stride == [1, 1]
        && s.padding == [0, 0]
        && s.output_padding == [0, 0];
    prefill_bias(out, plane_out, s.c_out, bias);
    let block = cout_g * plane_out;
    if s.n > 1 && plane_in < FOLD_PLANE_MAX && !unit && plan.outer.is_none() {
        conv_transpose2d_folded(s, &g, input, weight, out, plan.scratch_bytes);
        return;
    }
    let run = |task: usize, o: &mut [T], parallel: bool| {
        let (b, grp) = (task / s.groups, task % s.groups);
        let x = &input[(b * s.c_in + grp * cin_g) * plane_in..][..cin_g * plane_in];
        let wg = &weight[grp * cin_g * m..][..cin_g * m];
        // weightᵀ: row r of the [m, cin_g] operand is column r of the row-major [cin_g, m] group
        // slice
        let a = Mat {
            ptr: wg.as_ptr(),
            rs: 1,
            cs: m as isize,
        };
        if unit {
            // SAFETY: `wg`ᵀ is cout_g×cin_g (m == cout_g), `x` cin_g×plane_in, `o` cout_g×plane_out
            // with plane_out == plane_in; all in bounds and `o` is a distinct &mut slice.
            unsafe {
                gemm(
                    cout_g,
                    plane_out,
                    cin_g,
                    a,
                    Mat {
                        ptr: x.as_ptr(),
                        rs: plane_in as isize,
                        cs: 1,
                    },
                    MatMut {
                        ptr: o.as_mut_ptr(),
                        rs: plane_out as isize,
                        cs: 1,
                    },
                    true,
                    T::ONE,
                    parallel,
                )
            };
            return;
        }
        let cols = tile_cols::<T>(m, plane_in, plan.scratch_bytes);
        T::with_scratch(m * cols, |scratch| {
            let mut p0 = 0;
            while p0 < plane_in {
                let p1 = (p0 + cols).min(plane_in);
                let col = &mut scratch[..m * (p1 - p0)];
                // SAFETY: `wg`ᵀ is m×cin_g, input columns p0..p1 of the cin_g×plane_in block `x`,
                // and `col` an m×(p1-p0) row-major buffer distinct from both; all in bounds.
                unsafe {
                    gemm(
                        m,
                        p1 - p0,
                        cin_g,
                        a,
                        Mat {
                            ptr: x.as_ptr().add(p0),
                            rs: plane_in as isize,
                            cs: 1,
                        },
                        MatMut {
                            ptr: col.as_mut_ptr(),
                            rs: (p1 - p0) as isize,
                            cs: 1,
                        },
                        false,
                        T::ONE,
                        parallel,
                    )
                };
                col2im(&g, col, p1 - p0, p0, p1, o, parallel);
                p0 = p1;
            }
        });
    };
    let tasks = s.n * s.groups;
    if decide_outer(plan, tasks, m * cin_g * plane_in) {
        threads::par_chunks_mut(out, block, |t, o| run(t, o, false));
    } else {
        out.chunks_mut(block)
            .enumerate()
            .for_each(|(t, o)| run(t, o, true));
    }
}

/// [`conv_transpose2d_planned`] for small input planes: the inputs of a run of images side by side
/// as one GEMM's columns, so the weight is streamed once per run rather than once per image, then
/// each image's columns scattered into its planes. `out` holds the bias (or zeros) already.
fn conv_transpose2d_folded<T: ConvScalar>(
    s: &ConvTranspose2dShape,
    g: &Geom,
    input: &[T],
    weight: &[T],
    out: &mut [T],
    scratch_bytes: usize,
) {
    let (cin_g, cout_g) = (s.c_in / s.groups, s.c_out / s.groups);
    let m = cout_g * s.kh * s.kw;
    let (plane_in, plane_out) = (s.h * s.w, s.h_out * s.w_out);
    let block = cout_g * plane_out;
    let per_image = (m + cin_g) * plane_in * std::mem::size_of::<T>();
    let fewest =
        s.n.div_ceil((scratch_bytes / per_image.max(1)).clamp(1, s.n));
    let threads = threads::current();
    // as in `conv_gemm_folded`: a weight larger than the batch's input is streamed once, split
    let weight_heavy = m * cin_g > cin_g * s.n * plane_in;
    let runs = if s.groups * s.n >= threads && !weight_heavy {
        fewest.div_ceil(threads) * threads
    } else {
        fewest
    }
    .min(s.n);
    let images = s.n.div_ceil(runs);
    let runs = s.n.div_ceil(images);
    let items = s.groups * runs;
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let item = |i: usize, parallel: bool| {
        let (grp, run) = (i / runs, i % runs);
        let (b0, b1) = (run * images, ((run + 1) * images).min(s.n));
        let cols = (b1 - b0) * plane_in;
        T::with_scratch(cin_g * cols + m * cols, |buf| {
            let (xs, col) = buf.split_at_mut(cin_g * cols);
            // [cin_g, (image, position)]: the run's input planes of this group side by side
            for (c, row) in xs.chunks_exact_mut(cols).enumerate() {
                for (b, dst) in (b0..b1).zip(row.chunks_exact_mut(plane_in)) {
                    dst.copy_from_slice(
                        &input[(b * s.c_in + grp * cin_g + c) * plane_in..][..plane_in],
                    );
                }
            }
            let wg = &weight[grp * cin_g * m..][..cin_g * m];
            // SAFETY: `wg`ᵀ is m×cin_g (columns of the row-major [cin_g, m] group slice), `xs`
            // cin_g×cols and `col` m×cols, both row-major parts of this call's scratch.
            unsafe {
                gemm(
                    m,
                    cols,
                    cin_g,
                    Mat {
                        ptr: wg.as_ptr(),
                        rs: 1,
                        cs: m as isize,
                    },
                    Mat {
                        ptr: xs.as_ptr(),
                        rs: cols as isize,
                        cs: 1,
                    },
                    MatMut {
                        ptr: col.as_mut_ptr(),
                        rs: cols as isize,
                        cs: 1,
                    },
                    false,
                    T::ONE,
                    parallel,
                )
            };
            for (j, b) in (b0..b1).enumerate() {
                // SAFETY: the (image b, group grp) output block belongs to this item alone
                let o = unsafe {
                    std::slice::from_raw_parts_mut(
                        out_ptr.get().add((b * s.groups + grp) * block),
                        block,
                    )
                };
                col2im(g, &col[j * plane_in..], cols, 0, plane_in, o, false);
            }
        });
    };
    if threads > 1 && items >= threads {
        threads::parallel_for(items, |i| item(i, false));
    } else {
        (0..items).for_each(|i| item(i, true));
    }
}

/// Scatter-adds the column tile (row `(oc·kh + ki)·kw + kj` starting at `col[row · ld]`, columns =
/// input positions `p0..p1`) into the output planes `o` `[cout_g, h_out·w_out]`. Each output plane
/// only receives its own rows, so planes run in parallel.
fn col2im<T: ConvScalar>(
    g: &Geom,
    col: &[T],
    ld: usize,
    p0: usize,
    p1: usize,
    o: &mut [T],
    parallel: bool,
) {
    let cols = p1 - p0;
    let rows_per_plane = g.kh * g.kw * ld;
    let plane = g.h * g.w;
    let scatter = |oc: usize, dst: &mut [T]| {
        for ki in 0..g.kh {
            for kj in 0..g.kw {
                let src = &col[oc * rows_per_plane + (ki * g.kw + kj) * ld..][..cols];
                col2im_row(g, src, ki, kj, p0, dst);
            }
        }
    };
    if parallel && o.len() * g.kh * g.kw >= 1 << 16 {
        let min_len = TASK_MIN_WORK / rows_per_plane.max(1) + 1;
        threads::par_chunks_mut_min(o, plane, min_len, scatter);
    } else {
        o.chunks_mut(plane)
            .enumerate()
            .for_each(|(oc, dst)| scatter(oc, dst));
    }
}

fn col2im_row<T: ConvScalar>(
    g: &Geom,
    src: &[T],
    ki: usize,
    kj: usize,
    p0: usize,
    plane: &mut [T],
) {
    // forward view: `g.h_out × g.w_out` are the positions (our input), `g.h × g.w` the plane we add
    // into
    let off = (kj * g.dw) as isize - g.pw as isize;
    let (lo, hi) = valid_range(off, g.sw, g.w, g.w_out);
    let mut pos = p0;
    let mut rest = src;
    while !rest.is_empty() {
        let (iy, ix_a) = (pos / g.w_out, pos % g.w_out);
        let len = (g.w_out - ix_a).min(rest.len());
        let (seg, tail) = rest.split_at(len);
        let oy = (iy * g.sh + ki * g.dh) as isize - g.ph as isize;
        let ix_b = ix_a + len;
        let (a, b) = (lo.clamp(ix_a, ix_b), hi.clamp(ix_a, ix_b));
        if oy >= 0 && oy < g.h as isize && a < b {
            let orow = &mut plane[oy as usize * g.w..][..g.w];
            let start = ((a * g.sw) as isize + off) as usize;
            let vals = &seg[a - ix_a..b - ix_a];
            if g.sw == 1 {
                for (d, &v) in orow[start..start + vals.len()].iter_mut().zip(vals) {
                    *d += v;
                }
            } else {
                for (d, &v) in orow[start..].iter_mut().step_by(g.sw).zip(vals) {
                    *d += v;
                }
            }
        }
        pos += len;
        rest = tail;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic values in [-1, 1) (an LCG), so failures reproduce.
    pub(crate) fn data(len: usize, seed: u64) -> Vec<f64> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    fn naive_conv2d(s: &Conv2dShape, x: &[f64], w: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
        let (cin_g, cout_g) = (s.c_in / s.groups, s.c_out / s.groups);
        let mut out = vec![0.0; s.n * s.c_out * s.h_out * s.w_out];
        for b in 0..s.n {
            for oc in 0..s.c_out {
                let grp = oc / cout_g;
                for oy in 0..s.h_out {
                    for ox in 0..s.w_out {
                        let mut acc = bias.map_or(0.0, |b| b[oc]);
                        for c in 0..cin_g {
                            let ic = grp * cin_g + c;
                            for ki in 0..s.kh {
                                for kj in 0..s.kw {
                                    let iy = (oy * s.stride[0] + ki * s.dilation[0]) as isize
                                        - s.padding[0] as isize;
                                    let ix = (ox * s.stride[1] + kj * s.dilation[1]) as isize
                                        - s.padding[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= s.h as isize || ix >= s.w as isize
                                    {
                                        continue;
                                    }
                                    acc += w[((oc * cin_g + c) * s.kh + ki) * s.kw + kj]
                                        * x[((b * s.c_in + ic) * s.h + iy as usize) * s.w
                                            + ix as usize];
                                }
                            }
                        }
                        out[((b * s.c_out + oc) * s.h_out + oy) * s.w_out + ox] = acc;
                    }
                }
            }
        }
        out
    }

    fn naive_conv_transpose2d(
        s: &ConvTranspose2dShape,
        x: &[f64],
        w: &[f64],
        bias: Option<&[f64]>,
    ) -> Vec<f64> {
        let (cin_g, cout_g) = (s.c_in / s.groups, s.c_out / s.groups);
        let plane = s.h_out * s.w_out;
        let mut out = vec![0.0; s.n * s.c_out * plane];
        for b in 0..s.n {
            for oc in 0..s.c_out {
                out[(b * s.c_out + oc) * plane..][..plane].fill(bias.map_or(0.0, |b| b[oc]));
            }
            for ic in 0..s.c_in {
                let grp = ic / cin_g;
                for iy in 0..s.h {
                    for ix in 0..s.w {
                        let v = x[((b * s.c_in + ic) * s.h + iy) * s.w + ix];
                        for c in 0..cout_g {
                            let oc = grp * cout_g + c;
                            for ki in 0..s.kh {
                                for kj in 0..s.kw {
                                    let oy = (iy * s.stride[0] + ki * s.dilation[0]) as isize
                                        - s.padding[0] as isize;
                                    let ox = (ix * s.stride[1] + kj * s.dilation[1]) as isize
                                        - s.padding[1] as isize;
                                    if oy < 0
                                        || ox < 0
                                        || oy >= s.h_out as isize
                                        || ox >= s.w_out as isize
                                    {
                                        continue;
                                    }
                                    out[((b * s.c_out + oc) * s.h_out + oy as usize) * s.w_out
                                        + ox as usize] +=
                                        v * w[((ic * cout_g + c) * s.kh + ki) * s.kw + kj];
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    pub(crate) fn assert_close(got: &[f64], want: &[f64], tol: f64, ctx: &str) {
        assert_eq!(got.len(), want.len(), "{ctx}: length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "{ctx}: element {i}: got {g}, want {w}"
            );
        }
    }

    /// (n, c_in, h, w, c_out, kh, kw, stride, padding, dilation, groups)
    type Case = (
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        [usize; 2],
        [usize; 2],
        [usize; 2],
        usize,
    );

    fn shape(c: Case) -> Conv2dShape {
        let (n, c_in, h, w, c_out, kh, kw, stride, padding, dilation, groups) = c;
        let h_out =
            conv_out_size(h, padding[0], dilation[0], kh, stride[0]).expect("test case fits");
        let w_out =
            conv_out_size(w, padding[1], dilation[1], kw, stride[1]).expect("test case fits");
        Conv2dShape {
            n,
            c_in,
            h,
            w,
            c_out,
            kh,
            kw,
            stride,
            padding,
            dilation,
            groups,
            h_out,
            w_out,
        }
    }

    const CASES: &[Case] = &[
        // general im2col
        (1, 3, 7, 9, 5, 3, 3, [1, 1], [1, 1], [1, 1], 1),
        (2, 5, 11, 10, 7, 3, 3, [2, 2], [1, 1], [1, 1], 1),
        (2, 4, 11, 10, 6, 3, 2, [2, 1], [1, 0], [1, 2], 2),
        (1, 6, 9, 13, 9, 2, 5, [1, 3], [0, 2], [2, 1], 3),
        (1, 3, 23, 21, 8, 7, 7, [2, 2], [3, 3], [1, 1], 1),
        (2, 8, 6, 6, 4, 3, 3, [1, 1], [2, 2], [2, 2], 2),
        (1, 2, 5, 5, 3, 5, 5, [1, 1], [0, 0], [1, 1], 1),
        (1, 4, 3, 3, 5, 3, 3, [3, 3], [4, 4], [1, 1], 1), // padding larger than the image
        // small planes: images folded into one product's columns
        (3, 8, 2, 2, 6, 3, 3, [1, 1], [1, 1], [1, 1], 1),
        (4, 6, 5, 4, 4, 3, 3, [2, 2], [1, 1], [1, 1], 2), // 3x2 planes
        (5, 4, 3, 3, 5, 1, 1, [1, 1], [0, 0], [1, 1], 1),
        (3, 2, 6, 6, 3, 6, 6, [1, 1], [1, 1], [1, 1], 1), // a kernel-sized output, as a weight gradient
        (6, 3, 4, 4, 2, 3, 3, [1, 1], [0, 0], [1, 1], 1),
        // pointwise and strided 1x1
        (2, 5, 7, 6, 7, 1, 1, [1, 1], [0, 0], [1, 1], 1),
        (1, 6, 9, 9, 4, 1, 1, [1, 1], [0, 0], [1, 1], 2),
        (1, 5, 9, 8, 3, 1, 1, [2, 2], [0, 0], [1, 1], 1),
        (1, 4, 5, 5, 3, 1, 1, [1, 1], [1, 1], [1, 1], 1),
        // depthwise: fixed-size specialisations, multiplier, generic fallbacks
        (2, 6, 13, 13, 6, 3, 3, [1, 1], [1, 1], [1, 1], 6),
        (1, 5, 20, 17, 5, 3, 3, [2, 2], [1, 1], [1, 1], 5),
        (1, 3, 19, 22, 3, 5, 5, [1, 1], [2, 2], [1, 1], 3),
        (2, 4, 21, 20, 4, 5, 5, [2, 2], [2, 2], [1, 1], 4),
        (1, 2, 24, 23, 2, 7, 7, [1, 1], [3, 3], [1, 1], 2),
        (1, 2, 24, 23, 2, 7, 7, [2, 2], [3, 3], [1, 1], 2),
        (1, 3, 12, 12, 3, 3, 3, [1, 1], [0, 0], [1, 1], 3),
        (1, 3, 4, 4, 3, 5, 5, [1, 1], [2, 2], [1, 1], 3), // narrower than the kernel
        (2, 3, 12, 11, 6, 3, 3, [1, 1], [1, 1], [1, 1], 3),
        (1, 4, 15, 14, 4, 3, 3, [1, 1], [2, 2], [2, 2], 4),
        (1, 4, 15, 14, 4, 1, 7, [1, 2], [0, 3], [1, 1], 4),
        (1, 1, 16, 15, 5, 3, 3, [1, 1], [1, 1], [1, 1], 1), // c_in == 1 stem
        (1, 3, 9, 21, 3, 2, 2, [2, 2], [0, 0], [1, 1], 3),  // stride drops the last input column
        (2, 2, 10, 19, 4, 4, 4, [2, 2], [1, 1], [1, 1], 2),
        (1, 2, 11, 16, 2, 3, 3, [3, 3], [1, 1], [1, 1], 2),
        (1, 2, 11, 16, 2, 3, 3, [1, 2], [1, 1], [3, 1], 2),
        // conv1d as h = 1
        (2, 5, 1, 37, 7, 1, 3, [1, 1], [0, 1], [1, 1], 1),
        (1, 4, 1, 40, 6, 1, 5, [1, 2], [0, 2], [1, 2], 2),
        (2, 6, 1, 33, 6, 1, 4, [1, 1], [0, 3], [1, 1], 6),
        (1, 3, 1, 29, 3, 1, 3, [1, 2], [0, 0], [1, 3], 3),
        // empty batch
        (0, 4, 5, 5, 6, 3, 3, [1, 1], [1, 1], [1, 1], 2),
        (0, 4, 5, 5, 4, 3, 3, [1, 1], [1, 1], [1, 1], 4),
    ];

    fn check_conv(c: Case, with_bias: bool, plan: Plan) {
        let s = shape(c);
        let x = data(s.n * s.c_in * s.h * s.w, 1);
        let w = data(s.c_out * (s.c_in / s.groups) * s.kh * s.kw, 2);
        let b = data(s.c_out, 3);
        let bias = with_bias.then_some(&b[..]);
        let want = naive_conv2d(&s, &x, &w, bias);
        let ctx = format!("{s:?} bias={with_bias} {plan:?}");

        let mut got = vec![f64::NAN; want.len()];
        conv2d_planned(&s, &x, &w, bias, &mut got, &Epilogue::NONE, plan);
        assert_close(&got, &want, 1e-12, &ctx);

        let f = |v: &[f64]| v.iter().map(|&e| e as f32).collect::<Vec<f32>>();
        let (x32, w32, b32) = (f(&x), f(&w), f(&b));
        let mut got32 = vec![f32::NAN; want.len()];
        conv2d_planned(
            &s,
            &x32,
            &w32,
            with_bias.then_some(&b32[..]),
            &mut got32,
            &Epilogue::NONE,
            plan,
        );
        let got32: Vec<f64> = got32.iter().map(|&e| e as f64).collect();
        assert_close(&got32, &want, 1e-5, &format!("f32 {ctx}"));
    }

    #[test]
    fn conv2d_matches_naive() {
        for &c in CASES {
            for with_bias in [false, true] {
                check_conv(c, with_bias, DEFAULT_PLAN);
            }
        }
    }

    /// Small output planes fold images into the GEMM's columns: all of them in one product, and one
    /// image per product when the scratch holds no more.
    #[test]
    fn conv2d_folded_images_match_naive() {
        let folded = |c: &&Case| {
            let s = shape(**c);
            s.n > 1 && s.h_out * s.w_out < FOLD_PLANE_MAX && s.c_in / s.groups > 1
        };
        assert!(CASES.iter().filter(folded).count() >= 3);
        for c in CASES.iter().filter(folded) {
            for scratch_bytes in [SCRATCH_BYTES, 64] {
                for with_bias in [false, true] {
                    let plan = Plan {
                        scratch_bytes,
                        outer: None,
                    };
                    check_conv(*c, with_bias, plan);
                }
            }
        }
    }

    /// The reference epilogue: norm, then residual, then relu, over a whole NCHW output.
    fn epilogue_ref(
        out: &mut [f64],
        plane: usize,
        channels: usize,
        ss: Option<(&[f64], &[f64])>,
        residual: Option<&[f64]>,
        relu: bool,
    ) {
        for (i, v) in out.iter_mut().enumerate() {
            let c = (i / plane.max(1)) % channels;
            if let Some((a, b)) = ss {
                *v = *v * a[c] + b[c];
            }
            if let Some(r) = residual {
                *v += r[i];
            }
            if relu && *v < 0.0 {
                *v = 0.0;
            }
        }
    }

    /// Every combination of epilogue steps on every path (tiled im2col, pointwise, depthwise,
    /// one-item-at-a-time), against the plain convolution followed by the steps.
    #[test]
    fn epilogue_matches_the_steps_after_the_convolution() {
        for &c in CASES {
            let s = shape(c);
            let x = data(s.n * s.c_in * s.h * s.w, 1);
            let w = data(s.c_out * (s.c_in / s.groups) * s.kh * s.kw, 2);
            let len = s.n * s.c_out * s.h_out * s.w_out;
            let (scale, shift, res) = (data(s.c_out, 4), data(s.c_out, 5), data(len, 6));
            let plane = s.h_out * s.w_out;
            for (norm, residual, relu) in [
                (true, false, false),
                (true, false, true),
                (true, true, true),
                (false, true, false),
                (false, false, true),
            ] {
                for plan in [
                    DEFAULT_PLAN,
                    Plan {
                        scratch_bytes: 64,
                        outer: Some(false),
                    },
                ] {
                    let mut want = naive_conv2d(&s, &x, &w, None);
                    let ss = norm.then_some((&scale[..], &shift[..]));
                    let r = residual.then_some(&res[..]);
                    epilogue_ref(&mut want, plane, s.c_out, ss, r, relu);
                    let epi = Epilogue {
                        scale_shift: ss,
                        residual: r,
                        relu,
                    };
                    let mut got = vec![f64::NAN; len];
                    conv2d_planned(&s, &x, &w, None, &mut got, &epi, plan);
                    assert_close(&got, &want, 1e-12, &format!("{s:?} {epi:?} {plan:?}"));
                }
            }
        }
    }

    #[test]
    fn conv2d_tiled_and_scheduled_paths_match_naive() {
        for &c in CASES {
            for outer in [Some(true), Some(false)] {
                // 64 bytes: a handful of columns per tile, so tiles straddle output rows
                check_conv(
                    c,
                    true,
                    Plan {
                        scratch_bytes: 64,
                        outer,
                    },
                );
                check_conv(
                    c,
                    false,
                    Plan {
                        scratch_bytes: SCRATCH_BYTES,
                        outer,
                    },
                );
            }
        }
    }

    #[test]
    fn conv2d_large_layer_runs_parallel_paths() {
        // big enough for the parallel im2col and the rayon-split GEMM
        check_conv(
            (1, 16, 30, 31, 24, 3, 3, [1, 1], [1, 1], [1, 1], 1),
            true,
            DEFAULT_PLAN,
        );
        check_conv(
            (1, 16, 30, 31, 24, 3, 3, [1, 1], [1, 1], [1, 1], 1),
            true,
            Plan {
                scratch_bytes: 20000,
                outer: None,
            },
        );
        check_conv(
            (1, 32, 40, 40, 32, 3, 3, [2, 2], [1, 1], [1, 1], 32),
            true,
            DEFAULT_PLAN,
        );
    }

    #[test]
    #[should_panic(expected = "does not match")]
    fn conv2d_rejects_wrong_output_size() {
        let mut s = shape((1, 2, 5, 5, 2, 3, 3, [1, 1], [1, 1], [1, 1], 1));
        s.h_out += 1;
        let mut out = vec![0.0f32; 2 * s.h_out * s.w_out];
        conv2d(&s, &[0.0; 50], &[0.0; 36], None, &mut out);
    }

    #[test]
    #[should_panic(expected = "weight has")]
    fn conv2d_rejects_short_weight() {
        let s = shape((1, 2, 5, 5, 2, 3, 3, [1, 1], [1, 1], [1, 1], 1));
        let mut out = vec![0.0f32; 50];
        conv2d(&s, &[0.0; 50], &[0.0; 35], None, &mut out);
    }

    /// (n, c_in, h, w, c_out, kh, kw, stride, padding, output_padding, dilation, groups)
    type TCase = (
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        [usize; 2],
        [usize; 2],
        [usize; 2],
        [usize; 2],
        usize,
    );

    const TCASES: &[TCase] = &[
        (1, 3, 5, 6, 4, 3, 3, [1, 1], [0, 0], [0, 0], [1, 1], 1),
        (2, 4, 7, 5, 6, 4, 4, [2, 2], [1, 1], [0, 0], [1, 1], 2),
        (1, 6, 4, 7, 3, 3, 2, [2, 3], [1, 0], [1, 2], [1, 1], 3),
        (2, 3, 5, 5, 5, 3, 3, [2, 1], [2, 1], [1, 0], [2, 2], 1),
        (1, 4, 6, 6, 4, 3, 3, [1, 1], [1, 1], [0, 0], [1, 1], 4),
        (1, 5, 6, 7, 3, 1, 1, [1, 1], [0, 0], [0, 0], [1, 1], 1),
        (1, 4, 5, 5, 6, 1, 1, [2, 2], [0, 0], [1, 1], [1, 1], 2),
        (2, 3, 1, 17, 5, 1, 4, [1, 2], [0, 1], [0, 1], [1, 1], 1),
        (1, 2, 3, 3, 2, 5, 5, [3, 3], [4, 4], [2, 2], [1, 1], 1),
        (0, 4, 5, 5, 6, 3, 3, [2, 2], [1, 1], [1, 1], [1, 1], 2),
        // small input planes: a batch's images folded into one GEMM
        (4, 6, 2, 2, 5, 3, 3, [1, 1], [1, 1], [0, 0], [1, 1], 1),
        (3, 4, 3, 3, 6, 3, 3, [2, 2], [1, 1], [1, 1], [1, 1], 2),
        (5, 8, 2, 3, 4, 2, 2, [2, 2], [0, 0], [0, 0], [2, 1], 1),
    ];

    fn tshape(c: TCase) -> ConvTranspose2dShape {
        let (n, c_in, h, w, c_out, kh, kw, stride, padding, output_padding, dilation, groups) = c;
        let size = |i: usize, d: usize, k: usize| {
            (i - 1) * stride[d] + dilation[d] * (k - 1) + output_padding[d] + 1 - 2 * padding[d]
        };
        ConvTranspose2dShape {
            n,
            c_in,
            h,
            w,
            c_out,
            kh,
            kw,
            stride,
            padding,
            output_padding,
            dilation,
            groups,
            h_out: size(h, 0, kh),
            w_out: size(w, 1, kw),
        }
    }

    #[test]
    fn conv_transpose2d_matches_naive() {
        for &c in TCASES {
            let s = tshape(c);
            let x = data(s.n * s.c_in * s.h * s.w, 4);
            let w = data(s.c_in * (s.c_out / s.groups) * s.kh * s.kw, 5);
            let b = data(s.c_out, 6);
            for with_bias in [false, true] {
                let bias = with_bias.then_some(&b[..]);
                let want = naive_conv_transpose2d(&s, &x, &w, bias);
                for plan in [
                    DEFAULT_PLAN,
                    Plan {
                        scratch_bytes: 64,
                        outer: Some(false),
                    },
                    Plan {
                        scratch_bytes: 96,
                        outer: Some(true),
                    },
                    // folded: one image per run
                    Plan {
                        scratch_bytes: 64,
                        outer: None,
                    },
                ] {
                    let ctx = format!("{s:?} bias={with_bias} {plan:?}");
                    let mut got = vec![f64::NAN; want.len()];
                    conv_transpose2d_planned(&s, &x, &w, bias, &mut got, plan);
                    assert_close(&got, &want, 1e-12, &ctx);
                    let f = |v: &[f64]| v.iter().map(|&e| e as f32).collect::<Vec<f32>>();
                    let mut got32 = vec![f32::NAN; want.len()];
                    let b32 = f(&b);
                    conv_transpose2d_planned(
                        &s,
                        &f(&x),
                        &f(&w),
                        with_bias.then_some(&b32[..]),
                        &mut got32,
                        plan,
                    );
                    let got32: Vec<f64> = got32.iter().map(|&e| e as f64).collect();
                    assert_close(&got32, &want, 1e-5, &format!("f32 {ctx}"));
                }
            }
        }
    }

    #[test]
    fn conv_transpose2d_large_layer_runs_parallel_paths() {
        let s = tshape((1, 32, 20, 20, 16, 4, 4, [2, 2], [1, 1], [0, 0], [1, 1], 1));
        let x = data(s.n * s.c_in * s.h * s.w, 7);
        let w = data(s.c_in * s.c_out * s.kh * s.kw, 8);
        let want = naive_conv_transpose2d(&s, &x, &w, None);
        let mut got = vec![0.0; want.len()];
        conv_transpose2d(&s, &x, &w, None, &mut got);
        assert_close(&got, &want, 1e-12, "large transposed");
    }

    #[test]
    fn valid_range_edges() {
        assert_eq!(valid_range(-1, 1, 5, 5), (1, 5));
        assert_eq!(valid_range(-1, 2, 5, 3), (1, 3));
        assert_eq!(valid_range(2, 2, 5, 4), (0, 2));
        assert_eq!(valid_range(-7, 2, 5, 3), (3, 3));
        assert_eq!(valid_range(5, 1, 5, 3), (0, 0));
    }
}
