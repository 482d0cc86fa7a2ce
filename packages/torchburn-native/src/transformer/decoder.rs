//! One decode step of a decoder-only transformer in one call: the token's embedding through every layer
//! (RMSNorm, q/k/v projections with optional bias and q/k RMSNorm, rotary embedding, the KV cache
//! append, attention over the cache, output projection, the gated MLP) to the logits.
//!
//! The switches that tell the families apart are data: the MLP's activation (SiLU or tanh-GELU), the
//! attention's scale and logit cap, norms after attention and after the MLP (Gemma 2/3), a window
//! per layer, a second rotary table for windowed layers (Gemma 3), rotation of only the first part of
//! each head (Phi-4-mini), the embedding's scale and the logits' cap.
//!
//! The Python side describes the model (sizes, weights, norms) once; each step then costs one foreign
//! call instead of a few hundred torch operations and matrix calls, each with its own dispatch and
//! thread-pool wake-up. Projections that read the same input (q/k/v; gate/up) share one parallel job
//! and one activation quantization. Everything else is a few thousand flops per layer and runs on the
//! calling thread.
//!
//! Weights are int8/int4 [`QMatrix`] or f32 matrices owned by Python (raw addresses: the caller keeps
//! the tensors alive and unchanged while the decoder exists, see `Decoder` in `python/transformer.rs`).

use std::sync::Arc;

use torchburn_native_macros::isa_versions;

use super::attention::{attend, Scoring, PARALLEL_ATTENTION_MIN};
use super::project::project_tokens;
use crate::kernels::ggml::GgmlMatrix;
use crate::kernels::math::{exp_f32, gelu_tanh_f32, tanh_f32};
use crate::kernels::quant::QMatrix;
use crate::threads;

/// A projection's weight `[n, k]`.
pub enum Weight {
    Quant(Arc<QMatrix>),
    /// a GGUF tensor type, computed in as stored
    Ggml(Arc<GgmlMatrix>),
    /// row-major f32 at this address
    F32 {
        ptr: usize,
        n: usize,
        k: usize,
    },
}

/// `y = W x (+ b)`.
pub struct Projection {
    pub w: Weight,
    /// address of `n` f32
    pub bias: Option<usize>,
}

impl Projection {
    pub fn n(&self) -> usize {
        match &self.w {
            Weight::Quant(q) => q.n,
            Weight::Ggml(m) => m.n,
            Weight::F32 { n, .. } => *n,
        }
    }

    pub fn k(&self) -> usize {
        match &self.w {
            Weight::Quant(q) => q.k,
            Weight::Ggml(m) => m.k,
            Weight::F32 { k, .. } => *k,
        }
    }
}

/// One layer: addresses of f32 vectors for the norms, and its projections.
pub struct Layer {
    pub ln_attn: usize,
    pub ln_mlp: usize,
    /// RMSNorm of the attention's and the MLP's outputs before they join the residual (Gemma 2/3)
    pub post_attn_norm: Option<usize>,
    pub post_mlp_norm: Option<usize>,
    /// whether [`Dims::window`] limits this layer's attention (every layer's, unless a family
    /// alternates windowed and global layers)
    pub windowed: bool,
    /// which of the caller's rotary tables this layer reads (0: the main one, 1: the windowed
    /// layers' own, see [`CacheIo`])
    pub rope: usize,
    /// `[head_dim]` weights of the per-head q/k RMSNorm (Qwen3)
    pub q_norm: Option<usize>,
    pub k_norm: Option<usize>,
    pub q: Projection,
    pub k: Projection,
    pub v: Projection,
    pub o: Projection,
    pub gate: Projection,
    pub up: Projection,
    pub down: Projection,
}

/// The shapes of the model.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub eps: f32,
    /// keys older than this many positions are not attended to, in the layers marked windowed
    pub window: Option<usize>,
    /// the first this many elements of each head are rotated (pairs `i`, `i + rotary_dim / 2`); the
    /// rest pass unchanged
    pub rotary_dim: usize,
    /// attention scores are `q·k · attn_scale` (`1/√head_dim` in most families)
    pub attn_scale: f32,
    /// scores pass through `cap · tanh(s / cap)` before the softmax (Gemma 2)
    pub attn_softcap: Option<f32>,
    /// the logits too (Gemma 2)
    pub final_softcap: Option<f32>,
    /// the embedding rows are multiplied by this (`√hidden` in Gemma)
    pub embed_scale: f32,
    pub activation: Activation,
}

