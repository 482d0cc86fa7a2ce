//! The Python module `torchburn_native._native`.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::program::Program as Inner;

static RUNS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Pointers of this thread's last run, for tests that prove no copy crossed the boundary.
    static LAST_CALL: RefCell<(Vec<usize>, Vec<usize>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

fn to_py_err(msg: String) -> PyErr {
    if msg.contains("out of bounds") {
        PyIndexError::new_err(msg)
    } else {
        PyRuntimeError::new_err(msg)
    }
}

/// A compiled region. `run` takes data pointers (storage offsets applied) of the region's inputs and of
/// output tensors the caller allocated, and releases the GIL while the kernels run.
#[pyclass(frozen, module = "torchburn_native._native")]
struct Program {
    inner: Inner,
}

#[pymethods]
impl Program {
    #[new]
    fn new(plan_json: &str, in_bytes: Vec<usize>, out_bytes: Vec<usize>) -> PyResult<Self> {
        Inner::new(plan_json, in_bytes, out_bytes)
            .map(|inner| Program { inner })
            .map_err(PyValueError::new_err)
    }

    fn run(&self, py: Python<'_>, inputs: Vec<usize>, outputs: Vec<usize>) -> PyResult<()> {
        self.run_ptrs(py, inputs, outputs)
    }

    #[getter]
    fn n_inputs(&self) -> usize {
        self.inner.n_inputs()
    }

    fn set_profiling(&self, on: bool) {
        self.inner.set_profiling(on)
    }

    fn profile(&self) -> Vec<(u64, u64)> {
        self.inner.profile()
    }

    #[getter]
    fn n_outputs(&self) -> usize {
        self.inner.n_outputs()
    }
}

impl Program {
    fn run_ptrs(&self, py: Python<'_>, inputs: Vec<usize>, outputs: Vec<usize>) -> PyResult<()> {
        RUNS.fetch_add(1, Ordering::Relaxed);
        LAST_CALL.with(|c| {
            let mut c = c.borrow_mut();
            c.0.clone_from(&inputs);
            c.1.clone_from(&outputs);
        });
        // SAFETY: the Python side passes pointers of live tensors whose sizes it checked against the
        // plan's input signature, and output tensors it just allocated with the planned sizes.
        py.detach(|| unsafe { self.inner.run(&inputs, &outputs) })
            .map_err(to_py_err)
    }
}

/// `(size, stride, dtype)` of a tensor, as Python objects ready to pass to torch's C++ helpers.
type Layout = (Py<PyAny>, Py<PyAny>, Py<PyAny>);

/// The per-call path of a region planned for one all-tensor signature, in one foreign call: each
/// argument's dtype (by identity) and size and stride (torch's own `assert_size_stride`) are checked
/// against the plan's, outputs are allocated with the planned layouts, and the program runs. Returns
/// None, having run nothing, when an argument does not match: the caller then plans for it.
#[pyclass(frozen, module = "torchburn_native._native")]
struct FastCall {
    program: Py<Program>,
    args: Vec<Layout>,
    outs: Vec<Layout>,
    /// data pointers appended after the arguments' (the graph's constant tensors)
    extra: Vec<usize>,
    /// what owns the memory `extra` points into
    _keep: Py<PyAny>,
    assert_size_stride: Py<PyAny>,
    empty_strided: Py<PyAny>,
}

#[pymethods]
impl FastCall {
    #[new]
    fn new(
        program: Py<Program>,
        args: Vec<Layout>,
        outs: Vec<Layout>,
        extra: Vec<usize>,
        keep: Py<PyAny>,
        assert_size_stride: Py<PyAny>,
        empty_strided: Py<PyAny>,
    ) -> Self {
        FastCall {
            program,
            args,
            outs,
            extra,
            _keep: keep,
            assert_size_stride,
            empty_strided,
        }
    }

    #[pyo3(signature = (*args))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        if args.len() != self.args.len() {
            return Ok(None);
        }
        let check = self.assert_size_stride.bind(py);
        let mut ins = Vec::with_capacity(self.args.len() + self.extra.len());
        for (a, (size, stride, dtype)) in args.iter().zip(&self.args) {
            match a.getattr(intern!(py, "dtype")) {
                Ok(d) if d.is(dtype.bind(py)) => {}
                _ => return Ok(None),
            }
            if check.call1((&a, size.bind(py), stride.bind(py))).is_err() {
                return Ok(None);
            }
            ins.push(
                a.call_method0(intern!(py, "data_ptr"))?
                    .extract::<usize>()?,
            );
        }
        ins.extend_from_slice(&self.extra);
        let empty = self.empty_strided.bind(py);
        let mut outs = Vec::with_capacity(self.outs.len());
        let mut out_ptrs = Vec::with_capacity(self.outs.len());
        for (size, stride, dtype) in &self.outs {
            let t = empty.call1((size.bind(py), stride.bind(py), dtype.bind(py)))?;
            out_ptrs.push(
                t.call_method0(intern!(py, "data_ptr"))?
                    .extract::<usize>()?,
            );
            outs.push(t);
        }
        self.program.get().run_ptrs(py, ins, out_ptrs)?;
        Ok(Some(PyTuple::new(py, outs)?))
    }
}

