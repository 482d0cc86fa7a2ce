//! Times one fused elementwise op on the Rust side alone: `cargo run --release --example ew_bench -- exp 32768`
//! (a unary op's name, or `add` or `chain5` over two inputs).
use std::time::Instant;
use torchburn_native::program::Program;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let f = args.get(1).map_or("exp", |s| s.as_str());
    let n: usize = args.get(2).map_or(32768, |s| s.parse().unwrap());
    let chain5 = r#"{"op":"load","d":0,"input":0},{"op":"const","d":1,"value":1.5,"ivalue":0},
        {"op":"binary","d":2,"f":"mul","a":0,"b":1},{"op":"load","d":3,"input":1},{"op":"binary","d":4,"f":"add","a":2,"b":3},
        {"op":"unary","d":5,"f":"relu","a":4},{"op":"const","d":6,"value":0.25,"ivalue":0},{"op":"binary","d":7,"f":"sub","a":5,"b":6},
        {"op":"load","d":8,"input":1},{"op":"binary","d":9,"f":"mul","a":7,"b":8},{"op":"store","a":9,"output":0}"#;
    let add = r#"{"op":"load","d":0,"input":0},{"op":"load","d":1,"input":1},
        {"op":"binary","d":2,"f":"add","a":0,"b":1},{"op":"store","a":2,"output":0}"#;
    let (n_in, code, nregs) = if f == "chain5" {
        (2, chain5.to_string(), 10)
    } else if f == "add" {
        (2, add.to_string(), 3)
    } else {
        (
            1,
            format!(
                r#"{{"op":"load","d":0,"input":0}},{{"op":"unary","d":1,"f":"{f}","a":0}},{{"op":"store","a":1,"output":0}}"#
            ),
            2,
        )
    };
    let operand = |buf: &str| {
        format!(r#"{{"buf":{buf},"dtype":"f32","offset":0,"shape":[{n}],"strides":[1]}}"#)
    };
    let inputs: Vec<String> = (0..n_in)
        .map(|i| operand(&format!(r#"{{"In":{i}}}"#)))
        .collect();
    let plan = format!(
        r#"{{"n_inputs":{n_in},"n_outputs":1,"arena_bytes":0,"instrs":[{{"kind":"elementwise","domain":"f32","shape":[{n}],
        "inputs":[{}],"outputs":[{}],"code":[{code}],"nregs":{nregs}}}]}}"#,
        inputs.join(","),
        operand(r#"{"Out":0}"#)
    );
    let _old_plan = format!(
        r#"{{"n_inputs":1,"n_outputs":1,"arena_bytes":0,"instrs":[{{"kind":"elementwise","domain":"f32","shape":[{n}],
        "inputs":[{{"buf":{{"In":0}},"dtype":"f32","offset":0,"shape":[{n}],"strides":[1]}}],
        "outputs":[{{"buf":{{"Out":0}},"dtype":"f32","offset":0,"shape":[{n}],"strides":[1]}}],
        "code":[{{"op":"load","d":0,"input":0}},{{"op":"unary","d":1,"f":"{f}","a":0}},{{"op":"store","a":1,"output":0}}],"nregs":2}}]}}"#
    );
    let prog = Program::new(&plan, vec![n * 4; n_in], vec![n * 4]).unwrap();
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    let x2 = x.clone();
    let mut y = vec![0f32; n];
    let reps = (1 << 26) / n.max(1) + 10;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            unsafe {
                let ins = [x.as_ptr() as usize, x2.as_ptr() as usize];
                prog.run(&ins[..n_in], &[y.as_mut_ptr() as usize]).unwrap()
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
