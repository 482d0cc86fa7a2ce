//! Times one quantized matrix-vector product per format on one thread, row by row and through
//! `rows_into`: `cargo run --release --no-default-features --example qrow_bench -- [n k]` (past the
//! caches, e.g. 150000 576, it measures streaming from memory).
use std::time::Instant;
use torchburn_native::kernels::quant::{quantize_acts, QMatrix};
fn main() {
    let (n, k): (usize, usize) = (
        std::env::args().nth(1).map_or(1536, |s| s.parse().unwrap()),
        std::env::args().nth(2).map_or(576, |s| s.parse().unwrap()),
    );
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let x: Vec<f32> = (0..k)
        .map(|i| ((i * 31) % 100) as f32 / 100.0 - 0.5)
        .collect();
    for (name, m) in [
        ("q4", QMatrix::quantize_q4(&w, n, k)),
        ("q8", QMatrix::quantize_q8(&w, n, k)),
        ("q8b", QMatrix::quantize_q8_blocks(&w, n, k)),
    ] {
        let a = quantize_acts(&x, m.act_format());
        let mut s = 0.0;
        let reps = if n * k > 10_000_000 { 5 } else { 200 };
        let mut out = vec![0f32; n];
        let t = Instant::now();
        for _ in 0..reps {
            for r in 0..n {
                s += m.row_value(r, &a);
            }
        }
        let dt1 = t.elapsed().as_secs_f64() / reps as f64;
        let t = Instant::now();
        for _ in 0..reps {
            m.rows_into(0..n, &a, &mut out);
            s += out[0];
        }
        let dt = t.elapsed().as_secs_f64() / reps as f64;
        println!("  one row at a time: {:.1} us", dt1 * 1e6);
        println!(
            "{name}: {:.1} us per matvec, {:.1} GMAC/s single thread ({s})",
            dt * 1e6,
            (n * k) as f64 / dt / 1e9
        );
    }
}