/// A weight matrix `[n, k]` quantized for the LLM runtime (see `kernels::quant`).
#[pyclass(frozen, module = "torchburn_native._native")]
struct QMatrix {
    /// shared with the decoders built on it
    inner: std::sync::Arc<crate::kernels::quant::QMatrix>,
}

#[pymethods]
impl QMatrix {
    /// Quantizes the contiguous f32 matrix at `ptr` (`n·k` values): `kind` is "int8" (per row) or
    /// "int8-blocks" (blocks of 32 with a scale each), "int4" (blocks of 32 with scale and offset) or
    /// "bf16".
    #[staticmethod]
    fn quantize(py: Python<'_>, ptr: usize, n: usize, k: usize, kind: &str) -> PyResult<Self> {
        use crate::kernels::quant::{QMatrix as Q, BLOCK};
        if ptr == 0 || n == 0 || k == 0 {
            return Err(PyValueError::new_err("quantize needs a non-empty matrix"));
        }
        if !k.is_multiple_of(BLOCK) {
            return Err(PyValueError::new_err(format!(
                "quantized weights need rows whose length is a multiple of {BLOCK}, got {k}"
            )));
        }
        // SAFETY: the caller passes a live contiguous f32 tensor of n·k elements
        let w = unsafe { std::slice::from_raw_parts(ptr as *const f32, n * k) };
        let inner = match kind {
            "int8" => py.detach(|| Q::quantize_q8(w, n, k)),
            "int8-blocks" => py.detach(|| Q::quantize_q8_blocks(w, n, k)),
            "int4" => py.detach(|| Q::quantize_q4(w, n, k)),
            "bf16" => py.detach(|| Q::quantize_bf16(w, n, k)),
            other => {
                return Err(PyValueError::new_err(format!(
                    "quantization kind {other:?} is not one of \"int8\", \"int8-blocks\", \"int4\", \"bf16\""
                )))
            }
        };
        Ok(QMatrix {
            inner: std::sync::Arc::new(inner),
        })
    }

    /// Int4 weights `[n, k]` from GGUF Q4_1 blocks at `ptr` (`n · k / 32` blocks of 20 bytes, row
    /// after row), kept as they are.
    #[staticmethod]
    fn from_q4_1(py: Python<'_>, ptr: usize, n: usize, k: usize) -> PyResult<Self> {
        use crate::kernels::quant::{QMatrix as Q, BLOCK};
        if ptr == 0 || n == 0 || k == 0 || !k.is_multiple_of(BLOCK) {
            return Err(PyValueError::new_err(format!(
                "Q4_1 weights need a non-empty matrix with rows of a multiple of {BLOCK}, got {n}x{k}"
            )));
        }
        let len = n * k / BLOCK * Q::Q4_1_BLOCK_BYTES;
        // SAFETY: the caller passes a live contiguous buffer of that many bytes
        let raw = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
        let inner = py.detach(|| Q::from_q4_1(raw, n, k));
        Ok(QMatrix {
            inner: std::sync::Arc::new(inner),
        })
    }

