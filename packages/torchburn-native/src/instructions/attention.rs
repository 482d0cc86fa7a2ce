//! `Sdpa`: scaled dot-product attention, grouped-query, masked or causal (`kernels/attention.rs`).

use super::check::{require_contiguous, F32};
use super::{Check, Frame, Instruction};
use crate::kernels::attention;
use crate::plan::{self, DType, Operand};

/// An attention operand's row layout: 4-D f32 `[b, h, t, width]` with non-negative strides and
/// each row's `width` elements contiguous.
fn head_rows(op: &Operand, what: &str) -> Result<attention::HeadRows, String> {
    if op.shape.len() != 4 || op.dtype != DType::F32 {
        return Err(format!("sdpa {what} must be a 4-D f32 tensor"));
    }
    if op.strides.iter().any(|&s| s < 0) || (op.shape[3] > 1 && op.strides[3] != 1) {
        return Err(format!(
            "sdpa {what}: strides {:?} must be non-negative with rows contiguous",
            op.strides
        ));
    }
    Ok(attention::HeadRows {
        batch: op.strides[0] as usize,
        head: op.strides[1] as usize,
        row: op.strides[2] as usize,
    })
}

impl Instruction for plan::Sdpa {
    fn validate(&self, check: &Check<'_>) -> Result<(), String> {
        let plan::Sdpa {
            q,
            k,
            v,
            mask,
            out,
            lse,
            ..
        } = self;
        for (op, what) in [(q, "q"), (k, "k"), (v, "v"), (out, "out")] {
            check.operand(op)?;
            head_rows(op, what)?;
        }
        let (b, h, tq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
        let (hk, tk, dv) = (k.shape[1], k.shape[2], v.shape[3]);
        // grouped-query attention: k and v may have fewer heads, each read by
        // h / hk consecutive query heads
        if k.shape != [b, hk, tk, d] || v.shape != [b, hk, tk, dv] || out.shape != [b, h, tq, dv] {
            return Err(format!(
                "sdpa shapes do not agree: q {:?}, k {:?}, v {:?}, out {:?}",
                q.shape, k.shape, v.shape, out.shape
            ));
        }
        if h > 0 && (hk == 0 || h % hk != 0) {
            return Err(format!(
                "sdpa: {h} query heads do not split into {hk} key/value heads"
            ));
        }
        // tasks write their output rows in parallel
        if !head_rows(out, "out")?.rows_disjoint(b, h, tq, dv) {
            return Err(format!(
                "sdpa out: strides {:?} make rows overlap",
                out.strides
            ));
        }
        if let Some(m) = mask {
            check.operand(m)?;
            if m.shape != [b, h, tq, tk] || !matches!(m.dtype, DType::F32 | DType::Bool) {
                return Err("sdpa mask must be f32 or bool, broadcast to [b, h, tq, tk]".into());
            }
            if m.strides.iter().any(|&s| s < 0) {
                return Err("sdpa mask strides must be non-negative".into());
            }
        }
        if let Some(l) = lse {
            check.operand(l)?;
            require_contiguous(l, "sdpa lse", F32)?;
            if l.numel() != b * h * tq {
                return Err("sdpa lse size mismatch".into());
            }
        }
        Ok(())
    }

    unsafe fn run(&self, f: &Frame<'_>) -> Result<(), String> {
        let plan::Sdpa {
            q,
            k,
            v,
            mask,
            out,
            lse,
            causal,
            scale,
        } = self;
        let s = attention::SdpaShape {
            b: q.shape[0],
            h: q.shape[1],
            hk: k.shape[1],
            tq: q.shape[2],
            tk: k.shape[2],
            d: q.shape[3],
            dv: v.shape[3],
        };
        let mask_data = mask.as_ref().map(|m| {
            // the mask may be a broadcast view: hand the kernel the whole span its strides reach
            let span = m
                .shape
                .iter()
                .zip(&m.strides)
                .map(|(&n, &st)| (n.max(1) - 1) * st as usize)
                .sum::<usize>()
                + 1;
            let strides = [
                m.strides[0] as usize,
                m.strides[1] as usize,
                m.strides[2] as usize,
                m.strides[3] as usize,
            ];
            match m.dtype {
                DType::Bool => attention::AttnMask::Keep {
                    data: std::slice::from_raw_parts(f.ptr(m) as *const u8, span),
                    strides,
                },
                _ => attention::AttnMask::Additive {
                    data: std::slice::from_raw_parts(f.ptr(m) as *const f32, span),
                    strides,
                },
            }
        });
        // validated in Program::new
        let rows = |op: &Operand| head_rows(op, "").expect("sdpa operand layout");
        let rows = attention::SdpaRows {
            q: rows(q),
            k: rows(k),
            v: rows(v),
            out: rows(out),
        };
        let (b, h) = (s.b, s.h);
        attention::sdpa_f32_rows(
            &s,
            &rows,
            f.span(q, rows.q.span(b, h, s.tq, s.d)),
            f.span(k, rows.k.span(b, s.hk, s.tk, s.d)),
            f.span(v, rows.v.span(b, s.hk, s.tk, s.dv)),
            mask_data,
            *causal,
            *scale as f32,
            f.span_mut(out, rows.out.span(b, h, s.tq, s.dv)),
            lse.as_ref().map(|l| f.slice_mut(l)),
        );
        Ok(())
    }
}
