//! Activation rows quantized for the products with GGUF weights: int8 per block of 32 with an f32
//! scale for the 4- and 5-bit 32-element types (as llama.cpp pairs them), int8 per block of 256 for
//! the K-quants, int16 per block of 32 for `Q8_0` (so that its int8 weights are the only rounding
//! the product sees: a model's output projection is often `Q8_0`, and the next token hangs on its
//! last digits), and f32 as they are for the float types.
//!
//! The sum of each 16 integers is kept, and per block `d · Σ q`: the types with an offset (`Q4_1`,
//! `Q5_1`, the K-quants' mins) and the ones stored unsigned with a bias (`Q4_0`, `Q5_0`, `Q6_K`) need
//! `Σ x` per sub-block.

use super::blocks::{GgmlType, QK_K};

/// Elements per activation block of the 32-element types.
pub const QK8: usize = 32;
/// Elements per entry of [`Acts::sums16`].
pub const SUM_LEN: usize = 16;

/// How one weight type takes its activations (the order of [`ActForm::ALL`], which
/// `form as usize` indexes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActForm {
    F32,
    /// int8 per block of 32
    Int8x32,
    /// int16 per block of 32
    Int16x32,
    /// int8 per block of 256
    Int8x256,
}

impl ActForm {
    pub const ALL: [ActForm; 4] = [
        ActForm::F32,
        ActForm::Int8x32,
        ActForm::Int16x32,
        ActForm::Int8x256,
    ];

    /// Elements per scale (0 for f32).
    pub fn block(self) -> usize {
        match self {
            ActForm::F32 => 0,
            ActForm::Int8x32 | ActForm::Int16x32 => QK8,
            ActForm::Int8x256 => QK_K,
        }
    }
}

// `ALL` lists the forms in declaration order, so `form as usize` is a form's place in it
const _: () = {
    let mut i = 0;
    while i < ActForm::ALL.len() {
        assert!(ActForm::ALL[i] as usize == i);
        i += 1;
    }
};

/// The form products with `kind` take.
pub fn act_form(kind: GgmlType) -> ActForm {
    match kind {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ActForm::F32,
        GgmlType::Q8_0 => ActForm::Int16x32,
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => ActForm::Int8x256,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => ActForm::Int8x32,
    }
}

/// One activation row in one [`ActForm`].
pub struct Acts {
    pub form: ActForm,
    /// the integers of the int8 forms
    pub q: Vec<i8>,
    /// the integers of the int16 form
    pub q16: Vec<i16>,
    /// one scale per block: `x ≈ d · q`
    pub d: Vec<f32>,
    /// `Σ q` of each 16 consecutive integers
    pub sums16: Vec<i32>,
    /// `d · Σ q` of each block
    pub dsum: Vec<f32>,
    /// the row itself (float weight types)
    pub f: Vec<f32>,
}

impl Acts {
    /// Integer `i` of an int8 or int16 form.
    pub fn int(&self, i: usize) -> i32 {
        if self.form == ActForm::Int16x32 {
            self.q16[i] as i32
        } else {
            self.q[i] as i32
        }
    }
}

/// `x` (a multiple of the block length long) in `form`.
pub fn quantize(form: ActForm, x: &[f32]) -> Acts {
    let block = form.block();
    let mut out = Acts {
        form,
        q: vec![],
        q16: vec![],
        d: vec![],
        sums16: vec![],
        dsum: vec![],
        f: vec![],
    };
    if block == 0 {
        out.f = x.to_vec();
        return out;
    }
    assert!(
        x.len().is_multiple_of(block),
        "activation length {} is not a multiple of {block}",
        x.len()
    );
    let top = if form == ActForm::Int16x32 {
        32767.0
    } else {
        127.0
    };
    let mut ints = vec![0i32; x.len()];
    for (xs, qs) in x.chunks_exact(block).zip(ints.chunks_exact_mut(block)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / top;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (o, &v) in qs.iter_mut().zip(xs) {
            // round half away from zero; |v · inv| <= top up to rounding, clamped for safety
            *o = (v * inv).round().clamp(-top, top) as i32;
        }
        out.d.push(scale);
        out.dsum.push(scale * qs.iter().sum::<i32>() as f32);
    }
    out.sums16 = ints.chunks_exact(SUM_LEN).map(|c| c.iter().sum()).collect();
    if form == ActForm::Int16x32 {
        out.q16 = ints.iter().map(|&v| v as i16).collect();
    } else {
        out.q = ints.iter().map(|&v| v as i8).collect();
    }
    out
}

/// `x` in the form products with `kind` take.
pub fn quantize_for(kind: GgmlType, x: &[f32]) -> Acts {
    quantize(act_form(kind), x)
}
