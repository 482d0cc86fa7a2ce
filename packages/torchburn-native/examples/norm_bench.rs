//! Times layer norm on the Rust side alone: `cargo run --release --example norm_bench -- 64 1024`
//! (rows, row length; one thread unless `TORCHBURN_NUM_THREADS` says otherwise).
use std::time::Instant;
use torchburn_native::kernels::norm::layer_norm_f32;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows: usize = args.get(1).map_or(64, |s| s.parse().unwrap());
    let n: usize = args.get(2).map_or(1024, |s| s.parse().unwrap());
    let x: Vec<f32> = (0..rows * n)
        .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    let (w, b) = (vec![1.5f32; n], vec![0.25f32; n]);
    let mut out = vec![0f32; rows * n];
    let (mut mean, mut rstd) = (vec![0f32; rows], vec![0f32; rows]);
    let reps = (1 << 24) / (rows * n).max(1) + 10;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
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
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    println!(
        "layer_norm {rows}x{n}: {:.2} us, {:.1} ns/row",
        best * 1e6,
        best * 1e9 / rows as f64
    );
}
