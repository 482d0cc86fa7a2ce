//! The instructions a program runs, one file per family, each behind [`Instruction`].
//!
//! A family's file holds what its instructions require of their operands (checked once, when the
//! program is built) and how they run (calls into the kernels under `kernels/`). Files are named by
//! op family, as the Python lowerings (`lowering/<family>.py`) and the kernels are: the norms in
//! `norm.rs` next to `kernels/norm.rs`, and so on; `Matmul` in `matmul.rs` runs the GEMM kernels of
//! `kernels/gemm.rs`. [`Instr`] dispatches to them, as pydantic-core's `CombinedValidator` does to
//! its validators.

mod attention;
mod check;
mod conv;
mod elementwise;
mod frame;
mod index;
mod matmul;
mod norm;
mod pool;
mod reduce;
mod scan;
mod softmax;

pub use check::Check;
pub use frame::Frame;

use crate::plan;

/// One instruction of a program: its checks and its run.
pub trait Instruction {
    /// Checks everything [`Instruction::run`] relies on: operands inside their buffers, the dtypes,
    /// layouts and shapes its kernel takes.
    fn validate(&self, check: &Check<'_>) -> Result<(), String>;

    /// Runs the instruction on one run's buffers.
    ///
    /// # Safety
    /// The instruction was validated against buffers of the sizes `frame` points to, and the run
    /// holds them (see `Program::run`).
    unsafe fn run(&self, frame: &Frame<'_>) -> Result<(), String>;
}

/// Declares [`Instr`] over the families and dispatches both methods with one `match` each.
macro_rules! families {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        /// An instruction ready to run: the plan's, with whatever its family keeps between runs.
        pub enum Instr {
            $($variant($ty)),*
        }

        impl From<plan::Instr> for Instr {
            // most families run the plan's struct as it is
            #[allow(clippy::useless_conversion)]
            fn from(instr: plan::Instr) -> Self {
                match instr {
                    $(plan::Instr::$variant(i) => Instr::$variant(i.into())),*
                }
            }
        }

        impl Instruction for Instr {
            fn validate(&self, check: &Check<'_>) -> Result<(), String> {
                match self {
                    $(Instr::$variant(i) => i.validate(check)),*
                }
            }

            unsafe fn run(&self, frame: &Frame<'_>) -> Result<(), String> {
                match self {
                    $(Instr::$variant(i) => i.run(frame)),*
                }
            }
        }
    };
}

families! {
    Elementwise(elementwise::Elementwise),
    Matmul(plan::Matmul),
    GroupedMm(plan::GroupedMm),
    Reduce(plan::Reduce),
    Softmax(plan::Softmax),
    Scan(plan::Scan),
    Sort(plan::Sort),
    LayerNorm(plan::LayerNorm),
    RmsNorm(plan::RmsNorm),
    GroupNorm(plan::GroupNorm),
    Sdpa(plan::Sdpa),
    Conv2d(plan::Conv2d),
    Conv2dWeightGrad(plan::Conv2dWeightGrad),
    MaxPool2d(plan::MaxPool2d),
    AvgPool2d(plan::AvgPool2d),
    AdaptiveAvgPool2d(plan::AdaptiveAvgPool2d),
    Upsample2d(plan::Upsample2d),
    IndexSelect(plan::IndexSelect),
    Gather(plan::Gather),
    Index(plan::Index),
    Scatter(plan::Scatter),
    IndexPut(plan::IndexPut),
}
