//! 2-D upsampling over contiguous `[planes, h, w]` memory (`planes = n·c`): bilinear, nearest and
//! nearest-exact, with PyTorch's source positions (`aten/src/ATen/native/UpSample.h`: the scale from
//! the caller's factor when it gave one, otherwise from the sizes; half-pixel centres unless
//! `align_corners`; an output as large as its input copies it).
//!
//! Bilinear interpolation is separable: each output row blends two input rows, each of them first
//! interpolated along the width. An input row's width pass is kept while consecutive output rows read
//! it (an upscale by two reads every input row for two or three output rows), so the gathers run
//! about once per input row and the per-output work is one vectorizable blend of two rows. Output rows
//! are split into tasks across planes.

use crate::kernels::conv::{numel, ConvScalar};
use crate::threads;
use torchburn_native_macros::isa_versions;

/// Output elements below which a task is not worth its hand-off.
const TASK_MIN_WORK: usize = 1 << 15;

/// How output positions map to input positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Two taps per dim, weights by distance.
    Bilinear { align_corners: bool },
    /// `floor(dst · scale)` (PyTorch's legacy `nearest`).
    Nearest,
    /// `floor((dst + 0.5) · scale)`, the pixel centre (`nearest-exact`).
    NearestExact,
}

/// Shape of an upsampling and the scale factors the caller gave (`None`: from the sizes).
#[derive(Clone, Copy, Debug)]
pub struct Upsample2dShape {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub h_out: usize,
    pub w_out: usize,
    pub scales: [Option<f64>; 2],
}

/// Element types the resampling kernels run on, with the float arithmetic of their source positions.
pub trait ResampleScalar: ConvScalar {
    fn from_f64(v: f64) -> Self;
    /// `floor(self)` as an index, for a non-negative finite value.
    fn floor_index(self) -> usize;
    fn max(self, other: Self) -> Self;
    fn min(self, other: Self) -> Self;
}

