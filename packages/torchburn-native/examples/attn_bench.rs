//! Times fused attention on the Rust side alone (the engine's own micro-kernels, no host BLAS):
//! `cargo run --release --no-default-features --example attn_bench -- [b h t d [threads [causal [layout]]]]`
//! (`layout`: a bitmask of the operands laid out as in a transformer layer: 1 q, 2 k, 4 v as views of
//! one `[b, t, 3, h, d]` projection, 8 the output written as `[b, t, h, d]`; 15 all of them).
use std::time::Instant;
use torchburn_native::kernels::attention::{
    sdpa_f32, sdpa_f32_rows, HeadRows, SdpaRows, SdpaShape,
};

fn main() {
    let arg = |i: usize, d: usize| std::env::args().nth(i).map_or(d, |s| s.parse().unwrap());
    let (b, h, t, d, threads) = (arg(1, 4), arg(2, 8), arg(3, 128), arg(4, 64), arg(5, 2));
    let causal = arg(6, 0) != 0;
    torchburn_native::threads::init(threads);
    let s = SdpaShape {
        b,
        h,
        hk: h,
        tq: t,
        tk: t,
        d,
        dv: d,
    };
    let len = b * h * t * d;
    let data = |seed: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    };
    let (q, k, v) = (data(1), data(2), data(3));
    let qkv: Vec<f32> = (0..3 * len)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    // [b, t, 3, h, d]: row stride 3·h·d, head stride d, batch stride t·3·h·d
    let fused_rows = HeadRows {
        batch: t * 3 * h * d,
        head: d,
        row: 3 * h * d,
    };
    let layout = arg(7, 0);
    let plain = HeadRows::contiguous(h, t, d);
    let pick = |bit: usize, r: HeadRows| if layout & bit != 0 { r } else { plain };
    let rows = SdpaRows {
        q: pick(1, fused_rows),
        k: pick(2, fused_rows),
        v: pick(4, fused_rows),
        out: pick(
            8,
            HeadRows {
                batch: t * h * d,
                head: d,
                row: h * d,
            },
        ),
    };
    let mut out = vec![0f32; len];
    let scale = 1.0 / (d as f32).sqrt();
    let reps = (4e8 / (2 * b * h * t * t * d) as f64).clamp(5.0, 2000.0) as usize;
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            if layout != 0 {
                let (qs, ks, vs) = (
                    if layout & 1 != 0 { &qkv[..] } else { &q[..] },
                    if layout & 2 != 0 {
                        &qkv[h * d..]
                    } else {
                        &k[..]
                    },
                    if layout & 4 != 0 {
                        &qkv[2 * h * d..]
                    } else {
                        &v[..]
                    },
                );
                sdpa_f32_rows(&s, &rows, qs, ks, vs, None, causal, scale, &mut out, None);
            } else {
                sdpa_f32(&s, &q, &k, &v, None, causal, scale, &mut out, None);
            }
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let macs = 2.0 * (b * h * t * t * d) as f64 / if causal { 2.0 } else { 1.0 };
    println!(
        "sdpa b={b} h={h} t={t} d={d} causal={causal} {threads}t: median {:.1} us ({:.1} GMAC/s), best {:.1} us",
        median * 1e6,
        macs / median / 1e9,
        times[0] * 1e6
    );
}
