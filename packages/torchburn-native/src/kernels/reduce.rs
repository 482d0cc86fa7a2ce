//! Reductions over the trailing dimensions of a strided view (sum, mean, prod, max/min, arg*, any/all, var).
//!
//! Python permutes the reduced dims to the back (a stride permutation, no copy), so every reduction here
//! is "for each kept index, fold the trailing block". Floats accumulate in f64 per output element, which
//! keeps sums of millions of f32 values exact to f32 precision without a cascade.
//!
//! f32 sums and variances (means, batch norm statistics, `var_mean`) read their runs in place and
//! accumulate them in f64 vector lanes ([`moments_f32`]); every other case stages each chunk as f64
//! first. A variance can also write its mean (`var_mean` in one pass over memory: the second pass of
//! the two-pass variance reads a block the first has just brought into cache).

use super::elementwise::View;
use super::strided::{for_runs, layout_of, load_run, store_run, Layout};
use crate::plan::{DType, ReduceKind};
use crate::threads;
use torchburn_native_macros::isa_versions;

const CHUNK: usize = 1024;

pub struct ReduceArgs<'a> {
    pub input: &'a View,
    pub in_shape: &'a [usize],
    pub kept: usize,
    pub out: &'a View,
    pub op: ReduceKind,
    pub scale: f64,
    pub correction: f64,
    /// `Var` only: where each block's mean goes too (contiguous, as `out`)
    pub mean_out: Option<&'a View>,
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::Bf16)
}

/// # Safety
/// `input` must be valid for `in_shape`, `out` for `in_shape[..kept]` (contiguous), and disjoint.
pub unsafe fn reduce(a: &ReduceArgs<'_>) -> Result<(), String> {
    let kept_shape = &a.in_shape[..a.kept];
    let red_shape = &a.in_shape[a.kept..];
    let kept_strides = &a.input.strides[..a.kept];
    let red_strides = &a.input.strides[a.kept..];
    let outer: usize = kept_shape.iter().product();
    let inner: usize = red_shape.iter().product();
    if outer == 0 {
        return Ok(());
    }
    if inner == 0
        && matches!(
            a.op,
            ReduceKind::Max | ReduceKind::Min | ReduceKind::ArgMax | ReduceKind::ArgMin
        )
    {
        return Err(format!("{:?} of an empty dimension has no identity", a.op));
    }
    // reduce over a rank-1 view when there is nothing to reduce, so for_runs always has a dimension
    let (red_shape, red_strides) = coalesce(red_shape, red_strides);
    let red_layout = layout_of(&red_shape, &red_strides);
    let float = is_float(a.input.dtype);
    let one = |o: usize| {
        // offset of this kept index
        let mut rem = o;
        let mut off = 0isize;
        for d in (0..kept_shape.len()).rev() {
            off += (rem % kept_shape[d]) as isize * kept_strides[d];
            rem /= kept_shape[d];
        }
        let base = a.input.ptr.offset(off * a.input.dtype.size() as isize);
        let (fv, iv, mean) =
            if a.input.dtype == DType::F32 && matches!(a.op, ReduceKind::Sum | ReduceKind::Var) {
                let var = a.op == ReduceKind::Var;
                let (sum, m2) = moments_f32(
                    base as *const f32,
                    &red_shape,
                    &red_strides,
                    red_layout,
                    inner,
                    var,
                );
                if var {
                    (variance(a, m2, inner), 0, sum / inner as f64)
                } else {
                    (sum * a.scale, 0, 0.0)
                }
            } else if float {
                fold_float(a, base, &red_shape, &red_strides, red_layout, inner)
            } else {
                let (fv, iv) = fold_int(a, base, &red_shape, &red_strides, red_layout, inner);
                (fv, iv, 0.0)
            };
        if let Some(m) = a.mean_out {
            store_run::<f64>(m.dtype, m.ptr, o as isize, 1, &[mean]);
        }
        let out_ptr = a.out.ptr;
        match a.out.dtype {
            DType::I64 if matches!(a.op, ReduceKind::ArgMax | ReduceKind::ArgMin) => {
                *(out_ptr as *mut i64).add(o) = iv;
            }
            dt if is_float(dt) => store_run::<f64>(dt, out_ptr, o as isize, 1, &[fv]),
            dt => store_run::<i64>(dt, out_ptr, o as isize, 1, &[iv]),
        }
    };
    let cost = outer.saturating_mul(inner.max(1));
    if cost < (1 << 15) || threads::current() == 1 {
        (0..outer).for_each(one);
    } else {
        threads::par_ranges(outer, 1, |lo, hi| (lo..hi).for_each(&one));
    }
    Ok(())
}

fn variance(a: &ReduceArgs<'_>, m2: f64, inner: usize) -> f64 {
    let dof = inner as f64 - a.correction;
    let var = if dof > 0.0 { m2 / dof } else { f64::NAN };
    var * a.scale
}

