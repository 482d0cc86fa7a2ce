//! TorchBurn's native CPU engine.
//!
//! Python plans a compiled region into a flat program (JSON, [`plan`]); [`program::Program`] runs it
//! with one foreign call, on the caller's tensors' memory and a reusable scratch arena, each
//! instruction's checks and run in [`instructions`] over the kernels in [`kernels`]. Apart from the
//! compile path, [`transformer`] runs decoder-only transformer stacks for LLM runtimes on the same
//! kernels and threads.

pub mod instructions;
pub mod isa;
pub mod kernels;
pub mod plan;
pub mod program;
pub mod threads;
pub mod transformer;

#[cfg(feature = "python")]
mod python;
