//! `GgmlMatrix`: a matrix in one of GGUF's tensor types over bytes the caller lends (see
//! `crate::kernels::ggml`), with its dequantization and its product.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::kernels::ggml::{GgmlMatrix as M, GgmlType, WeightBytes};

/// A weight matrix `[n, k]` stored as a GGUF type, read in place.
#[pyclass(frozen, module = "torchburn_native._native")]
pub struct GgmlMatrix {
    /// shared with the decoders built on it
    pub inner: Arc<M>,
}

fn type_named(kind: &str) -> PyResult<GgmlType> {
    GgmlType::from_name(kind).ok_or_else(|| {
        let names: Vec<&str> = GgmlType::ALL.iter().map(|t| t.name()).collect();
        PyValueError::new_err(format!(
            "GGUF type {kind:?} is not computed in as stored; supported: {}",
            names.join(", ")
        ))
    })
}

#[pymethods]
impl GgmlMatrix {
    /// The `nbytes` bytes at `ptr`, `n` rows of `k` elements of `kind`, which `owner` keeps readable
    /// and unchanged for as long as it lives (the matrix holds it); with `order`, row `r` is read
    /// from stored row `order[r]`. `file_mapped`: the bytes are a view of a read-only file mapping,
    /// whose pages are handed back once the weights are regrouped into memory of their own.
    #[staticmethod]
    #[pyo3(signature = (kind, ptr, nbytes, n, k, owner, order=None, file_mapped=false))]
    #[allow(clippy::too_many_arguments)]
    fn lend(
        py: Python<'_>,
        kind: &str,
        ptr: usize,
        nbytes: usize,
        n: usize,
        k: usize,
        owner: Py<PyAny>,
        order: Option<Vec<u32>>,
        file_mapped: bool,
    ) -> PyResult<Self> {
        let kind = type_named(kind)?;
        if ptr == 0 {
            return Err(PyValueError::new_err("the weights' address is null"));
        }
        // SAFETY: the caller lends `nbytes` bytes at `ptr` that `owner` keeps alive and unwritten
        let bytes = unsafe { WeightBytes::lent(ptr as *const u8, nbytes, Box::new(owner)) };
        let mut inner = M::new(kind, n, k, bytes).map_err(PyValueError::new_err)?;
        if let Some(order) = order {
            inner = inner.with_row_order(order).map_err(PyValueError::new_err)?;
        }
        // regrouping copies the weights: the caller's lock is let go meanwhile
        let inner = py.detach(move || {
            if file_mapped {
                // SAFETY: the caller says the bytes are a read-only file mapping's
                unsafe { inner.interleaved_from_file() }
            } else {
                inner.interleaved_for_this_cpu()
            }
        });
        Ok(GgmlMatrix {
            inner: Arc::new(inner),
        })
    }

    /// Block and byte sizes of a type: (elements per block, bytes per block).
    #[staticmethod]
    fn block_size(kind: &str) -> PyResult<(usize, usize)> {
        let t = type_named(kind)?;
        Ok((t.block_len(), t.block_bytes()))
    }

    #[getter]
    fn shape(&self) -> (usize, usize) {
        (self.inner.n, self.inner.k)
    }

    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind.name()
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    /// Whether the weights were regrouped sixteen rows to a register for this CPU's kernels (Q4_0,
    /// Q4_1 from AVX2 up, Q8_0 with AVX-512).
    #[getter]
    fn regrouped(&self) -> bool {
        self.inner.is_interleaved()
    }

    /// Whether prompts (8 tokens or more) multiply these weights in integers at the running level,
    /// with the tokens quantized to int8 per block of 32 (the K-quants; IQ4_NL and IQ4_XS with
    /// AVX-512 VNNI); else they take the tokens as f32.
    #[getter]
    fn integer_prompts(&self) -> bool {
        crate::kernels::ggml::kprefill::takes(self.inner.kind)
    }

    /// Rows `start..start + count` as f32 into the `count · k` floats at `out`.
    fn dequantize_into(
        &self,
        py: Python<'_>,
        start: usize,
        count: usize,
        out: usize,
    ) -> PyResult<()> {
        let m = &self.inner;
        if out == 0 || start.checked_add(count).is_none_or(|end| end > m.n) {
            return Err(PyValueError::new_err(format!(
                "rows {start}..{start}+{count} of a {}-row matrix into address {out:#x}",
                m.n
            )));
        }
        py.detach(|| {
            // SAFETY: the caller passes a live contiguous f32 buffer of count·k elements
            let out = unsafe { std::slice::from_raw_parts_mut(out as *mut f32, count * m.k) };
            m.dequantize_rows(start..start + count, out)
        });
        Ok(())
    }

    /// `out[t, :] = W @ x[t, :]` for the `tokens` rows of `k` floats at `x`, into `tokens · n` at `out`.
    fn matmul_into(&self, py: Python<'_>, x: usize, tokens: usize, out: usize) -> PyResult<()> {
        let m = &self.inner;
        if x == 0 || out == 0 || tokens == 0 {
            return Err(PyValueError::new_err(
                "matmul needs non-null buffers and at least one row",
            ));
        }
        py.detach(|| {
            // SAFETY: the caller passes live contiguous f32 buffers of tokens·k and tokens·n elements
            let (x, out) = unsafe {
                (
                    std::slice::from_raw_parts(x as *const f32, tokens * m.k),
                    std::slice::from_raw_parts_mut(out as *mut f32, tokens * m.n),
                )
            };
            m.matmul(x, tokens, out)
        });
        Ok(())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GgmlMatrix>()
}
