//! Times an empty parallel job on the worker pool (the fixed cost every parallel kernel pays):
//! `cargo run --release --no-default-features --example pool_bench -- [threads]`.
use std::time::Instant;

fn main() {
    let threads: usize = std::env::args().nth(1).map_or(2, |s| s.parse().unwrap());
    torchburn_native::threads::init(threads);
    let sink = std::sync::atomic::AtomicUsize::new(0);
    for _ in 0..3 {
        let n = 100_000;
        let t = Instant::now();
        for _ in 0..n {
            torchburn_native::threads::parallel_for(threads, |i| {
                sink.fetch_add(i, std::sync::atomic::Ordering::Relaxed);
            });
        }
        println!(
            "{threads} threads: {:.2} us per job",
            t.elapsed().as_secs_f64() / n as f64 * 1e6
        );
    }
}
