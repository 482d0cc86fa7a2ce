//! Times f32 GEMM `C[m×n] = A[m×k]·B[k×n]` (row-major):
//! `cargo run --release --no-default-features --example gemm_bench -- [m n k [threads]]`.
use std::time::Instant;
use torchburn_native::kernels::gemm::gemm_rowmajor;

fn main() {
    let arg = |i: usize, d: usize| std::env::args().nth(i).map_or(d, |s| s.parse().unwrap());
    let (m, n, k, threads) = (arg(1, 128), arg(2, 1024), arg(3, 512), arg(4, 2));
    torchburn_native::threads::init(threads);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 31) % 100) as f32 / 100.0 - 0.5)
        .collect();
    let mut c = vec![0f32; m * n];
    let reps = (2e9 / (m * n * k) as f64).clamp(5.0, 2000.0) as usize;
    let mut ts: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            gemm_rowmajor(m, n, k, &a, &b, &mut c, false);
            s.elapsed().as_secs_f64()
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    let dt = ts[ts.len() / 2];
    println!(
        "{m}x{n}x{k} {threads}t: {:.3} ms, {:.1} GMAC/s",
        dt * 1e3,
        (m * n * k) as f64 / dt / 1e9
    );
}