macro_rules! impl_resample_scalar {
    ($t:ty) => {
        impl ResampleScalar for $t {
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn floor_index(self) -> usize {
                self.floor() as usize
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            #[inline(always)]
            fn min(self, other: Self) -> Self {
                <$t>::min(self, other)
            }
        }
    };
}
impl_resample_scalar!(f32);
impl_resample_scalar!(f64);

/// PyTorch's `compute_scales_value`: `1 / scale` when a positive factor was given, else in / out.
fn scale_value<T: ResampleScalar>(scale: Option<f64>, input: usize, output: usize) -> T {
    match scale {
        Some(s) if s > 0.0 => T::from_f64(1.0 / s),
        _ => T::from_i64(input as i64) / T::from_i64(output as i64),
    }
}

/// Taps and weights of one dim of a bilinear resampling: output `o` reads `i0[o]` with weight
/// `1 - l[o]` and `i1[o]` with weight `l[o]`.
struct LinearTaps<T> {
    i0: Vec<usize>,
    i1: Vec<usize>,
    l0: Vec<T>,
    l1: Vec<T>,
}

fn linear_taps<T: ResampleScalar>(
    input: usize,
    output: usize,
    align_corners: bool,
    scale: Option<f64>,
) -> LinearTaps<T> {
    let mut taps = LinearTaps {
        i0: Vec::with_capacity(output),
        i1: Vec::with_capacity(output),
        l0: Vec::with_capacity(output),
        l1: Vec::with_capacity(output),
    };
    let ratio: T = if align_corners {
        if output > 1 {
            T::from_i64(input as i64 - 1) / T::from_i64(output as i64 - 1)
        } else {
            T::ZERO
        }
    } else {
        scale_value(scale, input, output)
    };
    let half = T::from_f64(0.5);
    for o in 0..output {
        let (i0, l1) = if output == input {
            (o, T::ZERO)
        } else {
            let dst = T::from_i64(o as i64);
            let real = if align_corners {
                ratio * dst
            } else {
                // half-pixel centres, clamped at the first pixel
                (ratio * (dst + half) - half).max(T::ZERO)
            };
            let i0 = real.floor_index().min(input - 1);
            (i0, (real - T::from_i64(i0 as i64)).max(T::ZERO).min(T::ONE))
        };
        taps.i0.push(i0);
        taps.i1.push(if i0 < input - 1 { i0 + 1 } else { i0 });
        taps.l0.push(T::ONE - l1);
        taps.l1.push(l1);
    }
    taps
}

/// PyTorch's `nearest_idx` / `nearest_exact_idx`, in `f32` as PyTorch computes them.
fn nearest_taps(input: usize, output: usize, scale: Option<f64>, exact: bool) -> Vec<usize> {
    let scale: f32 = scale_value(scale, input, output);
    (0..output)
        .map(|o| {
            if !exact && output == input {
                o
            } else if !exact && output == 2 * input {
                o >> 1
            } else {
                let dst = o as f32 + if exact { 0.5 } else { 0.0 };
                ((dst * scale).floor() as usize).min(input - 1)
            }
        })
        .collect()
}

/// `out[p, oy, ox]` from `input[p, ·, ·]` by `mode`. `input` and `out` are contiguous.
pub fn upsample2d<T: ResampleScalar>(s: &Upsample2dShape, mode: Mode, input: &[T], out: &mut [T]) {
    const WHAT: &str = "upsample2d";
    let want_in = numel(WHAT, &[s.planes, s.h, s.w]);
    let want_out = numel(WHAT, &[s.planes, s.h_out, s.w_out]);
    assert!(
        input.len() == want_in && out.len() == want_out,
        "{WHAT}: operands have {} and {} elements, the shapes need {want_in} and {want_out}",
        input.len(),
        out.len()
    );
    if out.is_empty() {
        return;
    }
    assert!(
        s.h > 0 && s.w > 0,
        "{WHAT}: input planes must not be empty, got {}x{}",
        s.h,
        s.w
    );
    let rows_per_task = TASK_MIN_WORK / s.w_out + 1;
    match mode {
        Mode::Bilinear { align_corners } => {
            let ys = linear_taps::<T>(s.h, s.h_out, align_corners, s.scales[0]);
            let xs = linear_taps::<T>(s.w, s.w_out, align_corners, s.scales[1]);
            threads::par_chunks_mut(out, rows_per_task * s.w_out, |t, o| {
                bilinear_rows(s, &ys, &xs, t * rows_per_task, input, o)
            });
        }
        Mode::Nearest | Mode::NearestExact => {
            let exact = mode == Mode::NearestExact;
            let ys = nearest_taps(s.h, s.h_out, s.scales[0], exact);
            let xs = nearest_taps(s.w, s.w_out, s.scales[1], exact);
            threads::par_chunks_mut(out, rows_per_task * s.w_out, |t, o| {
                nearest_rows(s, &ys, &xs, t * rows_per_task, input, o)
            });
        }
    }
}

/// Output rows `first..` (global row index `plane · h_out + oy`) of a bilinear resampling.
fn bilinear_rows<T: ResampleScalar>(
    s: &Upsample2dShape,
    ys: &LinearTaps<T>,
    xs: &LinearTaps<T>,
    first: usize,
    input: &[T],
    out: &mut [T],
) {
    // two width-interpolated input rows, tagged with the (plane, input row) they hold
    let mut rows = [vec![T::ZERO; s.w_out], vec![T::ZERO; s.w_out]];
    let mut held: [Option<(usize, usize)>; 2] = [None, None];
    for (r, orow) in out.chunks_exact_mut(s.w_out).enumerate() {
        let (plane, oy) = ((first + r) / s.h_out, (first + r) % s.h_out);
        let x = &input[plane * s.h * s.w..][..s.h * s.w];
        let want = [(plane, ys.i0[oy]), (plane, ys.i1[oy])];
        // keep a held row that is still wanted in the slot that wants it
        if held[0] != Some(want[0]) && held[1] == Some(want[0]) {
            rows.swap(0, 1);
            held.swap(0, 1);
        }
        for k in 0..2 {
            if held[k] != Some(want[k]) {
                let iy = want[k].1;
                width_pass(&x[iy * s.w..][..s.w], xs, &mut rows[k]);
                held[k] = Some(want[k]);
            }
        }
        blend_rows(&rows[0], &rows[1], ys.l0[oy], ys.l1[oy], orow);
    }
}

#[isa_versions]
fn width_pass<T: ResampleScalar>(row: &[T], xs: &LinearTaps<T>, out: &mut [T]) {
    let n = out.len();
    let (i0, i1, l0, l1) = (&xs.i0[..n], &xs.i1[..n], &xs.l0[..n], &xs.l1[..n]);
    for o in 0..n {
        out[o] = l0[o] * row[i0[o]] + l1[o] * row[i1[o]];
    }
}

#[isa_versions]
fn blend_rows<T: ResampleScalar>(a: &[T], b: &[T], wa: T, wb: T, out: &mut [T]) {
    let n = out.len();
    let (a, b) = (&a[..n], &b[..n]);
    for o in 0..n {
        out[o] = wa * a[o] + wb * b[o];
    }
}

/// Output rows `first..` of a nearest resampling; a row that repeats the one before is copied.
fn nearest_rows<T: ResampleScalar>(
    s: &Upsample2dShape,
    ys: &[usize],
    xs: &[usize],
    first: usize,
    input: &[T],
    out: &mut [T],
) {
    let mut previous: Option<(usize, usize)> = None;
    for r in 0..out.len() / s.w_out {
        let (plane, oy) = ((first + r) / s.h_out, (first + r) % s.h_out);
        let source = (plane, ys[oy]);
        if previous == Some(source) {
            out.copy_within((r - 1) * s.w_out..r * s.w_out, r * s.w_out);
        } else {
            let row = &input[(plane * s.h + ys[oy]) * s.w..][..s.w];
            pick_columns(row, xs, &mut out[r * s.w_out..][..s.w_out]);
        }
        previous = Some(source);
    }
}

#[isa_versions]
fn pick_columns<T: ResampleScalar>(row: &[T], xs: &[usize], out: &mut [T]) {
    for (o, &i) in out.iter_mut().zip(xs) {
        *o = row[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(h: usize, w: usize, h_out: usize, w_out: usize) -> Upsample2dShape {
        Upsample2dShape {
            planes: 2,
            h,
            w,
            h_out,
            w_out,
            scales: [None, None],
        }
    }

    #[test]
    fn bilinear_by_hand() {
        // a 1x2 row upsampled to 1x4 with half-pixel centres: sources -0.25 (clamped to 0), 0.25,
        // 0.75, 1.25 (the last pixel twice)
        let s = Upsample2dShape {
            planes: 1,
            ..shape(1, 2, 1, 4)
        };
        let mut out = [0f32; 4];
        upsample2d(
            &s,
            Mode::Bilinear {
                align_corners: false,
            },
            &[0.0, 4.0],
            &mut out,
        );
        assert_eq!(out, [0.0, 1.0, 3.0, 4.0]);
        upsample2d(
            &s,
            Mode::Bilinear {
                align_corners: true,
            },
            &[0.0, 3.0],
            &mut out,
        );
        assert_eq!(out, [0.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn bilinear_matches_the_direct_formula() {
        let s = shape(5, 7, 11, 9);
        let input: Vec<f64> = (0..2 * 5 * 7).map(|i| ((i * 37) % 23) as f64).collect();
        let mut out = vec![0f64; 2 * 11 * 9];
        upsample2d(
            &s,
            Mode::Bilinear {
                align_corners: false,
            },
            &input,
            &mut out,
        );
        let ys = linear_taps::<f64>(5, 11, false, None);
        let xs = linear_taps::<f64>(7, 9, false, None);
        for p in 0..2 {
            for oy in 0..11 {
                for ox in 0..9 {
                    let at = |y: usize, x: usize| input[(p * 5 + y) * 7 + x];
                    let want = ys.l0[oy]
                        * (xs.l0[ox] * at(ys.i0[oy], xs.i0[ox])
                            + xs.l1[ox] * at(ys.i0[oy], xs.i1[ox]))
                        + ys.l1[oy]
                            * (xs.l0[ox] * at(ys.i1[oy], xs.i0[ox])
                                + xs.l1[ox] * at(ys.i1[oy], xs.i1[ox]));
                    let got = out[(p * 11 + oy) * 9 + ox];
                    assert!((got - want).abs() < 1e-12, "{p} {oy} {ox}: {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn nearest_sources() {
        assert_eq!(nearest_taps(3, 6, None, false), [0, 0, 1, 1, 2, 2]);
        assert_eq!(nearest_taps(4, 3, None, false), [0, 1, 2]);
        assert_eq!(nearest_taps(4, 3, None, true), [0, 2, 3]);
        let s = shape(2, 2, 3, 3);
        let input: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let mut out = vec![0f32; 18];
        upsample2d(&s, Mode::Nearest, &input, &mut out);
        assert_eq!(&out[..9], &[0., 0., 1., 0., 0., 1., 2., 2., 3.]);
        assert_eq!(&out[9..], &[4., 4., 5., 4., 4., 5., 6., 6., 7.]);
    }
}
