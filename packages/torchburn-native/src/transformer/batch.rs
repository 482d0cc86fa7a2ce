//! One decode step of several independent sequences in one call: token `b` at position `pos[b]` over
//! sequence `b`'s own KV cache, for every `b` (a server's continuous batching: sequences join and
//! leave between steps, each at its own length).
//!
//! The work is shaped like a prefill of `B` rows: the residual stream is `[B, H]` and each projection
//! runs over all the rows at once, so every weight is read from memory once per step for all the
//! sequences; a step of one sequence is bound by reading them. Unlike a prefill the rows are not
//! consecutive positions of one sequence: the q/k norms and rotary embedding use each row's own
//! position, each row's keys and values go to its own cache, and attention runs per (sequence, head)
//! over that sequence's cache alone.
//!
//! The projections take the decode step's kernels (activations quantized per row, see
//! [`project_tokens`]) and every other operation is the step's own function on the same row, so a
//! batch gives each sequence the logits [`Decoder::step`] gives it.

use super::attention::{attend_heads, Scoring, PARALLEL_ATTENTION_MIN};
use super::decoder::{
    add_into, rms_norm, rms_norm_in_place, rotate, scale_in_place, slice, soft_cap, CacheIo,
    Decoder,
};
use super::project::{project_tokens, project_tokens_to, RowOutputs};
use crate::threads::{self, SendPtr};

impl Decoder {
    /// Runs token `tokens[b]` at position `positions[b]` of sequence `b` (its cache, `ios[b]`, holds
    /// positions `0..positions[b]`) for every `b`: each sequence's keys and values go to its own cache
    /// and its logits to its own buffer, as [`Decoder::step`] would write them for it.
    ///
    /// # Safety
    /// As [`Decoder::step`] for every `(tokens[b], positions[b], ios[b])`; besides, no two sequences'
    /// buffers (caches, logits) may overlap.
    pub unsafe fn step_batch(&self, tokens: &[usize], positions: &[usize], ios: &[CacheIo]) {
        assert!(
            tokens.len() == positions.len() && tokens.len() == ios.len(),
            "a token, a position and a cache per sequence"
        );
        for (&pos, io) in positions.iter().zip(ios) {
            assert!(pos < io.capacity, "position {pos} past the cache");
        }
        match tokens.len() {
            0 => {}
            1 => self.step(tokens[0], positions[0], &ios[0]),
            _ => threads::on_own_pool(|| self.step_batch_on_pool(tokens, positions, ios)),
        }
    }

