//! Times decode steps of a random int4 decoder of SmolLM2-135M's shape on the Rust side alone:
//! `cargo run --release --no-default-features --example decode_bench -- [positions [threads]]`.
use std::sync::Arc;
use std::time::Instant;
use torchburn_native::kernels::quant::QMatrix;
use torchburn_native::transformer::{
    Activation, CacheIo, Decoder, Dims, Embedding, Layer, Projection, Weight,
};

fn main() {
    let positions: usize = std::env::args().nth(1).map_or(64, |s| s.parse().unwrap());
    if let Some(t) = std::env::args().nth(2) {
        torchburn_native::threads::init(t.parse().unwrap());
    }
    let (hidden, heads, kvh, hd, inter, vocab, layers) = (576, 9, 3, 64, 1536, 49152, 30);
    let mut seed = 1u64;
    let mut rand = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32 * 0.2
            })
            .collect()
    };
    let q4 = |w: Vec<f32>, n: usize, k: usize| Projection {
        w: Weight::Quant(Arc::new(QMatrix::quantize_q4(&w, n, k))),
        bias: None,
    };
    let ones: Vec<f32> = vec![1.0; hidden];
    let embed = rand(vocab * hidden);
    let layers: Vec<Layer> = (0..layers)
        .map(|_| Layer {
            ln_attn: ones.as_ptr() as usize,
            ln_mlp: ones.as_ptr() as usize,
            q_norm: None,
            k_norm: None,
            q: q4(rand(heads * hd * hidden), heads * hd, hidden),
            k: q4(rand(kvh * hd * hidden), kvh * hd, hidden),
            v: q4(rand(kvh * hd * hidden), kvh * hd, hidden),
            o: q4(rand(hidden * heads * hd), hidden, heads * hd),
            gate: q4(rand(inter * hidden), inter, hidden),
            up: q4(rand(inter * hidden), inter, hidden),
            down: q4(rand(hidden * inter), hidden, inter),
            post_attn_norm: None,
            post_mlp_norm: None,
            windowed: false,
            rope: 0,
        })
        .collect();
    let head = Projection {
        w: Weight::Quant(Arc::new(QMatrix::quantize_q8_blocks(&embed, vocab, hidden))),
        bias: None,
    };
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
        embed: Embedding::F32(embed.as_ptr() as usize),
        norm: ones.as_ptr() as usize,
        head,
        layers,
    };
    dec.validate().unwrap();
    let cap = positions + 8;
    let mut keys = vec![0f32; 30 * kvh * cap * hd];
    let mut values = vec![0f32; 30 * kvh * cap * hd];
    let (cos, sin) = (vec![1f32; hd], vec![0f32; hd]);
    let mut logits = vec![0f32; vocab];
    let io = CacheIo {
        keys: keys.as_mut_ptr(),
        values: values.as_mut_ptr(),
        capacity: cap,
        cos: [cos.as_ptr(); 2],
        sin: [sin.as_ptr(); 2],
        logits: logits.as_mut_ptr(),
    };
    let mut times = vec![];
    for pos in 0..positions {
        let t = Instant::now();
        unsafe { dec.step(pos % vocab, pos, &io) };
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    println!(
        "{} threads: {:.2} ms/step ({:.1} tok/s)",
        torchburn_native::threads::current(),
        med * 1e3,
        1.0 / med
    );
}
