//! Fused scaled-dot-product attention (flash style) for f32.
//!
//! Work is split into tasks of (batch, head, block of up to `QB` queries). A task walks the keys in
//! blocks of `KB`: it computes the block's scores, folds them into a running per-query max `m` and
//! sum `l` (online softmax), and adds the block's probabilities times values into an output
//! accumulator, first rescaled by `exp(m_old - m_new)` where the max grew. The full
//! `[B, H, Tq, Tk]` score tensor never exists; a task's working set (its query block, one score
//! block, the output accumulator: about 64 KiB at `d = 64`) stays in L1/L2.
//!
//! Layout choices, all measured on the (4, 8, 128, 64) benchmark:
//! * The score block is computed transposed, `Sᵀ = K · (scale·Q)ᵀ` (keys × queries). K is then read
//!   in place (no per-block packing; only the query block is packed, once per task, with `scale`
//!   folded in), and the softmax runs down columns, vectorized across `NR` queries with the running
//!   max and sum in registers, instead of one row at a time with horizontal reductions.
//! * `P · V` reads `Pᵀ` with broadcasts and V's rows in place (only a partial last `NR`-column
//!   panel is copied and zero-padded).
//! * Both products run on one register-blocked micro-kernel (broadcast-A / vector-B, FMA): `MR` rows
//!   by one `NR`-column panel with AVX2 (12 registers; about 85% of the FMA peak of a Zen 3), `MR`
//!   rows by four panels with AVX-512 (24 of its 32 registers, enough to keep both FMA ports busy).
//!   The `gemm` crate ([`crate::kernels::gemm`]) needs 1.75 ms single-threaded for just the
//!   products of that benchmark against about 1.65 ms here (Zen 3), and would force the row-major
//!   score layout.
//! * `exp` is a local variant (`exp_attn`) with the range handling cut to what online softmax
//!   needs.
//!
//! Where the process holds a host BLAS (MKL, see [`crate::kernels::gemm`]) and the CPU lacks
//! AVX-512, both products run on it instead, single-threaded per task, with the same blocking and
//! online softmax around them. With AVX-512 the four-panel tiles are faster than MKL's calls on
//! these small blocks (SDPA (4, 8, 128, 64), 2 threads: 0.55 ms on MKL, 0.49 ms here).
//!
//! Semantics follow `torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`:
//! * scores are `scale · q·k + mask` (additive mask) or `-inf` where a boolean mask is 0;
//! * `causal` is PyTorch's `is_causal`: the top-left aligned lower triangle, query `i` sees keys
//!   `j <= i` (also when `tq != tk`), combined with any explicit mask;
//! * `lse` is the natural log-sum-exp of the scaled, masked scores of each query row;
//! * a row whose every key is masked yields an output row of zeros and an `lse` of 0 (PyTorch
//!   resets such a row's max from `-inf` to 0 and its sum from 0 to 1, then computes
//!   `out = acc / sum`, `lse = max + ln(sum)`); this kernel applies the same rule, so the two agree
//!   exactly there (checked against PyTorch 2.15's output).
//!
//! NaN in `q`/`k`/`v` or the mask propagates to the affected output rows.
//!
//! Hot loops are plain `for` loops: a closure handed to an iterator adaptor that does not get
//! inlined is compiled without the `#[isa_versions]` caller's target features (no FMA, no AVX).

use crate::kernels::gemm;
use crate::threads::{self, SendPtr};
use torchburn_native_macros::isa_versions;

/// Micro-kernel width in f32 columns (two AVX2 registers, one AVX-512 register).
const NR: usize = 16;
/// Micro-kernel height: `MR × 2` AVX2 accumulators plus two B vectors and a broadcast fit 16
/// registers.
const MR: usize = 6;
/// Largest block of queries per task (smaller when there are too few tasks to keep every thread
/// busy).
const QB: usize = 64;
/// The same with the host BLAS: larger products amortize its per-call cost (SDPA (4, 8, 128, 64):
/// 2% faster than with 64).
const QB_BLAS: usize = 128;
/// Keys per block of the online softmax.
const KB: usize = 128;
/// Below this many multiply-adds the whole call runs on the calling thread.
const SERIAL_MAX_FLOPS: usize = 1 << 20;

/// Dimensions of one attention call: `q [b, h, tq, d]`, `k [b, hk, tk, d]`, `v [b, hk, tk, dv]`,
/// `out [b, h, tq, dv]`. With `hk < h` (grouped-query attention) `hk` divides `h` and query head
/// `i` reads key/value head `i / (h / hk)`, as PyTorch's flash attention does for k/v with fewer
/// heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SdpaShape {
    pub b: usize,
    pub h: usize,
    pub hk: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
    pub dv: usize,
}

/// Where one operand's rows lie: row `t` of head `(b, h)` starts at element
/// `b·batch + h·head + t·row`, and its `d` (or `dv`) elements follow contiguously. Attention's
/// operands are often views: q, k and v slices of one fused projection (`[b, t, 3, h, d]`), the
/// output written straight into the `[b, t, h, dv]` order the next projection reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadRows {
    pub batch: usize,
    pub head: usize,
    pub row: usize,
}

impl HeadRows {
    /// The rows of a contiguous `[b, h, t, width]` tensor.
    pub fn contiguous(h: usize, t: usize, width: usize) -> Self {
        HeadRows {
            batch: h * t * width,
            head: t * width,
            row: width,
        }
    }

    #[inline(always)]
    fn at(&self, b: usize, h: usize, t: usize) -> usize {
        b * self.batch + h * self.head + t * self.row
    }

    /// Elements from the first to one past the last of `[b, h, t, width]` (0 when empty).
    pub fn span(&self, b: usize, h: usize, t: usize, width: usize) -> usize {
        if b == 0 || h == 0 || t == 0 || width == 0 {
            return 0;
        }
        [(b - 1, self.batch), (h - 1, self.head), (t - 1, self.row)]
            .iter()
            .try_fold(width, |acc, &(i, st)| i.checked_mul(st)?.checked_add(acc))
            .expect("sdpa: operand strides overflow")
    }

    /// Whether no two of the `b·h·t` rows of `width` elements share an element (so tasks may write
    /// their rows in parallel).
    pub fn rows_disjoint(&self, b: usize, h: usize, t: usize, width: usize) -> bool {
        let mut dims = [(self.batch, b), (self.head, h), (self.row, t)];
        dims.sort_unstable();
        let mut extent = width; // elements covered by the inner dimensions so far
        for (stride, n) in dims {
            if n <= 1 {
                continue;
            }
            if stride < extent {
                return false;
            }
            extent += stride * (n - 1);
        }
        true
    }
}

/// The row layouts of one attention call's operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SdpaRows {
    pub q: HeadRows,
    pub k: HeadRows,
    pub v: HeadRows,
    pub out: HeadRows,
}

