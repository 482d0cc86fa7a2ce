//! A prompt's pass through a decoder-only transformer in one call: `T` tokens through every layer at the
//! positions after those already cached, their keys and values into the KV cache, and the logits of
//! the last token (or of all of them).
//!
//! The same model description as the decode step ([`Decoder`]), with the work shaped for many
//! tokens: the projections are matrix products over all the prompt's rows (q/k/v in one call and
//! gate/up in another, see [`qprefill::matmul_many`]); attention is two products per head and block
//! of queries, causal and windowed, with the softmax in between; the norms, rotary embedding and SiLU
//! run over the rows in parallel. The tensor-code forward pass in Python does the same in about a
//! dozen torch operations per layer, whose dispatch and passes over memory cost a sixth of a small
//! model's prompt.

use torchburn_native_macros::isa_versions;

use super::attention::Scoring;
use super::decoder::{
    add_into, rms_norm, rms_norm_in_place, rotate, scale_in_place, slice, soft_cap, CacheIo,
    Decoder, Projection, Weight,
};
use crate::kernels::gemm::{gemm, Mat, MatMut};
use crate::kernels::lanes::{max16, sum16};
use crate::kernels::math::exp_f32;
use crate::kernels::qprefill::{self, RowSource};
use crate::threads::{self, SendPtr};

/// Queries per attention task: a head's rows are split so that both threads have work on short
/// prompts and the causal triangle's uneven blocks balance out.
const QUERY_BLOCK: usize = 32;

/// One prompt of a batched prefill: `tokens` at positions `start..start + T` of the sequence whose
/// cache holds `0..start` (`io`: its cache, its rotary rows `[T, rotary_dim]` and its logits).
pub struct Prompt<'a> {
    pub tokens: &'a [usize],
    pub start: usize,
    pub io: CacheIo,
}

impl Decoder {
    /// Runs `tokens` at positions `start..start + T` (the cache holds `0..start`), writing the last
    /// token's logits, or every token's (`[T, vocab]`) with `all_logits`.
    ///
    /// # Safety
    /// Every address the decoder holds must be live; `io`'s buffers must have the sizes [`CacheIo`]
    /// names, with `start + T <= io.capacity`, and not overlap the weights.
    pub unsafe fn prefill(&self, tokens: &[usize], start: usize, io: &CacheIo, all_logits: bool) {
        let prompt = Prompt {
            tokens,
            start,
            io: *io,
        };
        threads::on_own_pool(|| self.prefill_on_pool(&[prompt], all_logits))
    }

