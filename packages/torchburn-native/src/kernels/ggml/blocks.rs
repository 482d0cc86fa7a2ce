//! GGUF's tensor types and their block layouts, decoded to integers and per-sub-block affine
//! factors: element `i` of a block is `scale[i / sub] · q[i] - min[i / sub]`.
//!
//! One decoder per type serves both dequantization and the portable dot products, so the two can
//! only disagree with the format together, and the tests hold both against `gguf`'s dequantizers.
//!
//! Layouts (little-endian; `d`, `m`, `dmin` are f16):
//!
//! | type | elements | bytes | layout |
//! | --- | ---: | ---: | --- |
//! | Q4_0 | 32 | 18 | `d`, 16 bytes of nibbles: byte j holds element j (low) and j + 16 (high); `w = d·(q - 8)` |
//! | Q4_1 | 32 | 20 | `d`, `m`, nibbles as Q4_0; `w = d·q + m` |
//! | Q5_0 | 32 | 22 | `d`, 32 high bits (bit j: element j's fifth bit), nibbles as Q4_0; `w = d·(q - 16)` |
//! | Q5_1 | 32 | 24 | `d`, `m`, high bits and nibbles as Q5_0; `w = d·q + m` |
//! | Q8_0 | 32 | 34 | `d`, 32 int8; `w = d·q` |
//! | Q4_K | 256 | 144 | `d`, `dmin`, 12 bytes of eight 6-bit scales and mins, 128 bytes of nibbles |
//! | Q5_K | 256 | 176 | as Q4_K, then 32 bytes of fifth bits before the nibbles |
//! | Q6_K | 256 | 210 | 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, `d` |
//! | Q2_K | 256 | 84 | 16 bytes of 4-bit scale (low) and min (high) per 16 elements, 64 bytes of bit pairs, `d`, `dmin` |
//! | Q3_K | 256 | 110 | 32 bytes of high bits (set: no -4), 64 bytes of bit pairs, 12 bytes of sixteen 6-bit scales (less 32), `d` |
//! | IQ4_NL | 32 | 18 | `d`, nibbles as Q4_0, each an index into [`IQ4_VALUES`]; `w = d·IQ4_VALUES[q]` |
//! | IQ4_XS | 256 | 136 | `d`, 16 bits of scales' top pairs, 4 bytes of their low nibbles (eight 6-bit scales, less 32), 128 bytes of IQ4_NL nibbles (16 per 32) |
//!
//! In the K-quants each 64 elements take 32 bytes of nibbles: the first 32 elements the low nibbles,
//! the next 32 the high ones (sub-blocks `2c` and `2c + 1` of chunk `c`).

use half::{bf16, f16};

/// A GGUF tensor type the runtime computes in as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
    Q2K,
    Q3K,
    IQ4NL,
    IQ4XS,
}

/// The sixteen values a 4-bit index of IQ4_NL and IQ4_XS stands for (before the block's scale):
/// denser near zero, where most weights are.
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Elements of a K-quant super-block.
pub const QK_K: usize = 256;
/// Largest number of sub-blocks a block has (Q6_K: sixteen of sixteen).
pub const MAX_SUBS: usize = 16;

impl GgmlType {
    pub const ALL: [GgmlType; 15] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
    ];

    /// The name GGUF and llama.cpp give the type.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::IQ4NL => "IQ4_NL",
            GgmlType::IQ4XS => "IQ4_XS",
        }
    }

    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Elements per block (1 for the float types).
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q8_0
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::IQ4NL => 32,
            GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
            | GgmlType::Q2K
            | GgmlType::Q3K
            | GgmlType::IQ4XS => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q4K => 144,
            GgmlType::Q5K => 176,
            GgmlType::Q6K => 210,
            GgmlType::Q2K => 84,
            GgmlType::Q3K => 110,
            GgmlType::IQ4NL => 18,
            GgmlType::IQ4XS => 136,
        }
    }

    /// Elements per sub-block: the run that shares one scale (and min).
    pub fn sub_len(self) -> usize {
        match self {
            GgmlType::Q6K | GgmlType::Q2K | GgmlType::Q3K => 16,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            _ => 32,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }

    pub fn is_k_quant(self) -> bool {
        matches!(self, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K)
    }

    /// Bytes of a row of `k` elements (`k` a multiple of [`GgmlType::block_len`]).
    pub fn row_bytes(self, k: usize) -> usize {
        k / self.block_len() * self.block_bytes()
    }
}

/// One quantized block as integers with the affine factors of its sub-blocks.
pub struct Decoded {
    /// the block's integers (`block_len` of them)
    pub q: [i8; QK_K],
    /// per sub-block: `w = scale · q - min`
    pub scale: [f32; MAX_SUBS],
    pub min: [f32; MAX_SUBS],
}

fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Scale and min `j` (0..8) of a Q4_K / Q5_K block's twelve bytes: six bits each; the first four
/// pairs sit in the low six bits of bytes j and j + 4, the last four are a nibble of bytes 8..12
/// joined by the top two bits of the first eight bytes.
pub fn k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Decodes one block of a quantized type (`block` holds [`GgmlType::block_bytes`] bytes).
///
/// # Panics
/// On a float type.
pub fn decode(kind: GgmlType, block: &[u8]) -> Decoded {
    let mut out = Decoded {
        q: [0; QK_K],
        scale: [0.0; MAX_SUBS],
        min: [0.0; MAX_SUBS],
    };
    let nibbles32 = |q: &mut [i8; QK_K], nib: &[u8], offset: i8| {
        for j in 0..16 {
            q[j] = (nib[j] & 0x0F) as i8 - offset;
            q[j + 16] = (nib[j] >> 4) as i8 - offset;
        }
    };
    match kind {
        GgmlType::Q4_0 => {
            out.scale[0] = half_at(block, 0);
            nibbles32(&mut out.q, &block[2..18], 8);
        }
        GgmlType::Q4_1 => {
            out.scale[0] = half_at(block, 0);
            out.min[0] = -half_at(block, 2);
            nibbles32(&mut out.q, &block[4..20], 0);
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let (head, offset) = if kind == GgmlType::Q5_0 {
                (2, 16)
            } else {
                out.min[0] = -half_at(block, 2);
                (4, 0)
            };
            out.scale[0] = half_at(block, 0);
            let high = u32::from_le_bytes(block[head..head + 4].try_into().unwrap());
            let nib = &block[head + 4..head + 20];
            for (j, &byte) in nib.iter().enumerate() {
                let lo = (byte & 0x0F) | ((((high >> j) & 1) as u8) << 4);
                let hi = (byte >> 4) | ((((high >> (j + 16)) & 1) as u8) << 4);
                out.q[j] = lo as i8 - offset;
                out.q[j + 16] = hi as i8 - offset;
            }
        }
        GgmlType::Q8_0 => {
            out.scale[0] = half_at(block, 0);
            for (q, &b) in out.q.iter_mut().zip(&block[2..34]) {
                *q = b as i8;
            }
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            let (d, dmin) = (half_at(block, 0), half_at(block, 2));
            let scales = &block[4..16];
            for j in 0..8 {
                let (sc, m) = k_scale_min(scales, j);
                out.scale[j] = d * sc as f32;
                out.min[j] = dmin * m as f32;
            }
            let (high, nib) = if kind == GgmlType::Q5K {
                (Some(&block[16..48]), &block[48..176])
            } else {
                (None, &block[16..144])
            };
            for c in 0..4 {
                let n = &nib[32 * c..32 * c + 32];
                for l in 0..32 {
                    let (mut lo, mut hi) = (n[l] & 0x0F, n[l] >> 4);
                    if let Some(h) = high {
                        lo |= ((h[l] >> (2 * c)) & 1) << 4;
                        hi |= ((h[l] >> (2 * c + 1)) & 1) << 4;
                    }
                    out.q[64 * c + l] = lo as i8;
                    out.q[64 * c + 32 + l] = hi as i8;
                }
            }
        }
        GgmlType::Q6K => {
            let (low, high, scales) = (&block[..128], &block[128..192], &block[192..208]);
            let d = half_at(block, 208);
            for (s, &sc) in out.scale.iter_mut().zip(scales) {
                *s = d * (sc as i8) as f32;
            }
            for half in 0..2 {
                let (ql, qh) = (&low[64 * half..], &high[32 * half..]);
                let q = &mut out.q[128 * half..];
                for l in 0..32 {
                    let bits = |shift: u32| ((qh[l] >> shift) & 3) << 4;
                    q[l] = ((ql[l] & 0x0F) | bits(0)) as i8 - 32;
                    q[l + 32] = ((ql[l + 32] & 0x0F) | bits(2)) as i8 - 32;
                    q[l + 64] = ((ql[l] >> 4) | bits(4)) as i8 - 32;
                    q[l + 96] = ((ql[l + 32] >> 4) | bits(6)) as i8 - 32;
                }
            }
        }
        GgmlType::Q2K => {
            let (scales, pairs) = (&block[..16], &block[16..80]);
            let (d, dmin) = (half_at(block, 80), half_at(block, 82));
            for (s, &sc) in scales.iter().enumerate() {
                out.scale[s] = d * (sc & 0x0F) as f32;
                out.min[s] = dmin * (sc >> 4) as f32;
            }
            bit_pairs(&mut out.q, pairs, |_, _| 0);
        }
        GgmlType::Q3K => {
            let (high, pairs) = (&block[..32], &block[32..96]);
            let d = half_at(block, 108);
            for (s, sc) in q3k_scales(&block[96..108]).into_iter().enumerate() {
                out.scale[s] = d * (sc as i32 - 32) as f32;
            }
            // element l of each 16 has its high bit in byte l (or l + 16) of `high`, bit `plane`;
            // a clear bit takes 4 off
            bit_pairs(&mut out.q, pairs, |plane, l| {
                if high[l] >> plane & 1 == 1 {
                    0
                } else {
                    4
                }
            });
        }
        GgmlType::IQ4NL => {
            out.scale[0] = half_at(block, 0);
            iq4_values(&mut out.q[..32], &block[2..18]);
        }
        GgmlType::IQ4XS => {
            let d = half_at(block, 0);
            for s in 0..8 {
                out.scale[s] = d * iq4xs_scale(block, s) as f32;
                iq4_values(
                    &mut out.q[32 * s..32 * s + 32],
                    &block[8 + 16 * s..24 + 16 * s],
                );
            }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            panic!("decode takes a quantized type, got {}", kind.name())
        }
    }
    out
}

