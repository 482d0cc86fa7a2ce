//! `IndexSelect`, `Gather`, `Index`, `Scatter` and `IndexPut`: reads and writes at positions an
//! index tensor holds, bounds-checked as they run (`kernels/index.rs`).

use super::check::{require_contiguous, FLOATS};
use super::{Check, Frame, Instruction};
use crate::kernels::elementwise::View;
use crate::kernels::index;
use crate::plan;

impl Instruction for plan::IndexSelect {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::IndexSelect {
            input,
            index,
            out,
            dim,
        } = self;
        check.operand(input)?;
        check.operand(index)?;
        check.operand(out)?;
        require_contiguous(input, "index_select", &[input.dtype])?;
        require_contiguous(out, "index_select", &[input.dtype])?;
        if index.shape.len() != 1 || *dim >= input.shape.len().max(1) {
            return Err("index_select: 1-D index and a valid dim required".into());
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::IndexSelect {
            input,
            index,
            out,
            dim,
        } = self;
        let (shape, dim) = if input.shape.is_empty() {
            (vec![1], 0)
        } else {
            (input.shape.clone(), *dim)
        };
        index::index_select(
            &f.view(input),
            &shape,
            dim,
            &f.view(index),
            index.shape[0],
            &f.view(out),
        )
    }
}

impl Instruction for plan::Gather {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Gather {
            input,
            index,
            out,
            dim,
        } = self;
        for op in [input, index, out] {
            check.operand(op)?;
        }
        require_contiguous(out, "gather", &[input.dtype])?;
        if index.shape != out.shape
            || *dim >= input.shape.len()
            || input.shape.len() != out.shape.len()
        {
            return Err("gather: index/out shapes or dim invalid".into());
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::Gather {
            input,
            index,
            out,
            dim,
        } = self;
        index::gather(
            &f.view(input),
            &input.shape,
            &f.view(index),
            &f.view(out),
            &out.shape,
            *dim,
        )
    }
}

impl Instruction for plan::Index {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Index {
            input,
            indices,
            out,
            first,
        } = self;
        check.operand(input)?;
        check.operand(out)?;
        require_contiguous(out, "index", &[input.dtype])?;
        for i in indices {
            check.operand(i)?;
        }
        if indices.is_empty() || first + indices.len() > input.shape.len() {
            return Err("index: bad index dims".into());
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::Index {
            input,
            indices,
            out,
            first,
        } = self;
        let iv: Vec<View> = indices.iter().map(|i| f.view(i)).collect();
        index::advanced_index(
            &f.view(input),
            &input.shape,
            &iv,
            &indices[0].shape,
            *first,
            &f.view(out),
        )
    }
}

impl Instruction for plan::Scatter {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Scatter {
            out,
            index,
            src,
            dim,
            ..
        } = self;
        for op in [out, index, src] {
            check.operand(op)?;
        }
        if src.dtype != out.dtype || *dim >= out.shape.len() || src.shape != index.shape {
            return Err("scatter: operands disagree".into());
        }
        if self.reduce.is_some() {
            require_contiguous(out, "scatter_reduce", FLOATS)?;
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::Scatter {
            out,
            index,
            src,
            dim,
            accumulate,
            reduce,
            include_self,
        } = self;
        if let Some(op) = reduce {
            return index::scatter_reduce(
                &f.view(out),
                &out.shape,
                &f.view(index),
                &f.view(src),
                &index.shape,
                *dim,
                *op,
                *include_self,
            );
        }
        index::scatter(
            &f.view(out),
            &out.shape,
            &f.view(index),
            &f.view(src),
            &index.shape,
            *dim,
            *accumulate,
        )
    }
}

impl Instruction for plan::IndexPut {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::IndexPut {
            out,
            indices,
            values,
            ..
        } = self;
        check.operand(out)?;
        check.operand(values)?;
        for i in indices {
            check.operand(i)?;
        }
        if values.dtype != out.dtype || indices.is_empty() || indices.len() > out.shape.len() {
            return Err("index_put: operands disagree".into());
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::IndexPut {
            out,
            indices,
            values,
            accumulate,
        } = self;
        let iv: Vec<View> = indices.iter().map(|i| f.view(i)).collect();
        index::index_put(
            &f.view(out),
            &out.shape,
            &iv,
            &indices[0].shape,
            &f.view(values),
            *accumulate,
        )
    }
}
