//! `Matmul`: batched strided products with a fused bias, residual and activation (`kernels/gemm.rs`,
//! and `kernels/gemm_packed.rs` for a B packed by MKL); `GroupedMm`: one product per group of rows
//! (a mixture of experts).

use std::ops::Range;

use super::check::FLOATS;
use super::{Check, Frame, Instruction};
use crate::kernels::elementwise;
use crate::kernels::gemm::{gemm_hooked, BlockFn, BlockHooks, GemmScalar, Mat, MatMut};
use crate::kernels::gemm_packed;
use crate::plan::{self, DType, Operand, UnaryFn};
use crate::threads;

impl Instruction for plan::Matmul {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Matmul {
            a,
            b,
            out,
            bias,
            residual,
            b_panel,
            b_packed,
            ..
        } = self;
        if residual.as_ref().is_some_and(|r| r.shape != out.shape) {
            return Err("matmul residual must have the output's shape".into());
        }
        for op in [a, b, out].into_iter().chain(bias).chain(residual) {
            check.operand(op)?;
            if op.shape.len() != 3 || !FLOATS.contains(&op.dtype) || op.dtype != out.dtype {
                return Err("matmul operands must be 3-D f32/f64 of one dtype".into());
            }
        }
        if a.shape[2] != b.shape[1] || a.shape[1] != out.shape[1] || b.shape[2] != out.shape[2] {
            return Err("matmul shapes do not agree".into());
        }
        if a.shape[0] != out.shape[0] || b.shape[0] != out.shape[0] {
            return Err("matmul batch sizes do not agree".into());
        }
        if *b_panel > 0 {
            let (rows, cols, width) = (b.shape[1], b.shape[2], *b_panel as isize);
            if b.strides != [0, width, 1] {
                return Err("a paneled matmul operand has strides (0, panel, 1)".into());
            }
            // the panels as they lie: [panels, rows, P], the last one padded
            check.operand(&Operand {
                shape: vec![cols.div_ceil(*b_panel), rows, *b_panel],
                strides: vec![rows as isize * width, width, 1],
                ..b.clone()
            })?;
        }
        if let Some(p) = b_packed {
            check.operand(p)?;
            let (m, k, n) = (a.shape[1], a.shape[2], b.shape[2]);
            let need = gemm_packed::packed_b_bytes(m, n, k, b.strides[1], b.strides[2]);
            if p.dtype != DType::F32
                || out.dtype != DType::F32
                || p.shape.len() != 1
                || !p.is_contiguous()
                || need == 0
                || p.shape[0] * 4 < need
            {
                return Err(format!(
                    "a packed matmul operand is a contiguous 1-D f32 operand of at least \
                     {need} bytes, for an f32 product whose B CBLAS can read, where \
                     MKL's packing is available"
                ));
            }
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::Matmul {
            a,
            b,
            out,
            bias,
            residual,
            alpha,
            beta,
            act,
            b_panel,
            b_packed,
        } = self;
        if act.is_some() && !out.is_contiguous() {
            return Err("matmul epilogue needs a contiguous output".into());
        }
        let addends = Addends {
            bias: bias.as_ref(),
            residual: residual.as_ref(),
        };
        // B packed for one product of these sizes, alpha folded in as 1
        let packed = b_packed
            .as_ref()
            .filter(|_| *alpha == 1.0 && out.shape[0] == 1);
        let b = (b, *b_panel, packed);
        match out.dtype {
            DType::F64 => matmul::<f64>(f, a, b, out, addends, *alpha, *beta, *act),
            _ => {
                let (alpha, beta) = (*alpha as f32, *beta as f32);
                matmul::<f32>(f, a, b, out, addends, alpha, beta, *act)
            }
        }
        Ok(())
    }
}

/// What a matmul adds to its product: `beta · bias` and a residual, either or both.
#[derive(Clone, Copy)]
struct Addends<'a> {
    bias: Option<&'a Operand>,
    residual: Option<&'a Operand>,
}

