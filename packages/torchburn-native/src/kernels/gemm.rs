//! Matrix multiply on the `gemm` crate (packed, cache-blocked, runtime-dispatched AVX2/AVX-512/NEON
//! micro-kernels), with strides in elements so transposed and sliced operands need no copy.
//!
//! When the process already holds a vendor BLAS (PyTorch's x86 wheels carry MKL and export its Fortran
//! `sgemm_`/`dgemm_`), the Python side may hand those over with [`share_host_blas`]: each block's
//! product then runs on it, single-threaded, while the blocking, threading and fused epilogues stay
//! here. On x86 MKL's micro-kernels are some 10% faster than the crate's; anywhere else (no MKL, or a
//! layout BLAS cannot express, such as a broadcast operand with a zero stride) the crate runs.

use std::ffi::{c_char, c_int};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use gemm::Parallelism;

use crate::isa;

/// Below this many multiply-adds a GEMM runs on the calling thread: waking the pool costs more.
const PARALLEL_MIN_FLOPS: usize = 96 * 96 * 96;
/// From this many multiply-adds a plain product (no fused hooks) runs on MKL's own threading, which
/// packs each shared operand once for all threads; below it the split by rows is faster (compiled
/// `a @ b` against eager on 2 threads, old -> new: 1024³ 0.96 -> 0.98x, 512³ 0.95 -> 0.95x, 256³
/// 0.96 -> 0.91x).
const HOST_THREADED_MIN_FLOPS: usize = 1 << 28;

/// A matrix view: base pointer plus row and column strides in elements.
#[derive(Debug)]
pub struct Mat<T> {
    pub ptr: *const T,
    pub rs: isize,
    pub cs: isize,
}

#[derive(Debug)]
pub struct MatMut<T> {
    pub ptr: *mut T,
    pub rs: isize,
    pub cs: isize,
}

// by hand: derived Clone/Copy would require `T: Copy`, but only the pointer is copied
impl<T> Clone for Mat<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Mat<T> {}
impl<T> Clone for MatMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for MatMut<T> {}

pub trait GemmScalar:
    Copy + Send + Sync + std::ops::Mul<Output = Self> + std::ops::Add<Output = Self> + 'static
{
    const ZERO: Self;
    const ONE: Self;
    /// Where the shared host BLAS routine for this type lives (0: none).
    fn host_gemm() -> &'static AtomicUsize;

    /// The `gemm` crate's product with the micro-kernels of `level`, below the CPU's best: see
    /// `crate_gemm`. C is column-major-ish (`|cs| >= |rs|`).
    ///
    /// # Safety
    /// As [`gemm`]; the CPU supports `level`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn crate_gemm_capped(
        level: isa::Level,
        m: usize,
        n: usize,
        k: usize,
        c: MatMut<Self>,
        accumulate: bool,
        a: Mat<Self>,
        b: Mat<Self>,
        alpha: Self,
    );

    /// `C = (accumulate ? C : 0) + A·B` from a B the host BLAS packed for these sizes (see
    /// `gemm_packed`), with `hooks` run over blocks of C's rows before and after the product; false
    /// (nothing done) where this type or these layouts have no packed path.
    ///
    /// # Safety
    /// As [`gemm_hooked`]; `packed` must hold B packed for exactly these sizes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_packed_b(
        _m: usize,
        _n: usize,
        _k: usize,
        _a: Mat<Self>,
        _packed: *const Self,
        _c: MatMut<Self>,
        _accumulate: bool,
        _hooks: BlockHooks<'_>,
    ) -> bool {
        false
    }
}

/// The crate's generic driver over one micro-kernel family: `$simd` is the crate's ISA token, `$n`
/// its lanes for this type, `$kernels` the family's module (e.g. `gemm_f32::microkernel::fma::f32`).
macro_rules! crate_driver {
    ($t:ty, $simd:ty, $n:expr, $kernels:path, $m:ident, $n_:ident, $k:ident, $c:ident, $accumulate:ident, $a:ident, $b:ident, $alpha:ident) => {{
        use $kernels as family;
        let simd = <$simd as gemm_common::simd::MixedSimd<$t, $t, $t, $t>>::try_new()
            .expect("the ISA level is only reported when the CPU supports it");
        gemm_common::gemm::gemm_basic_generic::<
            $simd,
            $t,
            { $n },
            { family::MR_DIV_N * $n },
            { family::NR },
            { family::MR_DIV_N },
            { family::H_M },
            { family::H_N },
        >(
            simd,
            $m,
            $n_,
            $k,
            $c.ptr,
            $c.cs,
            $c.rs,
            $accumulate,
            $a.ptr,
            $a.cs,
            $a.rs,
            $b.ptr,
            $b.cs,
            $b.rs,
            1.0,
            $alpha,
            false,
            false,
            false,
            |x, y, z| x * y + z,
            &family::UKR,
            &family::H_UKR,
            false,
            Parallelism::None,
        )
    }};
}