/// Sub-block `s`'s scale (-32..=31) of an IQ4_XS block: its low four bits in a nibble of bytes
/// 4..8 (`s` even: the low one), its top two in bits `2s, 2s + 1` of the 16-bit word at byte 2.
pub fn iq4xs_scale(block: &[u8], s: usize) -> i32 {
    let low = (block[4 + s / 2] >> (4 * (s % 2))) & 0x0F;
    let top = (u16::from_le_bytes([block[2], block[3]]) >> (2 * s)) & 3;
    (low | (top as u8) << 4) as i32 - 32
}

/// Thirty-two IQ4 values from sixteen bytes of indices: byte `j`'s low nibble is element `j`, its
/// high nibble element `j + 16` (Q4_0's order).
fn iq4_values(q: &mut [i8], nib: &[u8]) {
    for (j, &byte) in nib.iter().enumerate() {
        q[j] = IQ4_VALUES[(byte & 0x0F) as usize];
        q[j + 16] = IQ4_VALUES[(byte >> 4) as usize];
    }
}

/// Q2_K / Q3_K values from their 64 bytes of bit pairs: the `n`-th 128 elements read bytes
/// `32n..32n + 32` four times over, at shifts `2j` for `j` in 0..4, each time element `32j + l` from
/// byte `l`; `less(4n + j, l)` is subtracted (Q3_K's missing high bit).
fn bit_pairs(q: &mut [i8; QK_K], pairs: &[u8], less: impl Fn(usize, usize) -> i8) {
    for n in 0..2 {
        let bytes = &pairs[32 * n..32 * n + 32];
        for j in 0..4 {
            let plane = 4 * n + j;
            for l in 0..32 {
                q[128 * n + 32 * j + l] = ((bytes[l] >> (2 * j)) & 3) as i8 - less(plane, l);
            }
        }
    }
}

/// The sixteen 6-bit scales of a Q3_K block's twelve bytes: scale s has its low four bits in byte
/// s (s < 8: low nibble; else the high nibble of byte s - 8) and its top two bits in bytes 8..12,
/// two bits per scale (byte 8 + s % 4, at bit 2 · (s / 4)).
pub fn q3k_scales(b: &[u8]) -> [u8; 16] {
    std::array::from_fn(|s| {
        let low = if s < 8 { b[s] & 0x0F } else { b[s - 8] >> 4 };
        let top = (b[8 + s % 4] >> (2 * (s / 4))) & 3;
        low | (top << 4)
    })
}

/// Dequantizes a row of `out.len()` elements stored as `kind` in `row`.
pub fn dequantize_row(kind: GgmlType, row: &[u8], out: &mut [f32]) {
    let k = out.len();
    assert_eq!(row.len(), kind.row_bytes(k), "row bytes");
    match kind {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes(b.try_into().unwrap());
            }
        }
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
        _ => {
            let (len, sub) = (kind.block_len(), kind.sub_len());
            for (block, dst) in row
                .chunks_exact(kind.block_bytes())
                .zip(out.chunks_exact_mut(len))
            {
                let d = decode(kind, block);
                for (i, o) in dst.iter_mut().enumerate() {
                    *o = d.scale[i / sub] * d.q[i] as f32 - d.min[i / sub];
                }
            }
        }
    }
}