impl SdpaRows {
    pub fn contiguous(s: &SdpaShape) -> Self {
        SdpaRows {
            q: HeadRows::contiguous(s.h, s.tq, s.d),
            k: HeadRows::contiguous(s.hk, s.tk, s.d),
            v: HeadRows::contiguous(s.hk, s.tk, s.dv),
            out: HeadRows::contiguous(s.h, s.tq, s.dv),
        }
    }
}

/// An attention mask over `(batch, head, query, key)`, addressed by `strides` in elements
/// (`data[b·s0 + h·s1 + q·s2 + k·s3]`); a stride of 0 broadcasts that axis.
#[derive(Clone, Copy, Debug)]
pub enum AttnMask<'a> {
    /// Added to the scaled scores (`-inf` masks a key out).
    Additive {
        data: &'a [f32],
        strides: [usize; 4],
    },
    /// PyTorch's boolean mask: nonzero = attend, 0 = masked out.
    Keep { data: &'a [u8], strides: [usize; 4] },
}

impl AttnMask<'_> {
    fn parts(&self) -> (usize, [usize; 4]) {
        match self {
            AttnMask::Additive { data, strides } => (data.len(), *strides),
            AttnMask::Keep { data, strides } => (data.len(), *strides),
        }
    }
}

/// Everything a task reads.
struct Ctx<'a> {
    s: SdpaShape,
    rows: SdpaRows,
    /// The output's base pointer, shared by the tasks: each writes only its own rows, which
    /// [`HeadRows::rows_disjoint`] has checked never overlap.
    out: SendPtr<f32>,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    mask: Option<AttnMask<'a>>,
    causal: bool,
    scale: f32,
}

/// Per-thread working buffers, sized once for the largest block.
struct Scratch {
    /// The query block, transposed into panels of `NR` queries (`d × NR` each).
    qp: Vec<f32>,
    /// Transposed scores, then probabilities: `[kb, qb_pad]` (key-major, so the softmax over keys
    /// runs down columns and vectorizes across queries).
    st: Vec<f32>,
    /// Output accumulator `[qb, dv_pad]`.
    o: Vec<f32>,
    /// The last, partial `NR`-column panel of a value block, zero-padded (`kb × NR`).
    vtail: Vec<f32>,
    /// Per query (padded to `NR`): running max, running sum, this block's rescale factor.
    m: Vec<f32>,
    l: Vec<f32>,
    corr: Vec<f32>,
}

impl Scratch {
    fn new(s: &SdpaShape, qb: usize) -> Self {
        let qb_pad = qb.div_ceil(NR) * NR;
        let kb = KB.min(s.tk);
        let dv_pad = s.dv.div_ceil(NR) * NR;
        Scratch {
            qp: vec![0.0; qb_pad * s.d],
            st: vec![0.0; kb * qb_pad],
            o: vec![0.0; qb * dv_pad],
            vtail: vec![0.0; kb * NR],
            m: vec![0.0; qb_pad],
            l: vec![0.0; qb_pad],
            corr: vec![0.0; qb_pad],
        }
    }
}

/// A read-only matrix operand: element `(i, p)` at `ptr[i·rs + p·cs]`.
#[derive(Clone, Copy)]
struct MatA {
    ptr: *const f32,
    rs: usize,
    cs: usize,
}

/// `C[M × P·NR] (+)= A[M × k] · B[k × P·NR]` over `P` column panels of `B`: panel `v`'s row `p` is
/// the `NR` contiguous floats at `b + v·panel_stride + p·ldb`, and lands in columns `v·NR ..` of
/// `C` (row-major, row stride `ldc`). `M × P` accumulators of `NR` lanes stay in registers.
///
/// # Safety
/// `a` must be readable for `M × k`, each panel for `k` rows of `NR`, `c` writable (and, with
/// `accumulate`, readable) for `M` rows of `P·NR`; `c` must not overlap `a` or `b`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile<const M: usize, const P: usize>(
    k: usize,
    a: MatA,
    b: *const f32,
    ldb: usize,
    panel_stride: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let mut acc = [[[0f32; NR]; P]; M];
    if accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            for (v, part) in row.iter_mut().enumerate() {
                // SAFETY: row i of C, NR columns of panel v, inside the caller's extent.
                *part = unsafe { *(c.add(i * ldc + v * NR) as *const [f32; NR]) };
            }
        }
    }
    for p in 0..k {
        let mut bp = [[0f32; NR]; P];
        for (v, part) in bp.iter_mut().enumerate() {
            // SAFETY: row p of panel v of B, inside the caller's extent.
            *part = unsafe { *(b.add(v * panel_stride + p * ldb) as *const [f32; NR]) };
        }
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: element (i, p) of A, inside the caller's extent.
            let av = unsafe { *a.ptr.add(i * a.rs + p * a.cs) };
            for (part, bv) in row.iter_mut().zip(&bp) {
                for j in 0..NR {
                    part[j] = av.mul_add(bv[j], part[j]);
                }
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (v, part) in row.iter().enumerate() {
            // SAFETY: row i of C, as above.
            unsafe { *(c.add(i * ldc + v * NR) as *mut [f32; NR]) = *part };
        }
    }
}

/// [`tile`] over `P` panels for the `m` rows of A, `MR` rows at a time.
///
/// # Safety
/// As [`tile`], for `m` rows.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile_rows<const P: usize>(
    m: usize,
    k: usize,
    a: MatA,
    b: *const f32,
    ldb: usize,
    panel_stride: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let rows_at = |i: usize| MatA {
        // SAFETY: row i < m of A, inside the caller's extent
        ptr: unsafe { a.ptr.add(i * a.rs) },
        ..a
    };
    let mut i = 0;
    // SAFETY (whole block): every tile stays inside the extents the caller guarantees.
    unsafe {
        while i + MR <= m {
            tile::<MR, P>(
                k,
                rows_at(i),
                b,
                ldb,
                panel_stride,
                c.add(i * ldc),
                ldc,
                accumulate,
            );
            i += MR;
        }
        let (ai, c) = (rows_at(i), c.add(i * ldc));
        match m - i {
            0 => {}
            1 => tile::<1, P>(k, ai, b, ldb, panel_stride, c, ldc, accumulate),
            2 => tile::<2, P>(k, ai, b, ldb, panel_stride, c, ldc, accumulate),
            3 => tile::<3, P>(k, ai, b, ldb, panel_stride, c, ldc, accumulate),
            4 => tile::<4, P>(k, ai, b, ldb, panel_stride, c, ldc, accumulate),
            5 => tile::<5, P>(k, ai, b, ldb, panel_stride, c, ldc, accumulate),
            r => unreachable!("remainder {r} >= MR"),
        }
    }
}

