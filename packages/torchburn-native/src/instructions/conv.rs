//! `Conv2d`: forward and transposed 2-D convolutions with a fused batch-norm, residual and relu
//! epilogue (`kernels/conv.rs`, and `kernels/conv_shifted.rs` for shifted GEMMs); `Conv2dWeightGrad`:
//! a convolution's weight gradient (`kernels/conv_weight_grad.rs`).

use super::check::{require_contiguous, FLOATS};
use super::{Check, Frame, Instruction};
use crate::kernels::conv_weight_grad::{conv2d_weight_grad, ConvWeightGradShape};
use crate::kernels::{conv, conv_shifted};
use crate::plan::{self, DType, Operand};

/// A forward convolution's shape from its (validated, 4-D) operands.
fn conv2d_shape(
    input: &Operand,
    weight: &Operand,
    out: &Operand,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> conv::Conv2dShape {
    conv::Conv2dShape {
        n: input.shape[0],
        c_in: input.shape[1],
        h: input.shape[2],
        w: input.shape[3],
        c_out: out.shape[1],
        kh: weight.shape[2],
        kw: weight.shape[3],
        stride,
        padding,
        dilation,
        groups,
        h_out: out.shape[2],
        w_out: out.shape[3],
    }
}

impl Instruction for plan::Conv2d {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Conv2d {
            input,
            weight,
            weight_taps,
            bias,
            out,
            stride,
            padding,
            dilation,
            groups,
            transposed,
            epilogue,
            ..
        } = self;
        if let Some(e) = epilogue {
            if *transposed {
                return Err("conv2d epilogue: forward convolutions only".into());
            }
            let c_out = out.shape.get(1).copied().unwrap_or(0);
            if let Some(r) = &e.residual {
                check.operand(r)?;
                require_contiguous(r, "conv2d residual", &[out.dtype])?;
                if r.shape != out.shape {
                    return Err("conv2d residual must have the output's shape".into());
                }
            }
            if let Some(nm) = &e.norm {
                let params = [
                    Some(&nm.mean),
                    Some(&nm.var),
                    nm.weight.as_ref(),
                    nm.bias.as_ref(),
                ];
                for op in params.into_iter().flatten() {
                    check.operand(op)?;
                    require_contiguous(op, "conv2d batch norm", &[out.dtype])?;
                    if op.numel() != c_out {
                        return Err("conv2d batch norm: one value per output channel".into());
                    }
                }
            }
        }
        for op in [input, weight, out] {
            check.operand(op)?;
            require_contiguous(op, "conv2d", &[input.dtype])?;
            require_contiguous(op, "conv2d", FLOATS)?;
            if op.shape.len() != 4 {
                return Err("conv2d operands must be 4-D".into());
            }
        }
        if let Some(b) = bias {
            check.operand(b)?;
            require_contiguous(b, "conv2d bias", &[input.dtype])?;
        }
        if *groups == 0 {
            return Err("conv2d: groups must be positive".into());
        }
        if let Some(t) = weight_taps {
            check.operand(t)?;
            require_contiguous(t, "conv2d weight taps", &[weight.dtype])?;
            let (c_out, c_in, kh, kw) = (
                weight.shape[0],
                weight.shape[1],
                weight.shape[2],
                weight.shape[3],
            );
            if t.shape != [kh * kw, c_out, c_in] || *transposed {
                return Err(format!(
                    "conv2d weight taps: shape {:?}, want [{}, {c_out}, {c_in}] of a forward convolution",
                    t.shape,
                    kh * kw
                ));
            }
            if !conv_shifted::applies(&conv2d_shape(
                input, weight, out, *stride, *padding, *dilation, *groups,
            )) {
                return Err(
                    "conv2d weight taps need a stride-1 'same' convolution with one group".into(),
                );
            }
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::Conv2d {
            input,
            weight,
            weight_taps,
            bias,
            out,
            stride,
            padding,
            dilation,
            groups,
            transposed,
            output_padding,
            epilogue,
        } = self;
        let (n, c_in, h, w) = (
            input.shape[0],
            input.shape[1],
            input.shape[2],
            input.shape[3],
        );
        let (c_out, h_out, w_out) = (out.shape[1], out.shape[2], out.shape[3]);
        let (kh, kw) = (weight.shape[2], weight.shape[3]);
        macro_rules! run_conv {
            ($t:ty) => {{
                let b = bias.as_ref().map(|b| f.slice::<$t>(b));
                if *transposed {
                    let s = conv::ConvTranspose2dShape {
                        n,
                        c_in,
                        h,
                        w,
                        c_out,
                        kh,
                        kw,
                        stride: *stride,
                        padding: *padding,
                        dilation: *dilation,
                        groups: *groups,
                        h_out,
                        w_out,
                        output_padding: *output_padding,
                    };
                    conv::conv_transpose2d::<$t>(
                        &s,
                        f.slice(input),
                        f.slice(weight),
                        b,
                        f.slice_mut(out),
                    );
                } else {
                    let s = conv2d_shape(input, weight, out, *stride, *padding, *dilation, *groups);
                    let epilogue = epilogue.as_deref();
                    let norm = epilogue.and_then(|e| e.norm.as_ref()).map(|nm| {
                        let (s, t) = batch_norm_scale_shift(f, nm, c_out);
                        let cast = |v: Vec<f64>| v.into_iter().map(|x| x as $t).collect();
                        (cast(s), cast(t))
                    });
                    let epi = conv::Epilogue {
                        scale_shift: norm
                            .as_ref()
                            .map(|(s, t): &(Vec<$t>, Vec<$t>)| (&s[..], &t[..])),
                        residual: epilogue
                            .and_then(|e| e.residual.as_ref())
                            .map(|r| f.slice::<$t>(r)),
                        relu: epilogue.is_some_and(|e| e.relu),
                    };
                    match weight_taps {
                        Some(t) => conv_shifted::conv2d_shifted_with::<$t>(
                            &s,
                            f.slice(input),
                            f.slice(t),
                            b,
                            f.slice_mut(out),
                            &epi,
                        ),
                        None => conv::conv2d_with::<$t>(
                            &s,
                            f.slice(input),
                            f.slice(weight),
                            b,
                            f.slice_mut(out),
                            &epi,
                        ),
                    }
                }
            }};
        }
        match input.dtype {
            DType::F64 => run_conv!(f64),
            _ => run_conv!(f32),
        }
        Ok(())
    }
}

impl Instruction for plan::Conv2dWeightGrad {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Conv2dWeightGrad {
            input,
            grad,
            out,
            stride,
            dilation,
            ..
        } = self;
        for op in [input, grad, out] {
            check.operand(op)?;
            require_contiguous(op, "conv2d weight gradient", &[input.dtype])?;
            require_contiguous(op, "conv2d weight gradient", FLOATS)?;
            if op.shape.len() != 4 {
                return Err("conv2d weight gradient operands must be 4-D".into());
            }
        }
        if grad.shape[0] != input.shape[0]
            || out.shape[0] != grad.shape[1]
            || out.shape[1] != input.shape[1]
        {
            return Err(format!(
                "conv2d weight gradient: input {:?}, gradient {:?} and out {:?} disagree \
                 (want out [gradient channels, input channels, kh, kw] and one batch)",
                input.shape, grad.shape, out.shape
            ));
        }
        if stride.iter().chain(dilation).any(|&v| v == 0) {
            return Err("conv2d weight gradient: stride and dilation must be positive".into());
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::Conv2dWeightGrad {
            input,
            grad,
            out,
            stride,
            padding,
            dilation,
        } = self;
        let s = ConvWeightGradShape {
            n: input.shape[0],
            c_in: input.shape[1],
            h: input.shape[2],
            w: input.shape[3],
            c_out: grad.shape[1],
            h_out: grad.shape[2],
            w_out: grad.shape[3],
            kh: out.shape[2],
            kw: out.shape[3],
            stride: *stride,
            padding: *padding,
            dilation: *dilation,
        };
        match input.dtype {
            DType::F64 => {
                conv2d_weight_grad::<f64>(&s, f.slice(input), f.slice(grad), f.slice_mut(out))
            }
            _ => conv2d_weight_grad::<f32>(&s, f.slice(input), f.slice(grad), f.slice_mut(out)),
        }
        Ok(())
    }
}

/// Batch norm's per-channel `(scale, shift)` in f64: `scale = weight / sqrt(var + eps)`,
/// `shift = bias - mean · scale` (weight 1 and bias 0 when absent), as PyTorch's eval kernel folds them.
///
/// # Safety
/// The operands must be valid in `f`, as for every instruction (checked by `Instruction::validate`).
unsafe fn batch_norm_scale_shift(
    f: &Frame<'_>,
    nm: &plan::BatchNormEval,
    channels: usize,
) -> (Vec<f64>, Vec<f64>) {
    let read = |op: &Operand| -> Vec<f64> {
        match op.dtype {
            // SAFETY: as the function's
            DType::F64 => unsafe { f.slice::<f64>(op) }.to_vec(),
            _ => unsafe { f.slice::<f32>(op) }
                .iter()
                .map(|&v| v as f64)
                .collect(),
        }
    };
    let (mean, var) = (read(&nm.mean), read(&nm.var));
    let weight = nm.weight.as_ref().map(read);
    let bias = nm.bias.as_ref().map(read);
    let mut scale = Vec::with_capacity(channels);
    let mut shift = Vec::with_capacity(channels);
    for c in 0..channels {
        let s = weight.as_ref().map_or(1.0, |w| w[c]) / (var[c] + nm.eps).sqrt();
        scale.push(s);
        shift.push(bias.as_ref().map_or(0.0, |b| b[c]) - mean[c] * s);
    }
    (scale, shift)
}
