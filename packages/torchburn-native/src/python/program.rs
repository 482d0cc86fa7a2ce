//! `Program` and `FastCall`: a compiled region's foreign calls, and the counters tests read.

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

#[pyfunction]
fn debug_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("runs", RUNS.load(Ordering::Relaxed))?;
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Program>()?;
    m.add_class::<FastCall>()?;
    m.add_function(wrap_pyfunction!(debug_last_call, m)?)?;
    m.add_function(wrap_pyfunction!(debug_stats, m)?)?;
    Ok(())
}
