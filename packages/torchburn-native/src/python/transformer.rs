//! `QMatrix`, `Decoder` and `matmul_many`: the transformer API (`crate::transformer`) for LLM
//! runtimes, taking the caller's tensors as addresses.

use std::sync::Arc;

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::ggml::GgmlMatrix;
use crate::kernels::quant::{QMatrix as Q, QWeights, BLOCK};
use crate::transformer;

/// A weight matrix `[n, k]` quantized for the LLM runtime (see `kernels::quant`).
#[pyclass(frozen, module = "torchburn_native._native")]
struct QMatrix {
    /// shared with the decoders built on it
    inner: Arc<Q>,
}

#[pymethods]
impl QMatrix {
    /// Quantizes the contiguous f32 matrix at `ptr` (`n·k` values): `kind` is "int8" (per row) or
    /// "int8-blocks" (blocks of 32 with a scale each), "int4" (blocks of 32 with scale and offset) or
    /// "bf16".
    #[staticmethod]
    fn quantize(py: Python<'_>, ptr: usize, n: usize, k: usize, kind: &str) -> PyResult<Self> {
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
            inner: Arc::new(inner),
        })
    }

    /// Int4 weights `[n, k]` from GGUF Q4_1 blocks at `ptr` (`n · k / 32` blocks of 20 bytes, row
    /// after row), kept as they are.
    #[staticmethod]
    fn from_q4_1(py: Python<'_>, ptr: usize, n: usize, k: usize) -> PyResult<Self> {
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
            inner: Arc::new(inner),
        })
    }

    #[getter]
    fn shape(&self) -> (usize, usize) {
        (self.inner.n, self.inner.k)
    }

    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner.w {
            QWeights::Q8 { .. } => "int8",
            QWeights::Q8B { .. } => "int8-blocks",
            QWeights::Q4 { .. } => "int4",
            QWeights::BF16 { .. } => "bf16",
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
    cos: [usize; 2],
    sin: [usize; 2],
    logits: usize,
}

impl IoAddresses {
    /// `tables`: the main rotary table's cos and sin, then the windowed layers' (0, 0: the main one).
    fn new(
        keys: usize,
        values: usize,
        capacity: usize,
        tables: [usize; 4],
        logits: usize,
    ) -> PyResult<Self> {
        let [cos, sin, local_cos, local_sin] = tables;
        if [keys, values, cos, sin, logits].contains(&0) {
            return Err(PyValueError::new_err(
                "the KV cache, rotary table and logits buffers must be non-null",
            ));
        }
        if (local_cos == 0) != (local_sin == 0) {
            return Err(PyValueError::new_err(
                "the second rotary table needs both its cos and its sin",
            ));
        }
        let (local_cos, local_sin) = if local_cos == 0 {
            (cos, sin)
        } else {
            (local_cos, local_sin)
        };
        Ok(IoAddresses {
            keys,
            values,
            capacity,
            cos: [cos, local_cos],
            sin: [sin, local_sin],
            logits,
        })
    }

    fn get(self) -> transformer::CacheIo {
        transformer::CacheIo {
            keys: self.keys as *mut f32,
            values: self.values as *mut f32,
            capacity: self.capacity,
            cos: self.cos.map(|a| a as *const f32),
            sin: self.sin.map(|a| a as *const f32),
            logits: self.logits as *mut f32,
        }
    }
}

/// The model-wide switches after the sizes: rotary width, attention scale, attention and final logit
/// caps, embedding scale, activation name.
type Switches = (usize, f32, Option<f32>, Option<f32>, f32, String);

