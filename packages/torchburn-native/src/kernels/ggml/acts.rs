//! Activation rows quantized for the products with GGUF weights, as llama.cpp pairs them: int8 per
//! block of 32 with an f32 scale for the 32-element types, int8 per block of 256 for the K-quants,
//! and f32 as they are for the float types. Either way the sum of each 16 integers is kept: the
//! types with an offset (`Q4_1`, `Q5_1`, the K-quants' mins) and the ones stored unsigned with a
//! bias (`Q4_0`, `Q5_0`, `Q6_K`) need `Σ x` per sub-block.

use super::blocks::{GgmlType, QK_K};

/// Elements per activation block of the 32-element types.
pub const QK8: usize = 32;
/// Elements per entry of [`Acts::sums16`].
pub const SUM_LEN: usize = 16;

/// One activation row in the form one weight type's products take.
pub struct Acts {
    /// elements per block of `q` (32 or 256; 0 for f32 rows)
    pub block: usize,
    /// the integers, `block` per scale
    pub q: Vec<i8>,
    /// one scale per block: `x ≈ d · q`
    pub d: Vec<f32>,
    /// `Σ q` of each 16 consecutive integers
    pub sums16: Vec<i32>,
    /// the row itself (float weight types)
    pub f: Vec<f32>,
}

/// The activation block length products with `kind` take (0: f32).
pub fn act_block(kind: GgmlType) -> usize {
    if kind.is_float() {
        0
    } else if kind.is_k_quant() {
        QK_K
    } else {
        QK8
    }
}

/// `x` (a multiple of the block length long) in the form products with `kind` take.
pub fn quantize_for(kind: GgmlType, x: &[f32]) -> Acts {
    let block = act_block(kind);
    if block == 0 {
        return Acts {
            block,
            q: vec![],
            d: vec![],
            sums16: vec![],
            f: x.to_vec(),
        };
    }
    assert!(
        x.len().is_multiple_of(block),
        "activation length {} is not a multiple of {block}",
        x.len()
    );
    let mut q = vec![0i8; x.len()];
    let mut d = Vec::with_capacity(x.len() / block);
    for (xs, qs) in x.chunks_exact(block).zip(q.chunks_exact_mut(block)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (o, &v) in qs.iter_mut().zip(xs) {
            // round half away from zero; |v · inv| <= 127 up to rounding, clamped for safety
            *o = (v * inv).round().clamp(-127.0, 127.0) as i8;
        }
        d.push(scale);
    }
    let sums16 = q
        .chunks_exact(SUM_LEN)
        .map(|c| c.iter().map(|&v| v as i32).sum())
        .collect();
    Acts {
        block,
        q,
        d,
        sums16,
        f: vec![],
    }
}
