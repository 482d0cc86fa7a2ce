//! Times the products of a few tokens (a batch of decode steps) with SmolLM2-135M's matrices, per
//! shape and format, over the thread pool: `[THREADS=n] cargo run --release --no-default-features
//! --example tokens_bench -- [tokens...]`. Prints microseconds per product and the cost per token against one
//! token (1.00 would be no saving from reading the weights once for all tokens).
use std::time::Instant;
use torchburn_native::kernels::ggml::{GgmlMatrix, GgmlType, WeightBytes};
use torchburn_native::kernels::quant::QMatrix;

/// `out = x · Wᵀ` for `tokens` rows of `x`: one matrix in one format.
type Product = Box<dyn Fn(&[f32], usize, &mut [f32])>;

/// Random blocks of `kind` with small finite f16 factors where each type keeps them.
fn ggml(kind: GgmlType, n: usize, k: usize) -> GgmlMatrix {
    let len = n * kind.row_bytes(k);
    let mut seed = 7u64;
    let mut bytes: Vec<u8> = (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect();
    let halves: &[usize] = match kind {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => &[],
    };
    for block in bytes.chunks_exact_mut(kind.block_bytes()) {
        for &at in halves {
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    GgmlMatrix::new(kind, n, k, WeightBytes::owned(bytes)).unwrap()
}

/// Seconds per call of `f`: the best of `reps` calls.
fn time(reps: usize, f: &mut dyn FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    if let Ok(t) = std::env::var("THREADS") {
        torchburn_native::threads::init(t.parse().unwrap());
    }
    let tokens: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap())
        .collect();
    let tokens = if tokens.is_empty() {
        vec![1, 2, 4, 7]
    } else {
        tokens
    };
    let shapes = [
        ("qkv", 960, 576),
        ("o", 576, 576),
        ("gate+up", 3072, 576),
        ("down", 576, 1536),
        ("head", 49152, 576),
    ];
    println!(
        "{} threads, ISA {}",
        torchburn_native::threads::current(),
        torchburn_native::isa::level().name()
    );
    for (name, n, k) in shapes {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let mut kinds: Vec<(String, Product)> = vec![];
        let kind = if name == "head" {
            GgmlType::Q8_0
        } else {
            GgmlType::Q4_1
        };
        let g = ggml(kind, n, k);
        let regrouped = ggml(kind, n, k).interleaved_for_this_cpu();
        kinds.push((
            format!("regrouped {}", kind.name()),
            Box::new(move |x, t, o| regrouped.matmul(x, t, o)),
        ));
        kinds.push((
            format!("gguf {}", kind.name()),
            Box::new(move |x, t, o| g.matmul(x, t, o)),
        ));
        let q = if name == "head" {
            QMatrix::quantize_q8_blocks(&w, n, k)
        } else {
            QMatrix::quantize_q4(&w, n, k)
        };
        let label = if name == "head" {
            "int8-blocks"
        } else {
            "int4"
        };
        kinds.push((label.into(), Box::new(move |x, t, o| q.matmul(x, t, o))));
        for (label, f) in &kinds {
            let mut line = format!("{name:8} {n:6}x{k:<5} {label:12}");
            let xs: Vec<Vec<f32>> = tokens
                .iter()
                .map(|&t| {
                    (0..t * k)
                        .map(|i| ((i * 31) % 100) as f32 / 100.0 - 0.5)
                        .collect()
                })
                .collect();
            let mut outs: Vec<Vec<f32>> = tokens.iter().map(|&t| vec![0f32; t * n]).collect();
            // rounds over every token count in turn, the best of each: this machine's speed drifts
            // over seconds, which would bias counts timed one after another
            let mut best = vec![f64::INFINITY; tokens.len()];
            let reps = (400_000 / (n * k)).max(2);
            for _ in 0..20 {
                for (i, &t) in tokens.iter().enumerate() {
                    let (x, out) = (&xs[i], &mut outs[i]);
                    best[i] = best[i].min(time(reps, &mut || f(x, t, out)));
                }
            }
            for (i, &t) in tokens.iter().enumerate() {
                line += &format!(
                    " | T={t}: {:8.1} us {:.2}",
                    best[i] * 1e6,
                    best[i] / t as f64 / best[0] * tokens[0] as f64
                );
            }
            println!("{line}");
        }
    }
}
