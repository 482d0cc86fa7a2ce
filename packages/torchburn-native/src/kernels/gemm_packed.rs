//! f32 products whose right operand B is kept in MKL's packed layout between calls.
//!
//! A GEMM call packs B into its micro-kernel's layout every time. When B is a region input that stays
//! the same from call to call (a weight, or an operand a caller passes again unchanged), the Python
//! side packs it once per version with [`pack_b`] and the product reads the packed copy on MKL's own
//! threads ([`gemm_packed_b`]); a bias, residual and activation then run in a pass over one block of
//! C's rows per thread, before or after the product, as the split path runs them per block. On 2
//! threads: 1024³ 5% faster than the plain call in one process; bench rows against eager, from the
//! engine's own split with its fused epilogue: Linear+ReLU 128x512 -> 1024 1.02-1.04x -> 1.09-1.11x,
//! the encoder layer 1.01-1.03x -> 1.08-1.13x. Packing costs about what a plain call spends on it, so a
//! B that changes on every call loses nothing.
//!
//! MKL asks for a buffer some 7.5 MB larger than B (`cblas_sgemm_pack_get_size`), but writes only
//! the packed matrix. The caller gives each copy a fresh mapping of its own (`program.py`), whose
//! untouched pages take no memory (`mincore`: 1.01 MB resident for a 1 MB B in an 8.8 MB buffer)
//! and which goes back to the OS whole when the copy is dropped.
//!
//! Only PyTorch's MKL offers these routines (`cblas_sgemm_pack_get_size`, `cblas_sgemm_pack`,
//! `cblas_sgemm_compute`); without them [`packed_b_bytes`] is 0 and nothing here is used.

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use super::gemm::{host_set_local_threads, BlockFn, BlockHooks, Mat, MatMut, SetLocalThreads};

/// Below this many elements of C a hook runs on the calling thread alone.
const HOOK_SPLIT_MIN: usize = 1 << 14;

/// CBLAS enumerations, as `mkl_cblas.h` numbers them.
const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;
const PACKED: c_int = 151;
const B_MATRIX: c_int = 162;

/// `cblas_sgemm_pack_get_size(identifier, m, n, k) -> bytes`.
type PackGetSize = unsafe extern "C" fn(c_int, c_int, c_int, c_int) -> usize;
/// `cblas_sgemm_pack(layout, identifier, trans, m, n, k, alpha, src, ld, dest)`.
type Pack = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    f32,
    *const f32,
    c_int,
    *mut f32,
);
/// `cblas_sgemm_compute(layout, transa, transb, m, n, k, a, lda, b, ldb, beta, c, ldc)`.
type Compute = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const f32,
    c_int,
    *const f32,
    c_int,
    f32,
    *mut f32,
    c_int,
);

static GET_SIZE: AtomicUsize = AtomicUsize::new(0);
static PACK: AtomicUsize = AtomicUsize::new(0);
static COMPUTE: AtomicUsize = AtomicUsize::new(0);

/// The three routines, when all are shared.
#[derive(Clone, Copy)]
struct Routines {
    get_size: PackGetSize,
    pack: Pack,
    compute: Compute,
}

/// Makes the packed path available (any zero address: unavailable).
///
/// # Safety
/// Each nonzero address must be the named MKL routine (LP64 CBLAS interface), loaded for the life of
/// the process; MKL's thread setter must have been shared through `gemm::share_host_blas`.
pub unsafe fn share_host_packing(get_size: usize, pack: usize, compute: usize) {
    let all = get_size != 0 && pack != 0 && compute != 0;
    GET_SIZE.store(if all { get_size } else { 0 }, Relaxed);
    PACK.store(if all { pack } else { 0 }, Relaxed);
    COMPUTE.store(if all { compute } else { 0 }, Relaxed);
}