    #[getter]
    fn shape(&self) -> (usize, usize) {
        (self.inner.n, self.inner.k)
    }

    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner.w {
            crate::kernels::quant::QWeights::Q8 { .. } => "int8",
            crate::kernels::quant::QWeights::Q8B { .. } => "int8-blocks",
            crate::kernels::quant::QWeights::Q4 { .. } => "int4",
            crate::kernels::quant::QWeights::BF16 { .. } => "bf16",
        }
    }

    /// Bytes the quantized weights take.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }
}

/// The caller's buffers of one decoder call, as addresses (which may cross into `py.detach`).
#[derive(Clone, Copy)]
struct IoAddresses {
    keys: usize,
    values: usize,
    capacity: usize,
    cos: usize,
    sin: usize,
    logits: usize,
}

impl IoAddresses {
    fn new(
        keys: usize,
        values: usize,
        capacity: usize,
        cos: usize,
        sin: usize,
        logits: usize,
    ) -> PyResult<Self> {
        if [keys, values, cos, sin, logits].contains(&0) {
            return Err(PyValueError::new_err(
                "the KV cache, rotary table and logits buffers must be non-null",
            ));
        }
        Ok(IoAddresses {
            keys,
            values,
            capacity,
            cos,
            sin,
            logits,
        })
    }

    fn get(self) -> crate::decoder::CacheIo {
        crate::decoder::CacheIo {
            keys: self.keys as *mut f32,
            values: self.values as *mut f32,
            capacity: self.capacity,
            cos: self.cos as *const f32,
            sin: self.sin as *const f32,
            logits: self.logits as *mut f32,
        }
    }
}

