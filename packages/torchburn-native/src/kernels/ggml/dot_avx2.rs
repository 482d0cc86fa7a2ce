//! AVX2 row products over GGUF blocks. Every quantized type is brought to 32 unsigned bytes per
//! step (its integers plus a bias the activation sums take back out), multiplied with 32 int8
//! activations by `vpmaddubsw` (pairs into i16: at most 63 · 127 · 2, no saturation) and
//! `vpmaddwd` (pairs into i32, by one or by the sub-block's integer scale), so each sub-block's
//! sum is exact and only one f32 multiply-add per block (per super-block for the K-quants) rounds.

use std::arch::x86_64::*;

use half::f16;

use super::acts::Acts;
use super::blocks::{k_scale_min, GgmlType, QK_K};

#[inline(always)]
fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Eight i32 lanes of `Σ w · x` over 32 unsigned `w` and signed `x`, each pair of i16 products
/// multiplied by `scale` (i16 lanes).
#[inline(always)]
unsafe fn dot32(w: __m256i, x: __m256i, scale: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), scale)
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// 16 bytes of nibbles as 32 bytes: the low nibbles first, then the high ones.
#[inline(always)]
unsafe fn nibbles16(p: *const u8) -> __m256i {
    let n = _mm_loadu_si128(p as *const __m128i);
    let low = _mm_set1_epi8(0x0F);
    _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16::<4>(n), low),
        _mm_and_si128(n, low),
    )
}

/// 0x10 in byte i where bit i of `bits` is set.
#[inline(always)]
unsafe fn fifth_bits(bits: u32) -> __m256i {
    // byte i takes byte i / 8 of `bits`, then tests its bit i % 8
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// One row of weights stored as `kind` times one activation row.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `row` and `a` must be a whole row and its activations in
/// the form `kind` takes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn row_dot(kind: GgmlType, row: &[u8], a: &Acts) -> f32 {
    match kind {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => float_dot(kind, row, &a.f),
        GgmlType::Q4K | GgmlType::Q5K => q45k_dot(kind == GgmlType::Q5K, row, a),
        GgmlType::Q6K => q6k_dot(row, a),
        _ => legacy_dot(kind, row, a),
    }
}

#[inline(always)]
unsafe fn float_dot(kind: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let load = |i: usize| -> __m256 {
        match kind {
            GgmlType::F32 => _mm256_loadu_ps(row.as_ptr().add(4 * i) as *const f32),
            GgmlType::F16 => {
                _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(2 * i) as *const __m128i))
            }
            _ => {
                let h = _mm_loadu_si128(row.as_ptr().add(2 * i) as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
        }
    };
    let mut i = 0;
    while i + 16 <= k {
        acc0 = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(x.as_ptr().add(i)), acc0);
        acc1 = _mm256_fmadd_ps(load(i + 8), _mm256_loadu_ps(x.as_ptr().add(i + 8)), acc1);
        i += 16;
    }
    if i + 8 <= k {
        acc0 = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(x.as_ptr().add(i)), acc0);
        i += 8;
    }
    let mut sum = hsum(_mm256_add_ps(acc0, acc1));
    if i < k {
        // the last few, through the portable code
        let bytes = row.len() / k;
        let tail = super::acts::Acts {
            block: 0,
            q: vec![],
            d: vec![],
            sums16: vec![],
            f: x[i..].to_vec(),
        };
        sum += super::dot::row_dot(kind, &row[i * bytes..], &tail);
    }
    sum
}

/// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32 against activation blocks of 32.
#[inline(always)]
unsafe fn legacy_dot(kind: GgmlType, row: &[u8], a: &Acts) -> f32 {
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let mut fix = 0f32; // the biases' and offsets' share: Σ over blocks of c · dx · Σ x
    for (b, block) in row.chunks_exact(kind.block_bytes()).enumerate() {
        let x = _mm256_loadu_si256(a.q.as_ptr().add(32 * b) as *const __m256i);
        let dx = a.d[b];
        let xsum = (a.sums16[2 * b] + a.sums16[2 * b + 1]) as f32;
        let p = block.as_ptr();
        let d = half_at(block, 0);
        let isum = match kind {
            GgmlType::Q8_0 => {
                let w = _mm256_loadu_si256(p.add(2) as *const __m256i);
                dot32(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w), ones)
            }
            GgmlType::Q4_0 => {
                fix -= 8.0 * d * dx * xsum;
                dot32(nibbles16(p.add(2)), x, ones)
            }
            GgmlType::Q4_1 => {
                fix += half_at(block, 2) * dx * xsum;
                dot32(nibbles16(p.add(4)), x, ones)
            }
            GgmlType::Q5_0 => {
                fix -= 16.0 * d * dx * xsum;
                let high = u32::from_le_bytes(block[2..6].try_into().unwrap());
                dot32(
                    _mm256_or_si256(nibbles16(p.add(6)), fifth_bits(high)),
                    x,
                    ones,
                )
            }
            _ => {
                // Q5_1
                fix += half_at(block, 2) * dx * xsum;
                let high = u32::from_le_bytes(block[4..8].try_into().unwrap());
                dot32(
                    _mm256_or_si256(nibbles16(p.add(8)), fifth_bits(high)),
                    x,
                    ones,
                )
            }
        };
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dx), acc);
    }
    hsum(acc) + fix
}

