//! Indexing: index_select/embedding, gather, advanced indexing, scatter and index_put.
//!
//! These move whole elements, so they work on bytes and serve every dtype. Index values are read as
//! i64 (int32 indices are widened), negative values wrap as in Python, and an out-of-range index is an
//! error returned to Python (an IndexError there), never a read outside the tensor.

use super::elementwise::View;
use super::strided::load_run;
use crate::plan::DType;
use crate::threads;

fn wrap(i: i64, size: usize, what: &str) -> Result<isize, String> {
    let s = size as i64;
    let j = if i < 0 { i + s } else { i };
    if j < 0 || j >= s {
        return Err(format!(
            "{what}: index {i} is out of bounds for dimension of size {size}"
        ));
    }
    Ok(j as isize)
}

/// Reads index element `i` of a contiguous or strided 1-D walk: `offset` is an element offset.
#[inline]
unsafe fn index_at(v: &View, offset: isize) -> i64 {
    let mut x = [0i64; 1];
    load_run(v.dtype, v.ptr, offset, 1, &mut x);
    x[0]
}

#[inline]
unsafe fn copy_elem(dst: *mut u8, src: *const u8, size: usize) {
    std::ptr::copy_nonoverlapping(src, dst, size);
}

fn unravel(mut lin: usize, shape: &[usize], idx: &mut [usize]) {
    for d in (0..shape.len()).rev() {
        idx[d] = lin % shape[d];
        lin /= shape[d];
    }
}

fn dot(idx: &[usize], strides: &[isize]) -> isize {
    idx.iter().zip(strides).map(|(&i, &s)| i as isize * s).sum()
}

/// `out[o, i, n] = input[o, index[i], n]` for contiguous `input` `[outer, size, inner]` and contiguous `out`.
///
/// # Safety
/// Pointers valid for the given extents; `index` is 1-D with `nidx` elements.
pub unsafe fn index_select(
    input: &View,
    in_shape: &[usize],
    dim: usize,
    index: &View,
    nidx: usize,
    out: &View,
) -> Result<(), String> {
    let esize = input.dtype.size();
    let outer: usize = in_shape[..dim].iter().product();
    let size = in_shape[dim];
    let inner: usize = in_shape[dim + 1..].iter().product();
    let mut rows = Vec::with_capacity(nidx);
    for i in 0..nidx {
        rows.push(wrap(
            index_at(index, i as isize * index.strides[0]),
            size,
            "index_select",
        )?);
    }
    let bytes = inner * esize;
    let (src, dst) = (input.ptr as usize, out.ptr as usize);
    let job = |k: usize| {
        let (o, i) = (k / nidx, k % nidx);
        let s = src + (o * size + rows[i] as usize) * bytes;
        let d = dst + (o * nidx + i) * bytes;
        // SAFETY: both ranges are inside their tensors (index checked above) and the tensors are distinct.
        unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, bytes) };
    };
    if outer * nidx * bytes < (1 << 16) {
        (0..outer * nidx).for_each(job);
    } else {
        threads::par_ranges(outer * nidx, 16, |lo, hi| (lo..hi).for_each(&job));
    }
    Ok(())
}

/// torch.gather: `out[m] = input[m with m[dim] = index[m]]`; `out` contiguous with `shape` (= index's shape).
///
/// # Safety
/// Views valid for their shapes.
pub unsafe fn gather(
    input: &View,
    in_shape: &[usize],
    index: &View,
    out: &View,
    shape: &[usize],
    dim: usize,
) -> Result<(), String> {
    let esize = input.dtype.size();
    let total: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for lin in 0..total {
        unravel(lin, shape, &mut idx);
        let j = wrap(
            index_at(index, dot(&idx, &index.strides)),
            in_shape[dim],
            "gather",
        )?;
        let mut src = dot(&idx, &input.strides);
        src += (j - idx[dim] as isize) * input.strides[dim];
        copy_elem(
            out.ptr.add(lin * esize),
            input.ptr.offset(src * esize as isize),
            esize,
        );
    }
    Ok(())
}

