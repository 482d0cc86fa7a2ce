//! "Same" convolutions (stride 1, no dilation, padding `k/2`, odd kernels, one group) as a sum of
//! shifted GEMMs, with no im2col.
//!
//! With the input planes zero-padded to `[c_in, h + 2·ph, w + 2·pw]`, tap `(ki, kj)` of the kernel
//! reads, for output row `y` and column `x`, padded element `(y + ki, x + kj)`: over the flattened
//! padded planes that is one constant shift `ki·wp + kj`. So the output, computed on the padded
//! grid's width `wp` (the `wp - w` columns past each row's end are junk and dropped), is
//! `Σ_tap W_tap · shift(padded, tap)`: `kh·kw` GEMMs of `[c_out, c_in]` by a `[c_in, rows·wp]`
//! window that lies in the padded planes as it is, each accumulating onto one block held in cache.
//! Against im2col + GEMM this skips writing and re-reading the `kh·kw`-times larger unfolded
//! matrix; it pays `wp / w` in columns, so it is meant for planes well wider than the kernel.
//!
//! The weight is read tap-major, `[kh·kw, c_out, c_in]`: a copy the planner keeps per version of
//! the weight (as it does for Linear weights), since repacking it per call would cost as much as
//! the padding saves.
//!
//! Threads: images in turn; within an image, the padded copy by planes in parallel, then one band of
//! output rows per thread (more, narrower bands where a band's accumulator would outgrow
//! [`ACC_BYTES`]), each running its GEMMs single-threaded. The padded copy of one image is kept in a
//! per-thread buffer between calls; the planner takes this path only while that copy is small.

use crate::kernels::conv::{numel, Conv2dShape, ConvScalar, Epilogue};
use crate::kernels::gemm::{gemm, Mat, MatMut};
use crate::threads::{self, SendPtr};

/// Largest accumulator block of one band of output rows, in bytes: it is read and written once per
/// tap, so it should stay in a core's L2 (ResNet-18's bands take 100-420 KiB).
const ACC_BYTES: usize = 2 << 20;

/// Whether [`conv2d_shifted`] computes this convolution.
pub fn applies(s: &Conv2dShape) -> bool {
    s.groups == 1
        && s.stride == [1, 1]
        && s.dilation == [1, 1]
        && s.kh % 2 == 1
        && s.kw % 2 == 1
        && s.padding == [s.kh / 2, s.kw / 2]
        && s.h_out == s.h
        && s.w_out == s.w
}

/// 2-D convolution for shapes [`applies`] accepts: input NCHW `[n, c_in, h, w]`, `taps`
/// `[kh·kw, c_out, c_in]` (the weight `[c_out, c_in, kh, kw]` with its kernel dimensions moved
/// first), bias `[c_out]`, out `[n, c_out, h, w]`; every slice contiguous and exactly as long as its
/// shape. Panics otherwise.
pub fn conv2d_shifted<T: ConvScalar>(
    s: &Conv2dShape,
    input: &[T],
    taps: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
) {
    conv2d_shifted_with(s, input, taps, bias, out, &Epilogue::NONE)
}