/// `C[m × npanels·NR] (+)= A[m × k] · B`, where column panel `pn` of `B` (`k × NR`, row stride
/// `ldb`) starts at `b + pn·panel_stride` and lands in columns `pn·NR ..` of `C`.
///
/// With `wide` (AVX-512: 32 vector registers of one panel each) four panels go through each tile,
/// 24 accumulators, enough to keep both FMA ports busy; otherwise one (12 AVX2 registers).
///
/// # Safety
/// As `tile`, for every panel: `A` readable for `m × k`, `B`'s panels readable, `C` writable for
/// `m` rows of `npanels · NR` columns (stride `ldc`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn gemm_panels(
    m: usize,
    k: usize,
    a: MatA,
    b: *const f32,
    ldb: usize,
    panel_stride: usize,
    npanels: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    wide: bool,
) {
    let mut pn = 0;
    // SAFETY (whole block): every group of panels stays inside the extents the caller guarantees.
    unsafe {
        let at = |pn: usize| (b.add(pn * panel_stride), c.add(pn * NR));
        if wide {
            while pn + 4 <= npanels {
                let (b, c) = at(pn);
                tile_rows::<4>(m, k, a, b, ldb, panel_stride, c, ldc, accumulate);
                pn += 4;
            }
            let (b, c) = at(pn);
            match npanels - pn {
                0 => {}
                1 => tile_rows::<1>(m, k, a, b, ldb, panel_stride, c, ldc, accumulate),
                2 => tile_rows::<2>(m, k, a, b, ldb, panel_stride, c, ldc, accumulate),
                3 => tile_rows::<3>(m, k, a, b, ldb, panel_stride, c, ldc, accumulate),
                r => unreachable!("remainder {r} >= 4"),
            }
        } else {
            for pn in 0..npanels {
                let (b, c) = at(pn);
                tile_rows::<1>(m, k, a, b, ldb, panel_stride, c, ldc, accumulate);
            }
        }
    }
}