/// The sum of one f32 block and, when `var`, the sum of its squared deviations from its mean (two
/// passes; the second finds blocks of up to a few hundred KiB still in cache), both in f64.
#[inline]
unsafe fn moments_f32(
    base: *const f32,
    shape: &[usize],
    strides: &[isize],
    layout: Layout,
    inner: usize,
    var: bool,
) -> (f64, f64) {
    let sum = fold_runs(base, shape, strides, layout, inner, sum_f32, |v| v);
    if !var {
        return (sum, 0.0);
    }
    let mean = sum / inner as f64;
    let m2 = fold_runs(
        base,
        shape,
        strides,
        layout,
        inner,
        |run| squared_deviations_f32(run, mean),
        |v| (v - mean) * (v - mean),
    );
    (sum, m2)
}

/// One pass over the runs of an f32 block: `lanes` on unit-stride runs long enough to fill its
/// accumulators, the sum of `term` of each element on the others.
///
/// # Safety
/// Every run of `shape`/`strides` from `base` must be readable.
#[inline(always)]
unsafe fn fold_runs(
    base: *const f32,
    shape: &[usize],
    strides: &[isize],
    layout: Layout,
    inner: usize,
    lanes: impl Fn(&[f32]) -> f64,
    term: impl Fn(f64) -> f64,
) -> f64 {
    let mut acc = 0.0;
    for_runs(shape, strides, layout, 0, inner, |_, off, len, st| {
        acc += if st == 1 && len >= LANES {
            lanes(std::slice::from_raw_parts(base.offset(off), len))
        } else {
            (0..len as isize)
                .map(|i| term(*base.offset(off + i * st) as f64))
                .sum::<f64>()
        };
    });
    acc
}

/// f64 lanes kept by the f32 folds: four AVX-512 (eight AVX2) accumulators, enough independent
/// adds to cover the add latency.
const LANES: usize = 32;

/// The sum of `term` of each element of `x`, widened to f64, in `LANES` accumulators; inlined into
/// each ISA version of its callers.
#[inline(always)]
fn fold_lanes(x: &[f32], term: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0f64; LANES];
    let mut blocks = x.chunks_exact(LANES);
    for block in &mut blocks {
        for (a, &v) in acc.iter_mut().zip(block) {
            *a += term(v as f64);
        }
    }
    let tail: f64 = blocks.remainder().iter().map(|&v| term(v as f64)).sum();
    acc.iter().sum::<f64>() + tail
}

#[isa_versions]
fn sum_f32(x: &[f32]) -> f64 {
    fold_lanes(x, |v| v)
}

#[isa_versions]
fn squared_deviations_f32(x: &[f32], mean: f64) -> f64 {
    // d * d, not powi or mul_add: without FMA (the baseline level) mul_add is a libm call per element
    fold_lanes(x, |v| (v - mean) * (v - mean))
}

/// The reduced dims with unit dims dropped and each dim merged into the one before it where the two
/// step through memory as one (batch norm's `[n, h, w]` of a channel becomes `[n, h·w]`), so that runs
/// are as long as the layout allows; never empty (`[1]` for nothing to reduce).
fn coalesce(shape: &[usize], strides: &[isize]) -> (Vec<usize>, Vec<isize>) {
    let (mut dims, mut steps): (Vec<usize>, Vec<isize>) = (vec![], vec![]);
    for (&n, &st) in shape.iter().zip(strides) {
        if n == 1 {
            continue;
        }
        match (dims.last_mut(), steps.last_mut()) {
            (Some(last), Some(step)) if *step == st * n as isize => {
                *last *= n;
                *step = st;
            }
            _ => {
                dims.push(n);
                steps.push(st);
            }
        }
    }
    if dims.is_empty() || shape.contains(&0) {
        // one element, or none (an empty block: the sum of nothing)
        return (vec![shape.iter().product()], vec![0]);
    }
    (dims, steps)
}

