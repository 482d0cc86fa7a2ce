//! `Scan` (cumulative sum, product, log-sum-exp, max, min) and `Sort` (sort, top-k) along one dim of a
//! contiguous tensor (`kernels/scan.rs`).

use super::check::require_contiguous;
use super::{Check, Frame, Instruction};
use crate::kernels::scan::{self, Scalar};
use crate::plan::{self, DType, Operand, ScanOp};

const SCANNED: &[DType] = &[DType::F32, DType::F64, DType::I64];

fn extent(op: &Operand, want: usize, what: &str) -> Result<(), String> {
    if op.numel() != want {
        return Err(format!(
            "{what}: operand of {} elements, expected {want}",
            op.numel()
        ));
    }
    Ok(())
}

impl Instruction for plan::Scan {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Scan {
            input,
            out,
            indices,
            outer,
            n,
            inner,
            op,
        } = self;
        let total = outer * n * inner;
        for x in [input, out] {
            check.operand(x)?;
            require_contiguous(x, "scan", SCANNED)?;
            extent(x, total, "scan")?;
        }
        if input.dtype != out.dtype {
            return Err("scan: input and output dtypes differ".into());
        }
        if *op == ScanOp::Logsumexp && input.dtype == DType::I64 {
            return Err("scan: logcumsumexp needs a float dtype".into());
        }
        match (op, indices) {
            (ScanOp::Max | ScanOp::Min, Some(idx)) => {
                check.operand(idx)?;
                require_contiguous(idx, "scan indices", &[DType::I64])?;
                extent(idx, total, "scan indices")?;
            }
            (ScanOp::Max | ScanOp::Min, None) => return Err("scan: max/min write indices".into()),
            (_, Some(_)) => return Err("scan: only max/min write indices".into()),
            _ => {}
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        unsafe fn go<T: Scalar>(s: &plan::Scan, f: &Frame<'_>) {
            let idx = s.indices.as_ref().map(|i| f.slice_mut::<i64>(i));
            scan::scan::<T>(
                s.op,
                s.outer,
                s.n,
                s.inner,
                f.slice(&s.input),
                f.slice_mut(&s.out),
                idx,
            );
        }
        match self.input.dtype {
            DType::F64 => go::<f64>(self, f),
            DType::I64 => go::<i64>(self, f),
            _ => go::<f32>(self, f),
        }
        Ok(())
    }
}

impl Instruction for plan::Sort {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Sort {
            input,
            values,
            indices,
            outer,
            n,
            inner,
            k,
            ..
        } = self;
        if k > n {
            return Err(format!("sort: k = {k} exceeds the dim's {n}"));
        }
        check.operand(input)?;
        require_contiguous(input, "sort", SCANNED)?;
        extent(input, outer * n * inner, "sort")?;
        check.operand(values)?;
        require_contiguous(values, "sort values", &[input.dtype])?;
        extent(values, outer * k * inner, "sort values")?;
        check.operand(indices)?;
        require_contiguous(indices, "sort indices", &[DType::I64])?;
        extent(indices, outer * k * inner, "sort indices")?;
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        unsafe fn go<T: Scalar>(s: &plan::Sort, f: &Frame<'_>) {
            scan::sort::<T>(
                s.outer,
                s.n,
                s.inner,
                s.k,
                s.descending,
                f.slice(&s.input),
                f.slice_mut(&s.values),
                f.slice_mut(&s.indices),
            );
        }
        match self.input.dtype {
            DType::F64 => go::<f64>(self, f),
            DType::I64 => go::<i64>(self, f),
            _ => go::<f32>(self, f),
        }
        Ok(())
    }
}