/// Advanced indexing with `k` index tensors (broadcast to `bshape`) on consecutive dims `first..first+k`.
/// `out` is contiguous `in_shape[..first] ++ bshape ++ in_shape[first+k..]`.
///
/// # Safety
/// Views valid for their shapes.
pub unsafe fn advanced_index(
    input: &View,
    in_shape: &[usize],
    indices: &[View],
    bshape: &[usize],
    first: usize,
    out: &View,
) -> Result<(), String> {
    let esize = input.dtype.size();
    let k = indices.len();
    let pre = &in_shape[..first];
    let post = &in_shape[first + k..];
    let npre: usize = pre.iter().product();
    let nb: usize = bshape.iter().product();
    let npost: usize = post.iter().product();
    if npre * nb * npost == 0 {
        return Ok(());
    }
    // the source offset each broadcast index position selects, checked once (not once per `pre` row)
    let mut picked = Vec::with_capacity(nb);
    let mut bi = vec![0usize; bshape.len()];
    for b in 0..nb {
        unravel(b, bshape, &mut bi);
        let mut off = 0isize;
        for (j, iv) in indices.iter().enumerate() {
            let v = wrap(
                index_at(iv, dot(&bi, &iv.strides)),
                in_shape[first + j],
                "index",
            )?;
            off += v * input.strides[first + j];
        }
        picked.push(off);
    }
    let mut pi = vec![0usize; pre.len()];
    let pre_offsets: Vec<isize> = (0..npre)
        .map(|p| {
            unravel(p, pre, &mut pi);
            dot(&pi, &input.strides[..first])
        })
        .collect();
    let post_strides = &input.strides[first + k..];
    // `post` laid out densely in the input: each selected row is one run of bytes
    let mut dense = true;
    let mut expect = 1isize;
    for (&size, &stride) in post.iter().zip(post_strides).rev() {
        dense &= size == 1 || stride == expect;
        expect *= size as isize;
    }
    let (src, dst) = (input.ptr as usize, out.ptr as usize);
    let row_bytes = npost * esize;
    // rows lo..hi in order: (p, b) steps without a division per row
    let copy_rows = |lo: usize, hi: usize| {
        let mut qi = vec![0usize; post.len()];
        let (mut p, mut b) = (lo / nb, lo % nb);
        for r in lo..hi {
            let from = (src as isize + (pre_offsets[p] + picked[b]) * esize as isize) as *const u8;
            let to = (dst + r * row_bytes) as *mut u8;
            // SAFETY: offsets were checked in range above; the output holds npre * nb rows of row_bytes
            unsafe {
                match (npost, esize) {
                    (1, 4) => {
                        (to as *mut u32).write_unaligned((from as *const u32).read_unaligned())
                    }
                    (1, 8) => {
                        (to as *mut u64).write_unaligned((from as *const u64).read_unaligned())
                    }
                    (1, 2) => {
                        (to as *mut u16).write_unaligned((from as *const u16).read_unaligned())
                    }
                    _ if dense => std::ptr::copy_nonoverlapping(from, to, row_bytes),
                    _ => {
                        for q in 0..npost {
                            unravel(q, post, &mut qi);
                            let at = from.offset(dot(&qi, post_strides) * esize as isize);
                            copy_elem(to.add(q * esize), at, esize);
                        }
                    }
                }
            }
            b += 1;
            if b == nb {
                (p, b) = (p + 1, 0);
            }
        }
    };
    let rows = npre * nb;
    if rows * row_bytes < (1 << 16) {
        copy_rows(0, rows);
    } else {
        threads::par_ranges(rows, (4096 / npost).max(1), copy_rows);
    }
    Ok(())
}