/// Folds one block of a float input; returns (value, index, mean) where index is used by arg*
/// reductions and mean by `Var`.
#[inline]
unsafe fn fold_float(
    a: &ReduceArgs<'_>,
    base: *const u8,
    shape: &[usize],
    strides: &[isize],
    layout: Layout,
    inner: usize,
) -> (f64, i64, f64) {
    let mut buf = [0f64; CHUNK];
    let mut sum = 0.0f64;
    let mut prod = 1.0f64;
    let mut best = match a.op {
        ReduceKind::Max | ReduceKind::ArgMax => f64::NEG_INFINITY,
        _ => f64::INFINITY,
    };
    let mut best_i: i64 = 0;
    let mut any = false;
    let mut all = true;
    let mut found_nan = false;
    let mut start = 0;
    // pass 1 (every kind); var needs the mean first, then pass 2 below
    while start < inner {
        let n = CHUNK.min(inner - start);
        let chunk = &mut buf[..n];
        for_runs(shape, strides, layout, start, n, |pos, off, len, st| {
            load_run(a.input.dtype, base, off, st, &mut chunk[pos..pos + len]);
        });
        match a.op {
            ReduceKind::Sum | ReduceKind::Var => {
                let mut lanes = [0f64; 8];
                let mut it = chunk.chunks_exact(8);
                for c in &mut it {
                    for k in 0..8 {
                        lanes[k] += c[k];
                    }
                }
                sum += lanes.iter().sum::<f64>() + it.remainder().iter().sum::<f64>();
            }
            ReduceKind::Prod => chunk.iter().for_each(|&x| prod *= x),
            ReduceKind::Max | ReduceKind::Min | ReduceKind::ArgMax | ReduceKind::ArgMin => {
                let max = matches!(a.op, ReduceKind::Max | ReduceKind::ArgMax);
                for (i, &x) in chunk.iter().enumerate() {
                    if found_nan {
                        break;
                    }
                    if x.is_nan() {
                        found_nan = true;
                        best = x;
                        best_i = (start + i) as i64;
                    } else if (max && x > best) || (!max && x < best) || (start + i == 0) {
                        best = x;
                        best_i = (start + i) as i64;
                    }
                }
            }
            ReduceKind::Any => any |= chunk.iter().any(|&x| x != 0.0),
            ReduceKind::All => all &= chunk.iter().all(|&x| x != 0.0),
        }
        start += n;
    }
    match a.op {
        ReduceKind::Sum => (sum * a.scale, 0, 0.0),
        ReduceKind::Prod => (prod * a.scale, 0, 0.0),
        ReduceKind::Max | ReduceKind::Min | ReduceKind::ArgMax | ReduceKind::ArgMin => {
            (best, best_i, 0.0)
        }
        ReduceKind::Any => (any as i64 as f64, any as i64, 0.0),
        ReduceKind::All => (all as i64 as f64, all as i64, 0.0),
        ReduceKind::Var => {
            let mean = sum / inner as f64;
            let mut m2 = 0.0f64;
            let mut start = 0;
            while start < inner {
                let n = CHUNK.min(inner - start);
                let chunk = &mut buf[..n];
                for_runs(shape, strides, layout, start, n, |pos, off, len, st| {
                    load_run(a.input.dtype, base, off, st, &mut chunk[pos..pos + len]);
                });
                m2 += chunk.iter().map(|&x| (x - mean) * (x - mean)).sum::<f64>();
                start += n;
            }
            (variance(a, m2, inner), 0, mean)
        }
    }
}