/// Implements [`GemmScalar::crate_gemm_capped`] for one float type from its crate's micro-kernel
/// families.
macro_rules! crate_gemm_capped {
    ($t:ty, $fma:path, $scalar:path, $fma_lanes:expr) => {
        #[allow(clippy::too_many_arguments)]
        unsafe fn crate_gemm_capped(
            level: isa::Level,
            m: usize,
            n: usize,
            k: usize,
            c: MatMut<Self>,
            accumulate: bool,
            a: Mat<Self>,
            b: Mat<Self>,
            alpha: Self,
        ) {
            #[cfg(target_arch = "x86_64")]
            if level >= isa::Level::Avx2 {
                crate_driver!(
                    $t,
                    gemm_common::simd::V3,
                    $fma_lanes,
                    $fma,
                    m,
                    n,
                    k,
                    c,
                    accumulate,
                    a,
                    b,
                    alpha
                );
                return;
            }
            let _ = level;
            crate_driver!(
                $t,
                gemm_common::simd::Scalar,
                1,
                $scalar,
                m,
                n,
                k,
                c,
                accumulate,
                a,
                b,
                alpha
            );
        }
    };
}

/// Addresses of the host BLAS's `sgemm_`, `dgemm_` and `MKL_Set_Num_Threads_Local` (0: none).
static HOST_SGEMM: AtomicUsize = AtomicUsize::new(0);
static HOST_DGEMM: AtomicUsize = AtomicUsize::new(0);
static HOST_SET_LOCAL_THREADS: AtomicUsize = AtomicUsize::new(0);

impl GemmScalar for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn host_gemm() -> &'static AtomicUsize {
        &HOST_SGEMM
    }

    crate_gemm_capped!(
        f32,
        gemm_f32::microkernel::fma::f32,
        gemm_f32::microkernel::scalar::f32,
        8
    );

    /// `C = (accumulate ? C : 0) + A·B` from a B the host BLAS packed for these sizes (see
    /// `gemm_packed`), with `hooks` run over blocks of C's rows before and after the product; false
    /// (nothing done) where this type or these layouts have no packed path.
    ///
    /// # Safety
    /// As [`gemm_hooked`]; `packed` must hold B packed for exactly these sizes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_packed_b(
        m: usize,
        n: usize,
        k: usize,
        a: Mat<Self>,
        packed: *const Self,
        c: MatMut<Self>,
        accumulate: bool,
        hooks: BlockHooks<'_>,
    ) -> bool {
        super::gemm_packed::gemm_packed_b(m, n, k, a, packed, c, accumulate, hooks)
    }
}

impl GemmScalar for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn host_gemm() -> &'static AtomicUsize {
        &HOST_DGEMM
    }

    crate_gemm_capped!(
        f64,
        gemm_f64::microkernel::fma::f64,
        gemm_f64::microkernel::scalar::f64,
        4
    );
}

/// The Fortran BLAS `?gemm_` (LP64): `transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc`,
/// column-major, every argument by reference.
type FortranGemm<T> = unsafe extern "C" fn(
    *const c_char,
    *const c_char,
    *const c_int,
    *const c_int,
    *const c_int,
    *const T,
    *const T,
    *const c_int,
    *const T,
    *const c_int,
    *const T,
    *mut T,
    *const c_int,
);

/// MKL's C-interface `MKL_Set_Num_Threads_Local(n) -> previous` (the lowercase symbol is the Fortran
/// one, taking a pointer); 0 restores the global setting.
pub(crate) type SetLocalThreads = unsafe extern "C" fn(c_int) -> c_int;

/// Runs later GEMMs' block products on the host BLAS; a zero address leaves that type on the crate.
///
/// # Safety
/// Each nonzero address must be the named MKL routine (LP64 Fortran interface), loaded for the life of
/// the process.
pub unsafe fn share_host_blas(sgemm: usize, dgemm: usize, set_local_threads: usize) {
    HOST_SET_LOCAL_THREADS.store(set_local_threads, Relaxed);
    HOST_SGEMM.store(sgemm, Relaxed);
    HOST_DGEMM.store(dgemm, Relaxed);
}

