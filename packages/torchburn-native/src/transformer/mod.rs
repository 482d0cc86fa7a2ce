//! Decoder-only transformer stacks (pre-norm attention + gated MLP), described by the caller.
//!
//! An engine API for LLM runtimes, separate from the compile path: the caller describes a stack once
//! ([`Decoder`]: sizes, the addresses of its f32 tensors, its projections as quantized [`QMatrix`] or
//! f32 weights) and then runs it one token at a time ([`Decoder::step`]) or a prompt at a time
//! ([`Decoder::prefill`]), each one foreign call that appends to a KV cache the caller owns; or one
//! token of each of several sequences, each with its own cache ([`Decoder::step_batch`]).
//!
//! The layer it runs is the one most open-weight decoders share: RMSNorm before attention and MLP,
//! q/k/v projections (optional biases, optional per-head q/k RMSNorm), rotary embeddings from
//! tables the caller computes (so any rope scaling is the caller's), grouped-query attention over
//! the cache (optionally within a sliding window), the output projection, a SiLU-gated MLP, and a
//! final norm and output projection to the logits. Architectures map onto it as data, on the
//! caller's side.
//!
//! [`QMatrix`]: crate::kernels::quant::QMatrix

mod attention;
mod batch;
mod decoder;
mod prefill;
mod project;

pub use decoder::{Activation, CacheIo, Decoder, Dims, Embedding, Layer, Projection, Weight};
pub use prefill::Prompt;