/// A projection of the decoder from Python: `(weight, bias address or 0)`, the weight a [`QMatrix`]
/// or `(address, n, k)` of a row-major f32 matrix.
fn projection(obj: &Bound<'_, PyAny>) -> PyResult<transformer::Projection> {
    use crate::transformer::{Projection, Weight};
    let (w, bias): (Bound<'_, PyAny>, usize) = obj.extract()?;
    let w = if let Ok(q) = w.extract::<Py<QMatrix>>() {
        Weight::Quant(q.get().inner.clone())
    } else if let Ok(m) = w.extract::<Py<GgmlMatrix>>() {
        Weight::Ggml(m.get().inner.clone())
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

/// A decoder-only transformer stack (see `crate::transformer`): one call per generated token
/// (`step`) or per prompt (`prefill`).
///
/// It holds the addresses of f32 tensors (embedding, norms, f32 weights, biases): the Python object
/// that builds it keeps those tensors alive and unchanged for as long as it exists.
#[pyclass(frozen, module = "torchburn_native._native")]
struct Decoder {
    inner: transformer::Decoder,
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
        switches: Switches,
        embed: &Bound<'_, PyAny>,
        norm: usize,
        head: &Bound<'_, PyAny>,
        layers: Vec<Bound<'_, PyTuple>>,
    ) -> PyResult<Self> {
        let (hidden, heads, kv_heads, head_dim, vocab, eps, window) = dims;
        let (rotary_dim, attn_scale, attn_softcap, final_softcap, embed_scale, activation) =
            switches;
        let activation = match activation.as_str() {
            "silu" => transformer::Activation::Silu,
            "gelu_tanh" => transformer::Activation::GeluTanh,
            other => {
                return Err(PyValueError::new_err(format!(
                    "activation {other:?} is not one of \"silu\", \"gelu_tanh\""
                )))
            }
        };
        let nonzero = |a: usize, what: &str| {
            if a == 0 {
                Err(PyValueError::new_err(format!("the {what} address is null")))
            } else {
                Ok(a)
            }
        };
        let mut parsed = Vec::with_capacity(layers.len());
        for l in &layers {
            if l.len() != 15 {
                return Err(PyValueError::new_err(format!(
                    "a decoder layer is 15 entries, got {}",
                    l.len()
                )));
            }
            let addr = |i: usize| -> PyResult<usize> { l.get_item(i)?.extract() };
            let proj = |i: usize| projection(&l.get_item(i)?);
            parsed.push(transformer::Layer {
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
                post_attn_norm: Some(addr(11)?).filter(|&a| a != 0),
                post_mlp_norm: Some(addr(12)?).filter(|&a| a != 0),
                windowed: l.get_item(13)?.extract()?,
                rope: addr(14)?,
            });
        }
        let inner = transformer::Decoder {
            dims: transformer::Dims {
                hidden,
                heads,
                kv_heads,
                head_dim,
                vocab,
                eps,
                window,
                rotary_dim,
                attn_scale,
                attn_softcap,
                final_softcap,
                embed_scale,
                activation,
            },
            embed: match embed.extract::<Py<GgmlMatrix>>() {
                Ok(m) => transformer::Embedding::Ggml(m.get().inner.clone()),
                Err(_) => transformer::Embedding::F32(nonzero(embed.extract()?, "embedding")?),
            },
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
    #[pyo3(signature = (token, pos, keys, values, capacity, cos, sin, logits, local_cos=0, local_sin=0))]
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
        local_cos: usize,
        local_sin: usize,
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
        let io = IoAddresses::new(
            keys,
            values,
            capacity,
            [cos, sin, local_cos, local_sin],
            logits,
        )?;
        // SAFETY: the caller passes live buffers of the documented sizes; the weights' owner keeps
        // them alive (see the class docs)
        py.detach(move || unsafe { self.inner.step(token, pos, &io.get()) });
        Ok(())
    }

    /// Runs one token of each of several sequences: `tokens[b]` at position `positions[b]` of
    /// sequence `b`, whose KV cache is at `keys[b]` / `values[b]` (`capacities[b]` positions, laid out
    /// as in [`Decoder::step`]). `cos` / `sin` (and `local_cos` / `local_sin`) hold `[B, rotary_dim]`
    /// f32, row `b` for sequence `b`'s position, and `logits` receives `[B, vocab]` f32. Every
    /// sequence needs a cache of its own.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (tokens, positions, keys, values, capacities, cos, sin, logits, local_cos=0, local_sin=0))]
    fn step_batch(
        &self,
        py: Python<'_>,
        tokens: Vec<usize>,
        positions: Vec<usize>,
        keys: Vec<usize>,
        values: Vec<usize>,
        capacities: Vec<usize>,
        cos: usize,
        sin: usize,
        logits: usize,
        local_cos: usize,
        local_sin: usize,
    ) -> PyResult<()> {
        let d = self.inner.dims;
        let b = tokens.len();
        one_of_each(
            "step_batch",
            "sequence",
            [
                (b, "tokens"),
                (positions.len(), "positions"),
                (keys.len(), "key caches"),
                (values.len(), "value caches"),
                (capacities.len(), "capacities"),
            ],
        )?;
        for (i, (&token, (&pos, &capacity))) in tokens
            .iter()
            .zip(positions.iter().zip(&capacities))
            .enumerate()
        {
            if token >= d.vocab {
                return Err(PyIndexError::new_err(format!(
                    "sequence {i}: token id {token} is out of bounds for a vocabulary of {}",
                    d.vocab
                )));
            }
            if pos >= capacity {
                return Err(PyIndexError::new_err(format!(
                    "sequence {i}: position {pos} is out of bounds for a KV cache of {capacity} \
                     positions"
                )));
            }
        }
        self.check_distinct_caches(&keys, &values, &capacities)?;
        // sequence i's row of the tables is row i
        let ios = self.batch_ios(
            &keys,
            &values,
            &capacities,
            [cos, sin, local_cos, local_sin],
            logits,
            0..b,
        )?;
        // SAFETY: as in `step`, for every sequence; their caches are distinct (checked above) and
        // their rows of the tables and logits are distinct rows of the caller's buffers
        py.detach(move || unsafe {
            let ios: Vec<transformer::CacheIo> = ios.iter().map(|io| io.get()).collect();
            self.inner.step_batch(&tokens, &positions, &ios)
        });
        Ok(())
    }

    /// Runs the prompt `tokens` at positions `start..start + T`: their keys and values go to the caches
    /// (as in [`Decoder::step`]), `cos` / `sin` hold the positions' rotary tables (`[T, rotary_dim]`
    /// f32 each), and `logits` receives the last token's logits (`vocab` f32), or every token's
    /// (`[T, vocab]`) with `all_logits`.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (tokens, start, keys, values, capacity, cos, sin, logits, all_logits, local_cos=0, local_sin=0))]
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
        local_cos: usize,
        local_sin: usize,
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
        let io = IoAddresses::new(
            keys,
            values,
            capacity,
            [cos, sin, local_cos, local_sin],
            logits,
        )?;
        // SAFETY: as in `step`
        py.detach(move || unsafe { self.inner.prefill(&tokens, start, &io.get(), all_logits) });
        Ok(())
    }

    /// Runs several sequences' prompts in one pass: prompt `i` at positions `starts[i]..` of its own
    /// cache, its rotary rows stacked after the previous prompts' in `cos` / `sin`
    /// (`[ΣT, rotary_dim]`), its last token's logits into row `i` of `logits` (`[P, vocab]`).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (prompts, starts, keys, values, capacities, cos, sin, logits, local_cos=0, local_sin=0))]
    fn prefill_batch(
        &self,
        py: Python<'_>,
        prompts: Vec<Vec<usize>>,
        starts: Vec<usize>,
        keys: Vec<usize>,
        values: Vec<usize>,
        capacities: Vec<usize>,
        cos: usize,
        sin: usize,
        logits: usize,
        local_cos: usize,
        local_sin: usize,
    ) -> PyResult<()> {
        let d = self.inner.dims;
        one_of_each(
            "prefill_batch",
            "prompt",
            [
                (prompts.len(), "prompts"),
                (starts.len(), "starts"),
                (keys.len(), "key caches"),
                (values.len(), "value caches"),
                (capacities.len(), "capacities"),
            ],
        )?;
        for (i, (tokens, (&start, &capacity))) in prompts
            .iter()
            .zip(starts.iter().zip(&capacities))
            .enumerate()
        {
            if tokens.is_empty() {
                return Err(PyValueError::new_err(format!("prompt {i} has no tokens")));
            }
            if let Some(bad) = tokens.iter().find(|&&t| t >= d.vocab) {
                return Err(PyIndexError::new_err(format!(
                    "prompt {i}: token id {bad} is out of bounds for a vocabulary of {}",
                    d.vocab
                )));
            }
            if start.saturating_add(tokens.len()) > capacity {
                return Err(PyIndexError::new_err(format!(
                    "prompt {i}: positions {start}..{} do not fit a KV cache of {capacity} positions",
                    start.saturating_add(tokens.len())
                )));
            }
        }
        self.check_distinct_caches(&keys, &values, &capacities)?;
        // prompt i's rows of the tables come after the earlier prompts'
        let firsts = prompts.iter().scan(0, |row, tokens| {
            let first = *row;
            *row += tokens.len();
            Some(first)
        });
        let ios = self.batch_ios(
            &keys,
            &values,
            &capacities,
            [cos, sin, local_cos, local_sin],
            logits,
            firsts,
        )?;
        // SAFETY: as in `prefill`, for every prompt; their caches are distinct (checked above) and
        // their rows of the tables and logits are distinct rows of the caller's buffers
        py.detach(move || unsafe {
            let batch: Vec<transformer::Prompt> = prompts
                .iter()
                .zip(&starts)
                .zip(ios)
                .map(|((tokens, &start), io)| transformer::Prompt {
                    tokens,
                    start,
                    io: io.get(),
                })
                .collect();
            self.inner.prefill_batch(&batch)
        });
        Ok(())
    }

    #[getter]
    fn num_layers(&self) -> usize {
        self.inner.layers.len()
    }
}

impl Decoder {
    /// Each sequence's buffers of a batched call: its cache, its rows of the rotary tables (from
    /// `first_rows[i]` on) and its row `i` of the logits (table addresses of 0 stay 0: "none").
    fn batch_ios(
        &self,
        keys: &[usize],
        values: &[usize],
        capacities: &[usize],
        tables: [usize; 4],
        logits: usize,
        first_rows: impl Iterator<Item = usize>,
    ) -> PyResult<Vec<IoAddresses>> {
        let d = self.inner.dims;
        let row = |base: usize, first: usize, len: usize| {
            if base == 0 {
                0
            } else {
                base + first * len * std::mem::size_of::<f32>()
            }
        };
        first_rows
            .enumerate()
            .map(|(i, first)| {
                IoAddresses::new(
                    keys[i],
                    values[i],
                    capacities[i],
                    tables.map(|t| row(t, first, d.rotary_dim)),
                    row(logits, i, d.vocab),
                )
            })
            .collect()
    }

    /// Refuses KV caches that share memory: each sequence of a batch writes its own, and one whose
    /// keys or values another sequence also uses would be overwritten by it mid-step.
    fn check_distinct_caches(
        &self,
        keys: &[usize],
        values: &[usize],
        capacities: &[usize],
    ) -> PyResult<()> {
        let d = self.inner.dims;
        let per_position = self.inner.layers.len() * d.kv_heads * d.head_dim * 4;
        let mut spans = Vec::with_capacity(2 * keys.len());
        for (i, ((&k, &v), &capacity)) in keys.iter().zip(values).zip(capacities).enumerate() {
            let bytes = capacity.checked_mul(per_position).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "sequence {i}: a KV cache of {capacity} positions is too large"
                ))
            })?;
            for (start, what) in [(k, "keys"), (v, "values")] {
                // a null address is refused with the other buffers' checks
                spans.push((start, start.saturating_add(bytes), i, what));
            }
        }
        spans.sort_unstable();
        for pair in spans.windows(2) {
            let ((_, end, i, a), (start, _, j, b)) = (pair[0], pair[1]);
            if start < end {
                let what = if i == j {
                    format!("sequence {i}'s keys and values share memory")
                } else {
                    format!("sequence {i}'s {a} overlap sequence {j}'s {b}")
                };
                return Err(PyValueError::new_err(format!(
                    "every sequence of a batch needs a KV cache of its own: {what}"
                )));
            }
        }
        Ok(())
    }
}