/// A projection of the decoder from Python: `(weight, bias address or 0)`, the weight a [`QMatrix`]
/// or `(address, n, k)` of a row-major f32 matrix.
fn projection(obj: &Bound<'_, PyAny>) -> PyResult<crate::decoder::Projection> {
    use crate::decoder::{Projection, Weight};
    let (w, bias): (Bound<'_, PyAny>, usize) = obj.extract()?;
    let w = if let Ok(q) = w.extract::<Py<QMatrix>>() {
        Weight::Quant(q.get().inner.clone())
    } else {
        let (ptr, n, k): (usize, usize, usize) = w.extract()?;
        if ptr == 0 {
            return Err(PyValueError::new_err(
                "a projection's weight address is null",
            ));
        }
        Weight::F32 { ptr, n, k }
    };
    Ok(Projection {
        w,
        bias: (bias != 0).then_some(bias),
    })
}

/// The decode step of a Llama-family model (see `decoder.rs`): one call per generated token.
///
/// It holds the addresses of f32 tensors (embedding, norms, f32 weights, biases): the Python object
/// that builds it keeps those tensors alive and unchanged for as long as it exists.
#[pyclass(frozen, module = "torchburn_native._native")]
struct Decoder {
    inner: crate::decoder::Decoder,
}

#[pymethods]
impl Decoder {
    /// `dims`: (hidden, heads, kv_heads, head_dim, vocab, eps, sliding window or None); `layers`:
    /// tuples (ln_attn, ln_mlp, q_norm or 0, k_norm or 0, q, k, v, o, gate, up, down) of addresses
    /// and projections.
    #[new]
    #[allow(clippy::type_complexity)]
    fn new(
        dims: (usize, usize, usize, usize, usize, f32, Option<usize>),
        embed: usize,
        norm: usize,
        head: &Bound<'_, PyAny>,
        layers: Vec<Bound<'_, PyTuple>>,
    ) -> PyResult<Self> {
        let (hidden, heads, kv_heads, head_dim, vocab, eps, window) = dims;
        let nonzero = |a: usize, what: &str| {
            if a == 0 {
                Err(PyValueError::new_err(format!("the {what} address is null")))
            } else {
                Ok(a)
            }
        };
        let mut parsed = Vec::with_capacity(layers.len());
        for l in &layers {
            if l.len() != 11 {
                return Err(PyValueError::new_err(format!(
                    "a decoder layer is 11 entries, got {}",
                    l.len()
                )));
            }
            let addr = |i: usize| -> PyResult<usize> { l.get_item(i)?.extract() };
            let proj = |i: usize| projection(&l.get_item(i)?);
            parsed.push(crate::decoder::Layer {
                ln_attn: nonzero(addr(0)?, "input norm")?,
                ln_mlp: nonzero(addr(1)?, "MLP norm")?,
                q_norm: Some(addr(2)?).filter(|&a| a != 0),
                k_norm: Some(addr(3)?).filter(|&a| a != 0),
                q: proj(4)?,
                k: proj(5)?,
                v: proj(6)?,
                o: proj(7)?,
                gate: proj(8)?,
                up: proj(9)?,
                down: proj(10)?,
            });
        }
        let inner = crate::decoder::Decoder {
            dims: crate::decoder::Dims {
                hidden,
                heads,
                kv_heads,
                head_dim,
                vocab,
                eps,
                window,
            },
            embed: nonzero(embed, "embedding")?,
            norm: nonzero(norm, "final norm")?,
            head: projection(head)?,
            layers: parsed,
        };
        inner.validate().map_err(PyValueError::new_err)?;
        Ok(Decoder { inner })
    }

    /// Runs `token` at position `pos`: its keys and values go to the caches (f32
    /// `[layers, kv_heads, capacity, head_dim]` at `keys` / `values`), its logits (`vocab` f32) to
    /// `logits`; `cos` / `sin` hold the position's rotary tables (`head_dim` f32 each).
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        py: Python<'_>,
        token: usize,
        pos: usize,
        keys: usize,
        values: usize,
        capacity: usize,
        cos: usize,
        sin: usize,
        logits: usize,
    ) -> PyResult<()> {
        let d = self.inner.dims;
        if token >= d.vocab {
            return Err(PyIndexError::new_err(format!(
                "token id {token} is out of bounds for a vocabulary of {}",
                d.vocab
            )));
        }
        if pos >= capacity {
            return Err(PyIndexError::new_err(format!(
                "position {pos} is out of bounds for a KV cache of {capacity} positions"
            )));
        }
        let io = IoAddresses::new(keys, values, capacity, cos, sin, logits)?;
        // SAFETY: the caller passes live buffers of the documented sizes; the weights' owner keeps
        // them alive (see the class docs)
        py.detach(move || unsafe { self.inner.step(token, pos, &io.get()) });
        Ok(())
    }

    /// Runs the prompt `tokens` at positions `start..start + T`: their keys and values go to the caches
    /// (as in [`Decoder::step`]), `cos` / `sin` hold the positions' rotary tables (`[T, head_dim]`
    /// f32 each), and `logits` receives the last token's logits (`vocab` f32), or every token's
    /// (`[T, vocab]`) with `all_logits`.
    #[allow(clippy::too_many_arguments)]
    fn prefill(
        &self,
        py: Python<'_>,
        tokens: Vec<usize>,
        start: usize,
        keys: usize,
        values: usize,
        capacity: usize,
        cos: usize,
        sin: usize,
        logits: usize,
        all_logits: bool,
    ) -> PyResult<()> {
        let d = self.inner.dims;
        if let Some(bad) = tokens.iter().find(|&&t| t >= d.vocab) {
            return Err(PyIndexError::new_err(format!(
                "token id {bad} is out of bounds for a vocabulary of {}",
                d.vocab
            )));
        }
        if start.saturating_add(tokens.len()) > capacity {
            return Err(PyIndexError::new_err(format!(
                "positions {start}..{} do not fit a KV cache of {capacity} positions",
                start.saturating_add(tokens.len())
            )));
        }
        let io = IoAddresses::new(keys, values, capacity, cos, sin, logits)?;
        // SAFETY: as in `step`
        py.detach(move || unsafe { self.inner.prefill(&tokens, start, &io.get(), all_logits) });
        Ok(())
    }

    #[getter]
    fn num_layers(&self) -> usize {
        self.inner.layers.len()
    }
}

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
    crate::isa()
}