/// The address of MKL's `MKL_Set_Num_Threads_Local` (0: none shared).
pub(crate) fn host_set_local_threads() -> usize {
    HOST_SET_LOCAL_THREADS.load(Relaxed)
}

/// Whether products of `T` run on the host BLAS.
pub fn host_blas<T: GemmScalar>() -> bool {
    T::host_gemm().load(Relaxed) != 0
}

/// Which library runs the block products: "mkl" (the host's) or "gemm-crate".
pub fn backend() -> &'static str {
    if HOST_SGEMM.load(Relaxed) != 0 {
        "mkl"
    } else {
        "gemm-crate"
    }
}

/// A logical column-major `rows × cols` operand (element `(r, c)` at `r·rs + c·cs`) as BLAS sees it:
/// its transpose flag and leading dimension, or `None` if no unit stride makes it expressible.
fn blas_operand(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<(u8, c_int)> {
    let (rows_i, cols_i) = (rows as isize, cols as isize);
    // a stride along an extent of 1 is never used, so any value fits it
    if (rows == 1 || rs == 1) && (cols == 1 || cs >= rows_i.max(1)) {
        let ld = if cols == 1 { rows_i.max(1) } else { cs };
        return c_int::try_from(ld).ok().map(|ld| (b'N', ld));
    }
    if (cols == 1 || cs == 1) && (rows == 1 || rs >= cols_i.max(1)) {
        let ld = if rows == 1 { cols_i.max(1) } else { rs };
        return c_int::try_from(ld).ok().map(|ld| (b'T', ld));
    }
    None
}

/// `C = (accumulate ? C : 0) + alpha·A·B` through the Fortran `?gemm_` at `routine`, on this thread
/// alone (`set_threads`, MKL's thread setter, or 0 to leave threads alone); false (nothing done) when
/// `routine` is 0 or the layout is one BLAS cannot express.
///
/// # Safety
/// As [`gemm`]; `routine` must be 0 or a Fortran `?gemm_` for `T`, `set_threads` 0 or MKL's setter.
#[allow(clippy::too_many_arguments)]
unsafe fn blas_gemm<T: GemmScalar>(
    routine: usize,
    set_threads: usize,
    threads: c_int,
    m: usize,
    n: usize,
    k: usize,
    a: Mat<T>,
    b: Mat<T>,
    c: MatMut<T>,
    accumulate: bool,
    alpha: T,
) -> bool {
    if routine == 0 {
        return false;
    }
    let (Ok(mi), Ok(ni), Ok(ki)) = (c_int::try_from(m), c_int::try_from(n), c_int::try_from(k))
    else {
        return false;
    };
    // a row-major C is the column-major Cᵀ = Bᵀ·Aᵀ; a column-major C is itself
    let call = if c.cs == 1 || (n == 1 && c.rs != 1) {
        let ldc = if m == 1 { n.max(1) as isize } else { c.rs };
        (
            blas_operand(n, k, b.cs, b.rs),
            blas_operand(k, m, a.cs, a.rs),
            (ni, mi, b.ptr, a.ptr, ldc),
        )
    } else if c.rs == 1 {
        let ldc = if n == 1 { m.max(1) as isize } else { c.cs };
        (
            blas_operand(m, k, a.rs, a.cs),
            blas_operand(k, n, b.rs, b.cs),
            (mi, ni, a.ptr, b.ptr, ldc),
        )
    } else {
        return false;
    };
    let (Some((op1, ld1)), Some((op2, ld2)), (rows, cols, p1, p2, ldc)) = call else {
        return false;
    };
    let Ok(ldc) = c_int::try_from(ldc) else {
        return false;
    };
    if ldc < rows.max(1) {
        return false;
    }
    let beta = if accumulate { T::ONE } else { T::ZERO };
    let (op1, op2) = (op1 as c_char, op2 as c_char);
    // SAFETY: `share_host_blas` promised these routines; the operands are valid per the caller.
    let gemm: FortranGemm<T> = std::mem::transmute(routine);
    let previous = if set_threads != 0 {
        let set: SetLocalThreads = std::mem::transmute(set_threads);
        Some((set, set(threads)))
    } else {
        None
    };
    gemm(
        &op1, &op2, &rows, &cols, &ki, &alpha, p1, &ld1, p2, &ld2, &beta, c.ptr, &ldc,
    );
    if let Some((set, previous)) = previous {
        set(previous);
    }
    true
}

/// A hook on a block of C, given the block's rows and columns.
pub type BlockFn<'a> = &'a (dyn Fn(Range<usize>, Range<usize>) + Sync);

/// Work on each block of C right before and after the block's product, on the thread that computes
/// it and while the block is in its cache: filling in the bias the product accumulates onto, and
/// applying an activation. Without them each is a pass of its own over all of C.
#[derive(Clone, Copy, Default)]
pub struct BlockHooks<'a> {
    pub before: Option<BlockFn<'a>>,
    pub after: Option<BlockFn<'a>>,
}

