//! The weight gradient of a 2-D convolution, read straight from the forward's NCHW input and the
//! NCHW output gradient:
//!
//! `out[o, c, a, b] = Σ_n Σ_(i, j) x[n, c, i·s + a·d - p, j·s + b·d - p] · grad[n, o, i, j]`
//!
//! with the forward's stride `s`, dilation `d` and padding `p`. Core writes this product as a
//! convolution whose batch is the input's channels and whose kernel is the gradient (the batch and
//! channel dims of both operands swapped); run that way, each "image" is one input channel and
//! every unfolded row is as short as the kernel's plane. Here the input is unfolded exactly as the
//! forward convolution unfolds it (rows = taps of a channel, columns = output positions, as long
//! as the output plane) and the gradient of each image is a ready GEMM operand, so the whole
//! gradient is one product per block of channels: `[c_out, positions] · [positions, c·taps]`,
//! accumulated over runs of images that share an unfolded buffer.

use super::conv::{im2col_row, ConvScalar, Geom, SCRATCH_BYTES};
use crate::kernels::gemm::{gemm, Mat, MatMut};
use crate::threads;
use std::ops::Range;

/// Shape of a weight gradient: input `[n, c_in, h, w]`, gradient `[n, c_out, h_out, w_out]`,
/// out `[c_out, c_in, kh, kw]`. `kh`/`kw` may exceed the forward's kernel (core's product has
/// as many taps as fit its geometry; the caller narrows them away).
#[derive(Clone, Copy, Debug)]
pub struct ConvWeightGradShape {
    pub n: usize,
    pub c_in: usize,
    pub h: usize,
    pub w: usize,
    pub c_out: usize,
    pub h_out: usize,
    pub w_out: usize,
    pub kh: usize,
    pub kw: usize,
    /// The forward convolution's.
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

/// Below this many multiply-adds the gradient runs on the calling thread.
const PARALLEL_MIN_FLOPS: usize = 1 << 20;

/// Gradients up to this size split the batch's images between threads, each summing into its own
/// copy (added up at the end); larger ones split their channels, so no copy is needed.
const IMAGE_SPLIT_MAX_OUT_BYTES: usize = 1 << 20;

/// The weight gradient of [`ConvWeightGradShape`]; every slice contiguous and exactly as long as
/// its shape.
pub fn conv2d_weight_grad<T: ConvScalar>(
    s: &ConvWeightGradShape,
    input: &[T],
    grad: &[T],
    out: &mut [T],
) {
    planned(s, input, grad, out, SCRATCH_BYTES)
}

fn check_len<T>(name: &str, slice: &[T], dims: &[usize]) {
    let want = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .unwrap_or_else(|| panic!("conv2d_weight_grad: {name} of shape {dims:?} overflows"));
    assert_eq!(
        slice.len(),
        want,
        "conv2d_weight_grad: {name} has {} elements, its shape {dims:?} needs {want}",
        slice.len()
    );
}

fn planned<T: ConvScalar>(
    s: &ConvWeightGradShape,
    input: &[T],
    grad: &[T],
    out: &mut [T],
    scratch_bytes: usize,
) {
    assert!(
        s.stride.iter().chain(&s.dilation).all(|&v| v > 0),
        "conv2d_weight_grad: stride {:?} and dilation {:?} must be positive",
        s.stride,
        s.dilation
    );
    check_len("input", input, &[s.n, s.c_in, s.h, s.w]);
    check_len("grad", grad, &[s.n, s.c_out, s.h_out, s.w_out]);
    check_len("out", out, &[s.c_out, s.c_in, s.kh, s.kw]);
    let taps = s.kh * s.kw;
    let positions = s.h_out * s.w_out;
    let width = s.c_in * taps;
    if out.is_empty() {
        return;
    }
    if s.n == 0 || positions == 0 {
        out.fill(T::ZERO);
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
    let size = std::mem::size_of::<T>();
    let threads = threads::current();
    let flops = s.n * positions * s.c_out * width;
    let parallel = threads > 1 && flops >= PARALLEL_MIN_FLOPS;
    let out_bytes = std::mem::size_of_val(out);
    if parallel
        && s.n >= threads
        && (s.c_in < 2 * threads || out_bytes <= IMAGE_SPLIT_MAX_OUT_BYTES)
    {
        // a small gradient: each thread sums its own images into its own copy, then one adds them
        let per = s.n.div_ceil(threads);
        let parts = s.n.div_ceil(per);
        let mut partials = vec![T::ZERO; (parts - 1) * out.len()];
        let out_ptr = SyncPtr(out.as_mut_ptr());
        let partial_ptr = SyncPtr(partials.as_mut_ptr());
        threads::parallel_for(parts, |t| {
            let dst = if t == 0 {
                out_ptr.get()
            } else {
                // SAFETY: part t owns the (t-1)-th out-sized slice of `partials`
                unsafe { partial_ptr.get().add((t - 1) * width * s.c_out) }
            };
            let images = t * per..((t + 1) * per).min(s.n);
            // SAFETY: `dst` is an out-sized buffer only this part writes
            unsafe {
                accumulate(
                    s,
                    &g,
                    input,
                    grad,
                    dst,
                    images,
                    0..s.c_in,
                    scratch_bytes,
                    false,
                )
            };
        });
        for part in partials.chunks_exact(out.len()) {
            for (o, &v) in out.iter_mut().zip(part) {
                *o += v;
            }
        }
        return;
    }
    // else blocks of channels, each a column block of the product: as many as the scratch needs,
    // and a multiple of the thread count where there are channels enough
    let channel_image = taps * positions * size;
    let mut blocks = s.c_in.div_ceil((scratch_bytes / channel_image).max(1));
    if parallel && s.c_in >= threads {
        blocks = blocks.div_ceil(threads) * threads;
    }
    let per_block = s.c_in.div_ceil(blocks.min(s.c_in));
    let blocks = s.c_in.div_ceil(per_block);
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let block = |blk: usize, parallel: bool| {
        let channels = blk * per_block..((blk + 1) * per_block).min(s.c_in);
        // SAFETY: the block writes only its own columns of `out`
        unsafe {
            accumulate(
                s,
                &g,
                input,
                grad,
                out_ptr.get(),
                0..s.n,
                channels,
                scratch_bytes,
                parallel,
            )
        };
    };
    if parallel && blocks >= threads {
        threads::parallel_for(blocks, |i| block(i, false));
    } else {
        (0..blocks).for_each(|i| block(i, parallel));
    }
}

/// Writes `Σ_(n in images)` of the gradient's columns for `channels` into the row-major
/// `[c_out, c_in·taps]` output at `out`: runs of images that share one unfolded buffer in the
/// scratch, one GEMM each, the first overwriting and the rest accumulating.
///
/// # Safety
/// `out` must be valid for the whole output, and no one else may touch these columns meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate<T: ConvScalar>(
    s: &ConvWeightGradShape,
    g: &Geom,
    input: &[T],
    grad: &[T],
    out: *mut T,
    images: Range<usize>,
    channels: Range<usize>,
    scratch_bytes: usize,
    parallel: bool,
) {
    let taps = s.kh * s.kw;
    let positions = s.h_out * s.w_out;
    let (plane_in, width) = (s.h * s.w, s.c_in * taps);
    let rows = channels.len() * taps;
    // images per unfolded buffer, balanced so that the last run is not a sliver
    let run_bytes = rows * positions * std::mem::size_of::<T>();
    let fit = (scratch_bytes / run_bytes.max(1)).clamp(1, images.len().max(1));
    let runs = images.len().div_ceil(fit);
    let per_run = images.len().div_ceil(runs.max(1)).max(1);
    for b0 in images.clone().step_by(per_run) {
        let b1 = (b0 + per_run).min(images.end);
        let cols = (b1 - b0) * positions;
        let gathered = if b1 - b0 > 1 { s.c_out * cols } else { 0 };
        T::with_scratch(rows * cols + gathered, |buf| {
            let (col, lhs) = buf.split_at_mut(rows * cols);
            // [c·taps, (image, position)]: rows of these channels, images side by side
            for (r, row) in col.chunks_exact_mut(cols).enumerate() {
                let (c, tap) = (channels.start + r / taps, r % taps);
                for (b, dst) in (b0..b1).zip(row.chunks_exact_mut(positions)) {
                    let x = &input[(b * s.c_in + c) * plane_in..][..plane_in];
                    im2col_row(g, x, tap / s.kw, tap % s.kw, 0, dst);
                }
            }
            // [c_out, (image, position)]: one image's gradient as it lies, several side by side
            let a = if gathered == 0 {
                &grad[b0 * s.c_out * positions..][..s.c_out * positions]
            } else {
                for (o, row) in lhs.chunks_exact_mut(cols).enumerate() {
                    for (b, dst) in (b0..b1).zip(row.chunks_exact_mut(positions)) {
                        dst.copy_from_slice(&grad[(b * s.c_out + o) * positions..][..positions]);
                    }
                }
                &*lhs
            };
            // SAFETY: `a` is c_out×cols row-major, `col` rows×cols row-major (read transposed as
            // cols×rows), and the output block is columns channels.start·taps.. of the row-major
            // [c_out, width] output, this caller's alone (the function's contract).
            unsafe {
                gemm(
                    s.c_out,
                    rows,
                    cols,
                    Mat {
                        ptr: a.as_ptr(),
                        rs: cols as isize,
                        cs: 1,
                    },
                    Mat {
                        ptr: col.as_ptr(),
                        rs: 1,
                        cs: cols as isize,
                    },
                    MatMut {
                        ptr: out.add(channels.start * taps),
                        rs: width as isize,
                        cs: 1,
                    },
                    b0 > images.start,
                    T::ONE,
                    parallel,
                )
            };
        });
    }
}

/// The output pointer shared by blocks that write disjoint columns of it.
#[derive(Clone, Copy)]
struct SyncPtr<T>(*mut T);

// SAFETY: blocks write disjoint column ranges of one `&mut [T]` that outlives them.
unsafe impl<T: Send> Send for SyncPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// A method, so closures capture the whole (Sync) wrapper rather than the raw pointer field.
    fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv::tests::{assert_close, data};