    /// # Safety
    /// As [`Decoder::step_batch`].
    unsafe fn step_batch_on_pool(&self, tokens: &[usize], positions: &[usize], ios: &[CacheIo]) {
        let d = self.dims;
        let b = tokens.len();
        let (hd, kvh, hidden) = (d.head_dim, d.kv_heads, d.hidden);
        let (q_len, kv_len) = (d.heads * hd, kvh * hd);
        let inter = self.layers.first().map_or(0, |l| l.gate.n());
        let rd = d.rotary_dim;
        let mut x = vec![0f32; b * hidden]; // [B, H] the residual stream, a row per sequence
        for (row, &tok) in x.chunks_exact_mut(hidden).zip(tokens) {
            self.embed.row_into(tok, d.vocab, row);
            scale_in_place(row, d.embed_scale);
        }
        let mut h = vec![0f32; b * hidden];
        let (mut q, mut k, mut v) = (
            vec![0f32; b * q_len],  // [B, Hq·D]
            vec![0f32; b * kv_len], // [B, KVH·D]
            vec![0f32; b * kv_len],
        );
        let mut att = vec![0f32; b * q_len];
        let mut proj = vec![0f32; b * hidden];
        let (mut gate, mut up) = (vec![0f32; b * inter], vec![0f32; b * inter]);
        for (li, l) in self.layers.iter().enumerate() {
            norm_rows(&x, slice(l.ln_attn, hidden), d.eps, &mut h);
            project_tokens(&[&l.q, &l.k, &l.v], &h, b, &mut [&mut q, &mut k, &mut v]);
            for (r, io) in ios.iter().enumerate() {
                // this row's own position: its own rotary rows
                let cos = std::slice::from_raw_parts(io.cos[l.rope], rd);
                let sin = std::slice::from_raw_parts(io.sin[l.rope], rd);
                for (heads, norm, width) in [(&mut q, l.q_norm, q_len), (&mut k, l.k_norm, kv_len)]
                {
                    for head in heads[r * width..][..width].chunks_exact_mut(hd) {
                        if let Some(w) = norm {
                            rms_norm_in_place(head, slice(w, hd), d.eps);
                        }
                        rotate(&mut head[..rd], cos, sin);
                    }
                }
                // its keys and values into its own cache, at its own position
                let layer_at = li * kvh * io.capacity * hd;
                for g in 0..kvh {
                    let at = layer_at + (g * io.capacity + positions[r]) * hd;
                    let from = r * kv_len + g * hd;
                    std::ptr::copy_nonoverlapping(k[from..].as_ptr(), io.keys.add(at), hd);
                    std::ptr::copy_nonoverlapping(v[from..].as_ptr(), io.values.add(at), hd);
                }
            }
            self.attend_batch(li, l.windowed, &q, positions, ios, &mut att);
            project_tokens(&[&l.o], &att, b, &mut [&mut proj]);
            if let Some(w) = l.post_attn_norm {
                norm_rows_in_place(&mut proj, slice(w, hidden), d.eps);
            }
            add_into(&mut x, &proj);
            // MLP
            norm_rows(&x, slice(l.ln_mlp, hidden), d.eps, &mut h);
            project_tokens(&[&l.gate, &l.up], &h, b, &mut [&mut gate, &mut up]);
            for (g, u) in gate.chunks_exact_mut(inter).zip(up.chunks_exact(inter)) {
                d.activation.gate_into(g, u);
            }
            project_tokens(&[&l.down], &gate, b, &mut [&mut proj]);
            if let Some(w) = l.post_mlp_norm {
                norm_rows_in_place(&mut proj, slice(w, hidden), d.eps);
            }
            add_into(&mut x, &proj);
        }
        norm_rows(&x, slice(self.norm, hidden), d.eps, &mut h);
        // each sequence's logits straight into its own buffer
        let logits = RowOutputs {
            rows: vec![ios.iter().map(|io| SendPtr(io.logits)).collect()],
        };
        project_tokens_to(&[&self.head], &h, b, &logits);
        if let Some(cap) = d.final_softcap {
            let rows: Vec<SendPtr<f32>> = ios.iter().map(|io| SendPtr(io.logits)).collect();
            threads::parallel_for(b, |r| {
                // SAFETY: sequence r's logits, `vocab` floats of its own
                soft_cap(
                    unsafe { std::slice::from_raw_parts_mut(rows[r].get(), d.vocab) },
                    cap,
                )
            });
        }
    }

    /// Attention of each row's queries (`q` `[B, Hq·D]`) over its own sequence's cache of layer `li`
    /// (positions `0..=positions[b]`, within the window on windowed layers), into `out` `[B, Hq·D]`:
    /// the decode step's [`attend`] per (sequence, head), in parallel once there is enough of it.
    ///
    /// # Safety
    /// Each `ios[b]`'s cache holds positions `0..=positions[b]` of layer `li`.
    unsafe fn attend_batch(
        &self,
        li: usize,
        windowed: bool,
        q: &[f32],
        positions: &[usize],
        ios: &[CacheIo],
        out: &mut [f32],
    ) {
        let d = self.dims;
        let (hd, heads) = (d.head_dim, d.heads);
        let group = heads / d.kv_heads;
        let window = d.window.filter(|_| windowed);
        let scoring = Scoring::of(&d);
        let seqs: Vec<Seen> = positions
            .iter()
            .zip(ios)
            .map(|(&pos, io)| {
                let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let layer_at = li * d.kv_heads * io.capacity * hd;
                Seen {
                    first,
                    count: pos + 1 - first,
                    keys: SendPtr(io.keys.add(layer_at)),
                    values: SendPtr(io.values.add(layer_at)),
                    capacity: io.capacity,
                }
            })
            .collect();
        let out_ptr = SendPtr(out.as_mut_ptr());
        let kvh = d.kv_heads;
        // one task per (sequence, KV head): the query heads sharing that KV head run together
        let group_of = |task: usize, scores: &mut [f32]| {
            let (r, g) = (task / kvh, task % kvh);
            let Seen {
                first,
                count: seen,
                keys,
                values,
                capacity,
            } = seqs[r];
            let at = (g * capacity + first) * hd;
            let heads_at = (r * heads + g * group) * hd;
            // SAFETY: sequence r's cache holds `capacity` positions of every KV head of this layer;
            // task (r, g) writes its own heads' slice of row r of `out`
            let (kc, vc, o) = unsafe {
                (
                    std::slice::from_raw_parts(keys.get().add(at), seen * hd),
                    std::slice::from_raw_parts(values.get().add(at), seen * hd),
                    std::slice::from_raw_parts_mut(out_ptr.get().add(heads_at), group * hd),
                )
            };
            let qs = &q[heads_at..][..group * hd];
            attend_heads(qs, hd, kc, vc, &scoring, &mut scores[..group * seen], o);
        };
        let total: usize = seqs.iter().map(|s| s.count).sum::<usize>() * heads;
        let longest = seqs.iter().map(|s| s.count).max().unwrap_or(0);
        if total >= PARALLEL_ATTENTION_MIN {
            threads::parallel_for(seqs.len() * kvh, |task| {
                group_of(task, &mut vec![0f32; group * longest])
            });
        } else {
            let mut scores = vec![0f32; group * longest];
            for task in 0..seqs.len() * kvh {
                group_of(task, &mut scores);
            }
        }
    }
}

