//! Portable row products `Σ_k W[r, k] · x[k]` over GGUF blocks: every type through its block
//! decoder (`blocks::decode`), integer sums per sub-block, then the sub-block's affine factors.
//! The baseline path, and the reference the SIMD kernels are tested against.

use half::{bf16, f16};

use super::acts::{ActForm, Acts, SUM_LEN};
use super::blocks::{decode, GgmlType};

/// One row of weights (`row`, stored as `kind`) times one activation row.
pub fn row_dot(kind: GgmlType, row: &[u8], a: &Acts) -> f32 {
    match kind {
        GgmlType::F32 => row.chunks_exact(4).zip(&a.f).fold(0.0, |s, (w, &x)| {
            f32::from_le_bytes(w.try_into().unwrap()).mul_add(x, s)
        }),
        GgmlType::F16 => row.chunks_exact(2).zip(&a.f).fold(0.0, |s, (w, &x)| {
            f16::from_le_bytes([w[0], w[1]]).to_f32().mul_add(x, s)
        }),
        GgmlType::BF16 => row.chunks_exact(2).zip(&a.f).fold(0.0, |s, (w, &x)| {
            bf16::from_le_bytes([w[0], w[1]]).to_f32().mul_add(x, s)
        }),
        _ => quantized_dot(kind, row, a),
    }
}

fn quantized_dot(kind: GgmlType, row: &[u8], a: &Acts) -> f32 {
    let (len, sub) = (kind.block_len(), kind.sub_len());
    let mut acc = 0f32;
    for (b, block) in row.chunks_exact(kind.block_bytes()).enumerate() {
        let dec = decode(kind, block);
        let base = b * len; // the block's first element
        for s in 0..len / sub {
            let at = base + s * sub;
            let w = &dec.q[s * sub..(s + 1) * sub];
            // the integers as one slice of the form's width (not a branch per element), so the
            // sum vectorizes
            let isum: i32 = if a.form != ActForm::Int16x32 {
                w.iter()
                    .zip(&a.q[at..at + sub])
                    .map(|(&w, &x)| w as i32 * x as i32)
                    .sum()
            } else {
                w.iter()
                    .zip(&a.q16[at..at + sub])
                    .map(|(&w, &x)| w as i32 * x as i32)
                    .sum()
            };
            let xsum: i32 = a.sums16[at / SUM_LEN..(at + sub) / SUM_LEN].iter().sum();
            let dx = a.d[at / a.form.block()];
            acc += dx * (dec.scale[s] * isum as f32 - dec.min[s] * xsum as f32);
        }
    }
    acc
}
