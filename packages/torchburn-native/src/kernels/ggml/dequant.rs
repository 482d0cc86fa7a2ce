//! Rows of GGUF blocks to f32 at speed: the prefill dequantizes every row once per prompt. One
//! straight loop per type, compiled for each ISA level (`#[isa_versions]`), so the compiler
//! vectorizes the per-element work; the values are those of `blocks::dequantize_row` (the same
//! multiply and subtract, each rounded once), which the tests hold them to bit for bit.

use half::{bf16, f16};
use torchburn_native_macros::isa_versions;

use super::blocks::{dequantize_row, iq4xs_scale, k_scale_min, GgmlType, IQ4_VALUES};

fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Thirty-two IQ4 weights: `scale` times the values sixteen bytes of indices name (Q4_0's order).
#[inline(always)]
fn iq4_run(scale: f32, nib: &[u8], out: &mut [f32]) {
    let (lo, hi) = out.split_at_mut(16);
    for ((l, h), &byte) in lo.iter_mut().zip(hi).zip(nib) {
        *l = scale * IQ4_VALUES[(byte & 0x0F) as usize] as f32;
        *h = scale * IQ4_VALUES[(byte >> 4) as usize] as f32;
    }
}

/// Row `row` (stored as `kind`) into `out`, `out.len()` elements.
#[isa_versions]
pub fn dequantize_row_fast(kind: GgmlType, row: &[u8], out: &mut [f32]) {
    match kind {
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q8_0 => {
            for (o, block) in out.chunks_exact_mut(32).zip(row.chunks_exact(34)) {
                let d = half_at(block, 0);
                for (o, &q) in o.iter_mut().zip(&block[2..34]) {
                    *o = d * (q as i8) as f32;
                }
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (bytes, head) = if kind == GgmlType::Q4_0 {
                (18, 2)
            } else {
                (20, 4)
            };
            for (o, block) in out.chunks_exact_mut(32).zip(row.chunks_exact(bytes)) {
                let d = half_at(block, 0);
                // w = d·q - min: Q4_0 stores q + 8 (min = 8·d), Q4_1 an offset m (min = -m)
                let (offset, min) = if kind == GgmlType::Q4_0 {
                    (8.0, 0.0)
                } else {
                    (0.0, -half_at(block, 2))
                };
                let (lo, hi) = o.split_at_mut(16);
                for ((l, h), &byte) in lo.iter_mut().zip(hi).zip(&block[head..head + 16]) {
                    *l = d * ((byte & 0x0F) as f32 - offset) - min;
                    *h = d * ((byte >> 4) as f32 - offset) - min;
                }
            }
        }
        GgmlType::Q4K => {
            for (o, block) in out.chunks_exact_mut(256).zip(row.chunks_exact(144)) {
                let (d, dmin) = (half_at(block, 0), half_at(block, 2));
                for c in 0..4 {
                    let (sc0, m0) = k_scale_min(&block[4..16], 2 * c);
                    let (sc1, m1) = k_scale_min(&block[4..16], 2 * c + 1);
                    let (s0, n0) = (d * sc0 as f32, dmin * m0 as f32);
                    let (s1, n1) = (d * sc1 as f32, dmin * m1 as f32);
                    let (lo, hi) = o[64 * c..64 * c + 64].split_at_mut(32);
                    let nib = &block[16 + 32 * c..48 + 32 * c];
                    for ((l, h), &byte) in lo.iter_mut().zip(hi).zip(nib) {
                        *l = s0 * (byte & 0x0F) as f32 - n0;
                        *h = s1 * (byte >> 4) as f32 - n1;
                    }
                }
            }
        }
        GgmlType::Q6K => {
            for (o, block) in out.chunks_exact_mut(256).zip(row.chunks_exact(210)) {
                let d = half_at(block, 208);
                let scales = &block[192..208];
                for half in 0..2 {
                    let ql = &block[64 * half..64 * half + 64];
                    let qh = &block[128 + 32 * half..160 + 32 * half];
                    let o = &mut o[128 * half..128 * half + 128];
                    let sc = |e: usize| d * (scales[8 * half + e / 16] as i8) as f32;
                    for l in 0..32 {
                        let h = qh[l];
                        let q = [
                            ((ql[l] & 0x0F) | ((h & 3) << 4)) as i32 - 32,
                            ((ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4)) as i32 - 32,
                            ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32 - 32,
                            ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32 - 32,
                        ];
                        for (g, &q) in q.iter().enumerate() {
                            let e = 32 * g + l;
                            o[e] = sc(e) * q as f32;
                        }
                    }
                }
            }
        }
        GgmlType::IQ4NL => {
            for (o, block) in out.chunks_exact_mut(32).zip(row.chunks_exact(18)) {
                iq4_run(half_at(block, 0), &block[2..18], o);
            }
        }
        GgmlType::IQ4XS => {
            for (o, block) in out.chunks_exact_mut(256).zip(row.chunks_exact(136)) {
                let d = half_at(block, 0);
                for (s, o) in o.chunks_exact_mut(32).enumerate() {
                    iq4_run(
                        d * iq4xs_scale(block, s) as f32,
                        &block[8 + 16 * s..24 + 16 * s],
                        o,
                    );
                }
            }
        }
        // the rest through the reference decoder
        _ => dequantize_row(kind, row, out),
    }
}

#[cfg(test)]
mod tests {
    use super::super::blocks::GgmlType;
    use super::*;
    use crate::kernels::testing::uniform;

    #[test]
    fn fast_rows_equal_the_reference_decoder_bit_for_bit() {
        let k = 512;
        for kind in GgmlType::ALL {
            let mut row: Vec<u8> = uniform(kind.row_bytes(k), 7)
                .map(|u| (u * 256.0) as u8)
                .collect();
            if kind == GgmlType::F16 || !kind.is_float() {
                // keep the f16 factors (and F16 values) finite
                for c in row.chunks_exact_mut(2) {
                    c[1] &= 0x3B;
                }
            }
            if kind == GgmlType::F32 {
                for c in row.chunks_exact_mut(4) {
                    c[3] &= 0x3F;
                }
            }
            let (mut want, mut got) = (vec![0f32; k], vec![0f32; k]);
            dequantize_row(kind, &row, &mut want);
            dequantize_row_fast(kind, &row, &mut got);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{} element {i}: {a} against {b}",
                    kind.name()
                );
            }
        }
    }
}