/// The gated MLP's activation: `down(act(gate) · up)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// PyTorch's `gelu(approximate="tanh")`
    GeluTanh,
}

impl Activation {
    /// `g = act(g) · u`.
    pub(crate) fn gate_into(self, g: &mut [f32], u: &[f32]) {
        match self {
            Activation::Silu => silu_mul(g, u),
            Activation::GeluTanh => gelu_tanh_mul(g, u),
        }
    }
}

/// The token embedding `[vocab, hidden]`: f32 at an address, or a GGUF matrix whose rows are
/// dequantized as tokens look them up (a large vocabulary's table stays as stored).
pub enum Embedding {
    F32(usize),
    Ggml(Arc<GgmlMatrix>),
}

impl Embedding {
    /// Token `token`'s row into `out` (`hidden` long).
    ///
    /// # Safety
    /// An f32 table's address must hold `vocab · hidden` floats, with `token < vocab`.
    pub unsafe fn row_into(&self, token: usize, vocab: usize, out: &mut [f32]) {
        let hidden = out.len();
        match self {
            Embedding::F32(ptr) => {
                out.copy_from_slice(&slice(*ptr, vocab * hidden)[token * hidden..][..hidden])
            }
            Embedding::Ggml(m) => m.dequantize_rows(token..token + 1, out),
        }
    }

    /// `(rows, columns)` of the table (None for an f32 address, whose size the caller vouches for).
    pub fn shape(&self) -> Option<(usize, usize)> {
        match self {
            Embedding::F32(_) => None,
            Embedding::Ggml(m) => Some((m.n, m.k)),
        }
    }
}

pub struct Decoder {
    pub dims: Dims,
    pub embed: Embedding,
    pub norm: usize,
    pub head: Projection,
    pub layers: Vec<Layer>,
}

/// Where a call reads and writes: the KV cache `[layers, kv_heads, capacity, head_dim]` (keys and
/// values), the rotary tables of the positions it runs (`[T, rotary_dim]` each; one row for a step;
/// `[0]` the main table, `[1]` the one layers with `rope == 1` read, which may be the same) and the
/// logits (`vocab` per token they are asked for).
#[derive(Clone, Copy)]
pub struct CacheIo {
    pub keys: *mut f32,
    pub values: *mut f32,
    pub capacity: usize,
    pub cos: [*const f32; 2],
    pub sin: [*const f32; 2],
    pub logits: *mut f32,
}