/// Adds or stores one element of `dtype` at `dst` from `src`.
#[inline]
unsafe fn put(dtype: DType, dst: *mut u8, src: *const u8, accumulate: bool) {
    if !accumulate {
        return copy_elem(dst, src, dtype.size());
    }
    match dtype {
        DType::F32 => *(dst as *mut f32) += *(src as *const f32),
        DType::F64 => *(dst as *mut f64) += *(src as *const f64),
        DType::F16 => {
            let d = dst as *mut half::f16;
            *d = half::f16::from_f32((*d).to_f32() + (*(src as *const half::f16)).to_f32());
        }
        DType::Bf16 => {
            let d = dst as *mut half::bf16;
            *d = half::bf16::from_f32((*d).to_f32() + (*(src as *const half::bf16)).to_f32());
        }
        DType::I64 => *(dst as *mut i64) = (*(dst as *mut i64)).wrapping_add(*(src as *const i64)),
        DType::I32 => *(dst as *mut i32) = (*(dst as *mut i32)).wrapping_add(*(src as *const i32)),
        DType::I16 => *(dst as *mut i16) = (*(dst as *mut i16)).wrapping_add(*(src as *const i16)),
        DType::I8 => *(dst as *mut i8) = (*(dst as *mut i8)).wrapping_add(*(src as *const i8)),
        DType::U8 => *dst = (*dst).wrapping_add(*src),
        DType::Bool => *dst |= *src,
    }
}

/// torch.scatter / scatter_add in place on `out`: for every element m of `index` (shape `shape`),
/// `out[m with m[dim] = index[m]] (+)= src[m]`.
///
/// # Safety
/// Views valid for their shapes; `src` has the same dtype as `out`.
pub unsafe fn scatter(
    out: &View,
    out_shape: &[usize],
    index: &View,
    src: &View,
    shape: &[usize],
    dim: usize,
    accumulate: bool,
) -> Result<(), String> {
    let esize = out.dtype.size() as isize;
    let total: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for lin in 0..total {
        unravel(lin, shape, &mut idx);
        let j = wrap(
            index_at(index, dot(&idx, &index.strides)),
            out_shape[dim],
            "scatter",
        )?;
        let mut dst = dot(&idx, &out.strides);
        dst += (j - idx[dim] as isize) * out.strides[dim];
        let s = dot(&idx, &src.strides);
        put(
            out.dtype,
            out.ptr.offset(dst * esize),
            src.ptr.offset(s * esize),
            accumulate,
        );
    }
    Ok(())
}

/// How `scatter_reduce` combines the values landing on one element.
pub use crate::plan::ScatterReduce;

/// `scatter_reduce` in place on `out` (contiguous f32 or f64, holding `self`): every `src` element
/// lands where `scatter` would put it and is combined there by `op`. Without `include_self`, an
/// element some value lands on starts from the first of them instead of its own value; `mean`
/// divides by how many values landed (plus one with `include_self`). NaN propagates through
/// `amax`/`amin`, as in PyTorch.
///
/// # Safety
/// Views valid for their shapes; `out` contiguous and of `out_numel` f32 or f64 elements; `src` of
/// `out`'s dtype.
#[allow(clippy::too_many_arguments)]
pub unsafe fn scatter_reduce(
    out: &View,
    out_shape: &[usize],
    index: &View,
    src: &View,
    shape: &[usize],
    dim: usize,
    op: ScatterReduce,
    include_self: bool,
) -> Result<(), String> {
    let n_out: usize = out_shape.iter().product();
    let read = |p: *const u8, at: isize| -> f64 {
        match out.dtype {
            DType::F64 => *(p as *const f64).offset(at),
            _ => *(p as *const f32).offset(at) as f64,
        }
    };
    let mut acc: Vec<f64> = (0..n_out as isize).map(|i| read(out.ptr, i)).collect();
    let mut count = vec![u32::from(include_self); n_out];
    let mut touched = vec![false; n_out];
    let total: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for lin in 0..total {
        unravel(lin, shape, &mut idx);
        let j = wrap(
            index_at(index, dot(&idx, &index.strides)),
            out_shape[dim],
            "scatter_reduce",
        )?;
        let mut dst = dot(&idx, &out.strides);
        dst += (j - idx[dim] as isize) * out.strides[dim];
        let dst = dst as usize;
        let v = read(src.ptr, dot(&idx, &src.strides));
        let first = !include_self && !touched[dst];
        touched[dst] = true;
        count[dst] += 1;
        let a = &mut acc[dst];
        *a = if first {
            v
        } else {
            match op {
                ScatterReduce::Sum | ScatterReduce::Mean => *a + v,
                ScatterReduce::Prod => *a * v,
                ScatterReduce::Amax if a.is_nan() || v.is_nan() => f64::NAN,
                ScatterReduce::Amin if a.is_nan() || v.is_nan() => f64::NAN,
                ScatterReduce::Amax => a.max(v),
                ScatterReduce::Amin => a.min(v),
            }
        };
    }
    for (i, a) in acc.iter().enumerate() {
        let value = if op == ScatterReduce::Mean && count[i] > 0 {
            a / count[i] as f64
        } else {
            *a
        };
        match out.dtype {
            DType::F64 => *(out.ptr as *mut f64).add(i) = value,
            _ => *(out.ptr as *mut f32).add(i) = value as f32,
        }
    }
    Ok(())
}