/// A batched call's per-sequence lists: at least one of the first, and as many of every other.
fn one_of_each(call: &str, each: &str, counts: [(usize, &str); 5]) -> PyResult<()> {
    let n = counts[0].0;
    if n == 0 {
        return Err(PyValueError::new_err(format!(
            "{call} needs at least one {each}"
        )));
    }
    if counts.iter().all(|&(m, _)| m == n) {
        return Ok(());
    }
    let listed: Vec<String> = counts
        .iter()
        .map(|(m, name)| format!("{m} {name}"))
        .collect();
    let (last, rest) = listed.split_last().expect("five counts");
    Err(PyValueError::new_err(format!(
        "{call} got {} and {last}: it needs one of each per {each}",
        rest.join(", ")
    )))
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
    let inner: Vec<Arc<Q>> = mats.iter().map(|m| m.inner.clone()).collect();
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
        let refs: Vec<&Q> = inner.iter().map(|m| &**m).collect();
        crate::kernels::qprefill::matmul_many(&refs, xs, rows, &mut os)
    });
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<QMatrix>()?;
    m.add_class::<Decoder>()?;
    m.add_function(wrap_pyfunction!(matmul_many, m)?)?;
    m.add(
        "PROMPT_KERNEL_MIN_TOKENS",
        crate::kernels::qprefill::MIN_TOKENS,
    )?;
    Ok(())
}
