//! The Python module `torchburn_native._native`: one file per concern, each registering its part.
//!
//! Private to the package: Python code outside `torchburn_native` uses its public modules
//! (`torchburn_native.transformer` for LLM runtimes), which document and type what crosses here.

use pyo3::prelude::*;

mod ggml;
mod program;
mod runtime;
mod transformer;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    program::register(m)?;
    ggml::register(m)?;
    transformer::register(m)?;
    runtime::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
