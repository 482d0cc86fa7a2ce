//! Times batched decode steps (`Decoder::step_batch`) of a random decoder of SmolLM2-135M's shape in
//! GGUF types as its file stores them (Q4_1 layers, a Q8_0 embedding tied to the output projection),
//! on the Rust side alone: `cargo run --release --no-default-features --example batch_bench --
//! [context [B...]]`. Each batch size runs its sequences at `context` cached positions; the sizes take
//! turns in rounds (this machine's speed drifts) and each keeps its fastest round.
//!
//! Knobs (environment): `PROMPTS=8,64` times prompts of those lengths instead; `BODY=Q8_0` gives the
//! layers another type; `SHARED=1` gives every layer the first one's matrices (cache-resident: the
//! products' own time); `TORCHBURN_ROWS=1` keeps the stored rows; `BATCH_BENCH_ROUNDS` for profiling.
use std::sync::Arc;
use std::time::Instant;
use torchburn_native::kernels::ggml::{GgmlMatrix, GgmlType, WeightBytes};
use torchburn_native::transformer::{
    Activation, CacheIo, Decoder, Dims, Embedding, Layer, Projection, Weight,
};

/// Random blocks of `kind` with small f16 factors.
fn ggml(kind: GgmlType, n: usize, k: usize, seed: &mut u64) -> Arc<GgmlMatrix> {
    let mut bytes: Vec<u8> = (0..n * kind.row_bytes(k))
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 24) as u8
        })
        .collect();
    let halves: &[usize] = if kind == GgmlType::Q4_1 {
        &[0, 2]
    } else {
        &[0]
    };
    for block in bytes.chunks_exact_mut(kind.block_bytes()) {
        for &at in halves {
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(0.004).to_le_bytes());
        }
    }
    let m = GgmlMatrix::new(kind, n, k, WeightBytes::owned(bytes)).unwrap();
    // regrouped as the runtime loads it, unless TORCHBURN_ROWS asks for the stored rows
    if std::env::var_os("TORCHBURN_ROWS").is_some() {
        Arc::new(m)
    } else {
        Arc::new(m.interleaved_for_this_cpu())
    }
}

