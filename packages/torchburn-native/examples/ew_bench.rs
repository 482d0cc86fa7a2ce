//! Times one fused elementwise op on the Rust side alone: `cargo run --release --example ew_bench -- exp 32768`.
use std::time::Instant;
use torchburn_native::program::Program;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let f = args.get(1).map_or("exp", |s| s.as_str());
    let n: usize = args.get(2).map_or(32768, |s| s.parse().unwrap());
    let plan = format!(
        r#"{{"n_inputs":1,"n_outputs":1,"arena_bytes":0,"instrs":[{{"kind":"elementwise","domain":"f32","shape":[{n}],
        "inputs":[{{"buf":{{"In":0}},"dtype":"f32","offset":0,"shape":[{n}],"strides":[1]}}],
        "outputs":[{{"buf":{{"Out":0}},"dtype":"f32","offset":0,"shape":[{n}],"strides":[1]}}],
        "code":[{{"op":"load","d":0,"input":0}},{{"op":"unary","d":1,"f":"{f}","a":0}},{{"op":"store","a":1,"output":0}}],"nregs":2}}]}}"#
    );
    let prog = Program::new(&plan, vec![n * 4], vec![n * 4]).unwrap();
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    let mut y = vec![0f32; n];
    let reps = (1 << 26) / n.max(1) + 10;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            unsafe {
                prog.run(&[x.as_ptr() as usize], &[y.as_mut_ptr() as usize])
                    .unwrap()
            };
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    println!(
        "{f} n={n}: {:.2} us, {:.3} ns/elem",
        best * 1e6,
        best * 1e9 / n as f64
    );
}