/// `C = (accumulate ? C : 0) + alpha · A·B` for `A: m×k`, `B: k×n`, `C: m×n`.
///
/// # Safety
/// Every pointer must be valid for the extents its strides describe, and `C` must not overlap `A`/`B`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<T>,
    b: Mat<T>,
    c: MatMut<T>,
    accumulate: bool,
    alpha: T,
    allow_parallel: bool,
) {
    gemm_hooked(
        m,
        n,
        k,
        a,
        b,
        c,
        accumulate,
        alpha,
        allow_parallel,
        0,
        BlockHooks::default(),
    )
}

/// [`gemm`] with `hooks` run around the product of every block of C. `b_panel` 0 reads B through its
/// strides; P > 0 reads B as panels of P columns, panel q a contiguous row-major `k × P` block at
/// `b.ptr + q·k·P` (`b.rs`/`b.cs` unused), and splits the columns between threads at panel bounds.
///
/// # Safety
/// As [`gemm`]; the hooks may touch only the block of C they are given; with panels, B must hold
/// `ceil(n / P)` of them.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_hooked<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<T>,
    b: Mat<T>,
    c: MatMut<T>,
    accumulate: bool,
    alpha: T,
    allow_parallel: bool,
    b_panel: usize,
    hooks: BlockHooks<'_>,
) {
    if m == 0 || n == 0 {
        return;
    }
    let block = |rows: Range<usize>, cols: Range<usize>, product: &dyn Fn()| {
        if let Some(before) = hooks.before {
            before(rows.clone(), cols.clone());
        }
        product();
        if let Some(after) = hooks.after {
            after(rows, cols);
        }
    };
    if k == 0 {
        block(0..m, 0..n, &|| {
            if !accumulate {
                for i in 0..m as isize {
                    for j in 0..n as isize {
                        *c.ptr.offset(i * c.rs + j * c.cs) = T::ZERO;
                    }
                }
            }
        });
        return;
    }
    let threads = crate::threads::current();
    let flops = m.saturating_mul(n).saturating_mul(k);
    let parallel = allow_parallel && threads > 1 && flops >= PARALLEL_MIN_FLOPS;
    let plain = hooks.before.is_none() && hooks.after.is_none() && b_panel == 0;
    if parallel && plain && flops >= HOST_THREADED_MIN_FLOPS {
        // a plain product: MKL's own threading (on the same OpenMP team) packs each shared operand
        // once for all threads, where a split by rows packs B on every thread
        let (host, set_threads) = (
            T::host_gemm().load(Relaxed),
            HOST_SET_LOCAL_THREADS.load(Relaxed),
        );
        if set_threads != 0
            && c_int::try_from(threads)
                .is_ok_and(|t| blas_gemm(host, set_threads, t, m, n, k, a, b, c, accumulate, alpha))
        {
            return;
        }
    }
    if parallel {
        // one block of the larger output side per thread; each packs the shared operand itself,
        // which is cheap next to the multiply and needs no handoff between threads
        let split_rows = m >= n;
        let side = if split_rows { m } else { n };
        let unit = if split_rows || b_panel == 0 {
            16
        } else {
            b_panel
        };
        let per = side.div_ceil(threads).next_multiple_of(unit).min(side);
        let shared = SharedArgs { a, b, c };
        crate::threads::parallel_for(side.div_ceil(per), |t| {
            let (a, b, c) = shared.get();
            let lo = (t * per) as isize;
            let len = per.min(side - t * per);
            // SAFETY: blocks are disjoint row (column) ranges of C, reading in-bounds rows of A
            // (columns of B)
            if split_rows {
                let a = Mat {
                    ptr: a.ptr.offset(lo * a.rs),
                    ..a
                };
                let cb = MatMut {
                    ptr: c.ptr.offset(lo * c.rs),
                    ..c
                };
                let rows = lo as usize..lo as usize + len;
                block(rows, 0..n, &|| {
                    gemm_panels(len, n, k, a, b, b_panel, cb, accumulate, alpha)
                })
            } else {
                let b = Mat {
                    // with panels, `per` is a whole number of them
                    ptr: match (lo as usize).checked_div(b_panel) {
                        None => b.ptr.offset(lo * b.cs),
                        Some(panels) => b.ptr.add(panels * k * b_panel),
                    },
                    ..b
                };
                let cb = MatMut {
                    ptr: c.ptr.offset(lo * c.cs),
                    ..c
                };
                let cols = lo as usize..lo as usize + len;
                block(0..m, cols, &|| {
                    gemm_panels(m, len, k, a, b, b_panel, cb, accumulate, alpha)
                })
            }
        });
        return;
    }
    block(0..m, 0..n, &|| {
        gemm_panels(m, n, k, a, b, b_panel, c, accumulate, alpha)
    })
}