    /// Runs several sequences' prompts in one pass: the projections take all their rows at once (each
    /// weight read once for all of them, as one longer prompt would), attention runs per prompt over
    /// its own cache, and each prompt's last logits go to its own buffer. A prompt of at least
    /// [`qprefill::MIN_TOKENS`] tokens gets what [`Decoder::prefill`] gives it alone, bit for bit
    /// (the prompt kernels compute each row on its own); a shorter one would take the prompt
    /// kernels' arithmetic here and the decode kernels' alone.
    ///
    /// # Safety
    /// As [`Decoder::prefill`] for every prompt; besides, no two prompts' caches or logits may
    /// overlap.
    pub unsafe fn prefill_batch(&self, prompts: &[Prompt<'_>]) {
        threads::on_own_pool(|| self.prefill_on_pool(prompts, false))
    }

    /// # Safety
    /// As [`Decoder::prefill_batch`]; `all_logits` with a single prompt only.
    unsafe fn prefill_on_pool(&self, prompts: &[Prompt<'_>], all_logits: bool) {
        let d = self.dims;
        assert!(
            !all_logits || prompts.len() == 1,
            "every token's logits for one prompt only"
        );
        let prompts: Vec<&Prompt> = prompts.iter().filter(|p| !p.tokens.is_empty()).collect();
        // each prompt's first row in the stacked rows
        let firsts: Vec<usize> = prompts
            .iter()
            .scan(0, |row, p| {
                let first = *row;
                *row += p.tokens.len();
                Some(first)
            })
            .collect();
        let t: usize = prompts.iter().map(|p| p.tokens.len()).sum();
        if t == 0 {
            return;
        }
        let (hd, kvh, hidden) = (d.head_dim, d.kv_heads, d.hidden);
        let (q_len, kv_len) = (d.heads * hd, kvh * hd);
        let inter = self.layers.first().map_or(0, |l| l.gate.n());
        let mut x = vec![0f32; t * hidden]; // [T, H] the residual stream, every prompt's rows in turn
        let tokens = prompts.iter().flat_map(|p| p.tokens.iter());
        for (row, &tok) in x.chunks_exact_mut(hidden).zip(tokens) {
            self.embed.row_into(tok, d.vocab, row);
            scale_in_place(row, d.embed_scale);
        }
        let mut h = vec![0f32; t * hidden];
        let (mut q, mut k, mut v) = (
            vec![0f32; t * q_len],  // [T, Hq·D]
            vec![0f32; t * kv_len], // [T, KVH·D]
            vec![0f32; t * kv_len],
        );
        let mut att = vec![0f32; t * q_len];
        let mut proj = vec![0f32; t * hidden];
        let (mut gate, mut up) = (vec![0f32; t * inter], vec![0f32; t * inter]);
        let rd = d.rotary_dim;
        for (li, l) in self.layers.iter().enumerate() {
            norm_rows(&x, slice(l.ln_attn, hidden), d.eps, &mut h);
            project_rows(&[&l.q, &l.k, &l.v], &h, t, &mut [&mut q, &mut k, &mut v]);
            for (p, &first) in prompts.iter().zip(&firsts) {
                let (io, pt) = (&p.io, p.tokens.len());
                // this prompt's positions: its own rotary rows
                let cos = std::slice::from_raw_parts(io.cos[l.rope], pt * rd);
                let sin = std::slice::from_raw_parts(io.sin[l.rope], pt * rd);
                for (heads, norm, width) in [(&mut q, l.q_norm, q_len), (&mut k, l.k_norm, kv_len)]
                {
                    let norm = norm.map(|w| slice(w, hd));
                    let rows = &mut heads[first * width..][..pt * width];
                    threads::par_chunks_mut_min(rows, width, 8, |ti, row| {
                        for head in row.chunks_exact_mut(hd) {
                            if let Some(w) = norm {
                                rms_norm_in_place(head, w, d.eps);
                            }
                            rotate(
                                &mut head[..rd],
                                &cos[ti * rd..][..rd],
                                &sin[ti * rd..][..rd],
                            );
                        }
                    });
                }
                // its keys and values into its own cache
                let layer_stride = kvh * io.capacity * hd;
                let (keys, values) = (
                    io.keys.add(li * layer_stride),
                    io.values.add(li * layer_stride),
                );
                for ti in 0..pt {
                    for g in 0..kvh {
                        let at = (g * io.capacity + p.start + ti) * hd;
                        let from = (first + ti) * kv_len + g * hd;
                        std::ptr::copy_nonoverlapping(k[from..].as_ptr(), keys.add(at), hd);
                        std::ptr::copy_nonoverlapping(v[from..].as_ptr(), values.add(at), hd);
                    }
                }
                let window = d.window.filter(|_| l.windowed);
                self.attend_rows(
                    &q[first * q_len..][..pt * q_len],
                    keys,
                    values,
                    io.capacity,
                    p.start,
                    pt,
                    window,
                    &mut att[first * q_len..][..pt * q_len],
                );
            }
            project_rows(&[&l.o], &att, t, &mut [&mut proj]);
            if let Some(w) = l.post_attn_norm {
                norm_rows_in_place(&mut proj, slice(w, hidden), d.eps);
            }
            add_into(&mut x, &proj);
            norm_rows(&x, slice(l.ln_mlp, hidden), d.eps, &mut h);
            project_rows(&[&l.gate, &l.up], &h, t, &mut [&mut gate, &mut up]);
            threads::par_chunks_mut_min(&mut gate, inter, 8, |ti, g| {
                d.activation.gate_into(g, &up[ti * inter..][..inter])
            });
            project_rows(&[&l.down], &gate, t, &mut [&mut proj]);
            if let Some(w) = l.post_mlp_norm {
                norm_rows_in_place(&mut proj, slice(w, hidden), d.eps);
            }
            add_into(&mut x, &proj);
        }
        if all_logits {
            let io = &prompts[0].io;
            let mut normed = vec![0f32; t * hidden];
            norm_rows(&x, slice(self.norm, hidden), d.eps, &mut normed);
            let logits = std::slice::from_raw_parts_mut(io.logits, t * d.vocab);
            project_rows(&[&self.head], &normed, t, &mut [&mut *logits]);
            if let Some(cap) = d.final_softcap {
                threads::par_chunks_mut_min(logits, d.vocab, 1, |_, row| soft_cap(row, cap));
            }
            return;
        }
        // each prompt's last row: [P, H]
        let mut last = vec![0f32; prompts.len() * hidden];
        for ((p, &first), row) in prompts
            .iter()
            .zip(&firsts)
            .zip(last.chunks_exact_mut(hidden))
        {
            let at = (first + p.tokens.len() - 1) * hidden;
            rms_norm(&x[at..][..hidden], slice(self.norm, hidden), d.eps, row);
        }
        // fewer rows than the prompt kernels take at a time, so that each last row gets the
        // arithmetic a prompt's single last row gets alone
        let per_call = qprefill::MIN_TOKENS - 1;
        let mut logits = vec![0f32; per_call.min(prompts.len()) * d.vocab];
        for (rows, ps) in last.chunks(per_call * hidden).zip(prompts.chunks(per_call)) {
            let n = ps.len();
            if n == 1 {
                // straight into its own buffer
                let out = std::slice::from_raw_parts_mut(ps[0].io.logits, d.vocab);
                project_rows(&[&self.head], rows, 1, &mut [out]);
                continue;
            }
            let out = &mut logits[..n * d.vocab];
            project_rows(&[&self.head], rows, n, &mut [&mut *out]);
            for (p, row) in ps.iter().zip(out.chunks_exact(d.vocab)) {
                std::ptr::copy_nonoverlapping(row.as_ptr(), p.io.logits, d.vocab);
            }
        }
        if let Some(cap) = d.final_softcap {
            let rows: Vec<SendPtr<f32>> = prompts.iter().map(|p| SendPtr(p.io.logits)).collect();
            threads::parallel_for(rows.len(), |r| {
                // SAFETY: prompt r's logits, `vocab` floats of its own
                soft_cap(
                    unsafe { std::slice::from_raw_parts_mut(rows[r].get(), d.vocab) },
                    cap,
                )
            });
        }
    }

    /// Causal (and, with `window`, windowed) attention of the `t` new queries `q` `[T, Hq·D]` over the
    /// cache's keys and values `0..start + t` of one layer, into `out` `[T, Hq·D]`: per head and block
    /// of queries, `scores = Q·Kᵀ · scale` (capped where the family caps them), a softmax over each
    /// query's visible keys, `out = P·V`.
    ///
    /// # Safety
    /// `keys` / `values` point at one layer's cache, `[KVH, capacity, D]`, holding `start + t` positions.
    #[allow(clippy::too_many_arguments)]
    unsafe fn attend_rows(
        &self,
        q: &[f32],
        keys: *mut f32,
        values: *mut f32,
        capacity: usize,
        start: usize,
        t: usize,
        window: Option<usize>,
        out: &mut [f32],
    ) {
        let d = self.dims;
        let hd = d.head_dim;
        let q_len = d.heads * hd;
        let group = d.heads / d.kv_heads;
        let Scoring { scale, softcap } = Scoring::of(&d);
        let blocks = t.div_ceil(QUERY_BLOCK);
        let (keys, values, out_ptr) = (SendPtr(keys), SendPtr(values), SendPtr(out.as_mut_ptr()));
        // the last blocks of a head see the most keys: claim them first
        threads::parallel_for(d.heads * blocks, |task| {
            let (head, b) = (task % d.heads, blocks - 1 - task / d.heads);
            let g = head / group;
            let (t0, t1) = (b * QUERY_BLOCK, ((b + 1) * QUERY_BLOCK).min(t));
            let rows = t1 - t0;
            // keys any query of the block may see: from the first one's window to the last one
            let first = window.map_or(0, |w| (start + t0 + 1).saturating_sub(w));
            let seen = start + t1 - first;
            let mut scores = vec![0f32; rows * seen]; // [rows, S]
            let kv_at = (g * capacity + first) * hd;
            // SAFETY: the cache holds `start + t` positions of every KV head; this task writes its own
            // head's columns of its own rows of `out`
            unsafe {
                gemm(
                    rows,
                    seen,
                    hd,
                    Mat {
                        ptr: q.as_ptr().add(t0 * q_len + head * hd),
                        rs: q_len as isize,
                        cs: 1,
                    },
                    Mat {
                        ptr: keys.get().add(kv_at),
                        rs: 1,
                        cs: hd as isize,
                    },
                    MatMut {
                        ptr: scores.as_mut_ptr(),
                        rs: seen as isize,
                        cs: 1,
                    },
                    false,
                    scale,
                    false,
                );
                for (r, row) in scores.chunks_exact_mut(seen).enumerate() {
                    let pos = start + t0 + r;
                    let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w)) - first;
                    if let Some(cap) = softcap {
                        soft_cap(&mut row[lo..pos + 1 - first], cap);
                    }
                    softmax_visible(row, lo, pos + 1 - first);
                }
                gemm(
                    rows,
                    hd,
                    seen,
                    Mat {
                        ptr: scores.as_ptr(),
                        rs: seen as isize,
                        cs: 1,
                    },
                    Mat {
                        ptr: values.get().add(kv_at),
                        rs: hd as isize,
                        cs: 1,
                    },
                    MatMut {
                        ptr: out_ptr.get().add(t0 * q_len + head * hd),
                        rs: q_len as isize,
                        cs: 1,
                    },
                    false,
                    1.0,
                    false,
                );
            }
        });
    }
}