fn shared() -> Option<Routines> {
    let (get_size, pack, compute) = (
        GET_SIZE.load(Relaxed),
        PACK.load(Relaxed),
        COMPUTE.load(Relaxed),
    );
    if get_size == 0 || pack == 0 || compute == 0 {
        return None;
    }
    // SAFETY: `share_host_packing` promised these are MKL's routines of these signatures
    unsafe {
        Some(Routines {
            get_size: std::mem::transmute::<usize, PackGetSize>(get_size),
            pack: std::mem::transmute::<usize, Pack>(pack),
            compute: std::mem::transmute::<usize, Compute>(compute),
        })
    }
}

fn dims(m: usize, n: usize, k: usize) -> Option<(c_int, c_int, c_int)> {
    if m == 0 || n == 0 || k == 0 {
        return None;
    }
    Some((
        c_int::try_from(m).ok()?,
        c_int::try_from(n).ok()?,
        c_int::try_from(k).ok()?,
    ))
}

/// Bytes of B (`k × n`, element `(r, c)` at `r·rs + c·cs`) packed for products with `m` rows of A;
/// 0 where the packed path is unavailable (no MKL, an empty product, sizes beyond its 32-bit
/// integers, or a layout of B that CBLAS cannot read, such as a broadcast row).
pub fn packed_b_bytes(m: usize, n: usize, k: usize, rs: isize, cs: isize) -> usize {
    match (shared(), row_major_operand(k, n, rs, cs)) {
        (Some(r), Some(_)) => bytes_with(r, m, n, k),
        _ => 0,
    }
}

fn bytes_with(r: Routines, m: usize, n: usize, k: usize) -> usize {
    // SAFETY: the routine only computes a size
    dims(m, n, k).map_or(0, |(mi, ni, ki)| unsafe {
        (r.get_size)(B_MATRIX, mi, ni, ki)
    })
}

/// A row-major operand (`rows × cols`, element `(r, c)` at `r·rs + c·cs`) as CBLAS reads it: its
/// transpose flag and leading dimension, or `None` if no unit stride makes it expressible.
fn row_major_operand(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<(c_int, c_int)> {
    let (rows_i, cols_i) = (rows as isize, cols as isize);
    if cs == 1 && (rows == 1 || rs >= cols_i) {
        return c_int::try_from(if rows == 1 { cols_i } else { rs })
            .ok()
            .map(|ld| (NO_TRANS, ld.max(1)));
    }
    if rs == 1 && (cols == 1 || cs >= rows_i) {
        return c_int::try_from(if cols == 1 { rows_i } else { cs })
            .ok()
            .map(|ld| (TRANS, ld.max(1)));
    }
    None
}

/// Packs B (`k × n`) for products with `m` rows of A into `dest`, which holds `dest_bytes`; false
/// (nothing written) where the packed path is unavailable, `dest` is too small or B's layout is one
/// CBLAS cannot express.
///
/// # Safety
/// `b` must be valid for the `k × n` extent its strides describe and `dest` for `dest_bytes` bytes,
/// aligned for f32.
pub unsafe fn pack_b(
    m: usize,
    n: usize,
    k: usize,
    b: Mat<f32>,
    dest: *mut f32,
    dest_bytes: usize,
) -> bool {
    shared().is_some_and(|r| pack_b_with(r, m, n, k, b, dest, dest_bytes))
}

unsafe fn pack_b_with(
    r: Routines,
    m: usize,
    n: usize,
    k: usize,
    b: Mat<f32>,
    dest: *mut f32,
    dest_bytes: usize,
) -> bool {
    let need = bytes_with(r, m, n, k);
    let (Some((mi, ni, ki)), Some((trans, ld))) =
        (dims(m, n, k), row_major_operand(k, n, b.rs, b.cs))
    else {
        return false;
    };
    if need == 0 || dest_bytes < need {
        return false;
    }
    (r.pack)(ROW_MAJOR, B_MATRIX, trans, mi, ni, ki, 1.0, b.ptr, ld, dest);
    true
}

/// `C = (accumulate ? C : 0) + A·B` with B packed by [`pack_b`] for these `m, n, k`, on the engine's
/// thread count of MKL's own team, `hooks` run before and after it over one block of C's rows per
/// thread; false (nothing done) where the packed path is unavailable or A's or C's layout is one
/// CBLAS cannot express (C must have contiguous rows).
///
/// # Safety
/// `a` and `c` must be valid for the extents their strides describe, `packed` must hold B packed for
/// exactly these sizes, C must not overlap A or the packed copy, and the hooks may touch only the
/// block of C they are given.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_packed_b(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<f32>,
    packed: *const f32,
    c: MatMut<f32>,
    accumulate: bool,
    hooks: BlockHooks<'_>,
) -> bool {
    let set_threads = host_set_local_threads();
    let threads = crate::threads::current().max(1);
    let (Some(r), Ok(team)) = (shared(), c_int::try_from(threads)) else {
        return false;
    };
    let Some(args) = compute_args(m, n, k, a, c).filter(|_| set_threads != 0) else {
        return false;
    };
    run_hook(hooks.before, m, n, threads);
    // SAFETY: `share_host_blas` promised MKL's thread setter
    let set_threads: SetLocalThreads = std::mem::transmute(set_threads);
    let previous = set_threads(team);
    compute(r, args, a, packed, c, accumulate);
    set_threads(previous);
    run_hook(hooks.after, m, n, threads);
    true
}

