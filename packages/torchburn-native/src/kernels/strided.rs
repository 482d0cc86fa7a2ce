//! Walking strided views in runs along the innermost dimension, and typed load/store of those runs.
//!
//! Every kernel that accepts arbitrary strides goes through here, so a transposed, sliced, expanded or
//! offset tensor is read in place: no contiguous copy is made at the boundary.

use half::{bf16, f16};

use super::prefetch;
use crate::plan::DType;

pub const MAX_RANK: usize = 16;

/// How an operand's elements line up with the iteration order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// strides equal the contiguous strides of the iteration shape: one run per chunk
    Contiguous,
    /// every stride is 0: one value for the whole iteration
    Scalar,
    General,
}

pub fn layout_of(shape: &[usize], strides: &[isize]) -> Layout {
    if strides.iter().zip(shape).all(|(&s, &n)| s == 0 || n == 1) {
        return Layout::Scalar;
    }
    let mut expected = 1isize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expected {
            return Layout::General;
        }
        expected *= n as isize;
    }
    Layout::Contiguous
}

/// Calls `f(position_in_chunk, element_offset, run_length, inner_stride)` for each run of the chunk
/// `[start, start + len)` of the row-major iteration over `shape`.
#[inline(always)]
pub fn for_runs(
    shape: &[usize],
    strides: &[isize],
    layout: Layout,
    start: usize,
    len: usize,
    mut f: impl FnMut(usize, isize, usize, isize),
) {
    match layout {
        Layout::Contiguous => return f(0, start as isize, len, 1),
        Layout::Scalar => return f(0, 0, len, 0),
        Layout::General => {}
    }
    let rank = shape.len();
    let mut idx = [0usize; MAX_RANK];
    let mut rem = start;
    let mut off = 0isize;
    for d in (0..rank).rev() {
        idx[d] = rem % shape[d];
        rem /= shape[d];
        off += idx[d] as isize * strides[d];
    }
    let last = shape[rank - 1];
    let ls = strides[rank - 1];
    let mut pos = 0;
    while pos < len {
        let run = (last - idx[rank - 1]).min(len - pos);
        f(pos, off, run, ls);
        pos += run;
        off += run as isize * ls;
        idx[rank - 1] += run;
        if idx[rank - 1] == last && pos < len {
            off -= last as isize * ls;
            idx[rank - 1] = 0;
            let mut d = rank - 1;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                off += strides[d];
                if idx[d] < shape[d] {
                    break;
                }
                off -= shape[d] as isize * strides[d];
                idx[d] = 0;
            }
        }
    }
}

/// A compute type the elementwise machine works in (f32, f64 or i64), with conversions from and to
/// every storage dtype. Conversions follow PyTorch: float→int truncates, anything→bool is `!= 0`.
pub trait Lane: Copy + Send + Sync + Default + PartialEq + 'static {
    /// The storage dtype whose elements are this type exactly (read in place, without conversion).
    const STORAGE: DType;
    fn from_f32(v: f32) -> Self;
    fn from_f64(v: f64) -> Self;
    fn from_i64(v: i64) -> Self;
    fn to_f32(self) -> f32;
    fn to_f64(self) -> f64;
    fn to_i64(self) -> i64;
    fn is_nonzero(self) -> bool;
    /// A literal from the program: floats take the f64 form, integers the exact i64 form.
    fn constant(value: f64, ivalue: i64) -> Self;
}

impl Lane for f32 {
    const STORAGE: DType = DType::F32;
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn is_nonzero(self) -> bool {
        self != 0.0
    }
    #[inline(always)]
    fn constant(value: f64, ivalue: i64) -> Self {
        let _ = (value, ivalue);
        value as f32
    }
}

impl Lane for f64 {
    const STORAGE: DType = DType::F64;
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn is_nonzero(self) -> bool {
        self != 0.0
    }
    #[inline(always)]
    fn constant(value: f64, ivalue: i64) -> Self {
        let _ = (value, ivalue);
        value
    }
}

impl Lane for i64 {
    const STORAGE: DType = DType::I64;
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as i64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as i64
    }
    #[inline(always)]
    fn from_i64(v: i64) -> Self {
        v
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self
    }
    #[inline(always)]
    fn is_nonzero(self) -> bool {
        self != 0
    }
    #[inline(always)]
    fn constant(value: f64, ivalue: i64) -> Self {
        let _ = (value, ivalue);
        ivalue
    }
}

/// # Safety
/// `p.offset(off + i * stride)` must be readable for `i < out.len()`.
#[inline(always)]
unsafe fn read_run<S: Copy, T: Copy>(
    p: *const S,
    off: isize,
    stride: isize,
    out: &mut [T],
    f: impl Fn(S) -> T,
) {
    if stride == 1 {
        let src = std::slice::from_raw_parts(p.offset(off), out.len());
        let line = prefetch::elems_per_line(src);
        let n = out.len();
        let mut i = 0;
        while i + line <= n {
            prefetch::read_ahead(src.as_ptr().add(i));
            for j in i..i + line {
                *out.get_unchecked_mut(j) = f(*src.get_unchecked(j));
            }
            i += line;
        }
        for j in i..n {
            *out.get_unchecked_mut(j) = f(*src.get_unchecked(j));
        }
    } else if stride == 0 {
        let v = f(*p.offset(off));
        out.fill(v);
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            *o = f(*p.offset(off + i as isize * stride));
        }
    }
}