/// `out[P₀; P₁; ...]` of the `tokens` rows of `x`, each projection into its own `[T, n]` output, with
/// biases added: quantized and GGUF-typed weights through [`qprefill::matmul_sources`] (one call
/// for all of them when none is f32), f32 weights through the GEMM.
fn project_rows(ps: &[&Projection], x: &[f32], tokens: usize, outs: &mut [&mut [f32]]) {
    let quantized: Option<Vec<&dyn RowSource>> = ps
        .iter()
        .map(|p| match &p.w {
            Weight::Quant(q) => Some(&**q as &dyn RowSource),
            Weight::Ggml(m) => Some(&**m as &dyn RowSource),
            Weight::F32 { .. } => None,
        })
        .collect();
    if let (Some(ms), true) = (quantized, tokens >= qprefill::MIN_TOKENS) {
        qprefill::matmul_sources(&ms, x, tokens, outs);
    } else {
        for (p, out) in ps.iter().zip(outs.iter_mut()) {
            let (n, k) = (p.n(), p.k());
            match &p.w {
                Weight::Quant(q) => qprefill::matmul_many(&[&**q], x, tokens, &mut [&mut **out]),
                Weight::Ggml(m) => m.matmul(x, tokens, out),
                // SAFETY: the decoder's contract: a live n×k f32 matrix; `x` and `out` hold `tokens`
                // rows of k and n
                Weight::F32 { ptr, .. } => unsafe {
                    gemm(
                        tokens,
                        n,
                        k,
                        Mat {
                            ptr: x.as_ptr(),
                            rs: k as isize,
                            cs: 1,
                        },
                        Mat {
                            ptr: *ptr as *const f32,
                            rs: 1,
                            cs: k as isize,
                        },
                        MatMut {
                            ptr: out.as_mut_ptr(),
                            rs: n as isize,
                            cs: 1,
                        },
                        false,
                        1.0,
                        true,
                    )
                },
            }
        }
    }
    for (p, out) in ps.iter().zip(outs.iter_mut()) {
        if let Some(bias) = p.bias {
            // SAFETY: the bias holds n f32
            let bias = unsafe { slice(bias, p.n()) };
            for row in out.chunks_exact_mut(p.n()).take(tokens) {
                add_into(row, bias);
            }
        }
    }
}