/// `out[b] = alpha · a[b] @ b[b] (+ beta · bias) (+ residual) then act`, for every batch b, each block
/// of `out` finished by the thread that computes it (see [`BlockHooks`]).
///
/// Where `out`'s rows are contiguous and so are the addends' (a Linear's bias row, a residual), the
/// product is written first and the addends and the activation follow in one pass over the block
/// while it is in cache. Written into the block before the product instead, the addends are a write
/// stream of their own to memory not yet in cache: Linear+ReLU 128x512 -> 1024 on 2 threads took
/// 369-413 us that way against 345-359. Other layouts take that way still: the block starts as
/// `beta · bias + residual` and the product accumulates onto it.
#[allow(clippy::too_many_arguments)]
unsafe fn matmul<T: GemmScalar + elementwise::Activate>(
    f: &Frame<'_>,
    a: &Operand,
    (b, b_panel, b_packed): (&Operand, usize, Option<&Operand>),
    out: &Operand,
    addends: Addends<'_>,
    alpha: T,
    beta: T,
    act: Option<UnaryFn>,
) {
    let (batch, m, k, n) = (out.shape[0], a.shape[1], a.shape[2], out.shape[2]);
    let (pa, pb, pc) = (f.ptr(a) as usize, f.ptr(b) as usize, f.ptr(out) as usize);
    let packed_at = b_packed.map(|p| f.ptr(p) as usize);
    let os = &out.strides;
    let bias_at = addends.bias.map(|o| (f.ptr(o) as usize, &o.strides));
    let residual_at = addends.residual.map(|o| (f.ptr(o) as usize, &o.strides));
    let rows_contiguous = |o: &Operand| o.strides[2] == 1;
    let after_product = os[2] == 1
        && addends.bias.is_none_or(rows_contiguous)
        && addends.residual.is_none_or(rows_contiguous);
    let has_addends = addends.bias.is_some() || addends.residual.is_some();
    // the addends go after the product, in `finish`, or before it, in `fill`
    let (late_addends, accumulate) = (has_addends && after_product, has_addends && !after_product);
    let one = |bi: usize, parallel: bool| {
        let bi = bi as isize;
        let c_at = |i: usize, j: usize| {
            (pc as *mut T).offset(bi * os[0] + i as isize * os[1] + j as isize * os[2])
        };
        // the addends' rows `i` over the block's columns (contiguous, as `after_product` requires)
        let addend_row = |at: Option<(usize, &Vec<isize>)>, i: usize, cols: &Range<usize>| {
            at.map(|(p, st)| {
                let row = bi * st[0] + i as isize * st[1] + cols.start as isize;
                std::slice::from_raw_parts((p as *const T).offset(row), cols.len())
            })
        };
        let finish = |rows: Range<usize>, cols: Range<usize>| {
            for i in rows {
                let dst = std::slice::from_raw_parts_mut(c_at(i, cols.start), cols.len());
                if late_addends {
                    let bias = addend_row(bias_at, i, &cols);
                    let residual = addend_row(residual_at, i, &cols);
                    T::add_activate(act, beta, bias, residual, dst);
                } else if let Some(act) = act {
                    T::activate(act, dst);
                }
            }
        };
        // C's block starts as `beta · bias + residual` (either may be absent), one pass per row. Only
        // layouts `finish` does not take come here: a strided output or addend, or a bias of one
        // value per row (column stride 0), the one layout with a fast path
        let fill = |rows: Range<usize>, cols: Range<usize>| {
            let per_row_bias = bias_at.is_some_and(|(_, bs)| bs[2] == 0);
            let rows_dense = os[2] == 1 && residual_at.is_none_or(|(_, rs)| rs[2] == 1);
            let bias_at = |i: usize, j: usize| {
                bias_at.map(|(p, bs)| {
                    (p as *const T).offset(bi * bs[0] + i as isize * bs[1] + j as isize * bs[2])
                })
            };
            let residual_at = |i: usize, j: usize| {
                residual_at.map(|(p, rs)| {
                    (p as *const T).offset(bi * rs[0] + i as isize * rs[1] + j as isize * rs[2])
                })
            };
            for i in rows {
                let (n, j0) = (cols.len(), cols.start);
                if let (true, true, Some(v)) = (per_row_bias, rows_dense, bias_at(i, j0)) {
                    let dst = std::slice::from_raw_parts_mut(c_at(i, j0), n);
                    let v = beta * *v;
                    match residual_at(i, j0) {
                        None => dst.fill(v),
                        Some(r) => {
                            let r = std::slice::from_raw_parts(r, n);
                            for (d, &r) in dst.iter_mut().zip(r) {
                                *d = v + r;
                            }
                        }
                    }
                    continue;
                }
                for j in cols.clone() {
                    let b = bias_at(i, j).map_or(T::ZERO, |b| beta * *b);
                    *c_at(i, j) = residual_at(i, j).map_or(b, |r| b + *r);
                }
            }
        };
        let hooks = BlockHooks {
            before: accumulate.then_some(&fill as BlockFn<'_>),
            after: (act.is_some() || late_addends).then_some(&finish as BlockFn<'_>),
        };
        let a_mat = Mat {
            ptr: (pa as *const T).offset(bi * a.strides[0]),
            rs: a.strides[1],
            cs: a.strides[2],
        };
        let c_mat = MatMut {
            ptr: c_at(0, 0),
            rs: os[1],
            cs: os[2],
        };
        // a packed B is only ever given for a batch of one
        if let Some(packed) = packed_at {
            let packed = packed as *const T;
            if T::gemm_packed_b(m, n, k, a_mat, packed, c_mat, accumulate, hooks) {
                return;
            }
        }
        let b_mat = Mat {
            ptr: (pb as *const T).offset(bi * b.strides[0]),
            rs: b.strides[1],
            cs: b.strides[2],
        };
        gemm_hooked::<T>(
            m, n, k, a_mat, b_mat, c_mat, accumulate, alpha, parallel, b_panel, hooks,
        )
    };
    // many small products: one per thread; few large ones: let gemm split each
    if batch > 1 && m * n * k < 128 * 128 * 128 && threads::current() > 1 {
        threads::parallel_for(batch, |bi| one(bi, false));
    } else {
        (0..batch).for_each(|bi| one(bi, true));
    }
}

impl Instruction for plan::GroupedMm {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::GroupedMm { a, b, offs, out } = self;
        for op in [a, b, offs, out] {
            check.operand(op)?;
        }
        if a.shape.len() != 2 || b.shape.len() != 3 || offs.shape.len() != 1 || out.shape.len() != 2
        {
            return Err("grouped_mm takes a [S, K], b [G, K, N], offs [G] and out [S, N]".into());
        }
        if !FLOATS.contains(&out.dtype) || a.dtype != out.dtype || b.dtype != out.dtype {
            return Err("grouped_mm operands must be f32/f64 of one dtype".into());
        }
        if !matches!(offs.dtype, DType::I32 | DType::I64) {
            return Err("grouped_mm offsets must be i32 or i64".into());
        }
        let (s, k, g, n) = (a.shape[0], a.shape[1], b.shape[0], b.shape[2]);
        if b.shape[1] != k || offs.shape[0] != g || out.shape != [s, n] {
            return Err("grouped_mm shapes do not agree".into());
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::GroupedMm { a, b, offs, out } = self;
        let rows = a.shape[0];
        // the groups' ends, read as the run finds them: each within [previous end, rows]
        let at = f.ptr(offs);
        let mut ends = Vec::with_capacity(offs.shape[0]);
        for g in 0..offs.shape[0] {
            let i = g as isize * offs.strides[0];
            let end = match offs.dtype {
                DType::I32 => *(at as *const i32).offset(i) as i64,
                _ => *(at as *const i64).offset(i),
            };
            let start = ends.last().copied().unwrap_or(0);
            if end < start as i64 || end > rows as i64 {
                return Err(format!(
                    "grouped_mm: offset {g} is {end}; offsets must rise from 0 to at most the {rows} rows"
                ));
            }
            ends.push(end as usize);
        }
        match out.dtype {
            DType::F64 => grouped_mm::<f64>(f, a, b, out, &ends),
            _ => grouped_mm::<f32>(f, a, b, out, &ends),
        }
        Ok(())
    }
}

/// One product per group: its rows of `a` by its matrix of `b` into its rows of `out`; the rows no
/// group holds are zero.
unsafe fn grouped_mm<T: GemmScalar>(
    f: &Frame<'_>,
    a: &Operand,
    b: &Operand,
    out: &Operand,
    ends: &[usize],
) {
    let (k, n) = (a.shape[1], out.shape[1]);
    let (pa, pb, pc) = (
        f.ptr(a) as *const T,
        f.ptr(b) as *const T,
        f.ptr(out) as *mut T,
    );
    let os = &out.strides;
    let mut start = 0;
    for (g, &end) in ends.iter().enumerate() {
        if end > start {
            let a_mat = Mat {
                ptr: pa.offset(start as isize * a.strides[0]),
                rs: a.strides[0],
                cs: a.strides[1],
            };
            let b_mat = Mat {
                ptr: pb.offset(g as isize * b.strides[0]),
                rs: b.strides[1],
                cs: b.strides[2],
            };
            let c_mat = MatMut {
                ptr: pc.offset(start as isize * os[0]),
                rs: os[0],
                cs: os[1],
            };
            let hooks = BlockHooks {
                before: None,
                after: None,
            };
            gemm_hooked::<T>(
                end - start,
                n,
                k,
                a_mat,
                b_mat,
                c_mat,
                false,
                T::ONE,
                true,
                0,
                hooks,
            );
        }
        start = end;
    }
    for i in start..out.shape[0] {
        for j in 0..n {
            *pc.offset(i as isize * os[0] + j as isize * os[1]) = T::ZERO;
        }
    }
}