/// # Safety
/// `p.offset(off + i * stride)` must be writable for `i < src.len()`.
#[inline(always)]
unsafe fn write_run<S: Copy, T: Copy>(
    p: *mut S,
    off: isize,
    stride: isize,
    src: &[T],
    f: impl Fn(T) -> S,
) {
    if stride == 1 {
        let dst = std::slice::from_raw_parts_mut(p.offset(off), src.len());
        let line = prefetch::elems_per_line(dst);
        let n = src.len();
        let mut i = 0;
        while i + line <= n {
            prefetch::write_ahead(dst.as_ptr().add(i));
            for j in i..i + line {
                *dst.get_unchecked_mut(j) = f(*src.get_unchecked(j));
            }
            i += line;
        }
        for j in i..n {
            *dst.get_unchecked_mut(j) = f(*src.get_unchecked(j));
        }
    } else {
        for (i, &s) in src.iter().enumerate() {
            *p.offset(off + i as isize * stride) = f(s);
        }
    }
}

/// Reads `out.len()` elements of storage type `dtype` starting at element `off` of `base`.
///
/// # Safety
/// The run must lie inside the buffer `base` points to.
#[inline(always)]
pub unsafe fn load_run<T: Lane>(
    dtype: DType,
    base: *const u8,
    off: isize,
    stride: isize,
    out: &mut [T],
) {
    match dtype {
        DType::F32 => read_run(base as *const f32, off, stride, out, T::from_f32),
        DType::F64 => read_run(base as *const f64, off, stride, out, T::from_f64),
        DType::F16 => read_run(base as *const f16, off, stride, out, |v| {
            T::from_f32(v.to_f32())
        }),
        DType::Bf16 => read_run(base as *const bf16, off, stride, out, |v| {
            T::from_f32(v.to_f32())
        }),
        DType::I64 => read_run(base as *const i64, off, stride, out, T::from_i64),
        DType::I32 => read_run(base as *const i32, off, stride, out, |v| {
            T::from_i64(v as i64)
        }),
        DType::I16 => read_run(base as *const i16, off, stride, out, |v| {
            T::from_i64(v as i64)
        }),
        DType::I8 => read_run(base as *const i8, off, stride, out, |v| {
            T::from_i64(v as i64)
        }),
        DType::U8 | DType::Bool => read_run(base, off, stride, out, |v| T::from_i64(v as i64)),
    }
}

/// Writes `src` converted to storage type `dtype` starting at element `off` of `base`.
///
/// # Safety
/// The run must lie inside the buffer `base` points to.
#[inline(always)]
pub unsafe fn store_run<T: Lane>(
    dtype: DType,
    base: *mut u8,
    off: isize,
    stride: isize,
    src: &[T],
) {
    match dtype {
        DType::F32 => write_run(base as *mut f32, off, stride, src, T::to_f32),
        DType::F64 => write_run(base as *mut f64, off, stride, src, T::to_f64),
        DType::F16 => write_run(base as *mut f16, off, stride, src, |v| {
            f16::from_f32(v.to_f32())
        }),
        DType::Bf16 => write_run(base as *mut bf16, off, stride, src, |v| {
            bf16::from_f32(v.to_f32())
        }),
        DType::I64 => write_run(base as *mut i64, off, stride, src, T::to_i64),
        DType::I32 => write_run(base as *mut i32, off, stride, src, |v| v.to_i64() as i32),
        DType::I16 => write_run(base as *mut i16, off, stride, src, |v| v.to_i64() as i16),
        DType::I8 => write_run(base as *mut i8, off, stride, src, |v| v.to_i64() as i8),
        DType::U8 => write_run(base, off, stride, src, |v| v.to_i64() as u8),
        DType::Bool => write_run(base, off, stride, src, |v| v.is_nonzero() as u8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_a_transposed_view_in_order() {
        // a 3×4 row-major matrix read as its 4×3 transpose
        let shape = [4usize, 3];
        let strides = [1isize, 4];
        let mut seen = vec![];
        for_runs(
            &shape,
            &strides,
            layout_of(&shape, &strides),
            2,
            7,
            |pos, off, len, st| {
                for i in 0..len {
                    seen.push((pos + i, off + i as isize * st));
                }
            },
        );
        let want: Vec<(usize, isize)> = (2..9)
            .map(|l| (l - 2, ((l % 3) * 4 + l / 3) as isize))
            .collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn layouts() {
        assert_eq!(layout_of(&[2, 3], &[3, 1]), Layout::Contiguous);
        assert_eq!(layout_of(&[2, 3], &[0, 0]), Layout::Scalar);
        assert_eq!(layout_of(&[2, 3], &[0, 1]), Layout::General);
        assert_eq!(layout_of(&[1, 3], &[7, 1]), Layout::Contiguous);
    }
}
