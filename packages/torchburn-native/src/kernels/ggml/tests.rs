//! The row products of every GGUF type, on the path `TORCHBURN_ISA` selects and on the portable
//! one, against f64 sums over the dequantized weights and activations. (The dequantizer itself is
//! held against `gguf`'s in `tests/native/test_ggml.py`.)

use half::{bf16, f16};

use super::acts::{act_form, quantize_for, TokenActs};
use super::blocks::{dequantize_row, GgmlType};
#[cfg(target_arch = "x86_64")]
use super::Storage;
use super::{dot, GgmlMatrix, WeightBytes};
use crate::kernels::testing::{centered, uniform};

/// Where each type keeps its f16 factors (random bytes there could be infinite or NaN).
fn half_fields(kind: GgmlType) -> &'static [usize] {
    match kind {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::IQ4NL | GgmlType::IQ4XS => &[0],
        _ => &[],
    }
}

/// `n` rows of `k` elements of `kind`: random block bytes with finite factors in ±[0.001, 0.05).
fn random_matrix(kind: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let len = n * kind.row_bytes(k);
    let mut bytes: Vec<u8> = uniform(len, seed).map(|u| (u * 256.0) as u8).collect();
    let mut factor = uniform(len, seed + 1).map(|u| {
        let mag = 0.001 + 0.049 * u;
        if ((u * 1e6) as u64).is_multiple_of(2) {
            mag
        } else {
            -mag
        }
    });
    match kind {
        GgmlType::F32 => {
            for (c, v) in bytes.chunks_exact_mut(4).zip(centered(n * k, seed + 2)) {
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (c, v) in bytes.chunks_exact_mut(2).zip(centered(n * k, seed + 2)) {
                c.copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (c, v) in bytes.chunks_exact_mut(2).zip(centered(n * k, seed + 2)) {
                c.copy_from_slice(&bf16::from_f32(v).to_le_bytes());
            }
        }
        _ => {
            for block in bytes.chunks_exact_mut(kind.block_bytes()) {
                for &at in half_fields(kind) {
                    let v = f16::from_f64(factor.next().unwrap());
                    block[at..at + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
    bytes
}

/// A random `n`×`k` matrix of `kind` (see `random_matrix`; the transformer's tests build models of them).
pub(crate) fn matrix(kind: GgmlType, n: usize, k: usize, seed: u64) -> GgmlMatrix {
    GgmlMatrix::new(
        kind,
        n,
        k,
        WeightBytes::owned(random_matrix(kind, n, k, seed)),
    )
    .unwrap()
}

/// `Σ w · x` in f64 over the dequantized row and the activations as the product sees them.
fn reference(m: &GgmlMatrix, r: usize, x: &[f32]) -> (f64, f64) {
    let mut w = vec![0f32; m.k];
    dequantize_row(m.kind, m.row(r), &mut w);
    let a = quantize_for(m.kind, x);
    let block = a.form.block();
    let seen: Vec<f64> = if block == 0 {
        x.iter().map(|&v| v as f64).collect()
    } else {
        (0..x.len())
            .map(|i| a.d[i / block] as f64 * a.int(i) as f64)
            .collect()
    };
    let exact = w.iter().zip(&seen).map(|(&w, &x)| w as f64 * x).sum();
    let size = w
        .iter()
        .zip(&seen)
        .map(|(&w, &x)| (w as f64 * x).abs())
        .sum();
    (exact, size)
}

#[test]
fn every_type_matches_its_dequantized_product() {
    let k = 512;
    for kind in GgmlType::ALL {
        let m = matrix(kind, 6, k, 11);
        for seed in 0..3 {
            let x = centered(k, 100 + seed);
            let a = quantize_for(kind, &x);
            for r in 0..m.n {
                let (exact, size) = reference(&m, r, &x);
                let tol = 2e-6 * size + 1e-12;
                let best = m.row_dot(r, &a) as f64;
                let portable = dot::row_dot(kind, m.row(r), &a) as f64;
                assert!(
                    (best - exact).abs() <= tol,
                    "{} row {r}: {best} against {exact} (tolerance {tol}) at {}",
                    kind.name(),
                    crate::isa::level().name()
                );
                assert!(
                    (portable - exact).abs() <= tol,
                    "{} row {r} portable: {portable} against {exact}",
                    kind.name()
                );
            }
        }
    }
}

#[test]
fn a_rows_result_does_not_depend_on_the_rows_beside_it() {
    // 11 rows: two groups of four and three alone; each row equals its product computed alone,
    // bit for bit, and the VNNI copy (where the CPU has it) equals the plain one
    let k = 512;
    for kind in GgmlType::ALL {
        let m = matrix(kind, 11, k, 5);
        let a = quantize_for(kind, &centered(k, 77));
        let mut all = vec![0f32; 11];
        m.rows_into(0..11, &a, &mut all);
        let mut part = vec![0f32; 9];
        m.rows_into(2..11, &a, &mut part);
        for (r, &v) in all.iter().enumerate() {
            assert_eq!(v, m.row_dot(r, &a), "{} row {r}", kind.name());
        }
        assert_eq!(&all[2..], &part[..], "{}", kind.name());
        #[cfg(target_arch = "x86_64")]
        if crate::isa::avx512() && super::vnni() {
            let mut plain = vec![0f32; 11];
            // SAFETY: the CPU has AVX2 (below AVX-512); the activations are in the type's form
            unsafe { super::dot_avx2::rows_dot(&m, 0..11, &a, &mut plain) };
            assert_eq!(all, plain, "{} VNNI against plain", kind.name());
        }
    }
}

#[test]
fn extreme_blocks_do_not_saturate() {
    // every integer at its largest magnitude, activations all ±127 of the same sign: the widest sums
    let k = 256;
    for kind in GgmlType::ALL.into_iter().filter(|t| !t.is_float()) {
        for fill in [0x00u8, 0xFF, 0x80, 0x7F] {
            let mut bytes = vec![fill; kind.row_bytes(k)];
            for block in bytes.chunks_exact_mut(kind.block_bytes()) {
                for &at in half_fields(kind) {
                    block[at..at + 2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
                }
            }
            let m = GgmlMatrix::new(kind, 1, k, WeightBytes::owned(bytes)).unwrap();
            for sign in [1.0f32, -1.0] {
                let x = vec![sign; k];
                let a = quantize_for(kind, &x);
                let (exact, size) = reference(&m, 0, &x);
                let got = m.row_dot(0, &a) as f64;
                assert!(
                    (got - exact).abs() <= 2e-6 * size + 1e-9,
                    "{} filled with {fill:#x}, x = {sign}: {got} against {exact}",
                    kind.name()
                );
            }
        }
    }
}

#[test]
fn odd_lengths_of_float_rows() {
    for kind in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for k in [1, 7, 8, 9, 23, 40] {
            let m = matrix(kind, 2, k, k as u64);
            let x = centered(k, 5);
            let a = quantize_for(kind, &x);
            for r in 0..2 {
                let (exact, size) = reference(&m, r, &x);
                let got = m.row_dot(r, &a) as f64;
                assert!(
                    (got - exact).abs() <= 1e-6 * size + 1e-12,
                    "{} k={k}",
                    kind.name()
                );
            }
        }
    }
}

#[test]
fn matmul_gives_each_token_its_rows() {
    // tasks of 75 rows: more than one cache block of rows (see `row_blocks`) each, so that every
    // token runs over a block before the next
    let (n, k, tokens) = (600, 1024, 5);
    for kind in GgmlType::ALL {
        let m = matrix(kind, n, k, 3);
        assert!(75 > crate::kernels::row_blocks::block_rows(m.row_bytes()));
        let x = centered(tokens * k, 9);
        let mut out = vec![0f32; tokens * n];
        m.matmul(&x, tokens, &mut out);
        for t in 0..tokens {
            let a = quantize_for(kind, &x[t * k..(t + 1) * k]);
            for r in 0..n {
                assert_eq!(
                    out[t * n + r],
                    m.row_dot(r, &a),
                    "{} token {t} row {r}",
                    kind.name()
                );
            }
        }
    }
}

#[test]
fn several_tokens_give_each_row_what_one_token_gives() {
    // 1..=17 tokens: pairs with an odd token out, a whole group of sixteen and a second group
    let n = 13;
    for kind in GgmlType::ALL {
        let k = if kind.block_len() == 256 { 512 } else { 160 };
        let m = matrix(kind, n, k, 4);
        let x = centered(17 * k, 10);
        for tokens in 1..=17 {
            let acts = TokenActs::quantize(act_form(kind), &x[..tokens * k], tokens);
            let mut out = vec![0f32; tokens * (n - 3)];
            m.rows_tokens_into(2..n - 1, &acts, &mut out);
            // the AVX-512 kernel without VNNI too, where the level takes the one with it
            #[cfg(target_arch = "x86_64")]
            if crate::isa::avx512() && super::dot_tokens::takes(kind) && tokens > 1 {
                let mut plain = vec![0f32; out.len()];
                // SAFETY: the CPU has AVX-512 (the level checked); a type and form it takes
                unsafe { super::dot_tokens::rows_tokens_zmm(&m, 2..n - 1, &acts, &mut plain) };
                assert_eq!(plain, out, "{} {tokens} tokens without VNNI", kind.name());
            }
            for t in 0..tokens {
                let a = quantize_for(kind, &x[t * k..(t + 1) * k]);
                for r in 2..n - 1 {
                    assert_eq!(
                        out[t * (n - 3) + r - 2].to_bits(),
                        m.row_dot(r, &a).to_bits(),
                        "{} {tokens} tokens: token {t} row {r}",
                        kind.name()
                    );
                }
            }
        }
    }
}

#[test]
fn wrong_sizes_are_refused() {
    let bytes = |len| WeightBytes::owned(vec![0; len]);
    let err = GgmlMatrix::new(GgmlType::Q4K, 2, 128, bytes(144))
        .err()
        .unwrap();
    assert!(err.contains("whole blocks of 256"), "{err}");
    let err = GgmlMatrix::new(GgmlType::Q8_0, 2, 64, bytes(100))
        .err()
        .unwrap();
    assert!(err.contains("takes 136 bytes"), "{err}");
    assert!(GgmlMatrix::new(GgmlType::Q8_0, 0, 64, bytes(0)).is_err());
    assert!(GgmlMatrix::new(GgmlType::Q4_0, 1, 32, bytes(18)).is_ok());
}

/// The regrouped copy of `matrix(kind, n, k, seed)`, with its rows read in a shuffled order.
#[cfg(target_arch = "x86_64")]
fn regrouped_pair(kind: GgmlType, n: usize, k: usize, seed: u64) -> (GgmlMatrix, GgmlMatrix) {
    let order: Vec<u32> = (0..n as u32).map(|r| (r * 7 + 3) % n as u32).collect();
    let rows = || {
        matrix(kind, n, k, seed)
            .with_row_order(order.clone())
            .unwrap()
    };
    (rows(), rows().interleaved_for_this_cpu())
}

#[cfg(target_arch = "x86_64")]
#[test]
fn regrouped_products_match_the_dequantized_product_on_every_kernel() {
    use super::dot_interleaved::{rows_tokens_ymm, rows_tokens_zmm, rows_tokens_zmm_vnni, takes};
    // 37 rows: two whole groups and one of five; ranges that start and end inside groups
    let (n, k) = (37, 320);
    for kind in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        if !takes(kind) {
            continue;
        }
        let (rows, m) = regrouped_pair(kind, n, k, 21);
        assert!(m.is_interleaved() && !rows.is_interleaved());
        let Storage::Interleaved(packed) = &m.storage else {
            unreachable!()
        };
        let x = centered(17 * k, 31);
        for tokens in [1, 2, 5, 8, 9, 17] {
            let acts = TokenActs::quantize(act_form(kind), &x[..tokens * k], tokens);
            for range in [0..n, 3..29, 17..18, 30..37] {
                let len = range.len();
                let mut out = vec![0f32; tokens * len];
                m.rows_tokens_into(range.clone(), &acts, &mut out);
                for t in 0..tokens {
                    let xt = &x[t * k..(t + 1) * k];
                    let alone = m.row_dot(range.start, &acts.rows[t]);
                    assert_eq!(out[t * len].to_bits(), alone.to_bits(), "a token alone");
                    for r in range.clone() {
                        let (exact, size) = reference(&rows, r, xt);
                        let got = out[t * len + r - range.start] as f64;
                        assert!(
                            (got - exact).abs() <= 2e-6 * size + 1e-12,
                            "{} {tokens} tokens: token {t} row {r}: {got} against {exact}",
                            kind.name()
                        );
                    }
                }
                // every kernel this CPU runs gives the same bits (the same operations per lane)
                let mut other = vec![0f32; out.len()];
                // SAFETY: each runs only where the CPU has its features; forms checked above
                unsafe {
                    if crate::isa::avx512() {
                        rows_tokens_zmm(packed, range.clone(), &acts.rows, &mut other);
                        assert_eq!(other, out, "{} without VNNI", kind.name());
                        if super::vnni() {
                            rows_tokens_zmm_vnni(packed, range.clone(), &acts.rows, &mut other);
                            assert_eq!(other, out, "{} with VNNI", kind.name());
                        }
                    }
                    if kind != GgmlType::Q8_0 {
                        rows_tokens_ymm(packed, range.clone(), &acts.rows, &mut other);
                        assert_eq!(other, out, "{} on AVX2 registers", kind.name());
                    }
                }
            }
        }
        // the whole product through the matmul, and dequantized rows as the stored ones give them
        let mut out = vec![0f32; 3 * n];
        m.matmul(&x[..3 * k], 3, &mut out);
        let mut want = vec![0f32; 3 * n];
        let acts = TokenActs::quantize(act_form(kind), &x[..3 * k], 3);
        for t in 0..3 {
            m.rows_into(0..n, &acts.rows[t], &mut want[t * n..(t + 1) * n]);
        }
        assert_eq!(out, want, "{} matmul", kind.name());
        for range in [0..n, 5..33, 12..24, 36..37] {
            let len = range.len() * k;
            let (mut a, mut b) = (vec![0f32; len], vec![1f32; len]);
            rows.dequantize_rows(range.clone(), &mut a);
            m.dequantize_rows(range.clone(), &mut b);
            let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let (a, b) = (bits(a), bits(b));
            assert_eq!(a, b, "{} rows {range:?} dequantized", kind.name());
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn regrouped_extreme_blocks_do_not_saturate() {
    // every integer at its largest magnitude, activations all ±127: the widest int16 and int32 sums
    let k = 256;
    for kind in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        if !super::dot_interleaved::takes(kind) {
            continue;
        }
        for fill in [0x00u8, 0xFF, 0x80, 0x7F] {
            let mut bytes = vec![fill; 16 * kind.row_bytes(k)];
            for block in bytes.chunks_exact_mut(kind.block_bytes()) {
                for &at in half_fields(kind) {
                    block[at..at + 2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
                }
            }
            let rows = GgmlMatrix::new(kind, 16, k, WeightBytes::owned(bytes)).unwrap();
            let (rows, m) = (
                GgmlMatrix::new(kind, 16, k, WeightBytes::owned(rows.row(0).repeat(16))).unwrap(),
                rows.interleaved_for_this_cpu(),
            );
            for sign in [1.0f32, -1.0] {
                let x = vec![sign; k];
                let a = quantize_for(kind, &x);
                let (exact, size) = reference(&rows, 0, &x);
                for r in 0..16 {
                    let got = m.row_dot(r, &a) as f64;
                    assert!(
                        (got - exact).abs() <= 2e-6 * size + 1e-9,
                        "{} filled with {fill:#x}, x = {sign}: {got} against {exact}",
                        kind.name()
                    );
                }
            }
        }
    }
}