/// Make GELU(+inf) NaN (true) or +inf (false), as the process's eager kernel gives it.
#[pyfunction]
fn set_gelu_positive_infinity_nan(nan: bool) {
    crate::kernels::math::set_gelu_positive_infinity_nan(nan)
}

#[pyfunction]
fn debug_last_call(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    LAST_CALL.with(|c| -> PyResult<()> {
        let c = c.borrow();
        d.set_item("inputs", c.0.clone())?;
        d.set_item("outputs", c.1.clone())?;
        Ok(())
    })?;
    Ok(d)
}

/// `outs[i][rows, n_i] = x[rows, k] @ W_i.T` for matrices of one width `k`: the tokens are read once
/// for all of them (q, k and v of a prompt; gate and up).
#[pyfunction]
fn matmul_many(
    py: Python<'_>,
    mats: Vec<PyRef<'_, QMatrix>>,
    x: usize,
    rows: usize,
    outs: Vec<usize>,
) -> PyResult<()> {
    if mats.len() != outs.len() {
        return Err(PyValueError::new_err(format!(
            "matmul_many got {} matrices and {} outputs",
            mats.len(),
            outs.len()
        )));
    }
    if x == 0 || outs.contains(&0) {
        return Err(PyValueError::new_err("matmul_many needs non-null buffers"));
    }
    let inner: Vec<std::sync::Arc<crate::kernels::quant::QMatrix>> =
        mats.iter().map(|m| m.inner.clone()).collect();
    let k = inner.first().map_or(0, |m| m.k);
    if let Some(m) = inner.iter().find(|m| m.k != k) {
        return Err(PyValueError::new_err(format!(
            "matmul_many needs matrices of one width, got {k} and {}",
            m.k
        )));
    }
    py.detach(move || {
        // SAFETY: the caller passes live contiguous f32 tensors of rows·k and rows·n_i elements
        let xs = unsafe { std::slice::from_raw_parts(x as *const f32, rows * k) };
        let mut os: Vec<&mut [f32]> = inner
            .iter()
            .zip(&outs)
            .map(|(m, &o)| unsafe { std::slice::from_raw_parts_mut(o as *mut f32, rows * m.n) })
            .collect();
        let refs: Vec<&crate::kernels::quant::QMatrix> = inner.iter().map(|m| &**m).collect();
        crate::kernels::qprefill::matmul_many(&refs, xs, rows, &mut os)
    });
    Ok(())
}

#[pyfunction]
fn debug_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("runs", RUNS.load(Ordering::Relaxed))?;
    Ok(d)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Program>()?;
    m.add_class::<FastCall>()?;
    m.add_class::<QMatrix>()?;
    m.add_class::<Decoder>()?;
    m.add_function(wrap_pyfunction!(matmul_many, m)?)?;
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
    m.add_function(wrap_pyfunction!(set_gelu_positive_infinity_nan, m)?)?;
    m.add_function(wrap_pyfunction!(debug_last_call, m)?)?;
    m.add_function(wrap_pyfunction!(debug_stats, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