/// `cblas_sgemm_compute`'s sizes, A's transpose flag and the leading dimensions of A and C.
#[derive(Clone, Copy)]
struct ComputeArgs {
    dims: (c_int, c_int, c_int),
    trans_a: c_int,
    lda: c_int,
    ldc: c_int,
}

/// The CBLAS arguments for these sizes and A's and C's layouts; `None` where CBLAS cannot take
/// them (C must have contiguous rows).
fn compute_args(m: usize, n: usize, k: usize, a: Mat<f32>, c: MatMut<f32>) -> Option<ComputeArgs> {
    let (trans_a, lda) = row_major_operand(m, k, a.rs, a.cs)?;
    let (NO_TRANS, ldc) = row_major_operand(m, n, c.rs, c.cs)? else {
        return None;
    };
    Some(ComputeArgs {
        dims: dims(m, n, k)?,
        trans_a,
        lda,
        ldc,
    })
}

/// Runs `hook` over C's rows in one block per thread (one block when C is small: a pass over a few
/// thousand elements costs less than handing it out).
fn run_hook(hook: Option<BlockFn<'_>>, m: usize, n: usize, threads: usize) {
    let Some(hook) = hook else {
        return;
    };
    let per = if m * n < HOOK_SPLIT_MIN {
        m
    } else {
        m.div_ceil(threads)
    };
    crate::threads::parallel_for(m.div_ceil(per), |t| {
        hook(t * per..m.min((t + 1) * per), 0..n)
    });
}