/// index_put in place on `out`: `out[idx0, ..., idx(k-1), rest...] (+)= values` where the index tensors
/// (broadcast to `bshape`) address the leading k dims and `values` is broadcast to `bshape ++ rest`.
///
/// # Safety
/// Views valid for their shapes; `values` has the same dtype as `out`.
pub unsafe fn index_put(
    out: &View,
    out_shape: &[usize],
    indices: &[View],
    bshape: &[usize],
    values: &View,
    accumulate: bool,
) -> Result<(), String> {
    let esize = out.dtype.size() as isize;
    let k = indices.len();
    let post = &out_shape[k..];
    let nb: usize = bshape.iter().product();
    let npost: usize = post.iter().product();
    let mut bi = vec![0usize; bshape.len()];
    let mut qi = vec![0usize; post.len()];
    let nbd = bshape.len();
    for b in 0..nb {
        unravel(b, bshape, &mut bi);
        let mut off = 0isize;
        for (j, iv) in indices.iter().enumerate() {
            let v = wrap(
                index_at(iv, dot(&bi, &iv.strides)),
                out_shape[j],
                "index_put",
            )?;
            off += v * out.strides[j];
        }
        for q in 0..npost {
            unravel(q, post, &mut qi);
            let dst = off + dot(&qi, &out.strides[k..]);
            let s = dot(&bi, &values.strides[..nbd]) + dot(&qi, &values.strides[nbd..]);
            put(
                out.dtype,
                out.ptr.offset(dst * esize),
                values.ptr.offset(s * esize),
                accumulate,
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedding_rows_and_negative_and_bad_index() {
        let mut w: Vec<f32> = (0..12).map(|i| i as f32).collect(); // 4 rows of 3
        let mut idx: Vec<i64> = vec![2, 0, -1];
        let mut out = vec![0f32; 9];
        let wv = View::new(w.as_mut_ptr() as *mut u8, DType::F32, &[4, 3], &[3, 1]);
        let iv = View::new(idx.as_mut_ptr() as *mut u8, DType::I64, &[3], &[1]);
        let ov = View::new(out.as_mut_ptr() as *mut u8, DType::F32, &[3, 3], &[3, 1]);
        unsafe { index_select(&wv, &[4, 3], 0, &iv, 3, &ov).unwrap() };
        assert_eq!(out, vec![6.0, 7.0, 8.0, 0.0, 1.0, 2.0, 9.0, 10.0, 11.0]);
        idx[1] = 4;
        let err = unsafe { index_select(&wv, &[4, 3], 0, &iv, 3, &ov) }.unwrap_err();
        assert!(err.contains("index 4 is out of bounds"), "{err}");
    }

    #[test]
    fn scatter_add_with_duplicates() {
        let mut out = vec![0f32; 4];
        let mut idx: Vec<i64> = vec![1, 1, 3];
        let mut src = vec![1.0f32, 2.0, 5.0];
        let ov = View::new(out.as_mut_ptr() as *mut u8, DType::F32, &[4], &[1]);
        let iv = View::new(idx.as_mut_ptr() as *mut u8, DType::I64, &[3], &[1]);
        let sv = View::new(src.as_mut_ptr() as *mut u8, DType::F32, &[3], &[1]);
        unsafe { scatter(&ov, &[4], &iv, &sv, &[3], 0, true).unwrap() };
        assert_eq!(out, vec![0.0, 3.0, 0.0, 5.0]);
    }
}