#[inline]
unsafe fn fold_int(
    a: &ReduceArgs<'_>,
    base: *const u8,
    shape: &[usize],
    strides: &[isize],
    layout: Layout,
    inner: usize,
) -> (f64, i64) {
    let mut buf = [0i64; CHUNK];
    let mut acc: i64 = match a.op {
        ReduceKind::Prod | ReduceKind::All => 1,
        ReduceKind::Max | ReduceKind::ArgMax => i64::MIN,
        ReduceKind::Min | ReduceKind::ArgMin => i64::MAX,
        _ => 0,
    };
    let mut best_i = 0i64;
    let mut start = 0;
    while start < inner {
        let n = CHUNK.min(inner - start);
        let chunk = &mut buf[..n];
        for_runs(shape, strides, layout, start, n, |pos, off, len, st| {
            load_run(a.input.dtype, base, off, st, &mut chunk[pos..pos + len]);
        });
        for (i, &x) in chunk.iter().enumerate() {
            match a.op {
                ReduceKind::Sum | ReduceKind::Var => acc = acc.wrapping_add(x),
                ReduceKind::Prod => acc = acc.wrapping_mul(x),
                ReduceKind::Max | ReduceKind::ArgMax => {
                    if x > acc || start + i == 0 {
                        acc = x;
                        best_i = (start + i) as i64;
                    }
                }
                ReduceKind::Min | ReduceKind::ArgMin => {
                    if x < acc || start + i == 0 {
                        acc = x;
                        best_i = (start + i) as i64;
                    }
                }
                ReduceKind::Any => acc |= (x != 0) as i64,
                ReduceKind::All => acc &= (x != 0) as i64,
            }
        }
        start += n;
    }
    match a.op {
        ReduceKind::ArgMax | ReduceKind::ArgMin => (acc as f64, best_i),
        // integer sums stay integers; a mean of integers is computed by the planner in float
        _ => (acc as f64 * a.scale, acc),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_over_leading_dim_of_a_matrix_and_argmax_with_nan() {
        // x: 4×3, reduce over dim 0 → permuted view [3 (kept), 4 (reduced)]
        let mut x: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let mut out = vec![0f32; 3];
        let shape = [3usize, 4];
        let strides = [1isize, 3];
        let input = View::new(x.as_mut_ptr() as *mut u8, DType::F32, &shape, &strides);
        let outv = View::new(out.as_mut_ptr() as *mut u8, DType::F32, &[3], &[1]);
        let args = ReduceArgs {
            input: &input,
            in_shape: &shape,
            kept: 1,
            out: &outv,
            op: ReduceKind::Sum,
            scale: 1.0,
            correction: 0.0,
            mean_out: None,
        };
        unsafe { reduce(&args).unwrap() };
        assert_eq!(out, vec![18.0, 22.0, 26.0]);

        x[7] = f32::NAN;
        let mut idx = vec![0i64; 4];
        let rows = View::new(x.as_mut_ptr() as *mut u8, DType::F32, &[4, 3], &[3, 1]);
        let outi = View::new(idx.as_mut_ptr() as *mut u8, DType::I64, &[4], &[1]);
        let args = ReduceArgs {
            input: &rows,
            in_shape: &[4, 3],
            kept: 1,
            out: &outi,
            op: ReduceKind::ArgMax,
            scale: 1.0,
            correction: 0.0,
            mean_out: None,
        };
        unsafe { reduce(&args).unwrap() };
        assert_eq!(idx, vec![2, 2, 1, 2]);
    }

    #[test]
    fn unbiased_variance() {
        let mut x: Vec<f64> = vec![1.0, 2.0, 3.0, 4.0];
        let mut out = vec![0f64; 1];
        let input = View::new(x.as_mut_ptr() as *mut u8, DType::F64, &[1, 4], &[4, 1]);
        let outv = View::new(out.as_mut_ptr() as *mut u8, DType::F64, &[1], &[1]);
        let args = ReduceArgs {
            input: &input,
            in_shape: &[1, 4],
            kept: 1,
            out: &outv,
            op: ReduceKind::Var,
            scale: 1.0,
            correction: 1.0,
            mean_out: None,
        };
        unsafe { reduce(&args).unwrap() };
        assert!((out[0] - 5.0 / 3.0).abs() < 1e-12);
    }

    /// f32 sums and variances (with the mean written too) over strided views, unit-stride runs and
    /// strided runs, against f64 sums of the same elements.
    #[test]
    fn f32_sum_and_variance_with_mean_over_strided_views() {
        let x: Vec<f32> = (0..5 * 7 * 70)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37 + 1000.0)
            .collect();
        // [5, 7, 70] reduced over dims 0 and 2 (kept 7), and over dim 0 alone with 7·70 kept
        let cases: [(&[usize], &[isize]); 2] =
            [(&[7, 5, 70], &[70, 490, 1]), (&[490, 5], &[1, 490])];
        for (shape, strides) in cases {
            let outer = shape[0];
            let inner: usize = shape[1..].iter().product();
            let element = |o: usize, j: usize| {
                let (mut rem, mut off) = (j, o as isize * strides[0]);
                for d in (1..shape.len()).rev() {
                    off += (rem % shape[d]) as isize * strides[d];
                    rem /= shape[d];
                }
                x[off as usize] as f64
            };
            let mut xs = x.clone();
            let input = View::new(xs.as_mut_ptr() as *mut u8, DType::F32, shape, strides);
            for op in [ReduceKind::Sum, ReduceKind::Var] {
                let (mut out, mut mean) = (vec![0f32; outer], vec![0f32; outer]);
                let outv = View::new(out.as_mut_ptr() as *mut u8, DType::F32, &[outer], &[1]);
                let meanv = View::new(mean.as_mut_ptr() as *mut u8, DType::F32, &[outer], &[1]);
                let var = op == ReduceKind::Var;
                let args = ReduceArgs {
                    input: &input,
                    in_shape: shape,
                    kept: 1,
                    out: &outv,
                    op,
                    scale: 1.0,
                    correction: 1.0,
                    mean_out: var.then_some(&meanv),
                };
                unsafe { reduce(&args).unwrap() };
                for o in 0..outer {
                    let sum: f64 = (0..inner).map(|j| element(o, j)).sum();
                    let m = sum / inner as f64;
                    let m2: f64 = (0..inner).map(|j| (element(o, j) - m).powi(2)).sum();
                    let (want, got) = if var {
                        (m2 / (inner - 1) as f64, out[o])
                    } else {
                        (sum, out[o])
                    };
                    assert!(
                        (got as f64 - want).abs() <= 1e-6 * want.abs(),
                        "{op:?} {o}: {got} vs {want}"
                    );
                    if var {
                        assert!((mean[o] as f64 - m).abs() <= 1e-6 * m.abs(), "mean {o}");
                    }
                }
            }
        }
    }
}
