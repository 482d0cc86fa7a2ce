//! TorchBurn's native CPU engine.
//!
//! Python plans a compiled region into a flat program (JSON); [`program::Program`] runs it with one
//! foreign call, on the caller's tensors' memory and a reusable scratch arena.

pub mod kernels;
