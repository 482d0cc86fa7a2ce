//! Matrix multiply on the `gemm` crate (packed, cache-blocked, runtime-dispatched AVX2/AVX-512/NEON
//! micro-kernels), with strides in elements so transposed and sliced operands need no copy.

use std::ops::Range;

use gemm::Parallelism;

/// Below this many multiply-adds a GEMM runs on the calling thread: waking the pool costs more.
const PARALLEL_MIN_FLOPS: usize = 96 * 96 * 96;

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

pub trait GemmScalar: Copy + Send + Sync + std::ops::Mul<Output = Self> + 'static {
    const ZERO: Self;
    const ONE: Self;
}

impl GemmScalar for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}

impl GemmScalar for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
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
        BlockHooks::default(),
    )
}

/// [`gemm`] with `hooks` run around the product of every block of C.
///
/// # Safety
/// As [`gemm`]; the hooks may touch only the block of C they are given.
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
    if allow_parallel && threads > 1 && m.saturating_mul(n).saturating_mul(k) >= PARALLEL_MIN_FLOPS
    {
        // one block of the larger output side per thread; each packs the shared operand itself,
        // which is cheap next to the multiply and needs no handoff between threads
        let split_rows = m >= n;
        let side = if split_rows { m } else { n };
        let per = side.div_ceil(threads).next_multiple_of(16).min(side);
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
                    gemm_serial(len, n, k, a, b, cb, accumulate, alpha)
                })
            } else {
                let b = Mat {
                    ptr: b.ptr.offset(lo * b.cs),
                    ..b
                };
                let cb = MatMut {
                    ptr: c.ptr.offset(lo * c.cs),
                    ..c
                };
                let cols = lo as usize..lo as usize + len;
                block(0..m, cols, &|| {
                    gemm_serial(m, len, k, a, b, cb, accumulate, alpha)
                })
            }
        });
        return;
    }
    block(0..m, 0..n, &|| {
        gemm_serial(m, n, k, a, b, c, accumulate, alpha)
    })
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
    // gemm's convention: dst = alpha·dst + beta·lhs·rhs
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