/// Whether [`gemm_panels`] may take four panels per tile: the CPU has 32 vector registers of
/// `NR` lanes (AVX-512).
fn wide_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::isa::avx512()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether both products run on the host BLAS: where there is one and the CPU lacks AVX-512 (with it
/// the four-panel tiles are faster: SDPA (4, 8, 128, 64) on 2 threads, 0.55 -> 0.49 ms).
fn products_on_host_blas() -> bool {
    gemm::host_blas::<f32>() && !wide_tiles()
}

/// `exp(x)` for the `x <= 0` of online softmax (`score - max`, `old max - new max`), NaN and
/// `-inf`.
///
/// The polynomial of [`crate::kernels::math::exp_f32`] (within 2 ULP) with the range handling cut
/// to what attention needs, about 17 vector operations instead of 27: results below `2^-126`
/// (`x < -87.3`) flush to 0, so no two-factor scaling, and `-inf` (masked keys) gives exactly 0
/// because clamping at -88 makes the exponent field 0. NaN passes through the clamp and the
/// arithmetic.
#[inline(always)]
fn exp_attn(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    /// `t = v + 1.5·2^23` rounds `v` to an integer `n` held in t's low mantissa bits (|n| < 2^22).
    const ROUND_MAGIC: f32 = 12_582_912.0;
    // one maxps: a NaN x compares false and is kept
    let xc = if x < -88.0 { -88.0 } else { x };
    let t = xc.mul_add(LOG2E, ROUND_MAGIC);
    let n = t - ROUND_MAGIC;
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    let p = 1.987_569_1e-4_f32;
    let p = p.mul_add(r, 1.398_199_9e-3);
    let p = p.mul_add(r, 8.333_452e-3);
    let p = p.mul_add(r, 4.166_579_6e-2);
    let p = p.mul_add(r, 1.666_666_5e-1);
    let p = p.mul_add(r, 0.5);
    let p = (p * r).mul_add(r, r) + 1.0;
    // 2^n straight from t's bits: n + 127 in the exponent field; n = -127 (x <= -88) gives +0.0
    let scale = f32::from_bits(
        (t.to_bits()
            .wrapping_sub(ROUND_MAGIC.to_bits())
            .wrapping_add(127))
            << 23,
    );
    p * scale
}

/// Applies the mask and causality to the (already scaled) scores of key `kj` against queries
/// `q0 .. q0 + row.len()` of head `(bi, hi)`.
#[inline(always)]
fn mask_keyrow(row: &mut [f32], ctx: &Ctx<'_>, bi: usize, hi: usize, q0: usize, kj: usize) {
    let qn = row.len();
    match ctx.mask {
        None => {}
        Some(AttnMask::Additive { data, strides: st }) => {
            let base = bi * st[0] + hi * st[1] + q0 * st[2] + kj * st[3];
            match st[2] {
                0 => {
                    let a = data[base];
                    for v in row.iter_mut() {
                        *v += a;
                    }
                }
                1 => {
                    for (v, &a) in row.iter_mut().zip(&data[base..base + qn]) {
                        *v += a;
                    }
                }
                s2 => {
                    for (i, v) in row.iter_mut().enumerate() {
                        *v += data[base + i * s2];
                    }
                }
            }
        }
        Some(AttnMask::Keep { data, strides: st }) => {
            let base = bi * st[0] + hi * st[1] + q0 * st[2] + kj * st[3];
            match st[2] {
                0 => {
                    if data[base] == 0 {
                        row.fill(f32::NEG_INFINITY);
                    }
                }
                s2 => {
                    for (i, v) in row.iter_mut().enumerate() {
                        if data[base + i * s2] == 0 {
                            *v = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
    }
    if ctx.causal {
        // query q0 + i sees key kj only when kj <= q0 + i
        row[..kj.saturating_sub(q0).min(qn)].fill(f32::NEG_INFINITY);
    }
}

/// Attention for queries `q0 .. q0 + qn` of head `bh` (flattened batch·head) into their output rows
/// and `lse` (`qn`).
#[isa_versions]
fn attend_block(
    ctx: &Ctx<'_>,
    bh: usize,
    q0: usize,
    qn: usize,
    lse: Option<&mut [f32]>,
    sc: &mut Scratch,
) {
    let SdpaShape {
        h, hk, tk, d, dv, ..
    } = ctx.s;
    let rows = ctx.rows;
    let (bi, hi) = (bh / h, bh % h);
    let kvh = hi / (h / hk); // the key/value head this query head reads
                             // this block's query rows, and the head's keys and values, each `*_rs` apart
    let (q_rs, k_rs, v_rs) = (rows.q.row, rows.k.row, rows.v.row);
    let qm = &ctx.q[rows.q.at(bi, hi, q0)..][..rows.q.span(1, 1, qn, d)];
    let kh = &ctx.k[rows.k.at(bi, kvh, 0)..][..rows.k.span(1, 1, tk, d)];
    let vh = &ctx.v[rows.v.at(bi, kvh, 0)..][..rows.v.span(1, 1, tk, dv)];
    let qpn = qn.div_ceil(NR);
    let qn_pad = qpn * NR;
    let (dv_full, dv_tail) = (dv / NR, dv % NR);
    let dv_pad = dv.div_ceil(NR) * NR;
    let masked = ctx.mask.is_some() || ctx.causal;

    // Q block, times `scale` (folded here once instead of into every score), -> panels of NR
    // queries, d × NR each (query-minor), zero past qn
    // with the host BLAS (MKL) both products run there, reading Q, K and V in place: its
    // micro-kernels keep more accumulators busy than one-panel tiles (SDPA (4, 8, 128, 64) on a
    // 2-core AVX-512 Xeon: 0.86 -> 0.75 ms)
    let wide = wide_tiles();
    let blas = products_on_host_blas();
    if d > 0 && !blas {
        let qp = &mut sc.qp[..qn_pad * d];
        for (pn, panel) in qp.chunks_exact_mut(d * NR).enumerate() {
            for ii in 0..NR {
                let i = pn * NR + ii;
                if i < qn {
                    for (dd, &qv) in qm[i * q_rs..][..d].iter().enumerate() {
                        panel[dd * NR + ii] = qv * ctx.scale;
                    }
                } else {
                    for dd in 0..d {
                        panel[dd * NR + ii] = 0.0;
                    }
                }
            }
        }
    }

    // per-query state, over all qn_pad columns (the padding columns are computed and ignored)
    let (m, l, corr) = (
        &mut sc.m[..qn_pad],
        &mut sc.l[..qn_pad],
        &mut sc.corr[..qn_pad],
    );
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    // causal: the block's last query sees keys < q0 + qn, so later key blocks are skipped entirely
    let k_end = if ctx.causal { tk.min(q0 + qn) } else { tk };
    let mut first = true;
    for k0 in (0..k_end).step_by(KB) {
        let kn = KB.min(k_end - k0);
        let st = &mut sc.st[..kn * qn_pad];
        // Sᵀ = K · (scale·Q)ᵀ: rows are keys, columns queries
        let kmat = MatA {
            ptr: kh[k0 * k_rs..].as_ptr(),
            rs: k_rs,
            cs: 1,
        };
        if blas {
            // SAFETY: K rows k0 .. k0 + kn and the qn query rows of d floats; st is kn × qn_pad.
            unsafe {
                gemm::gemm::<f32>(
                    kn,
                    qn,
                    d,
                    gemm::Mat {
                        ptr: kmat.ptr,
                        rs: k_rs as isize,
                        cs: 1,
                    },
                    gemm::Mat {
                        ptr: qm.as_ptr(),
                        rs: 1,
                        cs: q_rs as isize,
                    },
                    gemm::MatMut {
                        ptr: st.as_mut_ptr(),
                        rs: qn_pad as isize,
                        cs: 1,
                    },
                    false,
                    ctx.scale,
                    false,
                )
            };
            if qn < qn_pad {
                // the padding columns, left unwritten by the product, enter the softmax (and are
                // ignored): keep them finite
                for row in st.chunks_exact_mut(qn_pad) {
                    row[qn..].fill(0.0);
                }
            }
        } else {
            // SAFETY: K rows k0 .. k0 + kn of d floats (k_rs apart); qp holds qpn panels of d × NR; st is kn ×
            // qn_pad.
            unsafe {
                gemm_panels(
                    kn,
                    d,
                    kmat,
                    sc.qp.as_ptr(),
                    NR,
                    d * NR,
                    qpn,
                    st.as_mut_ptr(),
                    qn_pad,
                    false,
                    wide,
                )
            };
        }
        if masked {
            for (j, row) in st.chunks_exact_mut(qn_pad).enumerate() {
                mask_keyrow(&mut row[..qn], ctx, bi, hi, q0, k0 + j);
            }
        }

        // online softmax down the columns, NR queries at a time with the column state in registers
        for c0 in (0..qn_pad).step_by(NR) {
            let m_old: [f32; NR] = m[c0..c0 + NR].try_into().unwrap();
            let mut mx = m_old;
            for row in st.chunks_exact(qn_pad) {
                let row: &[f32; NR] = row[c0..c0 + NR].try_into().unwrap();
                for (a, &v) in mx.iter_mut().zip(row) {
                    *a = if v > *a { v } else { *a };
                }
            }
            // nothing visible yet: keep max -inf but subtract 0, so exp gives 0 rather than NaN
            let mut mu = mx;
            for v in mu.iter_mut() {
                *v = if *v == f32::NEG_INFINITY { 0.0 } else { *v };
            }
            let mut sum = [0f32; NR];
            for row in st.chunks_exact_mut(qn_pad) {
                let row: &mut [f32; NR] = (&mut row[c0..c0 + NR]).try_into().unwrap();
                for ((v, s), &u) in row.iter_mut().zip(sum.iter_mut()).zip(&mu) {
                    *v = exp_attn(*v - u);
                    *s += *v;
                }
            }
            for i in 0..NR {
                let c = exp_attn(m_old[i] - mu[i]);
                corr[c0 + i] = c;
                l[c0 + i] = l[c0 + i].mul_add(c, sum[i]);
                m[c0 + i] = mx[i];
            }
        }

        // O = corr · O + P · V
        let o = &mut sc.o[..qn * dv_pad];
        if !first {
            for (orow, &c) in o.chunks_exact_mut(dv_pad).zip(corr.iter()) {
                for v in orow.iter_mut() {
                    *v *= c;
                }
            }
        }
        let pmat = MatA {
            ptr: st.as_ptr(),
            rs: 1,
            cs: qn_pad,
        };
        let vb = &vh[k0 * v_rs..][..rows.v.span(1, 1, kn, dv)];
        if blas {
            // SAFETY: P is qn × kn inside st (column-major, stride qn_pad); V's kn rows of dv; o is
            // qn × dv_pad.
            unsafe {
                gemm::gemm::<f32>(
                    qn,
                    dv,
                    kn,
                    gemm::Mat {
                        ptr: st.as_ptr(),
                        rs: 1,
                        cs: qn_pad as isize,
                    },
                    gemm::Mat {
                        ptr: vb.as_ptr(),
                        rs: v_rs as isize,
                        cs: 1,
                    },
                    gemm::MatMut {
                        ptr: o.as_mut_ptr(),
                        rs: dv_pad as isize,
                        cs: 1,
                    },
                    !first,
                    1.0,
                    false,
                )
            };
            first = false;
            continue;
        }
        // SAFETY: P is qn × kn inside st; the full panels are whole NR-column slices of V's kn
        // rows; o is qn × dv_pad.
        unsafe {
            gemm_panels(
                qn,
                kn,
                pmat,
                vb.as_ptr(),
                v_rs,
                NR,
                dv_full,
                o.as_mut_ptr(),
                dv_pad,
                !first,
                wide,
            )
        };
        if dv_tail > 0 {
            let vt = &mut sc.vtail[..kn * NR];
            for (j, dst) in vt.chunks_exact_mut(NR).enumerate() {
                dst[..dv_tail].copy_from_slice(&vb[j * v_rs + dv_full * NR..][..dv_tail]);
                dst[dv_tail..].fill(0.0);
            }
            // SAFETY: vt is kn × NR; the tail panel's columns dv_full·NR .. dv_pad lie inside o's
            // rows.
            unsafe {
                let c = o.as_mut_ptr().add(dv_full * NR);
                gemm_panels(qn, kn, pmat, vt.as_ptr(), NR, 0, 1, c, dv_pad, !first, wide)
            };
        }
        first = false;
    }

    // normalise, with PyTorch's reset for fully masked rows (max -inf -> 0, sum 0 -> 1)
    for (i, li) in l[..qn].iter_mut().enumerate() {
        let sum = if *li == 0.0 { 1.0 } else { *li };
        // SAFETY: row q0 + i of this head lies inside the output (`sdpa_f32_rows` checked its span)
        // and belongs to this task alone (its rows are disjoint)
        let orow = unsafe {
            std::slice::from_raw_parts_mut(ctx.out.get().add(rows.out.at(bi, hi, q0 + i)), dv)
        };
        if first {
            orow.fill(0.0);
        } else {
            let inv = 1.0 / sum;
            for (dst, &acc) in orow.iter_mut().zip(&sc.o[i * dv_pad..][..dv]) {
                *dst = acc * inv;
            }
        }
        *li = sum;
    }
    if let Some(lse) = lse {
        for i in 0..qn {
            let mx = if m[i] == f32::NEG_INFINITY { 0.0 } else { m[i] };
            lse[i] = mx + l[i].ln();
        }
    }
}

/// One task: a block of queries of one head and the output rows it alone writes.
struct Item<'o> {
    bh: usize,
    q0: usize,
    qn: usize,
    lse: Option<&'o mut [f32]>,
}

/// Fused scaled-dot-product attention, f32: `out = softmax(scale · q·kᵀ + mask) · v` per batch and
/// head, never materialising the `[b, h, tq, tk]` score tensor. See the module docs for masking,
/// `causal`, `lse` and fully masked rows (zeros, `lse` 0).
///
/// `q [b,h,tq,d]`, `k [b,h,tk,d]`, `v [b,h,tk,dv]`, `out [b,h,tq,dv]` contiguous; `lse`, if given,
/// `[b,h,tq]`. Panics if a slice length does not match `s` or a mask index would fall outside its
/// data.
#[allow(clippy::too_many_arguments)]
pub fn sdpa_f32(
    s: &SdpaShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<AttnMask<'_>>,
    causal: bool,
    scale: f32,
    out: &mut [f32],
    lse: Option<&mut [f32]>,
) {
    let rows = SdpaRows::contiguous(s);
    let &SdpaShape {
        b,
        h,
        hk,
        tq,
        tk,
        d,
        dv,
    } = s;
    let exact = |what: &str, got: usize, want: usize| {
        assert_eq!(
            got, want,
            "sdpa: {what} has {got} elements, its shape needs {want}"
        );
    };
    exact("q", q.len(), rows.q.span(b, h, tq, d));
    exact("k", k.len(), rows.k.span(b, hk, tk, d));
    exact("v", v.len(), rows.v.span(b, hk, tk, dv));
    exact("out", out.len(), rows.out.span(b, h, tq, dv));
    sdpa_f32_rows(s, &rows, q, k, v, mask, causal, scale, out, lse)
}

/// [`sdpa_f32`] over operands laid out by `rows`: each slice starts at its operand's first element
/// and reaches at least its last. Reads may overlap (a stride of 0 shares one head's keys among
/// several query heads); the output's rows must not. `lse`, if given, is `[b,h,tq]` contiguous.
/// Panics if a slice is too short for its layout, the output's rows overlap, or a mask index would
/// fall outside its data.
#[allow(clippy::too_many_arguments)]
pub fn sdpa_f32_rows(
    s: &SdpaShape,
    rows: &SdpaRows,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<AttnMask<'_>>,
    causal: bool,
    scale: f32,
    out: &mut [f32],
    lse: Option<&mut [f32]>,
) {
    let &SdpaShape {
        b,
        h,
        hk,
        tq,
        tk,
        d,
        dv,
    } = s;
    assert!(
        hk > 0 && h % hk == 0 || h == 0,
        "sdpa: {h} query heads do not split into {hk} key/value heads"
    );
    let covers =
        |what: &str, got: usize, layout: &HeadRows, heads: usize, t: usize, width: usize| {
            let want = layout.span(b, heads, t, width);
            assert!(
                got >= want,
                "sdpa: {what} has {got} elements, its layout {layout:?} reaches {want}"
            );
        };
    covers("q", q.len(), &rows.q, h, tq, d);
    covers("k", k.len(), &rows.k, hk, tk, d);
    covers("v", v.len(), &rows.v, hk, tk, dv);
    covers("out", out.len(), &rows.out, h, tq, dv);
    assert!(
        rows.out.rows_disjoint(b, h, tq, dv),
        "sdpa: output rows {:?} overlap",
        rows.out
    );
    if let Some(l) = lse.as_deref() {
        assert_eq!(l.len(), b * h * tq, "sdpa: lse must hold b·h·tq elements");
    }
    if let Some(mk) = &mask {
        let (mlen, st) = mk.parts();
        if b * h * tq * tk > 0 {
            let last = (b - 1) * st[0] + (h - 1) * st[1] + (tq - 1) * st[2] + (tk - 1) * st[3];
            assert!(
                last < mlen,
                "sdpa: mask has {mlen} elements, strides {st:?} reach index {last}"
            );
        }
    }
    if b * h * tq == 0 {
        return;
    }
    let ctx = Ctx {
        s: *s,
        rows: *rows,
        out: SendPtr(out.as_mut_ptr()),
        q,
        k,
        v,
        mask,
        causal,
        scale,
    };

    let threads = threads::current();
    let mut qb = if products_on_host_blas() { QB_BLAS } else { QB }.min(tq);
    while qb > 16 && b * h * tq.div_ceil(qb) < 4 * threads {
        qb /= 2;
    }
    let mut items = Vec::with_capacity(b * h * tq.div_ceil(qb));
    let mut lse_rest = lse;
    for bh in 0..b * h {
        for q0 in (0..tq).step_by(qb) {
            let qn = qb.min(tq - q0);
            let l = lse_rest.take().map(|ls| {
                let (l, rest) = ls.split_at_mut(qn);
                lse_rest = Some(rest);
                l
            });
            items.push(Item { bh, q0, qn, lse: l });
        }
    }
    let run = |sc: &mut Scratch, it: Item<'_>| attend_block(&ctx, it.bh, it.q0, it.qn, it.lse, sc);
    let flops = b * h * tq * tk * (d + dv);
    if flops < SERIAL_MAX_FLOPS || items.len() == 1 {
        let mut sc = Scratch::new(s, qb);
        items.into_iter().for_each(|it| run(&mut sc, it));
    } else {
        threads::par_each_init(items, || Scratch::new(s, qb), run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::uniform;

    fn data(len: usize, seed: u64) -> Vec<f32> {
        uniform(len, seed).map(|u| (u * 2.0 - 1.0) as f32).collect()
    }

    /// Naive f64 attention with PyTorch's conventions; returns (out, lse).
    fn reference(
        s: &SdpaShape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        mask: Option<AttnMask<'_>>,
        causal: bool,
        scale: f32,
    ) -> (Vec<f64>, Vec<f64>) {
        let SdpaShape {
            b,
            h,
            hk,
            tq,
            tk,
            d,
            dv,
        } = *s;
        let mut out = vec![0.0; b * h * tq * dv];
        let mut lse = vec![0.0; b * h * tq];
        for bi in 0..b {
            for hi in 0..h {
                let bh = bi * h + hi;
                let bkv = bi * hk + hi / (h / hk); // the key/value head query head hi reads
                for i in 0..tq {
                    let scores: Vec<f64> = (0..tk)
                        .map(|j| {
                            let dot: f64 = (0..d)
                                .map(|t| {
                                    q[(bh * tq + i) * d + t] as f64
                                        * k[(bkv * tk + j) * d + t] as f64
                                })
                                .sum();
                            let mut sc = dot * scale as f64;
                            if let Some(m) = &mask {
                                match m {
                                    AttnMask::Additive { data, strides: st } => {
                                        sc += data[bi * st[0] + hi * st[1] + i * st[2] + j * st[3]]
                                            as f64
                                    }
                                    AttnMask::Keep { data, strides: st } => {
                                        if data[bi * st[0] + hi * st[1] + i * st[2] + j * st[3]]
                                            == 0
                                        {
                                            sc = f64::NEG_INFINITY
                                        }
                                    }
                                }
                            }
                            if causal && j > i {
                                sc = f64::NEG_INFINITY;
                            }
                            sc
                        })
                        .collect();
                    let mx = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let mx = if mx == f64::NEG_INFINITY { 0.0 } else { mx };
                    let p: Vec<f64> = scores.iter().map(|&x| (x - mx).exp()).collect();
                    let sum: f64 = p.iter().sum();
                    let sum = if sum == 0.0 { 1.0 } else { sum };
                    lse[bh * tq + i] = mx + sum.ln();
                    for c in 0..dv {
                        let acc: f64 = (0..tk)
                            .map(|j| p[j] * v[(bkv * tk + j) * dv + c] as f64)
                            .sum();
                        out[(bh * tq + i) * dv + c] = acc / sum;
                    }
                }
            }
        }
        (out, lse)
    }

    fn check(s: SdpaShape, mask: Option<AttnMask<'_>>, causal: bool) -> (Vec<f32>, Vec<f32>) {
        let q = data(s.b * s.h * s.tq * s.d, 1 + s.tq as u64);
        let k = data(s.b * s.hk * s.tk * s.d, 2 + s.tk as u64);
        let v = data(s.b * s.hk * s.tk * s.dv, 3 + s.dv as u64);
        // a large scale makes the softmax peaky, which exercises the running-max rescaling
        let scale = 3.0 / (s.d.max(1) as f32).sqrt();
        let mut out = vec![f32::NAN; s.b * s.h * s.tq * s.dv];
        let mut lse = vec![f32::NAN; s.b * s.h * s.tq];
        sdpa_f32(
            &s,
            &q,
            &k,
            &v,
            mask,
            causal,
            scale,
            &mut out,
            Some(&mut lse),
        );
        let (want, want_lse) = reference(&s, &q, &k, &v, mask, causal, scale);
        for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
            assert!(
                (g as f64 - w).abs() < 2e-5 * (1.0 + w.abs()),
                "{s:?} causal={causal} out[{i}]: {g} vs {w}"
            );
        }
        for (i, (&g, &w)) in lse.iter().zip(&want_lse).enumerate() {
            assert!(
                (g as f64 - w).abs() < 2e-5 * (1.0 + w.abs()),
                "{s:?} causal={causal} lse[{i}]: {g} vs {w}"
            );
        }
        // without lse the output is the same
        let mut out2 = vec![f32::NAN; out.len()];
        sdpa_f32(&s, &q, &k, &v, mask, causal, scale, &mut out2, None);
        assert_eq!(out, out2);

        // and the same through strided rows: each input's rows spread out [b, t, h, width + 3]-wise
        // with NaN in the gaps (a read of one would poison the output), the output written as
        // [b, tq, h, dv]
        let spread = |x: &[f32], heads: usize, t: usize, w: usize| {
            let pitch = w + 3;
            let rows = HeadRows {
                batch: t * heads * pitch,
                head: pitch,
                row: heads * pitch,
            };
            let mut buf = vec![f32::NAN; s.b * t * heads * pitch];
            for bh in 0..s.b * heads {
                for ti in 0..t {
                    let at = rows.at(bh / heads, bh % heads, ti);
                    buf[at..at + w].copy_from_slice(&x[(bh * t + ti) * w..][..w]);
                }
            }
            (buf, rows)
        };
        let ((qs, q_rows), (ks, k_rows), (vs, v_rows)) = (
            spread(&q, s.h, s.tq, s.d),
            spread(&k, s.hk, s.tk, s.d),
            spread(&v, s.hk, s.tk, s.dv),
        );
        let out_rows = HeadRows {
            batch: s.tq * s.h * s.dv,
            head: s.dv,
            row: s.h * s.dv,
        };
        let rows = SdpaRows {
            q: q_rows,
            k: k_rows,
            v: v_rows,
            out: out_rows,
        };
        let mut out3 = vec![f32::NAN; out.len()];
        sdpa_f32_rows(
            &s, &rows, &qs, &ks, &vs, mask, causal, scale, &mut out3, None,
        );
        for bh in 0..s.b * s.h {
            for ti in 0..s.tq {
                let got = &out3[out_rows.at(bh / s.h, bh % s.h, ti)..][..s.dv];
                let w = &want[(bh * s.tq + ti) * s.dv..][..s.dv];
                for (j, (&g, &w)) in got.iter().zip(w).enumerate() {
                    assert!(
                        (g as f64 - w).abs() < 2e-5 * (1.0 + w.abs()),
                        "{s:?} causal={causal} strided out[{bh}, {ti}, {j}]: {g} vs {w}"
                    );
                }
            }
        }
        (out, lse)
    }

    fn shape(b: usize, h: usize, tq: usize, tk: usize, d: usize, dv: usize) -> SdpaShape {
        SdpaShape {
            b,
            h,
            hk: h,
            tq,
            tk,
            d,
            dv,
        }
    }

    #[test]
    fn grouped_query_heads() {
        // query head i reads key/value head i / (h / hk): pairs, fours, one shared head
        for (h, hk) in [(4, 2), (8, 2), (3, 1), (6, 3)] {
            for causal in [false, true] {
                let s = SdpaShape {
                    hk,
                    ..shape(2, h, 33, 70, 16, 24)
                };
                check(s, None, causal);
            }
        }
        let (h, hk, tq, tk) = (4, 2, 5, 9);
        let bias = data(h * tq * tk, 11);
        let m = AttnMask::Additive {
            data: &bias,
            strides: [0, tq * tk, tk, 1],
        };
        check(
            SdpaShape {
                hk,
                ..shape(2, h, tq, tk, 16, 16)
            },
            Some(m),
            true,
        );
    }

    #[test]
    #[should_panic(expected = "do not split")]
    fn kv_heads_must_divide_query_heads() {
        let s = SdpaShape {
            hk: 2,
            ..shape(1, 3, 2, 2, 4, 4)
        };
        let n = s.b * s.h * s.tq * s.d;
        sdpa_f32(
            &s,
            &vec![0.0; n],
            &[0.0; 2 * 2 * 4],
            &[0.0; 2 * 2 * 4],
            None,
            false,
            1.0,
            &mut vec![0.0; n],
            None,
        );
    }

    #[test]
    fn unmasked_odd_sizes() {
        for s in [
            shape(1, 1, 1, 1, 1, 1),
            shape(2, 3, 5, 7, 5, 7),
            shape(1, 2, 13, 17, 16, 33),
            shape(1, 1, 3, 4, 0, 2),
        ] {
            check(s, None, false);
        }
    }

    #[test]
    fn several_key_and_query_blocks() {
        // tk over KB (several online-softmax steps), tq over QB, d and dv not multiples of NR
        for causal in [false, true] {
            check(shape(1, 2, 130, 300, 64, 40), None, causal);
            check(shape(2, 1, 70, 129, 24, 16), None, causal);
        }
    }

    #[test]
    fn causal_with_unequal_lengths() {
        for (tq, tk) in [(5, 3), (3, 9), (200, 70), (70, 200), (1, 1), (4, 4)] {
            check(shape(2, 2, tq, tk, 8, 8), None, true);
        }
    }

    #[test]
    fn additive_mask_with_broadcast() {
        let (b, h, tq, tk) = (2, 3, 9, 150);
        // key padding mask [b, 1, 1, tk]: batch 1 masks its last 60 keys
        let pad: Vec<f32> = (0..b * tk)
            .map(|i| {
                if i / tk == 1 && i % tk >= 90 {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let m = AttnMask::Additive {
            data: &pad,
            strides: [tk, 0, 0, 1],
        };
        check(shape(b, h, tq, tk, 16, 16), Some(m), false);
        check(shape(b, h, tq, tk, 16, 16), Some(m), true);
        // full bias [b, h, tq, tk]
        let bias = data(b * h * tq * tk, 77);
        let m = AttnMask::Additive {
            data: &bias,
            strides: [h * tq * tk, tq * tk, tk, 1],
        };
        check(shape(b, h, tq, tk, 16, 16), Some(m), false);
        // per-query bias broadcast over keys (key stride 0) and heads
        let per_q = data(tq, 78);
        let m = AttnMask::Additive {
            data: &per_q,
            strides: [0, 0, 1, 0],
        };
        check(shape(b, h, tq, tk, 16, 16), Some(m), false);
        // transposed [tk, tq] storage (key stride != 1)
        let kt = data(tq * tk, 79);
        let m = AttnMask::Additive {
            data: &kt,
            strides: [0, 0, 1, tq],
        };
        check(shape(b, h, tq, tk, 16, 16), Some(m), true);
    }

    #[test]
    fn bool_mask_and_fully_masked_rows() {
        let (tq, tk) = (6, 140);
        // [tq, tk] broadcast over batch and head; row 2 masks every key
        let keep: Vec<u8> = (0..tq * tk)
            .map(|i| u8::from(i / tk != 2 && (i % tk) % 3 != 1))
            .collect();
        let m = AttnMask::Keep {
            data: &keep,
            strides: [0, 0, tk, 1],
        };
        let s = shape(2, 2, tq, tk, 8, 12);
        let (out, lse) = check(s, Some(m), false);
        for bh in 0..4 {
            assert!(
                out[(bh * tq + 2) * 12..][..12].iter().all(|&x| x == 0.0),
                "fully masked row is zeros"
            );
            assert_eq!(lse[bh * tq + 2], 0.0, "fully masked row has lse 0");
        }
        check(s, Some(m), true);
        // an all -inf additive row, and causal rows emptied by the mask
        let mut add = vec![0f32; tq * tk];
        add[..tk].fill(f32::NEG_INFINITY);
        let m = AttnMask::Additive {
            data: &add,
            strides: [0, 0, tk, 1],
        };
        let (out, lse) = check(s, Some(m), true);
        assert!(out[..12].iter().all(|&x| x == 0.0) && lse[0] == 0.0);
        // keys masked so that a whole first key block is invisible: rescaling from an empty start
        let keep: Vec<u8> = (0..tk).map(|j| u8::from(j >= KB)).collect();
        check(
            s,
            Some(AttnMask::Keep {
                data: &keep,
                strides: [0, 0, 0, 1],
            }),
            false,
        );
        // no keys at all
        let mut out = vec![f32::NAN; 2 * 3];
        let mut lse = vec![f32::NAN; 2];
        sdpa_f32(
            &shape(1, 1, 2, 0, 4, 3),
            &[0.5; 8],
            &[],
            &[],
            None,
            false,
            1.0,
            &mut out,
            Some(&mut lse),
        );
        assert_eq!((out, lse), (vec![0.0; 6], vec![0.0; 2]));
    }

    #[test]
    fn parallel_path_matches() {
        check(shape(4, 8, 128, 128, 64, 64), None, false);
        check(shape(2, 4, 100, 100, 32, 32), None, true);
    }

    /// Both tilings (one panel per tile, four with AVX-512) against a naive product, over row counts
    /// around `MR`, panel counts around 4, strided A in both orientations and accumulation.
    #[test]
    fn panel_products_match_naive_in_both_tilings() {
        let k = 37;
        for &m in &[1, 5, 6, 7, 13] {
            for &npanels in &[1, 2, 3, 4, 5, 8] {
                let n = npanels * NR;
                let a = data(m * k, (m * 100 + npanels) as u64);
                // B's panels laid out k × NR each, `panel_stride` apart with a gap between them
                let panel_stride = k * NR + 5;
                let b = data(npanels * panel_stride, 7);
                let c0 = data(m * n, 9);
                for (rs, cs) in [(k, 1), (1, m)] {
                    for accumulate in [false, true] {
                        let mut want = vec![0f64; m * n];
                        for i in 0..m {
                            for j in 0..n {
                                let (pn, jj) = (j / NR, j % NR);
                                let dot: f64 = (0..k)
                                    .map(|p| {
                                        a[i * rs + p * cs] as f64
                                            * b[pn * panel_stride + p * NR + jj] as f64
                                    })
                                    .sum();
                                want[i * n + j] = dot
                                    + if accumulate {
                                        c0[i * n + j] as f64
                                    } else {
                                        0.0
                                    };
                            }
                        }
                        for wide in [false, true] {
                            let mut c = c0.clone();
                            let am = MatA {
                                ptr: a.as_ptr(),
                                rs,
                                cs,
                            };
                            // SAFETY: a is m × k under (rs, cs); b holds npanels panels of k × NR;
                            // c is m × n
                            unsafe {
                                gemm_panels(
                                    m,
                                    k,
                                    am,
                                    b.as_ptr(),
                                    NR,
                                    panel_stride,
                                    npanels,
                                    c.as_mut_ptr(),
                                    n,
                                    accumulate,
                                    wide,
                                )
                            };
                            for (idx, (&g, &w)) in c.iter().zip(&want).enumerate() {
                                assert!(
                                    (g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                                    "m={m} panels={npanels} rs={rs} acc={accumulate} wide={wide} at {idx}: {g} vs {w}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn exp_attn_accuracy_and_special_values() {
        for i in 0..=1_750_000 {
            let x = -(i as f32) * 5e-5;
            let (got, want) = (exp_attn(x) as f64, (x as f64).exp());
            if x < -87.33 {
                // below 2^-126: flushed to zero (or, just above, the nearest normal result)
                assert!(
                    got == 0.0 || (got - want).abs() <= 3e-7 * want,
                    "exp({x}) = {got} want {want}"
                );
            } else {
                assert!(
                    (got - want).abs() <= 3e-7 * want,
                    "exp({x}) = {got} want {want}"
                );
            }
        }
        assert_eq!(exp_attn(0.0), 1.0);
        assert_eq!(exp_attn(-88.0), 0.0);
        assert_eq!(exp_attn(-1e30), 0.0);
        assert_eq!(exp_attn(f32::NEG_INFINITY), 0.0);
        assert!(exp_attn(f32::NAN).is_nan());
    }

    #[test]
    fn nan_propagates_to_its_row() {
        let s = shape(1, 1, 3, 5, 4, 4);
        let mut q = data(12, 1);
        q[4] = f32::NAN; // query 1
        let (k, v) = (data(20, 2), data(20, 3));
        let mut out = vec![0f32; 12];
        sdpa_f32(&s, &q, &k, &v, None, false, 0.5, &mut out, None);
        assert!(out[4..8].iter().all(|x| x.is_nan()));
        assert!(out[..4].iter().chain(&out[8..]).all(|x| x.is_finite()));
    }

    #[test]
    #[should_panic(expected = "sdpa: mask has 10 elements")]
    fn mask_extent_checked() {
        let s = shape(1, 1, 2, 6, 1, 1);
        let m = AttnMask::Keep {
            data: &[1; 10],
            strides: [0, 0, 6, 1],
        };
        sdpa_f32(
            &s,
            &[0.0; 2],
            &[0.0; 6],
            &[0.0; 6],
            Some(m),
            false,
            1.0,
            &mut [0.0; 2],
            None,
        );
    }

    #[test]
    fn heads_may_share_keys_and_values() {
        // grouped-query style: k and v have one head, read by all three query heads (head stride 0)
        let s = shape(2, 3, 9, 11, 8, 5);
        let q = data(s.b * s.h * s.tq * s.d, 7);
        let k1 = data(s.b * s.tk * s.d, 8);
        let v1 = data(s.b * s.tk * s.dv, 9);
        let expand = |x: &[f32], w: usize| -> Vec<f32> {
            let per = s.tk * w;
            (0..s.b * s.h)
                .flat_map(|bh| x[(bh / s.h) * per..][..per].iter().copied())
                .collect()
        };
        let (want, _) = reference(
            &s,
            &q,
            &expand(&k1, s.d),
            &expand(&v1, s.dv),
            None,
            false,
            0.4,
        );
        let mut rows = SdpaRows::contiguous(&s);
        rows.k = HeadRows {
            batch: s.tk * s.d,
            head: 0,
            row: s.d,
        };
        rows.v = HeadRows {
            batch: s.tk * s.dv,
            head: 0,
            row: s.dv,
        };
        let mut out = vec![f32::NAN; want.len()];
        sdpa_f32_rows(&s, &rows, &q, &k1, &v1, None, false, 0.4, &mut out, None);
        for (&g, &w) in out.iter().zip(&want) {
            assert!((g as f64 - w).abs() < 2e-5 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }

    #[test]
    #[should_panic(expected = "sdpa: output rows")]
    fn overlapping_output_rows_rejected() {
        let s = shape(1, 2, 3, 3, 4, 4);
        let mut rows = SdpaRows::contiguous(&s);
        rows.out.head = 2; // head 1's rows would start inside head 0's
        let n = s.b * s.h * s.tq * s.d;
        sdpa_f32_rows(
            &s,
            &rows,
            &vec![0.0; n],
            &vec![0.0; n],
            &vec![0.0; n],
            None,
            false,
            1.0,
            &mut vec![0.0; n],
            None,
        );
    }

    #[test]
    fn rows_disjoint_cases() {
        let r = |batch, head, row| HeadRows { batch, head, row };
        assert!(r(64 * 8 * 128, 64, 512).rows_disjoint(4, 8, 128, 64)); // [b, t, h, d]
        assert!(HeadRows::contiguous(8, 128, 64).rows_disjoint(4, 8, 128, 64));
        assert!(!r(64 * 8 * 128, 32, 512).rows_disjoint(4, 8, 128, 64)); // heads overlap
        assert!(!r(0, 64, 512).rows_disjoint(2, 8, 128, 64)); // batches share rows
        assert!(r(0, 64, 512).rows_disjoint(1, 8, 128, 64)); // a lone batch may have any stride
    }

    #[test]
    #[should_panic(expected = "sdpa: v has 5 elements")]
    fn lengths_checked() {
        let s = shape(1, 1, 2, 6, 1, 1);
        sdpa_f32(
            &s,
            &[0.0; 2],
            &[0.0; 6],
            &[0.0; 5],
            None,
            false,
            1.0,
            &mut [0.0; 2],
            None,
        );
    }
}