/// Q4_K and Q5_K: super-blocks of 256 in eight sub-blocks of 32 with 6-bit scales and mins.
#[inline(always)]
unsafe fn q45k_dot(five: bool, row: &[u8], a: &Acts) -> f32 {
    let bytes = if five { 176 } else { 144 };
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    for (b, block) in row.chunks_exact(bytes).enumerate() {
        let (d, dmin) = (half_at(block, 0), half_at(block, 2));
        let dx = a.d[b];
        let xq = a.q.as_ptr().add(QK_K * b);
        let sums = &a.sums16[16 * b..16 * b + 16];
        let mut isum = _mm256_setzero_si256();
        let mut msum = 0i32;
        let nib = block.as_ptr().add(if five { 48 } else { 16 });
        let high = if five {
            _mm256_loadu_si256(block.as_ptr().add(16) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        for c in 0..4 {
            let (sc0, m0) = k_scale_min(&block[4..16], 2 * c);
            let (sc1, m1) = k_scale_min(&block[4..16], 2 * c + 1);
            msum += m0 as i32 * (sums[4 * c] + sums[4 * c + 1])
                + m1 as i32 * (sums[4 * c + 2] + sums[4 * c + 3]);
            let n = _mm256_loadu_si256(nib.add(32 * c) as *const __m256i);
            let mut w0 = _mm256_and_si256(n, low);
            let mut w1 = _mm256_and_si256(_mm256_srli_epi16::<4>(n), low);
            if five {
                let (bit0, bit1) = (
                    _mm256_set1_epi8(1 << (2 * c)),
                    _mm256_set1_epi8(2 << (2 * c)),
                );
                let sixteen = _mm256_set1_epi8(0x10);
                let h0 = _mm256_cmpeq_epi8(_mm256_and_si256(high, bit0), bit0);
                let h1 = _mm256_cmpeq_epi8(_mm256_and_si256(high, bit1), bit1);
                w0 = _mm256_or_si256(w0, _mm256_and_si256(h0, sixteen));
                w1 = _mm256_or_si256(w1, _mm256_and_si256(h1, sixteen));
            }
            let x0 = _mm256_loadu_si256(xq.add(64 * c) as *const __m256i);
            let x1 = _mm256_loadu_si256(xq.add(64 * c + 32) as *const __m256i);
            isum = _mm256_add_epi32(isum, dot32(w0, x0, _mm256_set1_epi16(sc0 as i16)));
            isum = _mm256_add_epi32(isum, dot32(w1, x1, _mm256_set1_epi16(sc1 as i16)));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dx), acc);
        mins += dmin * dx * msum as f32;
    }
    hsum(acc) - mins
}

/// Q6_K: super-blocks of 256 in sixteen sub-blocks of 16 with int8 scales, values 6-bit minus 32.
#[inline(always)]
unsafe fn q6k_dot(row: &[u8], a: &Acts) -> f32 {
    let low = _mm256_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    let mut bias = 0f32;
    for (b, block) in row.chunks_exact(210).enumerate() {
        let d = half_at(block, 208);
        let dx = a.d[b];
        let sc = &block[192..208];
        let xq = a.q.as_ptr().add(QK_K * b);
        let sums = &a.sums16[16 * b..16 * b + 16];
        let bsum: i32 = (0..16).map(|s| (sc[s] as i8) as i32 * sums[s]).sum();
        bias += 32.0 * d * dx * bsum as f32;
        let mut isum = _mm256_setzero_si256();
        for half in 0..2 {
            let ql = block.as_ptr().add(64 * half);
            let qh = _mm256_loadu_si256(block.as_ptr().add(128 + 32 * half) as *const __m256i);
            let l0 = _mm256_loadu_si256(ql as *const __m256i);
            let l1 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
            let groups = [
                (_mm256_and_si256(l0, low), qh),
                (_mm256_and_si256(l1, low), _mm256_srli_epi16::<2>(qh)),
                (
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l0), low),
                    _mm256_srli_epi16::<4>(qh),
                ),
                (
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l1), low),
                    _mm256_srli_epi16::<6>(qh),
                ),
            ];
            for (g, (nib, hb)) in groups.into_iter().enumerate() {
                let w = _mm256_or_si256(nib, _mm256_slli_epi16::<4>(_mm256_and_si256(hb, three)));
                let s = 8 * half + 2 * g; // the group's two sub-blocks of 16
                let scale = _mm256_set_m128i(
                    _mm_set1_epi16((sc[s + 1] as i8) as i16),
                    _mm_set1_epi16((sc[s] as i8) as i16),
                );
                let x = _mm256_loadu_si256(xq.add(128 * half + 32 * g) as *const __m256i);
                isum = _mm256_add_epi32(isum, dot32(w, x, scale));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dx), acc);
    }
    hsum(acc) - bias
}
