//! Process-wide engine state: the worker threads, the host BLAS, the CPU's ISA, eager's special values.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Sizes the worker pool; only the first call takes effect.
#[pyfunction]
fn init_threads(n: usize) -> usize {
    crate::threads::init(n)
}

/// Runs parallel kernels on the process's OpenMP team (PyTorch's); `addr` is `GOMP_parallel`'s address.
#[pyfunction]
fn share_openmp(addr: usize) -> PyResult<()> {
    if addr == 0 {
        return Err(PyValueError::new_err(
            "GOMP_parallel address must not be null",
        ));
    }
    // SAFETY: the Python side resolves the symbol in a libgomp mapped into this process for good
    unsafe { crate::threads::share_openmp(addr) };
    Ok(())
}

/// Runs GEMM block products on the host's MKL; the addresses of `sgemm_`, `dgemm_` and
/// `MKL_Set_Num_Threads_Local` (0 for one that is missing leaves its type on the `gemm` crate).
#[pyfunction]
fn share_host_blas(sgemm: usize, dgemm: usize, set_local_threads: usize) -> PyResult<()> {
    if set_local_threads == 0 && (sgemm != 0 || dgemm != 0) {
        return Err(PyValueError::new_err(
            "MKL_Set_Num_Threads_Local is needed to keep the host BLAS on one thread per block",
        ));
    }
    // SAFETY: the Python side resolves these symbols in PyTorch's own MKL, mapped for good
    unsafe { crate::kernels::gemm::share_host_blas(sgemm, dgemm, set_local_threads) };
    Ok(())
}

/// Lets f32 products read B packed once per version of B; the addresses of MKL's
/// `cblas_sgemm_pack_get_size`, `cblas_sgemm_pack` and `cblas_sgemm_compute` (any 0: not available).
#[pyfunction]
fn share_host_packing(get_size: usize, pack: usize, compute: usize) {
    // SAFETY: the Python side resolves these symbols in PyTorch's own MKL, mapped for good
    unsafe { crate::kernels::gemm_packed::share_host_packing(get_size, pack, compute) };
}

/// Bytes of a `k × n` f32 B with strides `(rs, cs)` packed for products with `m` rows of A (0:
/// packing unavailable, or a layout CBLAS cannot read).
#[pyfunction]
fn packed_b_bytes(m: usize, n: usize, k: usize, rs: isize, cs: isize) -> usize {
    crate::kernels::gemm_packed::packed_b_bytes(m, n, k, rs, cs)
}

/// Packs the f32 `k × n` matrix at `src` (element `(r, c)` at `src + (r·rs + c·cs)` elements) for
/// products with `m` rows of A into the `dest_bytes` bytes at `dest`.
///
/// Raw addresses, as `Program.run` takes them: the caller passes live CPU tensors' data pointers.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn pack_gemm_b(
    py: Python<'_>,
    m: usize,
    n: usize,
    k: usize,
    src: usize,
    rs: isize,
    cs: isize,
    dest: usize,
    dest_bytes: usize,
) -> PyResult<()> {
    if src == 0 || dest == 0 || !dest.is_multiple_of(std::mem::align_of::<f32>()) {
        return Err(PyValueError::new_err(
            "pack_gemm_b needs non-null source and destination, the destination aligned for f32",
        ));
    }
    // SAFETY: the caller passes tensors valid for these extents (see above); MKL only reads the
    // source and writes at most `dest_bytes`, which `pack_b` checks against the packed size
    let packed = py.detach(|| unsafe {
        let b = crate::kernels::gemm::Mat {
            ptr: src as *const f32,
            rs,
            cs,
        };
        crate::kernels::gemm_packed::pack_b(m, n, k, b, dest as *mut f32, dest_bytes)
    });
    if !packed {
        return Err(PyValueError::new_err(format!(
            "cannot pack a {k}x{n} f32 matrix with strides ({rs}, {cs}) for {m} rows into {dest_bytes} \
             bytes: MKL's packing must be available, one stride must be 1 and the destination must \
             hold packed_b_bytes(m, n, k, rs, cs) = {} bytes",
            crate::kernels::gemm_packed::packed_b_bytes(m, n, k, rs, cs)
        )));
    }
    Ok(())
}

/// Which library computes GEMM block products: "mkl" or "gemm-crate".
#[pyfunction]
fn gemm_backend() -> &'static str {
    crate::kernels::gemm::backend()
}

#[pyfunction]
fn thread_pool() -> &'static str {
    crate::threads::pool_kind()
}

#[pyfunction]
fn num_threads() -> usize {
    crate::threads::current()
}

#[pyfunction]
fn isa() -> &'static str {
    crate::isa::name()
}

/// How the running ISA level was chosen: `level`, `detected` (the CPU's best), `supported` (every
/// level this CPU runs, lowest first), `requested` (`TORCHBURN_ISA` or None) and `ignored` (why the
/// request was not followed, or None).
#[pyfunction]
fn isa_status(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let status = crate::isa::status();
    let out = pyo3::types::PyDict::new(py);
    out.set_item("level", status.level.name())?;
    out.set_item("detected", status.detected.name())?;
    let supported: Vec<&str> = crate::isa::supported().iter().map(|l| l.name()).collect();
    out.set_item("supported", supported)?;
    out.set_item("requested", status.requested)?;
    out.set_item("ignored", status.ignored)?;
    Ok(out)
}

/// Make GELU(+inf) NaN (true) or +inf (false), as the process's eager kernel gives it.
#[pyfunction]
fn set_gelu_positive_infinity_nan(nan: bool) {
    crate::kernels::math::set_gelu_positive_infinity_nan(nan)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(init_threads, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(share_openmp, m)?)?;
    m.add_function(wrap_pyfunction!(thread_pool, m)?)?;
    m.add_function(wrap_pyfunction!(share_host_blas, m)?)?;
    m.add_function(wrap_pyfunction!(gemm_backend, m)?)?;
    m.add_function(wrap_pyfunction!(share_host_packing, m)?)?;
    m.add_function(wrap_pyfunction!(packed_b_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(pack_gemm_b, m)?)?;
    m.add_function(wrap_pyfunction!(isa, m)?)?;
    m.add_function(wrap_pyfunction!(isa_status, m)?)?;
    m.add_function(wrap_pyfunction!(set_gelu_positive_infinity_nan, m)?)?;
    Ok(())
}