/// RMSNorm of every row of `x` (rows of `w.len()`), in parallel over rows.
fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    threads::par_chunks_mut_min(out, n, 16, |r, o| rms_norm(&x[r * n..][..n], w, eps, o));
}

/// RMSNorm of every row of `x` in place (the post-attention and post-MLP norms).
fn norm_rows_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    threads::par_chunks_mut_min(x, n, 16, |_, row| rms_norm_in_place(row, w, eps));
}

/// Softmax of `row[lo..hi]` in place, zero elsewhere: the keys outside a query's causal window get
/// no weight.
#[isa_versions]
fn softmax_visible(row: &mut [f32], lo: usize, hi: usize) {
    let (before, rest) = row.split_at_mut(lo);
    let (visible, after) = rest.split_at_mut(hi - lo);
    before.fill(0.0);
    after.fill(0.0);
    let max = max16(visible);
    for s in visible.iter_mut() {
        *s = exp_f32(*s - max);
    }
    let inv = 1.0 / sum16(visible);
    for s in visible.iter_mut() {
        *s *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_visible_weights_only_the_window() {
        let mut row = [1.0f32, 2.0, 3.0, 4.0, 5.0];
        softmax_visible(&mut row, 1, 4);
        let e: Vec<f64> = [2.0f64, 3.0, 4.0].iter().map(|v| v.exp()).collect();
        let total: f64 = e.iter().sum();
        assert_eq!((row[0], row[4]), (0.0, 0.0));
        for (got, want) in row[1..4].iter().zip(&e) {
            assert!(
                (*got as f64 - want / total).abs() < 1e-6,
                "{got} vs {}",
                want / total
            );
        }
    }
}