    fn naive(s: &ConvWeightGradShape, x: &[f64], g: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; s.c_out * s.c_in * s.kh * s.kw];
        for o in 0..s.c_out {
            for c in 0..s.c_in {
                for a in 0..s.kh {
                    for b in 0..s.kw {
                        let mut acc = 0.0;
                        for n in 0..s.n {
                            for i in 0..s.h_out {
                                for j in 0..s.w_out {
                                    let y = (i * s.stride[0] + a * s.dilation[0]) as isize
                                        - s.padding[0] as isize;
                                    let xx = (j * s.stride[1] + b * s.dilation[1]) as isize
                                        - s.padding[1] as isize;
                                    if y < 0 || xx < 0 || y >= s.h as isize || xx >= s.w as isize {
                                        continue;
                                    }
                                    let xv = x
                                        [((n * s.c_in + c) * s.h + y as usize) * s.w + xx as usize];
                                    acc += xv * g[((n * s.c_out + o) * s.h_out + i) * s.w_out + j];
                                }
                            }
                        }
                        out[((o * s.c_in + c) * s.kh + a) * s.kw + b] = acc;
                    }
                }
            }
        }
        out
    }

    /// (n, c_in, h, w, c_out, kh, kw, stride, padding, dilation)
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
    );

    fn shape(c: Case) -> ConvWeightGradShape {
        let (n, c_in, h, w, c_out, kh, kw, stride, padding, dilation) = c;
        let size = |i: usize, d: usize, k: usize| {
            (i + 2 * padding[d] - dilation[d] * (k - 1) - 1) / stride[d] + 1
        };
        ConvWeightGradShape {
            n,
            c_in,
            h,
            w,
            c_out,
            h_out: size(h, 0, kh),
            w_out: size(w, 1, kw),
            kh,
            kw,
            stride,
            padding,
            dilation,
        }
    }

    #[test]
    fn weight_grad_matches_naive() {
        let cases: &[Case] = &[
            (2, 3, 6, 6, 4, 3, 3, [1, 1], [1, 1], [1, 1]),
            (3, 5, 7, 5, 2, 3, 2, [2, 1], [1, 0], [1, 1]),
            (1, 4, 9, 9, 3, 3, 3, [2, 2], [2, 2], [2, 2]),
            (4, 2, 2, 2, 6, 3, 3, [1, 1], [1, 1], [1, 1]),
            (2, 3, 11, 10, 5, 7, 7, [2, 2], [3, 3], [1, 1]),
            (5, 6, 4, 4, 3, 1, 1, [1, 1], [0, 0], [1, 1]),
            (2, 4, 8, 8, 3, 2, 3, [3, 2], [0, 1], [1, 2]),
        ];
        for &c in cases {
            let s = shape(c);
            let x = data(s.n * s.c_in * s.h * s.w, 11);
            let g = data(s.n * s.c_out * s.h_out * s.w_out, 12);
            let want = naive(&s, &x, &g);
            // the default buffer, and tiny ones: one channel and one image per product
            for scratch in [SCRATCH_BYTES, 1, 8 * s.kh * s.kw * s.h_out * s.w_out * 2] {
                let ctx = format!("{s:?} scratch={scratch}");
                let mut got = vec![f64::NAN; want.len()];
                planned(&s, &x, &g, &mut got, scratch);
                assert_close(&got, &want, 1e-12, &ctx);
                let f = |v: &[f64]| v.iter().map(|&e| e as f32).collect::<Vec<f32>>();
                let mut got32 = vec![f32::NAN; want.len()];
                planned(&s, &f(&x), &f(&g), &mut got32, scratch);
                let got32: Vec<f64> = got32.iter().map(|&e| e as f64).collect();
                assert_close(&got32, &want, 1e-5, &format!("f32 {ctx}"));
            }
        }
    }

    #[test]
    fn weight_grad_large_layers_run_parallel_paths() {
        // a small gradient (images split between threads) and a large one (channels split)
        for c in [
            (4, 16, 12, 12, 24, 3, 3, [1, 1], [1, 1], [1, 1]),
            (2, 128, 4, 4, 128, 3, 3, [1, 1], [1, 1], [1, 1]),
        ] {
            let s = shape(c);
            let x = data(s.n * s.c_in * s.h * s.w, 13);
            let g = data(s.n * s.c_out * s.h_out * s.w_out, 14);
            let want = naive(&s, &x, &g);
            let mut got = vec![f64::NAN; want.len()];
            conv2d_weight_grad(&s, &x, &g, &mut got);
            assert_close(&got, &want, 1e-12, &format!("{s:?}"));
        }
    }

    #[test]
    fn weight_grad_of_an_empty_batch_is_zero() {
        let s = shape((0, 2, 4, 4, 3, 3, 3, [1, 1], [1, 1], [1, 1]));
        let mut got = vec![f32::NAN; 2 * 3 * 9];
        conv2d_weight_grad::<f32>(&s, &[], &[], &mut got);
        assert!(got.iter().all(|&v| v == 0.0));
    }
}