/// [`conv2d_shifted`] followed by `epi` on each output row as it is copied out of the accumulator.
pub fn conv2d_shifted_with<T: ConvScalar>(
    s: &Conv2dShape,
    input: &[T],
    taps: &[T],
    bias: Option<&[T]>,
    out: &mut [T],
    epi: &Epilogue<'_, T>,
) {
    const WHAT: &str = "conv2d (shifted)";
    assert!(
        applies(s),
        "{WHAT}: shape {s:?} is not a stride-1 'same' convolution"
    );
    let exact = |name: &str, got: usize, dims: &[usize]| {
        let want = numel(WHAT, dims);
        assert_eq!(
            got, want,
            "{WHAT}: {name} has {got} elements, its shape needs {want}"
        );
    };
    let Conv2dShape {
        n,
        c_in,
        h,
        w,
        c_out,
        kh,
        kw,
        ..
    } = *s;
    exact("input", input.len(), &[n, c_in, h, w]);
    exact("taps", taps.len(), &[kh * kw, c_out, c_in]);
    exact("out", out.len(), &[n, c_out, h, w]);
    if let Some(b) = bias {
        exact("bias", b.len(), &[c_out]);
    }
    epi.check(c_out, out.len());
    if out.is_empty() {
        return;
    }
    let (ph, pw) = (kh / 2, kw / 2);
    let (hp, wp) = (h + 2 * ph, w + 2 * pw);
    // the last tap's window runs `kw - 1` elements past a padded plane: slack, kept zero
    let plane = hp * wp + kw - 1;
    let threads = threads::current();
    // one band of rows per thread, narrowed so that its accumulator stays within ACC_BYTES
    let fit = (ACC_BYTES / std::mem::size_of::<T>() / (c_out * wp).max(1)).max(1);
    let rows_per_band = h.div_ceil(threads.min(h).max(1)).min(fit);
    let bands = h.div_ceil(rows_per_band);
    let out_ptr = SendPtr(out.as_mut_ptr());
    T::with_shared_scratch(c_in * plane, |padded| {
        for b in 0..n {
            let x = &input[b * c_in * h * w..][..c_in * h * w];
            let pad_plane = |c: usize, dst: &mut [T]| {
                dst.fill(T::ZERO);
                for (y, src) in x[c * h * w..][..h * w].chunks_exact(w).enumerate() {
                    dst[(y + ph) * wp + pw..][..w].copy_from_slice(src);
                }
            };
            if threads > 1 && c_in > 1 {
                threads::par_chunks_mut_min(padded, plane, 4, pad_plane);
            } else {
                padded
                    .chunks_exact_mut(plane)
                    .enumerate()
                    .for_each(|(c, d)| pad_plane(c, d));
            }
            let padded: &[T] = padded;
            let band = |i: usize| {
                let (y0, y1) = (i * rows_per_band, ((i + 1) * rows_per_band).min(h));
                let cols = (y1 - y0) * wp;
                T::with_scratch(c_out * cols, |acc| {
                    for (t, tap) in taps.chunks_exact(c_out * c_in).enumerate() {
                        let (ki, kj) = (t / kw, t % kw);
                        // SAFETY: tap is c_out×c_in; the window's c_in rows of `cols` elements,
                        // `plane` apart, start at (y0 + ki)·wp + kj and end at most at
                        // hp·wp + kw - 1 = plane (see above); acc is c_out×cols.
                        unsafe {
                            gemm(
                                c_out,
                                cols,
                                c_in,
                                Mat {
                                    ptr: tap.as_ptr(),
                                    rs: c_in as isize,
                                    cs: 1,
                                },
                                Mat {
                                    ptr: padded.as_ptr().add((y0 + ki) * wp + kj),
                                    rs: plane as isize,
                                    cs: 1,
                                },
                                MatMut {
                                    ptr: acc.as_mut_ptr(),
                                    rs: cols as isize,
                                    cs: 1,
                                },
                                t > 0,
                                T::ONE,
                                false,
                            )
                        };
                    }
                    // each row's first w columns, plus the bias, into the output
                    for o in 0..c_out {
                        let add = bias.map_or(T::ZERO, |bv| bv[o]);
                        for y in y0..y1 {
                            let src = &acc[o * cols + (y - y0) * wp..][..w];
                            // SAFETY: row y of channel o of image b, inside `out`; bands own
                            // disjoint rows and `out` outlives them all
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut(
                                    out_ptr.get().add(((b * c_out + o) * h + y) * w),
                                    w,
                                )
                            };
                            for (d, &v) in dst.iter_mut().zip(src) {
                                *d = v + add;
                            }
                            epi.apply(o, ((b * c_out + o) * h + y) * w, dst);
                        }
                    }
                });
            };
            if threads > 1 && bands > 1 {
                threads::parallel_for(bands, band);
            } else {
                (0..bands).for_each(band);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv::conv2d;
    use crate::kernels::testing::uniform;

    fn data(len: usize, seed: u64) -> Vec<f32> {
        uniform(len, seed).map(|u| (u * 2.0 - 1.0) as f32).collect()
    }

    #[test]
    fn epilogue_matches_the_im2col_convolution_with_it() {
        use crate::kernels::conv::conv2d_with;
        let (n, c_in, c_out, h, w, k) = (2, 5, 6, 13, 9, 3);
        let s = Conv2dShape {
            n,
            c_in,
            h,
            w,
            c_out,
            kh: k,
            kw: k,
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
            h_out: h,
            w_out: w,
        };
        let x = data(n * c_in * h * w, 1);
        let wt = data(c_out * c_in * k * k, 2);
        let mut taps = vec![0f32; wt.len()];
        for o in 0..c_out {
            for i in 0..c_in {
                for t in 0..k * k {
                    taps[(t * c_out + o) * c_in + i] = wt[(o * c_in + i) * k * k + t];
                }
            }
        }
        let (scale, shift, res) = (data(c_out, 3), data(c_out, 4), data(n * c_out * h * w, 5));
        for (norm, residual, relu) in [
            (true, true, true),
            (true, false, true),
            (false, true, false),
        ] {
            let epi = Epilogue {
                scale_shift: norm.then_some((&scale[..], &shift[..])),
                residual: residual.then_some(&res[..]),
                relu,
            };
            let mut want = vec![0f32; res.len()];
            conv2d_with(&s, &x, &wt, None, &mut want, &epi);
            let mut got = vec![f32::NAN; res.len()];
            conv2d_shifted_with(&s, &x, &taps, None, &mut got, &epi);
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-5 * (1.0 + e.abs()),
                    "{epi:?} at {i}: {g} vs {e}"
                );
            }
        }
    }

    #[test]
    fn matches_the_im2col_convolution() {
        // (n, c_in, c_out, h, w, kh, kw): odd and non-square planes, 5×5 and 1×3 kernels, batches
        for (n, c_in, c_out, h, w, kh, kw) in [
            (1, 3, 4, 5, 7, 3, 3),
            (2, 8, 5, 9, 6, 3, 3),
            (1, 4, 3, 11, 13, 5, 5),
            (3, 2, 6, 4, 9, 1, 3),
            (1, 16, 16, 1, 1, 3, 3),
            // c_out·wp large enough that a band's accumulator is capped at a few rows
            (1, 2, 1024, 40, 300, 3, 3),
        ] {
            let s = Conv2dShape {
                n,
                c_in,
                h,
                w,
                c_out,
                kh,
                kw,
                stride: [1, 1],
                padding: [kh / 2, kw / 2],
                dilation: [1, 1],
                groups: 1,
                h_out: h,
                w_out: w,
            };
            assert!(applies(&s));
            let x = data(n * c_in * h * w, 1 + h as u64);
            let wt = data(c_out * c_in * kh * kw, 2 + w as u64);
            let bias = data(c_out, 3);
            // taps[t][o][c] = weight[o][c][t]
            let taps: Vec<f32> = (0..kh * kw)
                .flat_map(|t| {
                    let wt = &wt;
                    (0..c_out * c_in).map(move |oc| wt[oc * kh * kw + t])
                })
                .collect();
            let mut want = vec![0f32; n * c_out * h * w];
            conv2d(&s, &x, &wt, Some(&bias), &mut want);
            let mut got = vec![f32::NAN; want.len()];
            conv2d_shifted(&s, &x, &taps, Some(&bias), &mut got);
            for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() < 1e-4 * (1.0 + e.abs()),
                    "{s:?} out[{i}]: {g} vs {e}"
                );
            }
        }
    }

    #[test]
    fn other_shapes_are_not_taken() {
        let base = Conv2dShape {
            n: 1,
            c_in: 4,
            h: 8,
            w: 8,
            c_out: 4,
            kh: 3,
            kw: 3,
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
            h_out: 8,
            w_out: 8,
        };
        assert!(applies(&base));
        let strided = Conv2dShape {
            stride: [2, 2],
            h_out: 4,
            w_out: 4,
            ..base
        };
        let valid = Conv2dShape {
            padding: [0, 0],
            h_out: 6,
            w_out: 6,
            ..base
        };
        let grouped = Conv2dShape { groups: 2, ..base };
        let even = Conv2dShape {
            kh: 2,
            kw: 2,
            padding: [1, 1],
            h_out: 9,
            w_out: 9,
            ..base
        };
        for s in [strided, valid, grouped, even] {
            assert!(!applies(&s), "{s:?}");
        }
    }
}
