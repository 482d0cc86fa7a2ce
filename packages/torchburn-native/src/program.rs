//! A compiled region: a validated [`Plan`] plus a pool of scratch arenas, run with one call.
//!
//! This is the container and the loop; what each instruction checks and does is in `instructions/`.
//!
//! Inputs and outputs are the caller's tensors, passed as raw data pointers (their storage offsets
//! already applied), so nothing is copied at the boundary. Intermediates live in an arena laid out by
//! Python's memory plan; each concurrent caller takes its own arena from the pool, so one compiled
//! model can run from several threads at once.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

use crate::instructions::{Check, Frame, Instr, Instruction};
use crate::plan::Plan;

pub struct Program {
    n_inputs: usize,
    n_outputs: usize,
    arena_bytes: usize,
    instrs: Vec<Instr>,
    arenas: Mutex<Vec<Vec<u64>>>,
    /// Whether runs time each instruction into `times` (off: one relaxed load per run).
    profiling: AtomicBool,
    /// Per instruction: (nanoseconds, runs) since profiling was last switched on.
    times: Mutex<Vec<(u64, u64)>>,
}

impl Program {
    pub fn new(json: &str, in_bytes: Vec<usize>, out_bytes: Vec<usize>) -> Result<Program, String> {
        let plan: Plan =
            serde_json::from_str(json).map_err(|e| format!("malformed program: {e}"))?;
        if plan.n_inputs != in_bytes.len() || plan.n_outputs != out_bytes.len() {
            return Err("program inputs/outputs do not match the buffers given".into());
        }
        let check = Check {
            in_bytes: &in_bytes,
            out_bytes: &out_bytes,
            arena_bytes: plan.arena_bytes,
        };
        let instrs: Vec<Instr> = plan.instrs.into_iter().map(Instr::from).collect();
        for instr in &instrs {
            instr.validate(&check)?;
        }
        Ok(Program {
            n_inputs: plan.n_inputs,
            n_outputs: plan.n_outputs,
            arena_bytes: plan.arena_bytes,
            instrs,
            arenas: Mutex::new(Vec::new()),
            profiling: AtomicBool::new(false),
            times: Mutex::new(Vec::new()),
        })
    }

    pub fn n_inputs(&self) -> usize {
        self.n_inputs
    }

    /// Switches per-instruction timing on (clearing earlier times) or off.
    pub fn set_profiling(&self, on: bool) {
        if on {
            let mut times = self.times.lock().unwrap_or_else(|e| e.into_inner());
            *times = vec![(0, 0); self.instrs.len()];
        }
        self.profiling.store(on, Relaxed);
    }

    /// Per instruction, in plan order: (nanoseconds, runs) timed since profiling was switched on.
    pub fn profile(&self) -> Vec<(u64, u64)> {
        self.times.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The instructions of one run, each timed (wall clock; kernels run on all threads).
    ///
    /// # Safety
    /// As [`Program::run`].
    unsafe fn run_timed(&self, frame: &Frame<'_>) -> Result<(), String> {
        let mut spent = Vec::with_capacity(self.instrs.len());
        for instr in &self.instrs {
            let start = std::time::Instant::now();
            instr.run(frame)?;
            spent.push(start.elapsed().as_nanos() as u64);
        }
        let mut times = self.times.lock().unwrap_or_else(|e| e.into_inner());
        if times.len() == spent.len() {
            for ((total, runs), ns) in times.iter_mut().zip(spent) {
                *total += ns;
                *runs += 1;
            }
        }
        Ok(())
    }

    pub fn n_outputs(&self) -> usize {
        self.n_outputs
    }

    /// Runs the program.
    ///
    /// # Safety
    /// `ins[i]` / `outs[i]` must point to at least `in_bytes[i]` / `out_bytes[i]` valid bytes, laid out
    /// as the plan describes, with outputs not overlapping inputs.
    pub unsafe fn run(&self, ins: &[usize], outs: &[usize]) -> Result<(), String> {
        if ins.len() != self.n_inputs || outs.len() != self.n_outputs {
            return Err(format!(
                "program takes {} inputs and {} outputs, got {} and {}",
                self.n_inputs,
                self.n_outputs,
                ins.len(),
                outs.len()
            ));
        }
        let words = self.arena_bytes.div_ceil(8);
        let mut arena = self
            .arenas
            .lock()
            .map_err(|_| "arena pool poisoned")?
            .pop()
            .unwrap_or_default();
        if arena.len() < words {
            arena = vec![0u64; words];
        }
        let frame = Frame {
            ins,
            outs,
            arena: arena.as_mut_ptr() as *mut u8,
        };
        let result = if self.profiling.load(Relaxed) {
            self.run_timed(&frame)
        } else {
            self.instrs.iter().try_for_each(|i| i.run(&frame))
        };
        if let Ok(mut pool) = self.arenas.lock() {
            pool.push(arena);
        }
        result
    }
}
