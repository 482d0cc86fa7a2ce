//! Times a quantized matrix product over a prompt's worth of activation rows (prefill):
//! `cargo run --release --no-default-features --example prefill_bench -- [tokens [n k [threads]]]`.
use std::time::Instant;
use torchburn_native::kernels::quant::QMatrix;

fn main() {
    let arg = |i: usize, d: usize| std::env::args().nth(i).map_or(d, |s| s.parse().unwrap());
    let (t, n, k) = (arg(1, 128), arg(2, 1536), arg(3, 576));
    torchburn_native::threads::init(arg(4, 2));
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let x: Vec<f32> = (0..t * k)
        .map(|i| ((i * 31) % 100) as f32 / 100.0 - 0.5)
        .collect();
    let mut out = vec![0f32; t * n];
    for (name, m) in [
        ("q4", QMatrix::quantize_q4(&w, n, k)),
        ("q8", QMatrix::quantize_q8(&w, n, k)),
    ] {
        let mut ts: Vec<f64> = (0..20)
            .map(|_| {
                let s = Instant::now();
                m.matmul(&x, t, &mut out);
                s.elapsed().as_secs_f64()
            })
            .collect();
        ts.sort_by(f64::total_cmp);
        let dt = ts[ts.len() / 2];
        println!(
            "{name} {t}x{n}x{k}: {:.2} ms, {:.1} GMAC/s",
            dt * 1e3,
            (t * n * k) as f64 / dt / 1e9
        );
    }
}