/// [`gemm_serial`] over B's panels in turn (one call when `b_panel` is 0: B is strided).
///
/// # Safety
/// As [`gemm_hooked`], with `b` at the first panel of these `n` columns.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_panels<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<T>,
    b: Mat<T>,
    b_panel: usize,
    c: MatMut<T>,
    accumulate: bool,
    alpha: T,
) {
    if b_panel == 0 {
        return gemm_serial(m, n, k, a, b, c, accumulate, alpha);
    }
    for (q, col) in (0..n).step_by(b_panel).enumerate() {
        let panel = Mat {
            ptr: b.ptr.add(q * k * b_panel),
            rs: b_panel as isize,
            cs: 1,
        };
        let cq = MatMut {
            ptr: c.ptr.offset(col as isize * c.cs),
            ..c
        };
        gemm_serial(m, b_panel.min(n - col), k, a, panel, cq, accumulate, alpha);
    }
}

/// The operands of one GEMM, handed to the tasks that compute disjoint blocks of C.
struct SharedArgs<T> {
    a: Mat<T>,
    b: Mat<T>,
    c: MatMut<T>,
}
// SAFETY: tasks only read A and B and write disjoint blocks of C
unsafe impl<T> Sync for SharedArgs<T> {}
unsafe impl<T> Send for SharedArgs<T> {}

impl<T> SharedArgs<T> {
    /// A method, so closures capture the whole (Sync) wrapper rather than its raw-pointer fields.
    fn get(&self) -> (Mat<T>, Mat<T>, MatMut<T>) {
        (self.a, self.b, self.c)
    }
}

/// # Safety
/// As [`gemm`].
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_serial<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<T>,
    b: Mat<T>,
    c: MatMut<T>,
    accumulate: bool,
    alpha: T,
) {
    let (host, set_threads) = (
        T::host_gemm().load(Relaxed),
        HOST_SET_LOCAL_THREADS.load(Relaxed),
    );
    // one thread: the callers here already split the work across the pool
    if blas_gemm(host, set_threads, 1, m, n, k, a, b, c, accumulate, alpha) {
        return;
    }
    // gemm's convention: dst = alpha·dst + beta·lhs·rhs
    crate_gemm(m, n, k, c, accumulate, a, b, alpha);
}

/// `C = (accumulate ? C : 0) + alpha·A·B` on the `gemm` crate, one thread, with its micro-kernels
/// for the running [`isa::level`].
///
/// The crate picks its micro-kernels by CPU detection, which is the running level unless
/// `TORCHBURN_ISA` caps it; then the product goes through the crate's generic driver with the
/// capped level's micro-kernels (and the crate's own layout rule: they want a column-major C, so a
/// row-major one is computed as `Cᵀ = Bᵀ·Aᵀ`).
///
/// # Safety
/// As [`gemm`].
#[allow(clippy::too_many_arguments)]
unsafe fn crate_gemm<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    c: MatMut<T>,
    accumulate: bool,
    a: Mat<T>,
    b: Mat<T>,
    alpha: T,
) {
    if !isa::capped() {
        gemm::gemm(
            m,
            n,
            k,
            c.ptr,
            c.cs,
            c.rs,
            accumulate,
            a.ptr,
            a.cs,
            a.rs,
            b.ptr,
            b.cs,
            b.rs,
            T::ONE,
            alpha,
            false,
            false,
            false,
            Parallelism::None,
        );
        return;
    }
    let (m, n, c, a, b) = if c.cs.abs() < c.rs.abs() {
        let ct = MatMut {
            ptr: c.ptr,
            rs: c.cs,
            cs: c.rs,
        };
        let (at, bt) = (
            Mat {
                ptr: b.ptr,
                rs: b.cs,
                cs: b.rs,
            },
            Mat {
                ptr: a.ptr,
                rs: a.cs,
                cs: a.rs,
            },
        );
        (n, m, ct, at, bt)
    } else {
        (m, n, c, a, b)
    };
    T::crate_gemm_capped(isa::level(), m, n, k, c, accumulate, a, b, alpha);
}