impl Decoder {
    /// Checks that every projection has the shape the dimensions call for.
    pub fn validate(&self) -> Result<(), String> {
        let Dims {
            hidden,
            heads,
            kv_heads,
            head_dim,
            vocab,
            ..
        } = self.dims;
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) || head_dim % 2 != 0 {
            return Err(format!(
                "{heads} heads over {kv_heads} KV heads of size {head_dim} is not a valid attention shape"
            ));
        }
        let rd = self.dims.rotary_dim;
        if rd == 0 || !rd.is_multiple_of(2) || rd > head_dim {
            return Err(format!(
                "a rotary width of {rd} does not fit heads of {head_dim} (it must be even, 2..={head_dim})"
            ));
        }
        for cap in [self.dims.attn_softcap, self.dims.final_softcap]
            .into_iter()
            .flatten()
        {
            if !(cap.is_finite() && cap > 0.0) {
                return Err(format!(
                    "a logit cap must be positive and finite, got {cap}"
                ));
            }
        }
        if let Some(l) = self.layers.iter().position(|l| l.rope > 1) {
            return Err(format!(
                "layer {l} names rotary table {}; there are two (0, 1)",
                self.layers[l].rope
            ));
        }
        let check = |what: &str, p: &Projection, n: usize, k: usize| {
            if (p.n(), p.k()) == (n, k) {
                Ok(())
            } else {
                Err(format!("{what} is {}x{}, expected {n}x{k}", p.n(), p.k()))
            }
        };
        let inter = self.layers.first().map_or(0, |l| l.gate.n());
        for (i, l) in self.layers.iter().enumerate() {
            check(&format!("layer {i} q"), &l.q, heads * head_dim, hidden)?;
            check(&format!("layer {i} k"), &l.k, kv_heads * head_dim, hidden)?;
            check(&format!("layer {i} v"), &l.v, kv_heads * head_dim, hidden)?;
            check(&format!("layer {i} o"), &l.o, hidden, heads * head_dim)?;
            check(&format!("layer {i} gate"), &l.gate, inter, hidden)?;
            check(&format!("layer {i} up"), &l.up, inter, hidden)?;
            check(&format!("layer {i} down"), &l.down, hidden, inter)?;
        }
        if let Some(shape) = self.embed.shape() {
            if shape != (vocab, hidden) {
                return Err(format!(
                    "the embedding is {}x{}, expected {vocab}x{hidden}",
                    shape.0, shape.1
                ));
            }
        }
        check("the output projection", &self.head, vocab, hidden)
    }

    /// Runs token `token` at position `pos` (the cache holds positions `0..pos`), writing its keys and
    /// values at `pos` and its logits.
    ///
    /// # Safety
    /// Every address the decoder holds must be live; `io`'s buffers must have the sizes [`CacheIo`]
    /// names, with `pos < io.capacity`, and not overlap the weights.
    pub unsafe fn step(&self, token: usize, pos: usize, io: &CacheIo) {
        // a step is ~120 short parallel jobs with nothing of PyTorch's between them
        threads::on_own_pool(|| self.step_on_pool(token, pos, io))
    }

    /// # Safety
    /// As [`Decoder::step`].
    unsafe fn step_on_pool(&self, token: usize, pos: usize, io: &CacheIo) {
        let d = self.dims;
        let (hd, kvh) = (d.head_dim, d.kv_heads);
        let q_len = d.heads * hd;
        let kv_len = kvh * hd;
        let inter = self.layers.first().map_or(0, |l| l.gate.n());
        let mut x = vec![0f32; d.hidden];
        self.embed.row_into(token, d.vocab, &mut x);
        scale_in_place(&mut x, d.embed_scale);
        let mut h = vec![0f32; d.hidden];
        let mut qkv = vec![0f32; q_len + 2 * kv_len];
        let mut att = vec![0f32; q_len];
        let mut proj = vec![0f32; d.hidden];
        let mut gate_up = vec![0f32; 2 * inter];
        let mut scores = vec![0f32; pos + 1];
        let rd = d.rotary_dim;
        let layer_stride = kvh * io.capacity * hd;
        for (li, l) in self.layers.iter().enumerate() {
            let cos = std::slice::from_raw_parts(io.cos[l.rope], rd);
            let sin = std::slice::from_raw_parts(io.sin[l.rope], rd);
            // attention
            rms_norm(&x, slice(l.ln_attn, d.hidden), d.eps, &mut h);
            project(&[&l.q, &l.k, &l.v], &h, &mut qkv);
            let (q, kv) = qkv.split_at_mut(q_len);
            let (k, v) = kv.split_at_mut(kv_len);
            for (heads, norm) in [(&mut *q, l.q_norm), (&mut *k, l.k_norm)] {
                for head in heads.chunks_exact_mut(hd) {
                    if let Some(w) = norm {
                        rms_norm_in_place(head, slice(w, hd), d.eps);
                    }
                    rotate(&mut head[..rd], cos, sin);
                }
            }
            let keys = io.keys.add(li * layer_stride);
            let values = io.values.add(li * layer_stride);
            for g in 0..kvh {
                let at = (g * io.capacity + pos) * hd;
                std::ptr::copy_nonoverlapping(k[g * hd..].as_ptr(), keys.add(at), hd);
                std::ptr::copy_nonoverlapping(v[g * hd..].as_ptr(), values.add(at), hd);
            }
            let window = d.window.filter(|_| l.windowed);
            let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let group = d.heads / kvh;
            let seen = pos + 1 - first;
            let (q, att_out) = (&*q, threads::SendPtr(att.as_mut_ptr()));
            let (keys, values) = (threads::SendPtr(keys), threads::SendPtr(values));
            let capacity = io.capacity;
            let scoring = Scoring::of(&d);
            let head = |hi: usize, scores: &mut [f32]| {
                let g = hi / group;
                let at = (g * capacity + first) * hd;
                // SAFETY: the cache holds `capacity` positions of every KV head of this layer; head
                // `hi` writes its own slice of `att`
                let (kc, vc, out) = unsafe {
                    (
                        std::slice::from_raw_parts(keys.get().add(at), seen * hd),
                        std::slice::from_raw_parts(values.get().add(at), seen * hd),
                        std::slice::from_raw_parts_mut(att_out.get().add(hi * hd), hd),
                    )
                };
                attend(&q[hi * hd..][..hd], kc, vc, &scoring, scores, out);
            };
            // heads in parallel once the context makes them worth waking the pool
            if seen * d.heads >= PARALLEL_ATTENTION_MIN {
                threads::parallel_for(d.heads, |hi| head(hi, &mut vec![0f32; seen]));
            } else {
                for hi in 0..d.heads {
                    head(hi, &mut scores[..seen]);
                }
            }
            project(&[&l.o], &att, &mut proj);
            if let Some(w) = l.post_attn_norm {
                rms_norm_in_place(&mut proj, slice(w, d.hidden), d.eps);
            }
            add_into(&mut x, &proj);
            // MLP
            rms_norm(&x, slice(l.ln_mlp, d.hidden), d.eps, &mut h);
            project(&[&l.gate, &l.up], &h, &mut gate_up);
            let (g, u) = gate_up.split_at_mut(inter);
            d.activation.gate_into(g, u);
            project(&[&l.down], g, &mut proj);
            if let Some(w) = l.post_mlp_norm {
                rms_norm_in_place(&mut proj, slice(w, d.hidden), d.eps);
            }
            add_into(&mut x, &proj);
        }
        rms_norm(&x, slice(self.norm, d.hidden), d.eps, &mut h);
        let logits = std::slice::from_raw_parts_mut(io.logits, d.vocab);
        project(&[&self.head], &h, logits);
        if let Some(cap) = d.final_softcap {
            soft_cap(logits, cap);
        }
    }
}