/// `C = (accumulate ? C : 0) + A·B` from the packed B, on the calling thread's MKL team.
unsafe fn compute(
    r: Routines,
    args: ComputeArgs,
    a: Mat<f32>,
    packed: *const f32,
    c: MatMut<f32>,
    accumulate: bool,
) {
    let ComputeArgs {
        dims: (mi, ni, ki),
        trans_a,
        lda,
        ldc,
    } = args;
    let beta = if accumulate { 1.0 } else { 0.0 };
    // ldb is ignored for a packed operand
    (r.compute)(
        ROW_MAJOR, trans_a, PACKED, mi, ni, ki, a.ptr, lda, packed, ni, beta, c.ptr, ldc,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stand-ins for MKL's routines: "packed" B is `op(B)` row-major after a 16-float header, so the
    /// tests check what this module passes (flags, leading dimensions, sizes), not MKL itself.
    const HEADER: usize = 16;

    unsafe extern "C" fn size(id: c_int, _m: c_int, n: c_int, k: c_int) -> usize {
        assert_eq!(id, B_MATRIX);
        (HEADER + (n * k) as usize) * 4
    }

    #[allow(clippy::too_many_arguments)]
    unsafe extern "C" fn pack(
        layout: c_int,
        id: c_int,
        trans: c_int,
        _m: c_int,
        n: c_int,
        k: c_int,
        alpha: f32,
        src: *const f32,
        ld: c_int,
        dest: *mut f32,
    ) {
        assert_eq!((layout, id, alpha), (ROW_MAJOR, B_MATRIX, 1.0));
        let (n, k, ld) = (n as usize, k as usize, ld as usize);
        for p in 0..k {
            for j in 0..n {
                let v = if trans == NO_TRANS {
                    *src.add(p * ld + j)
                } else {
                    *src.add(j * ld + p)
                };
                *dest.add(HEADER + p * n + j) = v;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    unsafe extern "C" fn compute(
        layout: c_int,
        trans_a: c_int,
        trans_b: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        a: *const f32,
        lda: c_int,
        b: *const f32,
        _ldb: c_int,
        beta: f32,
        c: *mut f32,
        ldc: c_int,
    ) {
        assert_eq!((layout, trans_b), (ROW_MAJOR, PACKED));
        let (m, n, k, lda, ldc) = (
            m as usize,
            n as usize,
            k as usize,
            lda as usize,
            ldc as usize,
        );
        for i in 0..m {
            for j in 0..n {
                let dot: f32 = (0..k)
                    .map(|p| {
                        let x = if trans_a == NO_TRANS {
                            *a.add(i * lda + p)
                        } else {
                            *a.add(p * lda + i)
                        };
                        x * *b.add(HEADER + p * n + j)
                    })
                    .sum();
                let out = c.add(i * ldc + j);
                *out = dot + if beta == 0.0 { 0.0 } else { beta * *out };
            }
        }
    }

    /// [`super::compute`] where [`compute_args`] takes the layouts; false (nothing done) where it
    /// does not.
    #[allow(clippy::too_many_arguments)]
    unsafe fn compute_with(
        r: Routines,
        m: usize,
        n: usize,
        k: usize,
        a: Mat<f32>,
        packed: *const f32,
        c: MatMut<f32>,
        accumulate: bool,
    ) -> bool {
        let Some(args) = compute_args(m, n, k, a, c) else {
            return false;
        };
        super::compute(r, args, a, packed, c, accumulate);
        true
    }

    const STAND_INS: Routines = Routines {
        get_size: size,
        pack,
        compute,
    };

    #[test]
    fn operand_layouts() {
        assert_eq!(row_major_operand(4, 3, 3, 1), Some((NO_TRANS, 3)));
        assert_eq!(row_major_operand(4, 3, 5, 1), Some((NO_TRANS, 5)));
        assert_eq!(row_major_operand(4, 3, 1, 4), Some((TRANS, 4)));
        assert_eq!(row_major_operand(1, 3, 0, 1), Some((NO_TRANS, 3)));
        assert_eq!(row_major_operand(4, 3, 2, 1), None); // overlapping rows
        assert_eq!(row_major_operand(4, 3, 6, 2), None); // no unit stride
        assert_eq!(row_major_operand(4, 3, 0, 1), None); // broadcast rows
    }

    #[test]
    fn packed_products_match_a_naive_product_for_every_layout() {
        let (m, n, k) = (5usize, 7usize, 3usize);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
        let want: Vec<f32> = (0..m * n)
            .map(|e| (0..k).map(|p| a[e / n * k + p] * b[p * n + e % n]).sum())
            .collect();
        // row-major, column-major, and a row stride wider than the row
        let a_cm: Vec<f32> = (0..m * k).map(|i| a[(i % m) * k + i / m]).collect();
        let b_cm: Vec<f32> = (0..k * n).map(|i| b[(i % k) * n + i / k]).collect();
        let b_wide: Vec<f32> = (0..k * (n + 2))
            .map(|i| {
                if i % (n + 2) < n {
                    b[i / (n + 2) * n + i % (n + 2)]
                } else {
                    f32::NAN
                }
            })
            .collect();
        let a_views = [(&a, k as isize, 1isize), (&a_cm, 1, m as isize)];
        let b_views = [
            (&b, n as isize, 1isize),
            (&b_cm, 1, k as isize),
            (&b_wide, (n + 2) as isize, 1),
        ];
        for &(bp, brs, bcs) in &b_views {
            let bytes = bytes_with(STAND_INS, m, n, k);
            let mut packed = vec![0.0f32; bytes / 4];
            let bm = Mat {
                ptr: bp.as_ptr(),
                rs: brs,
                cs: bcs,
            };
            // SAFETY: the view covers its vector; the destination holds `bytes`
            unsafe {
                assert!(!pack_b_with(
                    STAND_INS,
                    m,
                    n,
                    k,
                    bm,
                    packed.as_mut_ptr(),
                    bytes - 4
                ));
                assert!(pack_b_with(
                    STAND_INS,
                    m,
                    n,
                    k,
                    bm,
                    packed.as_mut_ptr(),
                    bytes
                ));
            }
            for &(ap, ars, acs) in &a_views {
                for accumulate in [false, true] {
                    let mut c = vec![1.0f32; m * n];
                    let am = Mat {
                        ptr: ap.as_ptr(),
                        rs: ars,
                        cs: acs,
                    };
                    let cm = MatMut {
                        ptr: c.as_mut_ptr(),
                        rs: n as isize,
                        cs: 1,
                    };
                    // SAFETY: as above; C is its own vector
                    let ran = unsafe {
                        compute_with(STAND_INS, m, n, k, am, packed.as_ptr(), cm, accumulate)
                    };
                    assert!(ran);
                    let offset = if accumulate { 1.0 } else { 0.0 };
                    for (e, (&got, &want)) in c.iter().zip(&want).enumerate() {
                        assert_eq!(got, want + offset, "C[{e}] a=({ars},{acs}) b=({brs},{bcs})");
                    }
                }
            }
        }
    }

    #[test]
    fn hooks_cover_every_row_once() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        for (m, n, threads) in [
            (1, 1, 2),
            (7, 3, 2),
            (512, 1024, 2),
            (513, 64, 3),
            (100, 200, 1),
        ] {
            let seen: Vec<AtomicUsize> = (0..m).map(|_| AtomicUsize::new(0)).collect();
            let hook = |rows: std::ops::Range<usize>, cols: std::ops::Range<usize>| {
                assert_eq!(cols, 0..n);
                for r in rows {
                    seen[r].fetch_add(1, SeqCst);
                }
            };
            run_hook(Some(&hook), m, n, threads);
            assert!(
                seen.iter().all(|c| c.load(SeqCst) == 1),
                "{m}x{n} on {threads}"
            );
        }
    }

    #[test]
    fn layouts_cblas_cannot_take_are_refused() {
        let (m, n, k) = (4usize, 3usize, 2usize);
        let (a, b) = (vec![1.0f32; m * k], vec![1.0f32; k * n]);
        let mut packed = vec![0.0f32; bytes_with(STAND_INS, m, n, k) / 4];
        let mut c = vec![0.0f32; m * n];
        let strided_b = Mat {
            ptr: b.as_ptr(),
            rs: 2,
            cs: 2,
        };
        let a_rm = Mat {
            ptr: a.as_ptr(),
            rs: k as isize,
            cs: 1,
        };
        let c_cm = MatMut {
            ptr: c.as_mut_ptr(),
            rs: 1,
            cs: m as isize,
        };
        let bytes = packed.len() * 4;
        // SAFETY: nothing is read or written when a layout is refused
        unsafe {
            assert!(!pack_b_with(
                STAND_INS,
                m,
                n,
                k,
                strided_b,
                packed.as_mut_ptr(),
                bytes
            ));
            assert!(!compute_with(
                STAND_INS,
                m,
                n,
                k,
                a_rm,
                packed.as_ptr(),
                c_cm,
                false
            ));
            assert!(!compute_with(
                STAND_INS,
                0,
                n,
                k,
                a_rm,
                packed.as_ptr(),
                c_cm,
                false
            ));
        }
        assert_eq!(bytes_with(STAND_INS, m, 0, k), 0);
    }
}