/// Contiguous row-major convenience wrapper: `C[m×n] (+)= A[m×k] · B[k×n]`.
pub fn gemm_rowmajor<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    b: &[T],
    c: &mut [T],
    accumulate: bool,
) {
    assert!(
        a.len() >= m * k && b.len() >= k * n && c.len() >= m * n,
        "gemm_rowmajor: slice too short"
    );
    // SAFETY: the asserts above bound every access; C is a distinct &mut slice.
    unsafe {
        gemm(
            m,
            n,
            k,
            Mat {
                ptr: a.as_ptr(),
                rs: k as isize,
                cs: 1,
            },
            Mat {
                ptr: b.as_ptr(),
                rs: n as isize,
                cs: 1,
            },
            MatMut {
                ptr: c.as_mut_ptr(),
                rs: n as isize,
                cs: 1,
            },
            accumulate,
            T::ONE,
            true,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f64], b: &[f64]) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn odd_sizes_match_naive() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (7, 13, 5),
            (1, 257, 31),
            (129, 1, 64),
            (100, 100, 100),
            (3, 4, 0),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 5 % 13) as f32 - 6.0) / 4.0)
                .collect();
            let mut c = vec![1.0f32; m * n];
            gemm_rowmajor(m, n, k, &a, &b, &mut c, false);
            let a64: Vec<f64> = a.iter().map(|&x| x as f64).collect();
            let b64: Vec<f64> = b.iter().map(|&x| x as f64).collect();
            let want = naive(m, n, k, &a64, &b64);
            for (got, want) in c.iter().zip(want) {
                assert!(
                    (*got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{m}x{n}x{k}"
                );
            }
        }
    }

    /// Each level's micro-kernels, as `TORCHBURN_ISA` would pick them, against the naive product:
    /// f32 and f64, accumulating or not, a scaled product, and row- and column-major operands.
    #[test]
    fn every_supported_level_matches_naive() {
        for level in isa::supported() {
            for &(m, n, k) in &[
                (1, 1, 1),
                (7, 13, 5),
                (33, 70, 19),
                (100, 100, 100),
                (3, 4, 0),
            ] {
                let a: Vec<f64> = (0..m * k)
                    .map(|i| ((i * 7 % 11) as f64 - 5.0) / 3.0)
                    .collect();
                let b: Vec<f64> = (0..k * n)
                    .map(|i| ((i * 5 % 13) as f64 - 6.0) / 4.0)
                    .collect();
                let want = naive(m, n, k, &a, &b);
                for accumulate in [false, true] {
                    // C column-major (the drivers' layout), starting at 1.0
                    let mut c64 = vec![1.0f64; m * n];
                    let mut c32 = vec![1.0f32; m * n];
                    let (a32, b32): (Vec<f32>, Vec<f32>) = (
                        a.iter().map(|&x| x as f32).collect(),
                        b.iter().map(|&x| x as f32).collect(),
                    );
                    let (mi, ki) = (m as isize, k as isize);
                    let ni = n as isize;
                    // SAFETY: A is m×k and B k×n row-major, C m×n column-major, all in bounds
                    unsafe {
                        f64::crate_gemm_capped(
                            level,
                            m,
                            n,
                            k,
                            MatMut {
                                ptr: c64.as_mut_ptr(),
                                rs: 1,
                                cs: mi,
                            },
                            accumulate,
                            Mat {
                                ptr: a.as_ptr(),
                                rs: ki,
                                cs: 1,
                            },
                            Mat {
                                ptr: b.as_ptr(),
                                rs: ni,
                                cs: 1,
                            },
                            2.0,
                        );
                        f32::crate_gemm_capped(
                            level,
                            m,
                            n,
                            k,
                            MatMut {
                                ptr: c32.as_mut_ptr(),
                                rs: 1,
                                cs: mi,
                            },
                            accumulate,
                            Mat {
                                ptr: a32.as_ptr(),
                                rs: ki,
                                cs: 1,
                            },
                            Mat {
                                ptr: b32.as_ptr(),
                                rs: ni,
                                cs: 1,
                            },
                            2.0,
                        );
                    }
                    for i in 0..m {
                        for j in 0..n {
                            let expect = 2.0 * want[i * n + j] + if accumulate { 1.0 } else { 0.0 };
                            let (g64, g32) = (c64[j * m + i], c32[j * m + i] as f64);
                            let what = format!("{level:?} {m}x{n}x{k} accumulate={accumulate}");
                            assert!(
                                (g64 - expect).abs() < 1e-9 * (1.0 + expect.abs()),
                                "f64 {what}"
                            );
                            assert!(
                                (g32 - expect).abs() < 1e-4 * (1.0 + expect.abs()),
                                "f32 {what}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A column-major reference `sgemm_` with the Fortran calling convention, standing in for MKL.
    unsafe extern "C" fn reference_sgemm(
        ta: *const c_char,
        tb: *const c_char,
        m: *const c_int,
        n: *const c_int,
        k: *const c_int,
        alpha: *const f32,
        a: *const f32,
        lda: *const c_int,
        b: *const f32,
        ldb: *const c_int,
        beta: *const f32,
        c: *mut f32,
        ldc: *const c_int,
    ) {
        let (m, n, k) = (*m as usize, *n as usize, *k as usize);
        let (lda, ldb, ldc) = (*lda as usize, *ldb as usize, *ldc as usize);
        let at = |i: usize, p: usize| match *ta as u8 {
            b'N' => *a.add(i + p * lda),
            _ => *a.add(p + i * lda),
        };
        let bt = |p: usize, j: usize| match *tb as u8 {
            b'N' => *b.add(p + j * ldb),
            _ => *b.add(j + p * ldb),
        };
        for j in 0..n {
            for i in 0..m {
                let dot: f32 = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                let out = c.add(i + j * ldc);
                *out = *alpha * dot + if *beta == 0.0 { 0.0 } else { *beta * *out };
            }
        }
    }

    unsafe extern "C" fn keep_threads(n: c_int) -> c_int {
        n
    }

    #[test]
    fn blas_operand_layouts() {
        // column-major, row-major (a transpose), degenerate extents, and what BLAS cannot express
        assert_eq!(blas_operand(4, 3, 1, 4), Some((b'N', 4)));
        assert_eq!(blas_operand(4, 3, 3, 1), Some((b'T', 3)));
        assert_eq!(blas_operand(4, 3, 1, 6), Some((b'N', 6)));
        assert_eq!(blas_operand(1, 3, 9, 1), Some((b'N', 1)));
        assert_eq!(blas_operand(4, 1, 1, 0), Some((b'N', 4)));
        assert_eq!(blas_operand(4, 3, 0, 1), None); // broadcast rows
        assert_eq!(blas_operand(4, 3, 2, 8), None); // no unit stride
        assert_eq!(blas_operand(4, 3, 1, 2), None); // overlapping columns
        assert_eq!(blas_operand(4, 3, -1, 4), None);
    }

    /// Every operand layout through the host-BLAS path (here a reference `sgemm_`), against the crate.
    #[test]
    fn host_blas_path_matches_the_crate_for_every_layout() {
        let (m, n, k) = (5usize, 7usize, 3usize);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
        // (row stride, column stride) of a row-major and a column-major copy of each matrix
        let a_cm: Vec<f32> = (0..m * k).map(|i| a[(i % m) * k + i / m]).collect();
        let b_cm: Vec<f32> = (0..k * n).map(|i| b[(i % k) * n + i / k]).collect();
        let a_views = [(&a, k as isize, 1isize), (&a_cm, 1, m as isize)];
        let b_views = [(&b, n as isize, 1isize), (&b_cm, 1, k as isize)];
        let mut want = vec![0.0f32; m * n];
        gemm_rowmajor(m, n, k, &a, &b, &mut want, false);
        let (reference, threads) = (
            reference_sgemm as *const () as usize,
            keep_threads as *const () as usize,
        );
        for &(ap, ars, acs) in &a_views {
            for &(bp, brs, bcs) in &b_views {
                for c_row_major in [true, false] {
                    for accumulate in [false, true] {
                        let (crs, ccs) = if c_row_major {
                            (n as isize, 1)
                        } else {
                            (1, m as isize)
                        };
                        let mut c = vec![1.0f32; m * n];
                        let (a_m, b_m, c_m) = (
                            Mat {
                                ptr: ap.as_ptr(),
                                rs: ars,
                                cs: acs,
                            },
                            Mat {
                                ptr: bp.as_ptr(),
                                rs: brs,
                                cs: bcs,
                            },
                            MatMut {
                                ptr: c.as_mut_ptr(),
                                rs: crs,
                                cs: ccs,
                            },
                        );
                        // SAFETY: every view covers its vector exactly; the reference routine is sound
                        let ran = unsafe {
                            blas_gemm(
                                reference, threads, 1, m, n, k, a_m, b_m, c_m, accumulate, 1.0,
                            )
                        };
                        assert!(ran);
                        for i in 0..m {
                            for j in 0..n {
                                let got = c[i * crs as usize + j * ccs as usize];
                                let expect = want[i * n + j] + if accumulate { 1.0 } else { 0.0 };
                                assert_eq!(
                                    got, expect,
                                    "C[{i},{j}] a=({ars},{acs}) b=({brs},{bcs})"
                                );
                            }
                        }
                    }
                }
            }
        }
        // a broadcast operand is left to the crate
        let zero_stride = Mat {
            ptr: b.as_ptr(),
            rs: 0,
            cs: 1,
        };
        let mut c = vec![0.0f32; m * n];
        let c_m = MatMut {
            ptr: c.as_mut_ptr(),
            rs: n as isize,
            cs: 1,
        };
        let a_m = Mat {
            ptr: a.as_ptr(),
            rs: k as isize,
            cs: 1,
        };
        // SAFETY: as above
        assert!(!unsafe {
            blas_gemm(
                reference,
                threads,
                1,
                m,
                n,
                k,
                a_m,
                zero_stride,
                c_m,
                false,
                1.0,
            )
        });
    }

    /// B laid out in panels (as `b_panel` describes) gives what B read row-major gives, for column
    /// and row splits, a short last panel, and a GEMM too small to split.
    #[test]
    fn paneled_operand_matches_row_major() {
        let cases: [(usize, usize, usize, usize); 4] = [
            (64, 300, 70, 64),
            (300, 40, 90, 16),
            (3, 5, 4, 2),
            (33, 33, 33, 33),
        ];
        for (m, n, k, panel) in cases {
            let a: Vec<f64> = (0..m * k)
                .map(|i| ((i * 7 % 11) as f64 - 5.0) / 3.0)
                .collect();
            let b: Vec<f64> = (0..k * n)
                .map(|i| ((i * 5 % 13) as f64 - 6.0) / 4.0)
                .collect();
            let panels = n.div_ceil(panel);
            let mut paneled = vec![f64::NAN; panels * k * panel];
            for q in 0..panels {
                for r in 0..k {
                    for j in 0..panel.min(n - q * panel) {
                        paneled[(q * k + r) * panel + j] = b[r * n + q * panel + j];
                    }
                }
            }
            let mut want = vec![0.0; m * n];
            gemm_rowmajor(m, n, k, &a, &b, &mut want, false);
            for parallel in [false, true] {
                let mut c = vec![1.0; m * n];
                // SAFETY: the views cover their vectors; C is distinct
                unsafe {
                    gemm_hooked(
                        m,
                        n,
                        k,
                        Mat {
                            ptr: a.as_ptr(),
                            rs: k as isize,
                            cs: 1,
                        },
                        Mat {
                            ptr: paneled.as_ptr(),
                            rs: 0,
                            cs: 0,
                        },
                        MatMut {
                            ptr: c.as_mut_ptr(),
                            rs: n as isize,
                            cs: 1,
                        },
                        false,
                        1.0,
                        parallel,
                        panel,
                        BlockHooks::default(),
                    )
                };
                for (i, (got, want)) in c.iter().zip(&want).enumerate() {
                    assert!(
                        (got - want).abs() < 1e-9 * (1.0 + want.abs()),
                        "{m}x{n}x{k} panel {panel}: C[{i}] {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn transposed_operand_by_strides() {
        let (m, n, k) = (5, 6, 7);
        let a: Vec<f64> = (0..m * k).map(|i| i as f64).collect();
        let bt: Vec<f64> = (0..n * k).map(|i| (i % 5) as f64).collect(); // stored n×k
        let mut c = vec![0.0; m * n];
        unsafe {
            gemm(
                m,
                n,
                k,
                Mat {
                    ptr: a.as_ptr(),
                    rs: k as isize,
                    cs: 1,
                },
                Mat {
                    ptr: bt.as_ptr(),
                    rs: 1,
                    cs: k as isize,
                },
                MatMut {
                    ptr: c.as_mut_ptr(),
                    rs: n as isize,
                    cs: 1,
                },
                false,
                1.0,
                false,
            );
        }
        let b: Vec<f64> = (0..k * n).map(|i| bt[(i % n) * k + i / n]).collect();
        assert_eq!(c, naive(m, n, k, &a, &b));
    }
}
