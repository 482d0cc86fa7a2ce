//! Times layer norm and softmax on the Rust side alone:
//! `cargo run --release --example norm_bench -- 64 1024 [threads]` (rows, row length, threads).
use std::time::Instant;
use torchburn_native::kernels::norm::layer_norm_f32;
use torchburn_native::kernels::softmax::softmax_f32;

/// Best time per call in seconds over five rounds of enough calls to run about 16M elements each.
fn best_of(elements: usize, mut call: impl FnMut()) -> f64 {
    let reps = (1 << 24) / elements.max(1) + 10;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            call();
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    best
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows: usize = args.get(1).map_or(64, |s| s.parse().unwrap());
    let n: usize = args.get(2).map_or(1024, |s| s.parse().unwrap());
    let threads: usize = args.get(3).map_or(1, |s| s.parse().unwrap());
    torchburn_native::threads::init(threads);
    let x: Vec<f32> = (0..rows * n)
        .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    let (w, b) = (vec![1.5f32; n], vec![0.25f32; n]);
    let mut out = vec![0f32; rows * n];
    let (mut mean, mut rstd) = (vec![0f32; rows], vec![0f32; rows]);
    let best = best_of(rows * n, || {
        layer_norm_f32(
            rows,
            n,
            &x,
            Some(&w),
            Some(&b),
            1e-5,
            &mut out,
            Some(&mut mean),
            Some(&mut rstd),
        );
    });
    println!(
        "layer_norm {rows}x{n} {threads}t: {:.2} us, {:.1} ns/row",
        best * 1e6,
        best * 1e9 / rows as f64
    );
    let best = best_of(rows * n, || softmax_f32(rows, n, 1, &x, &mut out, false));
    println!(
        "softmax {rows}x{n} {threads}t: {:.2} us, {:.3} ns/element",
        best * 1e6,
        best * 1e9 / (rows * n) as f64
    );
}