/// # Safety
/// `addr` must hold `len` live f32.
pub(crate) unsafe fn slice<'a>(addr: usize, len: usize) -> &'a [f32] {
    std::slice::from_raw_parts(addr as *const f32, len)
}

/// `out = x / sqrt(mean(x²) + eps) · w`.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let r = rms_scale(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * r * g;
    }
}

/// [`rms_norm`] of `x` into itself (a head's q or k).
pub(crate) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let r = rms_scale(x, eps);
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * r * g;
    }
}

/// `1 / sqrt(mean(x²) + eps)`.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    1.0 / (sum_squares(x) / x.len() as f32 + eps).sqrt()
}

#[isa_versions]
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[isa_versions]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot16(a, b)
}

/// Sixteen running sums, so the loop vectorizes in a fixed order; inlined into callers compiled per ISA.
#[inline(always)]
pub(super) fn dot16(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    tree16(acc) + tail
}

/// The sum of sixteen lanes by halving (`a[i] + a[i + 8]`, then `+ 4`, `+ 2`, `+ 1`): a few vector
/// adds, where a left-to-right sum is fifteen dependent scalar adds (the cost of a whole 64-wide dot
/// product again, in attention's one dot per cached key).
#[inline(always)]
fn tree16(a: [f32; 16]) -> f32 {
    let a8: [f32; 8] = std::array::from_fn(|i| a[i] + a[i + 8]);
    let a4: [f32; 4] = std::array::from_fn(|i| a8[i] + a8[i + 4]);
    (a4[0] + a4[2]) + (a4[1] + a4[3])
}

/// Rotary embedding in the "rotate half" layout: pairs are (i, i + D/2).
pub(crate) fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/// `x += y`.
#[isa_versions]
pub(crate) fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `x = cap · tanh(x / cap)`, in that order of operations (as `transformers` computes it).
#[isa_versions]
pub(crate) fn soft_cap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = tanh_f32(*v / cap) * cap;
    }
}

