//! `MaxPool2d`, `AvgPool2d` and `AdaptiveAvgPool2d` over contiguous NCHW planes (`kernels/pool.rs`),
//! and `Upsample2d` (`kernels/resample.rs`).

use super::check::{require_contiguous, FLOATS};
use super::{Check, Frame, Instruction};
use crate::kernels::pool;
use crate::kernels::resample::{self, Mode, Upsample2dShape};
use crate::plan::{self, DType, Operand};

/// Input and output of a 2-D pooling: contiguous, float, 4-D.
fn check_planes(
    check: &Check<'_>,
    input: &Operand,
    out: &Operand,
    what: &str,
) -> Result<(), String> {
    for op in [input, out] {
        check.operand(op)?;
        require_contiguous(op, what, FLOATS)?;
        if op.shape.len() != 4 {
            return Err(format!("{what} operands must be 4-D"));
        }
    }
    Ok(())
}

fn pool_shape(
    input: &Operand,
    out: &Operand,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
) -> pool::Pool2dShape {
    pool::Pool2dShape {
        planes: input.shape[0] * input.shape[1],
        h: input.shape[2],
        w: input.shape[3],
        kh: kernel[0],
        kw: kernel[1],
        stride,
        padding,
        dilation,
        h_out: out.shape[2],
        w_out: out.shape[3],
    }
}

impl Instruction for plan::MaxPool2d {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::MaxPool2d {
            input,
            out,
            indices,
            ..
        } = self;
        check_planes(check, input, out, "max_pool2d")?;
        if let Some(i) = indices {
            check.operand(i)?;
            require_contiguous(i, "max_pool2d indices", &[DType::I64])?;
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::MaxPool2d {
            input,
            out,
            indices,
            kernel,
            stride,
            padding,
            dilation,
        } = self;
        let s = pool_shape(input, out, *kernel, *stride, *padding, *dilation);
        let idx = indices.as_ref().map(|i| f.slice_mut::<i64>(i));
        match input.dtype {
            DType::F64 => pool::max_pool2d::<f64>(&s, f.slice(input), f.slice_mut(out), idx),
            _ => pool::max_pool2d::<f32>(&s, f.slice(input), f.slice_mut(out), idx),
        }
        Ok(())
    }
}

impl Instruction for plan::AvgPool2d {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        check_planes(check, &self.input, &self.out, "avg_pool2d")
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::AvgPool2d {
            input,
            out,
            kernel,
            stride,
            padding,
            count_include_pad,
            divisor_override,
        } = self;
        let s = pool_shape(input, out, *kernel, *stride, *padding, [1, 1]);
        match input.dtype {
            DType::F64 => pool::avg_pool2d::<f64>(
                &s,
                *count_include_pad,
                *divisor_override,
                f.slice(input),
                f.slice_mut(out),
            ),
            _ => pool::avg_pool2d::<f32>(
                &s,
                *count_include_pad,
                *divisor_override,
                f.slice(input),
                f.slice_mut(out),
            ),
        }
        Ok(())
    }
}

impl Instruction for plan::AdaptiveAvgPool2d {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        // the plain average pool's checks and messages: it is one to the planner
        check_planes(check, &self.input, &self.out, "avg_pool2d")
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::AdaptiveAvgPool2d { input, out } = self;
        let planes = input.shape[0] * input.shape[1];
        let (h, w, ho, wo) = (input.shape[2], input.shape[3], out.shape[2], out.shape[3]);
        match input.dtype {
            DType::F64 => pool::adaptive_avg_pool2d::<f64>(
                planes,
                h,
                w,
                ho,
                wo,
                f.slice(input),
                f.slice_mut(out),
            ),
            _ => pool::adaptive_avg_pool2d::<f32>(
                planes,
                h,
                w,
                ho,
                wo,
                f.slice(input),
                f.slice_mut(out),
            ),
        }
        Ok(())
    }
}

impl plan::Upsample2d {
    fn mode(&self) -> Result<Mode, String> {
        match self.mode.as_str() {
            "bilinear" => Ok(Mode::Bilinear {
                align_corners: self.align_corners,
            }),
            "nearest" => Ok(Mode::Nearest),
            "nearest_exact" => Ok(Mode::NearestExact),
            other => Err(format!(
                "upsample2d: mode {other:?} is not one of \"bilinear\", \"nearest\", \"nearest_exact\""
            )),
        }
    }
}

impl Instruction for plan::Upsample2d {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        check_planes(check, &self.input, &self.out, "upsample2d")?;
        self.mode()?;
        if self.input.shape[..2] != self.out.shape[..2] {
            return Err(
                "upsample2d: input and output must have the same batch and channels".into(),
            );
        }
        if self.input.shape[2] == 0 || self.input.shape[3] == 0 {
            return Err("upsample2d: input planes must not be empty".into());
        }
        if self.scales.iter().flatten().any(|s| !s.is_finite()) {
            return Err("upsample2d: scale factors must be finite".into());
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let (input, out) = (&self.input, &self.out);
        let s = Upsample2dShape {
            planes: input.shape[0] * input.shape[1],
            h: input.shape[2],
            w: input.shape[3],
            h_out: out.shape[2],
            w_out: out.shape[3],
            scales: self.scales,
        };
        let mode = self.mode()?;
        match input.dtype {
            DType::F64 => resample::upsample2d::<f64>(&s, mode, f.slice(input), f.slice_mut(out)),
            _ => resample::upsample2d::<f32>(&s, mode, f.slice(input), f.slice_mut(out)),
        }
        Ok(())
    }
}