/// What one sequence's queries see of one layer's cache: positions `first..first + count`.
#[derive(Clone, Copy)]
struct Seen {
    first: usize,
    count: usize,
    /// the layer's keys and values, `[KVH, capacity, D]`
    keys: SendPtr<f32>,
    values: SendPtr<f32>,
    capacity: usize,
}

/// RMSNorm of every row of `x` (rows of `w.len()`), one row after another as the step runs them
/// (a few rows: too little work to wake the pool for).
fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        rms_norm(row, w, eps, o);
    }
}

/// RMSNorm of every row of `x` in place (the post-attention and post-MLP norms).
fn norm_rows_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(w.len()) {
        rms_norm_in_place(row, w, eps);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::decoder::{Activation, Dims, Embedding, Layer, Projection, Weight};
    use super::*;
    use crate::kernels::ggml::{tests::matrix as ggml_matrix, GgmlType};
    use crate::kernels::quant::QMatrix;
    use crate::kernels::testing::centered;

    /// How the tiny models store their projections.
    #[derive(Clone, Copy, Debug)]
    enum Weights {
        F32,
        /// int4 layers, int8 blocks for the output projection (the runtime's int4)
        Int4,
        /// int8 per row, int8 blocks for the output projection
        Int8,
        /// a GGUF file's types as stored, a different one per projection
        Gguf,
    }

    const HIDDEN: usize = 256;
    const INTER: usize = 512;
    const VOCAB: usize = 300;
    const LAYERS: usize = 2;

    /// A random two-layer decoder (layer 0 windowed with its own rotary table, layer 1 global; q/k
    /// norms, biases, post norms, logit caps) and the f32 buffers its addresses point into.
    struct Tiny {
        decoder: Decoder,
        _buffers: Vec<Vec<f32>>,
    }

    impl Tiny {
        fn new(weights: Weights, activation: Activation, rotary_dim: usize) -> Tiny {
            let mut buffers: Vec<Vec<f32>> = vec![];
            let mut seed = 100;
            // an f32 buffer of `len` values around `center`, kept alive with the decoder
            let mut data = |len: usize, center: f32, spread: f32| -> usize {
                seed += 1;
                let v: Vec<f32> = centered(len, seed)
                    .iter()
                    .map(|x| center + spread * x)
                    .collect();
                buffers.push(v);
                buffers.last().unwrap().as_ptr() as usize
            };
            let mut kinds = [
                GgmlType::Q4_1,
                GgmlType::Q4K,
                GgmlType::Q6K,
                GgmlType::Q5_0,
                GgmlType::Q8_0,
                GgmlType::Q4_0,
                GgmlType::Q5K,
            ]
            .into_iter()
            .cycle();
            let mut proj =
                |n: usize, k: usize, bias: bool, data: &mut dyn FnMut(usize, f32, f32) -> usize| {
                    let w = match weights {
                        Weights::F32 => Weight::F32 {
                            ptr: data(n * k, 0.0, 0.2),
                            n,
                            k,
                        },
                        Weights::Int4 | Weights::Int8 => {
                            let ptr = data(n * k, 0.0, 0.2);
                            // SAFETY: just made, n·k long
                            let w = unsafe { slice(ptr, n * k) };
                            Weight::Quant(Arc::new(match weights {
                                Weights::Int4 => QMatrix::quantize_q4(w, n, k),
                                _ => QMatrix::quantize_q8(w, n, k),
                            }))
                        }
                        Weights::Gguf => {
                            let kind = kinds.next().unwrap();
                            // regrouped where the level has kernels for it, as the runtime loads them
                            let m = ggml_matrix(kind, n, k, (n * 7 + k) as u64);
                            Weight::Ggml(Arc::new(m.interleaved_for_this_cpu()))
                        }
                    };
                    Projection {
                        w,
                        bias: bias.then(|| data(n, 0.0, 0.1)),
                    }
                };
            let (heads, kv_heads, head_dim) = (4, 2, 64);
            let mut layers = vec![];
            for li in 0..LAYERS {
                layers.push(Layer {
                    ln_attn: data(HIDDEN, 1.0, 0.2),
                    ln_mlp: data(HIDDEN, 1.0, 0.2),
                    post_attn_norm: Some(data(HIDDEN, 1.0, 0.2)),
                    post_mlp_norm: (li == 0).then(|| data(HIDDEN, 1.0, 0.2)),
                    windowed: li == 0,
                    rope: if li == 0 { 1 } else { 0 },
                    q_norm: (li == 1).then(|| data(head_dim, 1.0, 0.2)),
                    k_norm: (li == 1).then(|| data(head_dim, 1.0, 0.2)),
                    q: proj(heads * head_dim, HIDDEN, true, &mut data),
                    k: proj(kv_heads * head_dim, HIDDEN, true, &mut data),
                    v: proj(kv_heads * head_dim, HIDDEN, li == 0, &mut data),
                    o: proj(HIDDEN, heads * head_dim, false, &mut data),
                    gate: proj(INTER, HIDDEN, false, &mut data),
                    up: proj(INTER, HIDDEN, false, &mut data),
                    down: proj(HIDDEN, INTER, false, &mut data),
                });
            }
            let (embed, head) = match weights {
                Weights::Gguf => {
                    let table = Arc::new(ggml_matrix(GgmlType::Q8_0, VOCAB, HIDDEN, 5));
                    let head = Projection {
                        w: Weight::Ggml(table.clone()),
                        bias: None,
                    };
                    (Embedding::Ggml(table), head)
                }
                _ => {
                    let table = data(VOCAB * HIDDEN, 0.0, 1.0);
                    // SAFETY: just made, VOCAB·HIDDEN long
                    let w = unsafe { slice(table, VOCAB * HIDDEN) };
                    let w = match weights {
                        Weights::F32 => Weight::F32 {
                            ptr: table,
                            n: VOCAB,
                            k: HIDDEN,
                        },
                        _ => Weight::Quant(Arc::new(QMatrix::quantize_q8_blocks(w, VOCAB, HIDDEN))),
                    };
                    (Embedding::F32(table), Projection { w, bias: None })
                }
            };
            let decoder = Decoder {
                dims: Dims {
                    hidden: HIDDEN,
                    heads,
                    kv_heads,
                    head_dim,
                    vocab: VOCAB,
                    eps: 1e-5,
                    window: Some(4),
                    rotary_dim,
                    attn_scale: 0.1,
                    attn_softcap: Some(6.0),
                    final_softcap: Some(20.0),
                    embed_scale: 2.0,
                    activation,
                },
                embed,
                // random GGUF blocks make large weights: a small final norm keeps the logits inside
                // the cap's linear range
                norm: match weights {
                    Weights::Gguf => data(HIDDEN, 0.02, 0.004),
                    _ => data(HIDDEN, 1.0, 0.2),
                },
                head,
                layers,
            };
            decoder.validate().unwrap();
            Tiny {
                decoder,
                _buffers: buffers,
            }
        }
    }

    /// A sequence: its KV cache and the tokens it holds.
    #[derive(Clone)]
    struct Sequence {
        keys: Vec<f32>,
        values: Vec<f32>,
        capacity: usize,
        len: usize,
    }

    /// cos and sin rows of `pos` (`rd` each, "rotate half" layout) at rotation base `theta`.
    fn rotary(pos: usize, rd: usize, theta: f32) -> (Vec<f32>, Vec<f32>) {
        let angle = |i: usize| pos as f32 * theta.powf(-((2 * (i % (rd / 2))) as f32) / rd as f32);
        (
            (0..rd).map(|i| angle(i).cos()).collect(),
            (0..rd).map(|i| angle(i).sin()).collect(),
        )
    }

    /// The rotary rows of one position, for both tables, kept alive while a call reads them.
    struct Tables([(Vec<f32>, Vec<f32>); 2]);

    impl Tables {
        fn at(pos: usize, rd: usize) -> Tables {
            Tables([rotary(pos, rd, 10000.0), rotary(pos, rd, 500.0)])
        }
    }

    fn io(seq: &mut Sequence, tables: &Tables, logits: &mut [f32]) -> CacheIo {
        CacheIo {
            keys: seq.keys.as_mut_ptr(),
            values: seq.values.as_mut_ptr(),
            capacity: seq.capacity,
            cos: [tables.0[0].0.as_ptr(), tables.0[1].0.as_ptr()],
            sin: [tables.0[0].1.as_ptr(), tables.0[1].1.as_ptr()],
            logits: logits.as_mut_ptr(),
        }
    }

    impl Tiny {
        /// Token `token` of `seq` by [`Decoder::step`]: its logits.
        fn step(&self, seq: &mut Sequence, token: usize) -> Vec<f32> {
            let rd = self.decoder.dims.rotary_dim;
            let tables = Tables::at(seq.len, rd);
            let mut logits = vec![0f32; VOCAB];
            let io = io(seq, &tables, &mut logits);
            // SAFETY: the buffers are live and sized as CacheIo names them
            unsafe { self.decoder.step(token, seq.len, &io) };
            seq.len += 1;
            logits
        }

        /// One token of each sequence by [`Decoder::step_batch`]: their logits.
        fn step_batch(&self, seqs: &mut [Sequence], tokens: &[usize]) -> Vec<Vec<f32>> {
            let rd = self.decoder.dims.rotary_dim;
            let positions: Vec<usize> = seqs.iter().map(|s| s.len).collect();
            let tables: Vec<Tables> = positions.iter().map(|&p| Tables::at(p, rd)).collect();
            let mut logits = vec![vec![0f32; VOCAB]; seqs.len()];
            let ios: Vec<CacheIo> = seqs
                .iter_mut()
                .zip(&tables)
                .zip(logits.iter_mut())
                .map(|((s, t), l)| io(s, t, l))
                .collect();
            // SAFETY: as in `step`; every sequence has buffers of its own
            unsafe { self.decoder.step_batch(tokens, &positions, &ios) };
            for s in seqs.iter_mut() {
                s.len += 1;
            }
            logits
        }
    }

    fn argmax(v: &[f32]) -> usize {
        (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best })
    }

    /// Sequences holding `prefixes[b]` tokens each (run by `step`), in caches of different sizes.
    fn sequences(tiny: &Tiny, prefixes: &[usize]) -> Vec<Sequence> {
        let d = tiny.decoder.dims;
        prefixes
            .iter()
            .enumerate()
            .map(|(b, &len)| {
                let capacity = len + 2 + 3 * b;
                let size = LAYERS * d.kv_heads * capacity * d.head_dim;
                let mut seq = Sequence {
                    keys: vec![0f32; size],
                    values: vec![0f32; size],
                    capacity,
                    len: 0,
                };
                for t in 0..len {
                    tiny.step(&mut seq, (t * 37 + b * 11) % VOCAB);
                }
                seq
            })
            .collect()
    }

    #[test]
    fn a_batch_of_steps_gives_each_sequence_what_its_own_step_gives() {
        let models = [
            (Weights::F32, Activation::Silu, 64),
            (Weights::Int4, Activation::GeluTanh, 64),
            (Weights::Int8, Activation::Silu, 32),
            (Weights::Gguf, Activation::Silu, 64),
        ];
        // short contexts (attention on the calling thread), then long ones (heads in parallel on the
        // global layer); the window of 4 cuts all but the shortest on layer 0
        for (weights, activation, rd) in models {
            let tiny = Tiny::new(weights, activation, rd);
            for prefixes in [&[0usize, 3, 9, 2][..], &[5, 80, 100, 1, 33]] {
                let mut batched = sequences(&tiny, prefixes);
                let mut alone = batched.clone();
                for round in 0..2 {
                    let tokens: Vec<usize> = (0..prefixes.len())
                        .map(|b| (b * 53 + round * 7 + 1) % VOCAB)
                        .collect();
                    let got = tiny.step_batch(&mut batched, &tokens);
                    for (b, seq) in alone.iter_mut().enumerate() {
                        let want = tiny.step(seq, tokens[b]);
                        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                        for (g, w) in got[b].iter().zip(&want) {
                            assert!(
                                (g - w).abs() <= 1e-5 * scale,
                                "{weights:?} {prefixes:?} sequence {b}: {g} vs {w}"
                            );
                        }
                        assert_eq!(argmax(&got[b]), argmax(&want), "{weights:?} sequence {b}");
                        // the same keys and values, at this sequence's own positions only
                        assert_eq!(batched[b].keys, seq.keys, "{weights:?} sequence {b} keys");
                        assert_eq!(
                            batched[b].values, seq.values,
                            "{weights:?} sequence {b} values"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_batch_of_one_is_a_step() {
        let tiny = Tiny::new(Weights::Int4, Activation::Silu, 64);
        let mut batched = sequences(&tiny, &[6]);
        let mut alone = batched.clone();
        let got = tiny.step_batch(&mut batched, &[17]);
        assert_eq!(got[0], tiny.step(&mut alone[0], 17));
        assert_eq!(batched[0].keys, alone[0].keys);
    }
}