fn main() {
    let context: usize = std::env::args().nth(1).map_or(100, |s| s.parse().unwrap());
    let sizes: Vec<usize> = std::env::args()
        .skip(2)
        .map(|s| s.parse().unwrap())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1, 2, 4, 8, 16]
    } else {
        sizes
    };
    let (hidden, heads, kvh, hd, inter, vocab, layers) = (576, 9, 3, 64, 1536, 49152, 30);
    // BODY=Q8_0 (or another type name) for the layers' type
    let body = std::env::var("BODY").map_or(GgmlType::Q4_1, |name| {
        *GgmlType::ALL
            .iter()
            .find(|t| t.name() == name)
            .expect("a GGUF type name")
    });
    let mut seed = 1u64;
    // SHARED=1: every layer takes the first layer's matrices (which then stay in cache), to tell the
    // products' own time from the time spent waiting on memory
    let shared = std::env::var_os("SHARED").is_some();
    let mut made: std::collections::HashMap<(usize, usize), Arc<GgmlMatrix>> = Default::default();
    let mut proj = |n: usize, k: usize| {
        let w = if shared {
            made.entry((n, k))
                .or_insert_with(|| ggml(body, n, k, &mut seed))
                .clone()
        } else {
            ggml(body, n, k, &mut seed)
        };
        Projection {
            w: Weight::Ggml(w),
            bias: None,
        }
    };
    let ones: Vec<f32> = vec![1.0; hidden];
    let layers: Vec<Layer> = (0..layers)
        .map(|_| Layer {
            ln_attn: ones.as_ptr() as usize,
            ln_mlp: ones.as_ptr() as usize,
            q_norm: None,
            k_norm: None,
            q: proj(heads * hd, hidden),
            k: proj(kvh * hd, hidden),
            v: proj(kvh * hd, hidden),
            o: proj(hidden, heads * hd),
            gate: proj(inter, hidden),
            up: proj(inter, hidden),
            down: proj(hidden, inter),
            post_attn_norm: None,
            post_mlp_norm: None,
            windowed: false,
            rope: 0,
        })
        .collect();
    let table = ggml(GgmlType::Q8_0, vocab, hidden, &mut seed);
    let dec = Decoder {
        dims: Dims {
            hidden,
            heads,
            kv_heads: kvh,
            head_dim: hd,
            vocab,
            eps: 1e-5,
            window: None,
            rotary_dim: hd,
            attn_scale: 1.0 / (hd as f32).sqrt(),
            attn_softcap: None,
            final_softcap: None,
            embed_scale: 1.0,
            activation: Activation::Silu,
        },
        embed: Embedding::Ggml(table.clone()),
        norm: ones.as_ptr() as usize,
        head: Projection {
            w: Weight::Ggml(table),
            bias: None,
        },
        layers,
    };
    dec.validate().unwrap();
    let cap = context + 1;
    let (cos, sin) = (vec![1f32; hd], vec![0f32; hd]);
    let most = *sizes.iter().max().unwrap();
    let mut keys: Vec<Vec<f32>> = (0..most)
        .map(|_| vec![0.01f32; 30 * kvh * cap * hd])
        .collect();
    let mut values = keys.clone();
    let mut logits = vec![vec![0f32; vocab]; most];
    let mut best = vec![f64::INFINITY; sizes.len()];
    // more rounds (BATCH_BENCH_ROUNDS) make a steady state long enough to profile
    let rounds: usize = std::env::var("BATCH_BENCH_ROUNDS").map_or(10, |s| s.parse().unwrap());
    // PROMPTS=4,8,12 times a prompt of each length after `context` cached positions instead
    if let Ok(list) = std::env::var("PROMPTS") {
        let lengths: Vec<usize> = list.split(',').map(|s| s.parse().unwrap()).collect();
        let longest = *lengths.iter().max().unwrap();
        let cap = context + longest;
        let (cos, sin) = (vec![1f32; cap * hd], vec![0f32; cap * hd]);
        let mut keys = vec![0.01f32; 30 * kvh * cap * hd];
        let mut values = keys.clone();
        let mut logits = vec![0f32; vocab];
        let mut best = vec![f64::INFINITY; lengths.len()];
        for _ in 0..rounds {
            for (i, &t) in lengths.iter().enumerate() {
                let io = CacheIo {
                    keys: keys.as_mut_ptr(),
                    values: values.as_mut_ptr(),
                    capacity: cap,
                    cos: [cos.as_ptr(); 2],
                    sin: [sin.as_ptr(); 2],
                    logits: logits.as_mut_ptr(),
                };
                let tokens: Vec<usize> = (0..t).map(|s| (s * 131 + 7) % vocab).collect();
                let start = Instant::now();
                // SAFETY: every buffer is live and sized as CacheIo names it, rows for `cap` positions
                unsafe { dec.prefill(&tokens, context, &io, false) };
                best[i] = best[i].min(start.elapsed().as_secs_f64());
            }
        }
        for (i, &t) in lengths.iter().enumerate() {
            println!(
                "prompt {t:3}: {:6.2} ms, {:5.2} ms/token",
                best[i] * 1e3,
                best[i] * 1e3 / t as f64
            );
        }
        return;
    }
    for _ in 0..rounds {
        for (i, &b) in sizes.iter().enumerate() {
            let ios: Vec<CacheIo> = (0..b)
                .map(|s| CacheIo {
                    keys: keys[s].as_mut_ptr(),
                    values: values[s].as_mut_ptr(),
                    capacity: cap,
                    cos: [cos.as_ptr(); 2],
                    sin: [sin.as_ptr(); 2],
                    logits: logits[s].as_mut_ptr(),
                })
                .collect();
            let tokens: Vec<usize> = (0..b).map(|s| (s * 131 + 7) % vocab).collect();
            let positions = vec![context; b];
            for _ in 0..3 {
                let t = Instant::now();
                // SAFETY: every buffer is live and sized as CacheIo names it; one cache per sequence
                unsafe { dec.step_batch(&tokens, &positions, &ios) };
                best[i] = best[i].min(t.elapsed().as_secs_f64());
            }
        }
    }
    println!(
        "{} threads, ISA {}, {context} cached positions",
        torchburn_native::threads::current(),
        torchburn_native::isa::level().name()
    );
    for (i, &b) in sizes.iter().enumerate() {
        println!(
            "B={b:2}: {:6.2} ms/step, {:6.1} tokens/s, {:.2}x B={}",
            best[i] * 1e3,
            b as f64 / best[i],
            b as f64 / best[i] / (sizes[0] as f64 / best[0]),
            sizes[0]
        );
    }
}
