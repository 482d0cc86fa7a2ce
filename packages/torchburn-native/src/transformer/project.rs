//! Projections of a few tokens on the decode step's kernels: one decode step (one token) or a batch of
//! them (one token of each of several sequences).
//!
//! Projections that read the same input (q/k/v; gate/up) share one parallel job, and each token's
//! input is quantized once per activation format they take. Each task walks its rows in blocks that
//! stay in cache and runs every token over a block before the next ([`row_blocks`]), so each weight
//! is read from memory once per call however many tokens it has (and the 32-element GGUF types
//! decode each block of weights once for all of them). Every (row, token) gets the value a one-token
//! call gives, so a batch of steps computes what the steps would one by one.

use super::decoder::{dot, slice, Projection, Weight};
use crate::kernels::ggml::acts as ggml_acts;
use crate::kernels::quant::{quantize_acts, ActFormat, QActs};
use crate::kernels::row_blocks::{row_blocks, ROW_GROUP};
use crate::threads::{self, SendPtr};

/// Where projection `i`'s output for token `t` goes: `rows[i][t]`, `n_i` floats.
pub(super) struct RowOutputs {
    pub rows: Vec<Vec<SendPtr<f32>>>,
}

impl RowOutputs {
    /// Outputs `[T, n_i]` of each projection.
    pub fn of(ps: &[&Projection], tokens: usize, outs: &mut [&mut [f32]]) -> RowOutputs {
        assert_eq!(ps.len(), outs.len(), "one output per projection");
        let rows = ps
            .iter()
            .zip(outs.iter_mut())
            .map(|(p, out)| {
                assert_eq!(out.len(), tokens * p.n(), "projection output length");
                (0..tokens)
                    .map(|t| SendPtr(out[t * p.n()..].as_mut_ptr()))
                    .collect()
            })
            .collect();
        RowOutputs { rows }
    }
}

/// `outs[i][t·n_i + r] = (P_i x_t)[r]` (biases added) for the `tokens` rows of `x` `[T, k]`.
pub(super) fn project_tokens(
    ps: &[&Projection],
    x: &[f32],
    tokens: usize,
    outs: &mut [&mut [f32]],
) {
    let dst = RowOutputs::of(ps, tokens, outs);
    // SAFETY: the pointers are the rows of the caller's exclusively borrowed outputs
    unsafe { project_tokens_to(ps, x, tokens, &dst) }
}

/// [`project_tokens`] into rows anywhere (each token's logits in its own buffer).
///
/// # Safety
/// Every pointer of `dst` must hold its projection's `n` writable floats, none overlapping another
/// or `x`.
pub(super) unsafe fn project_tokens_to(
    ps: &[&Projection],
    x: &[f32],
    tokens: usize,
    dst: &RowOutputs,
) {
    let k = ps.first().map_or(0, |p| p.k());
    assert!(ps.iter().all(|p| p.k() == k), "projections of one width");
    assert_eq!(x.len(), tokens * k, "input length");
    assert!(
        dst.rows.len() == ps.len() && dst.rows.iter().all(|r| r.len() == tokens),
        "an output row per projection and token"
    );
    let rows_of = |t: usize| &x[t * k..][..k];
    // each token's input in each activation format the quantized weights take: [int8, int16, f32]
    let formats = [ActFormat::Int8, ActFormat::Int16, ActFormat::F32];
    let acts: [Vec<QActs>; 3] = formats.map(|f| {
        let used = ps
            .iter()
            .any(|p| matches!(&p.w, Weight::Quant(q) if q.act_format() == f));
        let n = if used { tokens } else { 0 };
        (0..n).map(|t| quantize_acts(rows_of(t), f)).collect()
    });
    // and in each form the GGUF-typed ones take
    let ggml: [Option<ggml_acts::TokenActs>; 4] = ggml_acts::ActForm::ALL.map(|f| {
        // whether each projection taking this form reads the tokens in pairs
        let pairs: Vec<bool> = ps
            .iter()
            .filter_map(|p| match &p.w {
                Weight::Ggml(m) if ggml_acts::act_form(m.kind) == f => Some(m.reads_pairs()),
                _ => None,
            })
            .collect();
        (!pairs.is_empty())
            .then(|| ggml_acts::TokenActs::quantize_rows(f, x, tokens, pairs.contains(&true)))
    });
    let acts: [Vec<&QActs>; 3] = std::array::from_fn(|i| acts[i].iter().collect());
    let total: usize = ps.iter().map(|p| p.n()).sum();
    threads::par_steps(total, ROW_GROUP, |lo, hi| {
        let mut block = Vec::new(); // [T, rows of the block]
                                    // this task's rows of every projection it overlaps
        let mut base = 0;
        for (p, rows_out) in ps.iter().zip(&dst.rows) {
            let n = p.n();
            let (a, b) = (lo.max(base), hi.min(base + n));
            base += n;
            if a >= b {
                continue;
            }
            for rows in row_blocks(a - (base - n)..b - (base - n), row_bytes(p), tokens) {
                let len = rows.len();
                block.resize(tokens * len, 0f32);
                let got = &mut block[..tokens * len];
                match &p.w {
                    Weight::Quant(q) => {
                        let slot = formats.iter().position(|&f| f == q.act_format());
                        let acts = &acts[slot.expect("a format of the list")];
                        q.rows_tokens_into(rows.clone(), acts, got);
                    }
                    Weight::Ggml(m) => {
                        let acts = ggml[ggml_acts::act_form(m.kind) as usize]
                            .as_ref()
                            .expect("activations in the weights' form");
                        m.rows_tokens_into(rows.clone(), acts, got);
                    }
                    Weight::F32 { ptr, .. } => {
                        // SAFETY: the decoder's contract: a live n×k f32 matrix
                        let w = unsafe { slice(*ptr, n * k) };
                        for (t, out) in got.chunks_exact_mut(len).enumerate() {
                            for (o, r) in out.iter_mut().zip(rows.clone()) {
                                *o = dot(&w[r * k..][..k], rows_of(t));
                            }
                        }
                    }
                }
                if let Some(bias) = p.bias {
                    // SAFETY: the bias holds n f32
                    let bias = unsafe { slice(bias, n) };
                    for out in got.chunks_exact_mut(len) {
                        for (o, r) in out.iter_mut().zip(rows.clone()) {
                            *o += bias[r];
                        }
                    }
                }
                for (values, row) in got.chunks_exact(len).zip(rows_out) {
                    // SAFETY: rows a..b of every token's output of this projection are this task's
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            values.as_ptr(),
                            row.get().add(rows.start),
                            len,
                        )
                    };
                }
            }
        }
    });
}

/// Bytes a projection reads per row of its weight.
fn row_bytes(p: &Projection) -> usize {
    match &p.w {
        Weight::Quant(q) => q.row_bytes(),
        Weight::Ggml(m) => m.row_bytes(),
        Weight::F32 { k, .. } => 4 * k,
    }
}