/// `x *= s` (nothing to do for 1).
pub(crate) fn scale_in_place(x: &mut [f32], s: f32) {
    if s != 1.0 {
        for v in x.iter_mut() {
            *v *= s;
        }
    }
}

/// `g = gelu_tanh(g) · u`.
#[isa_versions]
pub(crate) fn gelu_tanh_mul(g: &mut [f32], u: &[f32]) {
    for (a, &b) in g.iter_mut().zip(u) {
        *a = gelu_tanh_f32(*a) * b;
    }
}

/// `g = silu(g) · u`, as `g / (1 + e^-g) · u` (PyTorch's form).
#[isa_versions]
pub(crate) fn silu_mul(g: &mut [f32], u: &[f32]) {
    for (a, &b) in g.iter_mut().zip(u) {
        *a = *a / (1.0 + exp_f32(-*a)) * b;
    }
}

/// `out = [P₀ x; P₁ x; ...]` for projections with the same input, as one parallel job over all their
/// rows (see [`project_tokens`]: the input is quantized once per activation format they take).
fn project(ps: &[&Projection], x: &[f32], out: &mut [f32]) {
    let total: usize = ps.iter().map(|p| p.n()).sum();
    assert_eq!(out.len(), total, "projection output length");
    let mut parts = Vec::with_capacity(ps.len());
    let mut rest = out;
    for p in ps {
        let (part, tail) = rest.split_at_mut(p.n());
        parts.push(part);
        rest = tail;
    }
    project_tokens(ps, x, 1, &mut parts);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotate_matches_the_rotate_half_formula() {
        let mut x = [1.0, 2.0, 3.0, 4.0];
        let (cos, sin) = ([0.5, 0.25, 0.5, 0.25], [0.1, 0.2, 0.1, 0.2]);
        rotate(&mut x, &cos, &sin);
        // x·cos + cat(-x2, x1)·sin
        let want = [
            1.0 * 0.5 - 3.0 * 0.1,
            2.0 * 0.25 - 4.0 * 0.2,
            3.0 * 0.5 + 1.0 * 0.1,
            4.0 * 0.25 + 2.0 * 0.2,
        ];
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{x:?} vs {want:?}");
        }
    }

    #[test]
    fn silu_mul_is_g_sigmoid_g_times_u() {
        let mut g: Vec<f32> = (0..37).map(|i| i as f32 * 0.37 - 6.0).collect();
        let u: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.05).collect();
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&a, &b)| a as f64 / (1.0 + (-a as f64).exp()) * b as f64)
            .collect();
        silu_mul(&mut g, &u);
        for (got, want) in g.iter().zip(want) {
            assert!((*got as f64 - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn gelu_tanh_mul_is_pytorchs_tanh_gelu_times_u() {
        let mut g: Vec<f32> = (0..53).map(|i| i as f32 * 0.41 - 11.0).collect();
        let u: Vec<f32> = (0..53).map(|i| 0.5 + i as f32 * 0.03).collect();
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&a, &b)| {
                let a = a as f64;
                let inner = (2.0 / std::f64::consts::PI).sqrt() * (a + 0.044715 * a * a * a);
                0.5 * a * (1.0 + inner.tanh()) * b as f64
            })
            .collect();
        gelu_tanh_mul(&mut g, &u);
        for (got, want) in g.iter().zip(want) {
            assert!(
                (*got as f64 - want).abs() < 2e-6 * (1.0 + want.abs()),
                "{got} vs {want}"
            );
        }
    }

    #[test]
    fn soft_cap_is_cap_tanh_of_x_over_cap() {
        let mut x: Vec<f32> = (0..41).map(|i| i as f32 * 3.3 - 66.0).collect();
        x.extend([f32::INFINITY, f32::NEG_INFINITY, 0.0]);
        let want: Vec<f64> = x.iter().map(|&v| 30.0 * (v as f64 / 30.0).tanh()).collect();
        soft_cap(&mut x, 30.0);
        for (got, want) in x.iter().zip(want) {
            assert!((*got as f64 - want).abs() < 1e-5 * 30.0, "{got} vs {want}");
        }
    }
}
