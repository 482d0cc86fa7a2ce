//! A compiled region: a validated [`Plan`] plus a pool of scratch arenas, run with one call.
//!
//! Inputs and outputs are the caller's tensors, passed as raw data pointers (their storage offsets
//! already applied), so nothing is copied at the boundary. Intermediates live in an arena laid out by
//! Python's memory plan; each concurrent caller takes its own arena from the pool, so one compiled
//! model can run from several threads at once.

use crate::threads;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

use crate::kernels::elementwise::{self, UnaryFn, View};
use crate::kernels::gemm::{gemm_hooked, BlockFn, BlockHooks, GemmScalar, Mat, MatMut};
use crate::kernels::{
    attention, conv, conv_shifted, gemm_packed, index, norm, pool, reduce, softmax,
};
use crate::plan::{Buf, DType, Instr, Operand, Plan};

pub struct Program {
    plan: Plan,
    in_bytes: Vec<usize>,
    out_bytes: Vec<usize>,
    arenas: Mutex<Vec<Vec<u64>>>,
    /// Whether runs time each instruction into `times` (off: one relaxed load per run).
    profiling: AtomicBool,
    /// Per instruction: (nanoseconds, runs) since profiling was last switched on.
    times: Mutex<Vec<(u64, u64)>>,
}

/// Base pointers of one run.
struct Frame<'a> {
    ins: &'a [usize],
    outs: &'a [usize],
    arena: *mut u8,
}

impl Frame<'_> {
    fn ptr(&self, op: &Operand) -> *mut u8 {
        let base = match op.buf {
            Buf::In(i) => self.ins[i] as *mut u8,
            Buf::Out(i) => self.outs[i] as *mut u8,
            // SAFETY: validated against arena_bytes in Program::new
            Buf::Tmp(off) => unsafe { self.arena.add(off) },
        };
        // SAFETY: offset validated against the buffer's size in Program::new
        unsafe { base.offset(op.offset * op.dtype.size() as isize) }
    }

    fn view(&self, op: &Operand) -> View {
        View::new(self.ptr(op), op.dtype, &op.shape, &op.strides)
    }

    /// The operand as a typed slice; only for operands validated contiguous.
    unsafe fn slice<T>(&self, op: &Operand) -> &[T] {
        std::slice::from_raw_parts(self.ptr(op) as *const T, op.numel())
    }

    #[allow(clippy::mut_from_ref)]
    unsafe fn slice_mut<T>(&self, op: &Operand) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.ptr(op) as *mut T, op.numel())
    }

    /// The `len` elements from `op`'s first: a strided operand's whole span (validated against its
    /// buffer in Program::new).
    unsafe fn span<T>(&self, op: &Operand, len: usize) -> &[T] {
        std::slice::from_raw_parts(self.ptr(op) as *const T, len)
    }

    #[allow(clippy::mut_from_ref)]
    unsafe fn span_mut<T>(&self, op: &Operand, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.ptr(op) as *mut T, len)
    }
}

/// A forward convolution's shape from its (validated, 4-D) operands.
fn conv2d_shape(
    input: &Operand,
    weight: &Operand,
    out: &Operand,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> conv::Conv2dShape {
    conv::Conv2dShape {
        n: input.shape[0],
        c_in: input.shape[1],
        h: input.shape[2],
        w: input.shape[3],
        c_out: out.shape[1],
        kh: weight.shape[2],
        kw: weight.shape[3],
        stride,
        padding,
        dilation,
        groups,
        h_out: out.shape[2],
        w_out: out.shape[3],
    }
}

/// An attention operand's row layout: 4-D f32 `[b, h, t, width]` with non-negative strides and
/// each row's `width` elements contiguous.
fn head_rows(op: &Operand, what: &str) -> Result<attention::HeadRows, String> {
    if op.shape.len() != 4 || op.dtype != DType::F32 {
        return Err(format!("sdpa {what} must be a 4-D f32 tensor"));
    }
    if op.strides.iter().any(|&s| s < 0) || (op.shape[3] > 1 && op.strides[3] != 1) {
        return Err(format!(
            "sdpa {what}: strides {:?} must be non-negative with rows contiguous",
            op.strides
        ));
    }
    Ok(attention::HeadRows {
        batch: op.strides[0] as usize,
        head: op.strides[1] as usize,
        row: op.strides[2] as usize,
    })
}

fn check_operand(
    op: &Operand,
    in_bytes: &[usize],
    out_bytes: &[usize],
    arena: usize,
) -> Result<(), String> {
    if op.shape.len() != op.strides.len() || op.shape.len() > crate::kernels::strided::MAX_RANK {
        return Err(format!("operand rank mismatch or too large: {op:?}"));
    }
    let (limit, start) = match op.buf {
        Buf::In(i) => (*in_bytes.get(i).ok_or("input index out of range")?, 0usize),
        Buf::Out(i) => (*out_bytes.get(i).ok_or("output index out of range")?, 0),
        Buf::Tmp(off) => (arena, off),
    };
    if op.numel() == 0 {
        return Ok(());
    }
    let mut lo = op.offset;
    let mut hi = op.offset;
    for (&n, &s) in op.shape.iter().zip(&op.strides) {
        let span = (n as isize - 1) * s;
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    let es = op.dtype.size() as isize;
    if lo < 0 || start as isize + (hi + 1) * es > limit as isize {
        return Err(format!(
            "operand reaches outside its buffer ({limit} bytes): {op:?}"
        ));
    }
    Ok(())
}

fn require_contiguous(op: &Operand, what: &str, dtypes: &[DType]) -> Result<(), String> {
    if !op.is_contiguous() {
        return Err(format!("{what}: operand must be contiguous"));
    }
    if !dtypes.contains(&op.dtype) {
        return Err(format!("{what}: dtype {:?} not in {dtypes:?}", op.dtype));
    }
    Ok(())
}

const FLOATS: &[DType] = &[DType::F32, DType::F64];
const F32: &[DType] = &[DType::F32];

impl Program {
    pub fn new(json: &str, in_bytes: Vec<usize>, out_bytes: Vec<usize>) -> Result<Program, String> {
        let plan: Plan =
            serde_json::from_str(json).map_err(|e| format!("malformed program: {e}"))?;
        if plan.n_inputs != in_bytes.len() || plan.n_outputs != out_bytes.len() {
            return Err("program inputs/outputs do not match the buffers given".into());
        }
        let program = Program {
            plan,
            in_bytes,
            out_bytes,
            arenas: Mutex::new(Vec::new()),
            profiling: AtomicBool::new(false),
            times: Mutex::new(Vec::new()),
        };
        program.validate()?;
        Ok(program)
    }

    fn validate(&self) -> Result<(), String> {
        let chk = |op: &Operand| {
            check_operand(op, &self.in_bytes, &self.out_bytes, self.plan.arena_bytes)
        };
        for ins in &self.plan.instrs {
            match ins {
                Instr::Elementwise {
                    shape,
                    inputs,
                    outputs,
                    code,
                    nregs,
                    ..
                } => {
                    for op in inputs.iter().chain(outputs) {
                        chk(op)?;
                        if &op.shape != shape {
                            return Err(
                                "elementwise operand shape differs from iteration shape".into()
                            );
                        }
                    }
                    if shape.is_empty() {
                        return Err("elementwise iteration needs rank >= 1".into());
                    }
                    elementwise::validate(code, *nregs, inputs.len(), outputs.len())?;
                }
                Instr::Matmul {
                    a,
                    b,
                    out,
                    bias,
                    residual,
                    b_panel,
                    b_packed,
                    ..
                } => {
                    if residual.as_ref().is_some_and(|r| r.shape != out.shape) {
                        return Err("matmul residual must have the output's shape".into());
                    }
                    for op in [a, b, out].into_iter().chain(bias).chain(residual) {
                        chk(op)?;
                        if op.shape.len() != 3
                            || !FLOATS.contains(&op.dtype)
                            || op.dtype != out.dtype
                        {
                            return Err("matmul operands must be 3-D f32/f64 of one dtype".into());
                        }
                    }
                    if a.shape[2] != b.shape[1]
                        || a.shape[1] != out.shape[1]
                        || b.shape[2] != out.shape[2]
                    {
                        return Err("matmul shapes do not agree".into());
                    }
                    if a.shape[0] != out.shape[0] || b.shape[0] != out.shape[0] {
                        return Err("matmul batch sizes do not agree".into());
                    }
                    if *b_panel > 0 {
                        let (rows, cols, width) = (b.shape[1], b.shape[2], *b_panel as isize);
                        if b.strides != [0, width, 1] {
                            return Err("a paneled matmul operand has strides (0, panel, 1)".into());
                        }
                        // the panels as they lie: [panels, rows, P], the last one padded
                        chk(&Operand {
                            shape: vec![cols.div_ceil(*b_panel), rows, *b_panel],
                            strides: vec![rows as isize * width, width, 1],
                            ..b.clone()
                        })?;
                    }
                    if let Some(p) = b_packed {
                        chk(p)?;
                        let (m, k, n) = (a.shape[1], a.shape[2], b.shape[2]);
                        let need = gemm_packed::packed_b_bytes(m, n, k, b.strides[1], b.strides[2]);
                        if p.dtype != DType::F32
                            || out.dtype != DType::F32
                            || p.shape.len() != 1
                            || !p.is_contiguous()
                            || need == 0
                            || p.shape[0] * 4 < need
                        {
                            return Err(format!(
                                "a packed matmul operand is a contiguous 1-D f32 operand of at least \
                                 {need} bytes, for an f32 product whose B CBLAS can read, where \
                                 MKL's packing is available"
                            ));
                        }
                    }
                }
                Instr::Reduce {
                    input, out, kept, ..
                } => {
                    chk(input)?;
                    chk(out)?;
                    if !out.is_contiguous() || *kept > input.shape.len() {
                        return Err("reduce output must be contiguous".into());
                    }
                }
                Instr::Softmax {
                    input,
                    out,
                    outer,
                    n,
                    inner,
                    ..
                } => {
                    for op in [input, out] {
                        chk(op)?;
                        require_contiguous(op, "softmax", FLOATS)?;
                        if op.numel() != outer * n * inner {
                            return Err("softmax extent mismatch".into());
                        }
                    }
                }
                Instr::LayerNorm {
                    input,
                    weight,
                    bias,
                    out,
                    mean,
                    rstd,
                    rows,
                    n,
                    ..
                } => {
                    for op in [input, out] {
                        chk(op)?;
                        require_contiguous(op, "layer_norm", FLOATS)?;
                        if op.numel() != rows * n {
                            return Err("layer_norm extent mismatch".into());
                        }
                    }
                    for op in [weight, bias].into_iter().flatten() {
                        chk(op)?;
                        require_contiguous(op, "layer_norm weight", &[input.dtype])?;
                        if op.numel() != *n {
                            return Err("layer_norm weight size mismatch".into());
                        }
                    }
                    for op in [mean, rstd].into_iter().flatten() {
                        chk(op)?;
                        require_contiguous(op, "layer_norm stats", &[input.dtype])?;
                        if op.numel() != *rows {
                            return Err("layer_norm stats size mismatch".into());
                        }
                    }
                }
                Instr::RmsNorm {
                    input,
                    weight,
                    out,
                    rows,
                    n,
                    ..
                } => {
                    for op in [input, out] {
                        chk(op)?;
                        require_contiguous(op, "rms_norm", FLOATS)?;
                        if op.numel() != rows * n {
                            return Err("rms_norm extent mismatch".into());
                        }
                    }
                    if let Some(w) = weight {
                        chk(w)?;
                        require_contiguous(w, "rms_norm weight", &[input.dtype])?;
                        if w.numel() != *n {
                            return Err("rms_norm weight size mismatch".into());
                        }
                    }
                }
                Instr::GroupNorm {
                    input,
                    weight,
                    bias,
                    out,
                    mean,
                    rstd,
                    n,
                    c,
                    hw,
                    groups,
                    ..
                } => {
                    for op in [input, out] {
                        chk(op)?;
                        require_contiguous(op, "group_norm", FLOATS)?;
                        if op.numel() != n * c * hw {
                            return Err("group_norm extent mismatch".into());
                        }
                    }
                    for op in [weight, bias].into_iter().flatten() {
                        chk(op)?;
                        require_contiguous(op, "group_norm weight", &[input.dtype])?;
                        if op.numel() != *c {
                            return Err("group_norm weight size mismatch".into());
                        }
                    }
                    for op in [mean, rstd].into_iter().flatten() {
                        chk(op)?;
                        require_contiguous(op, "group_norm stats", &[input.dtype])?;
                        if op.numel() != n * groups {
                            return Err("group_norm stats size mismatch".into());
                        }
                    }
                    if *groups == 0 || c % groups != 0 {
                        return Err("group_norm: channels must divide into groups".into());
                    }
                }
                Instr::Sdpa {
                    q,
                    k,
                    v,
                    mask,
                    out,
                    lse,
                    ..
                } => {
                    for (op, what) in [(q, "q"), (k, "k"), (v, "v"), (out, "out")] {
                        chk(op)?;
                        head_rows(op, what)?;
                    }
                    let (b, h, tq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
                    let (hk, tk, dv) = (k.shape[1], k.shape[2], v.shape[3]);
                    // grouped-query attention: k and v may have fewer heads, each read by
                    // h / hk consecutive query heads
                    if k.shape != [b, hk, tk, d]
                        || v.shape != [b, hk, tk, dv]
                        || out.shape != [b, h, tq, dv]
                    {
                        return Err(format!(
                            "sdpa shapes do not agree: q {:?}, k {:?}, v {:?}, out {:?}",
                            q.shape, k.shape, v.shape, out.shape
                        ));
                    }
                    if h > 0 && (hk == 0 || h % hk != 0) {
                        return Err(format!(
                            "sdpa: {h} query heads do not split into {hk} key/value heads"
                        ));
                    }
                    // tasks write their output rows in parallel
                    if !head_rows(out, "out")?.rows_disjoint(b, h, tq, dv) {
                        return Err(format!(
                            "sdpa out: strides {:?} make rows overlap",
                            out.strides
                        ));
                    }
                    if let Some(m) = mask {
                        chk(m)?;
                        if m.shape != [b, h, tq, tk] || !matches!(m.dtype, DType::F32 | DType::Bool)
                        {
                            return Err(
                                "sdpa mask must be f32 or bool, broadcast to [b, h, tq, tk]".into(),
                            );
                        }
                        if m.strides.iter().any(|&s| s < 0) {
                            return Err("sdpa mask strides must be non-negative".into());
                        }
                    }
                    if let Some(l) = lse {
                        chk(l)?;
                        require_contiguous(l, "sdpa lse", F32)?;
                        if l.numel() != b * h * tq {
                            return Err("sdpa lse size mismatch".into());
                        }
                    }
                }
                Instr::Conv2d {
                    input,
                    weight,
                    weight_taps,
                    bias,
                    out,
                    stride,
                    padding,
                    dilation,
                    groups,
                    transposed,
                    epilogue,
                    ..
                } => {
                    if let Some(e) = epilogue {
                        if *transposed {
                            return Err("conv2d epilogue: forward convolutions only".into());
                        }
                        let c_out = out.shape.get(1).copied().unwrap_or(0);
                        if let Some(r) = &e.residual {
                            chk(r)?;
                            require_contiguous(r, "conv2d residual", &[out.dtype])?;
                            if r.shape != out.shape {
                                return Err("conv2d residual must have the output's shape".into());
                            }
                        }
                        if let Some(nm) = &e.norm {
                            let params = [
                                Some(&nm.mean),
                                Some(&nm.var),
                                nm.weight.as_ref(),
                                nm.bias.as_ref(),
                            ];
                            for op in params.into_iter().flatten() {
                                chk(op)?;
                                require_contiguous(op, "conv2d batch norm", &[out.dtype])?;
                                if op.numel() != c_out {
                                    return Err(
                                        "conv2d batch norm: one value per output channel".into()
                                    );
                                }
                            }
                        }
                    }
                    for op in [input, weight, out] {
                        chk(op)?;
                        require_contiguous(op, "conv2d", &[input.dtype])?;
                        require_contiguous(op, "conv2d", FLOATS)?;
                        if op.shape.len() != 4 {
                            return Err("conv2d operands must be 4-D".into());
                        }
                    }
                    if let Some(b) = bias {
                        chk(b)?;
                        require_contiguous(b, "conv2d bias", &[input.dtype])?;
                    }
                    if *groups == 0 {
                        return Err("conv2d: groups must be positive".into());
                    }
                    if let Some(t) = weight_taps {
                        chk(t)?;
                        require_contiguous(t, "conv2d weight taps", &[weight.dtype])?;
                        let (c_out, c_in, kh, kw) = (
                            weight.shape[0],
                            weight.shape[1],
                            weight.shape[2],
                            weight.shape[3],
                        );
                        if t.shape != [kh * kw, c_out, c_in] || *transposed {
                            return Err(format!(
                                "conv2d weight taps: shape {:?}, want [{}, {c_out}, {c_in}] of a forward convolution",
                                t.shape,
                                kh * kw
                            ));
                        }
                        if !conv_shifted::applies(&conv2d_shape(
                            input, weight, out, *stride, *padding, *dilation, *groups,
                        )) {
                            return Err("conv2d weight taps need a stride-1 'same' convolution with one group".into());
                        }
                    }
                }
                Instr::MaxPool2d {
                    input,
                    out,
                    indices,
                    ..
                } => {
                    for op in [input, out] {
                        chk(op)?;
                        require_contiguous(op, "max_pool2d", FLOATS)?;
                        if op.shape.len() != 4 {
                            return Err("max_pool2d operands must be 4-D".into());
                        }
                    }
                    if let Some(i) = indices {
                        chk(i)?;
                        require_contiguous(i, "max_pool2d indices", &[DType::I64])?;
                    }
                }
                Instr::AvgPool2d { input, out, .. } | Instr::AdaptiveAvgPool2d { input, out } => {
                    for op in [input, out] {
                        chk(op)?;
                        require_contiguous(op, "avg_pool2d", FLOATS)?;
                        if op.shape.len() != 4 {
                            return Err("avg_pool2d operands must be 4-D".into());
                        }
                    }
                }
                Instr::IndexSelect {
                    input,
                    index,
                    out,
                    dim,
                } => {
                    chk(input)?;
                    chk(index)?;
                    chk(out)?;
                    require_contiguous(input, "index_select", &[input.dtype])?;
                    require_contiguous(out, "index_select", &[input.dtype])?;
                    if index.shape.len() != 1 || *dim >= input.shape.len().max(1) {
                        return Err("index_select: 1-D index and a valid dim required".into());
                    }
                }
                Instr::Gather {
                    input,
                    index,
                    out,
                    dim,
                } => {
                    for op in [input, index, out] {
                        chk(op)?;
                    }
                    require_contiguous(out, "gather", &[input.dtype])?;
                    if index.shape != out.shape
                        || *dim >= input.shape.len()
                        || input.shape.len() != out.shape.len()
                    {
                        return Err("gather: index/out shapes or dim invalid".into());
                    }
                }
                Instr::Index {
                    input,
                    indices,
                    out,
                    first,
                } => {
                    chk(input)?;
                    chk(out)?;
                    require_contiguous(out, "index", &[input.dtype])?;
                    for i in indices {
                        chk(i)?;
                    }
                    if indices.is_empty() || first + indices.len() > input.shape.len() {
                        return Err("index: bad index dims".into());
                    }
                }
                Instr::Scatter {
                    out,
                    index,
                    src,
                    dim,
                    ..
                } => {
                    for op in [out, index, src] {
                        chk(op)?;
                    }
                    if src.dtype != out.dtype || *dim >= out.shape.len() || src.shape != index.shape
                    {
                        return Err("scatter: operands disagree".into());
                    }
                }
                Instr::IndexPut {
                    out,
                    indices,
                    values,
                    ..
                } => {
                    chk(out)?;
                    chk(values)?;
                    for i in indices {
                        chk(i)?;
                    }
                    if values.dtype != out.dtype
                        || indices.is_empty()
                        || indices.len() > out.shape.len()
                    {
                        return Err("index_put: operands disagree".into());
                    }
                }
            }
        }
        Ok(())
    }

    pub fn n_inputs(&self) -> usize {
        self.plan.n_inputs
    }

    /// Switches per-instruction timing on (clearing earlier times) or off.
    pub fn set_profiling(&self, on: bool) {
        if on {
            let mut times = self.times.lock().unwrap_or_else(|e| e.into_inner());
            *times = vec![(0, 0); self.plan.instrs.len()];
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
        let mut spent = Vec::with_capacity(self.plan.instrs.len());
        for instr in &self.plan.instrs {
            let start = std::time::Instant::now();
            exec(frame, instr)?;
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
        self.plan.n_outputs
    }

    /// Runs the program.
    ///
    /// # Safety
    /// `ins[i]` / `outs[i]` must point to at least `in_bytes[i]` / `out_bytes[i]` valid bytes, laid out
    /// as the plan describes, with outputs not overlapping inputs.
    pub unsafe fn run(&self, ins: &[usize], outs: &[usize]) -> Result<(), String> {
        if ins.len() != self.plan.n_inputs || outs.len() != self.plan.n_outputs {
            return Err(format!(
                "program takes {} inputs and {} outputs, got {} and {}",
                self.plan.n_inputs,
                self.plan.n_outputs,
                ins.len(),
                outs.len()
            ));
        }
        let words = self.plan.arena_bytes.div_ceil(8);
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
            self.plan.instrs.iter().try_for_each(|i| exec(&frame, i))
        };
        if let Ok(mut pool) = self.arenas.lock() {
            pool.push(arena);
        }
        result
    }
}

/// What a matmul adds to its product: `beta · bias` and a residual, either or both.
#[derive(Clone, Copy)]
struct Addends<'a> {
    bias: Option<&'a Operand>,
    residual: Option<&'a Operand>,
}

/// `out[b] = alpha · a[b] @ b[b] (+ beta · bias) (+ residual) then act`, for every batch b, each block
/// of `out` finished by the thread that computes it (see [`BlockHooks`]).
///
/// Where `out`'s rows are contiguous and so are the addends' (a Linear's bias row, a residual), the
/// product is written first and the addends and the activation follow in one pass over the block
/// while it is in cache. Written into the block before the product instead, the addends are a write
/// stream of their own to memory not yet in cache: Linear+ReLU 128x512 -> 1024 on 2 threads took
/// 369-413 us that way against 345-359. Other layouts take that way still: the block starts as
/// `beta · bias + residual` and the product accumulates onto it.
#[allow(clippy::too_many_arguments)]
unsafe fn matmul<T: GemmScalar + elementwise::Activate>(
    f: &Frame<'_>,
    a: &Operand,
    (b, b_panel, b_packed): (&Operand, usize, Option<&Operand>),
    out: &Operand,
    addends: Addends<'_>,
    alpha: T,
    beta: T,
    act: Option<UnaryFn>,
) {
    let (batch, m, k, n) = (out.shape[0], a.shape[1], a.shape[2], out.shape[2]);
    let (pa, pb, pc) = (f.ptr(a) as usize, f.ptr(b) as usize, f.ptr(out) as usize);
    let packed_at = b_packed.map(|p| f.ptr(p) as usize);
    let os = &out.strides;
    let bias_at = addends.bias.map(|o| (f.ptr(o) as usize, &o.strides));
    let residual_at = addends.residual.map(|o| (f.ptr(o) as usize, &o.strides));
    let rows_contiguous = |o: &Operand| o.strides[2] == 1;
    let after_product = os[2] == 1
        && addends.bias.is_none_or(rows_contiguous)
        && addends.residual.is_none_or(rows_contiguous);
    let has_addends = addends.bias.is_some() || addends.residual.is_some();
    // the addends go after the product, in `finish`, or before it, in `fill`
    let (late_addends, accumulate) = (has_addends && after_product, has_addends && !after_product);
    let one = |bi: usize, parallel: bool| {
        let bi = bi as isize;
        let c_at = |i: usize, j: usize| {
            (pc as *mut T).offset(bi * os[0] + i as isize * os[1] + j as isize * os[2])
        };
        // the addends' rows `i` over the block's columns (contiguous, as `after_product` requires)
        let addend_row = |at: Option<(usize, &Vec<isize>)>, i: usize, cols: &Range<usize>| {
            at.map(|(p, st)| {
                let row = bi * st[0] + i as isize * st[1] + cols.start as isize;
                std::slice::from_raw_parts((p as *const T).offset(row), cols.len())
            })
        };
        let finish = |rows: Range<usize>, cols: Range<usize>| {
            for i in rows {
                let dst = std::slice::from_raw_parts_mut(c_at(i, cols.start), cols.len());
                if late_addends {
                    let bias = addend_row(bias_at, i, &cols);
                    let residual = addend_row(residual_at, i, &cols);
                    T::add_activate(act, beta, bias, residual, dst);
                } else if let Some(act) = act {
                    T::activate(act, dst);
                }
            }
        };
        // C's block starts as `beta · bias + residual` (either may be absent), one pass per row. Only
        // layouts `finish` does not take come here: a strided output or addend, or a bias of one
        // value per row (column stride 0), the one layout with a fast path
        let fill = |rows: Range<usize>, cols: Range<usize>| {
            let per_row_bias = bias_at.is_some_and(|(_, bs)| bs[2] == 0);
            let rows_dense = os[2] == 1 && residual_at.is_none_or(|(_, rs)| rs[2] == 1);
            let bias_at = |i: usize, j: usize| {
                bias_at.map(|(p, bs)| {
                    (p as *const T).offset(bi * bs[0] + i as isize * bs[1] + j as isize * bs[2])
                })
            };
            let residual_at = |i: usize, j: usize| {
                residual_at.map(|(p, rs)| {
                    (p as *const T).offset(bi * rs[0] + i as isize * rs[1] + j as isize * rs[2])
                })
            };
            for i in rows {
                let (n, j0) = (cols.len(), cols.start);
                if let (true, true, Some(v)) = (per_row_bias, rows_dense, bias_at(i, j0)) {
                    let dst = std::slice::from_raw_parts_mut(c_at(i, j0), n);
                    let v = beta * *v;
                    match residual_at(i, j0) {
                        None => dst.fill(v),
                        Some(r) => {
                            let r = std::slice::from_raw_parts(r, n);
                            for (d, &r) in dst.iter_mut().zip(r) {
                                *d = v + r;
                            }
                        }
                    }
                    continue;
                }
                for j in cols.clone() {
                    let b = bias_at(i, j).map_or(T::ZERO, |b| beta * *b);
                    *c_at(i, j) = residual_at(i, j).map_or(b, |r| b + *r);
                }
            }
        };
        let hooks = BlockHooks {
            before: accumulate.then_some(&fill as BlockFn<'_>),
            after: (act.is_some() || late_addends).then_some(&finish as BlockFn<'_>),
        };
        let a_mat = Mat {
            ptr: (pa as *const T).offset(bi * a.strides[0]),
            rs: a.strides[1],
            cs: a.strides[2],
        };
        let c_mat = MatMut {
            ptr: c_at(0, 0),
            rs: os[1],
            cs: os[2],
        };
        // a packed B is only ever given for a batch of one
        if let Some(packed) = packed_at {
            let packed = packed as *const T;
            if T::gemm_packed_b(m, n, k, a_mat, packed, c_mat, accumulate, hooks) {
                return;
            }
        }
        let b_mat = Mat {
            ptr: (pb as *const T).offset(bi * b.strides[0]),
            rs: b.strides[1],
            cs: b.strides[2],
        };
        gemm_hooked::<T>(
            m, n, k, a_mat, b_mat, c_mat, accumulate, alpha, parallel, b_panel, hooks,
        )
    };
    // many small products: one per thread; few large ones: let gemm split each
    if batch > 1 && m * n * k < 128 * 128 * 128 && threads::current() > 1 {
        threads::parallel_for(batch, |bi| one(bi, false));
    } else {
        (0..batch).for_each(|bi| one(bi, true));
    }
}

/// Batch norm's per-channel `(scale, shift)` in f64: `scale = weight / sqrt(var + eps)`,
/// `shift = bias - mean · scale` (weight 1 and bias 0 when absent), as PyTorch's eval kernel folds them.
///
/// # Safety
/// The operands must be valid in `f`, as for every instruction (checked by `validate`).
unsafe fn batch_norm_scale_shift(
    f: &Frame<'_>,
    nm: &crate::plan::BatchNormEval,
    channels: usize,
) -> (Vec<f64>, Vec<f64>) {
    let read = |op: &Operand| -> Vec<f64> {
        match op.dtype {
            // SAFETY: as the function's
            DType::F64 => unsafe { f.slice::<f64>(op) }.to_vec(),
            _ => unsafe { f.slice::<f32>(op) }
                .iter()
                .map(|&v| v as f64)
                .collect(),
        }
    };
    let (mean, var) = (read(&nm.mean), read(&nm.var));
    let weight = nm.weight.as_ref().map(read);
    let bias = nm.bias.as_ref().map(read);
    let mut scale = Vec::with_capacity(channels);
    let mut shift = Vec::with_capacity(channels);
    for c in 0..channels {
        let s = weight.as_ref().map_or(1.0, |w| w[c]) / (var[c] + nm.eps).sqrt();
        scale.push(s);
        shift.push(bias.as_ref().map_or(0.0, |b| b[c]) - mean[c] * s);
    }
    (scale, shift)
}

/// Calls the f64 or the f32 variant of a kernel with the same arguments (slices take their type from it).
macro_rules! by_float {
    ($dtype:expr, $f32:path, $f64:path, ($($arg:expr),* $(,)?)) => {
        match $dtype {
            DType::F64 => $f64($($arg),*),
            _ => $f32($($arg),*),
        }
    };
}

unsafe fn exec(f: &Frame<'_>, ins: &Instr) -> Result<(), String> {
    match ins {
        Instr::Elementwise {
            domain,
            shape,
            inputs,
            outputs,
            code,
            nregs,
            prepared,
        } => {
            let iv: Vec<View> = inputs.iter().map(|o| f.view(o)).collect();
            let ov: Vec<View> = outputs.iter().map(|o| f.view(o)).collect();
            let prepared =
                prepared.get_or_init(|| elementwise::prepare_for(*domain, code, *nregs, &iv, &ov));
            elementwise::run_prepared(*domain, shape, &iv, &ov, prepared);
        }
        Instr::Matmul {
            a,
            b,
            out,
            bias,
            residual,
            alpha,
            beta,
            act,
            b_panel,
            b_packed,
        } => {
            if act.is_some() && !out.is_contiguous() {
                return Err("matmul epilogue needs a contiguous output".into());
            }
            let addends = Addends {
                bias: bias.as_ref(),
                residual: residual.as_ref(),
            };
            // B packed for one product of these sizes, alpha folded in as 1
            let packed = b_packed
                .as_ref()
                .filter(|_| *alpha == 1.0 && out.shape[0] == 1);
            let b = (b, *b_panel, packed);
            match out.dtype {
                DType::F64 => matmul::<f64>(f, a, b, out, addends, *alpha, *beta, *act),
                _ => {
                    let (alpha, beta) = (*alpha as f32, *beta as f32);
                    matmul::<f32>(f, a, b, out, addends, alpha, beta, *act)
                }
            }
        }
        Instr::Reduce {
            input,
            out,
            kept,
            op,
            scale,
            correction,
        } => {
            let iv = f.view(input);
            let ov = f.view(out);
            reduce::reduce(&reduce::ReduceArgs {
                input: &iv,
                in_shape: &input.shape,
                kept: *kept,
                out: &ov,
                op: *op,
                scale: *scale,
                correction: *correction,
            })?;
        }
        Instr::Softmax {
            input,
            out,
            outer,
            n,
            inner,
            log,
        } => match input.dtype {
            DType::F64 => {
                softmax::softmax_f64(*outer, *n, *inner, f.slice(input), f.slice_mut(out), *log)
            }
            _ => softmax::softmax_f32(*outer, *n, *inner, f.slice(input), f.slice_mut(out), *log),
        },
        Instr::LayerNorm {
            input,
            weight,
            bias,
            out,
            mean,
            rstd,
            rows,
            n,
            eps,
        } => {
            by_float!(
                input.dtype,
                norm::layer_norm_f32,
                norm::layer_norm_f64,
                (
                    *rows,
                    *n,
                    f.slice(input),
                    weight.as_ref().map(|w| f.slice(w)),
                    bias.as_ref().map(|w| f.slice(w)),
                    *eps,
                    f.slice_mut(out),
                    mean.as_ref().map(|w| f.slice_mut(w)),
                    rstd.as_ref().map(|w| f.slice_mut(w)),
                )
            )
        }
        Instr::RmsNorm {
            input,
            weight,
            out,
            rows,
            n,
            eps,
        } => match input.dtype {
            DType::F64 => norm::rms_norm_f64(
                *rows,
                *n,
                f.slice(input),
                weight.as_ref().map(|w| f.slice(w)),
                *eps,
                f.slice_mut(out),
            ),
            _ => norm::rms_norm_f32(
                *rows,
                *n,
                f.slice(input),
                weight.as_ref().map(|w| f.slice(w)),
                *eps,
                f.slice_mut(out),
            ),
        },
        Instr::GroupNorm {
            input,
            weight,
            bias,
            out,
            mean,
            rstd,
            n,
            c,
            hw,
            groups,
            eps,
        } => {
            by_float!(
                input.dtype,
                norm::group_norm_f32,
                norm::group_norm_f64,
                (
                    *n,
                    *c,
                    *hw,
                    *groups,
                    f.slice(input),
                    weight.as_ref().map(|w| f.slice(w)),
                    bias.as_ref().map(|w| f.slice(w)),
                    *eps,
                    f.slice_mut(out),
                    mean.as_ref().map(|w| f.slice_mut(w)),
                    rstd.as_ref().map(|w| f.slice_mut(w)),
                )
            )
        }
        Instr::Sdpa {
            q,
            k,
            v,
            mask,
            out,
            lse,
            causal,
            scale,
        } => {
            let s = attention::SdpaShape {
                b: q.shape[0],
                h: q.shape[1],
                hk: k.shape[1],
                tq: q.shape[2],
                tk: k.shape[2],
                d: q.shape[3],
                dv: v.shape[3],
            };
            let mask_data = mask.as_ref().map(|m| {
                // the mask may be a broadcast view: hand the kernel the whole span its strides reach
                let span = m
                    .shape
                    .iter()
                    .zip(&m.strides)
                    .map(|(&n, &st)| (n.max(1) - 1) * st as usize)
                    .sum::<usize>()
                    + 1;
                let strides = [
                    m.strides[0] as usize,
                    m.strides[1] as usize,
                    m.strides[2] as usize,
                    m.strides[3] as usize,
                ];
                match m.dtype {
                    DType::Bool => attention::AttnMask::Keep {
                        data: std::slice::from_raw_parts(f.ptr(m) as *const u8, span),
                        strides,
                    },
                    _ => attention::AttnMask::Additive {
                        data: std::slice::from_raw_parts(f.ptr(m) as *const f32, span),
                        strides,
                    },
                }
            });
            // validated in Program::new
            let rows = |op: &Operand| head_rows(op, "").expect("sdpa operand layout");
            let rows = attention::SdpaRows {
                q: rows(q),
                k: rows(k),
                v: rows(v),
                out: rows(out),
            };
            let (b, h) = (s.b, s.h);
            attention::sdpa_f32_rows(
                &s,
                &rows,
                f.span(q, rows.q.span(b, h, s.tq, s.d)),
                f.span(k, rows.k.span(b, s.hk, s.tk, s.d)),
                f.span(v, rows.v.span(b, s.hk, s.tk, s.dv)),
                mask_data,
                *causal,
                *scale as f32,
                f.span_mut(out, rows.out.span(b, h, s.tq, s.dv)),
                lse.as_ref().map(|l| f.slice_mut(l)),
            );
        }
        Instr::Conv2d {
            input,
            weight,
            weight_taps,
            bias,
            out,
            stride,
            padding,
            dilation,
            groups,
            transposed,
            output_padding,
            epilogue,
        } => {
            let (n, c_in, h, w) = (
                input.shape[0],
                input.shape[1],
                input.shape[2],
                input.shape[3],
            );
            let (c_out, h_out, w_out) = (out.shape[1], out.shape[2], out.shape[3]);
            let (kh, kw) = (weight.shape[2], weight.shape[3]);
            macro_rules! run_conv {
                ($t:ty) => {{
                    let b = bias.as_ref().map(|b| f.slice::<$t>(b));
                    if *transposed {
                        let s = conv::ConvTranspose2dShape {
                            n,
                            c_in,
                            h,
                            w,
                            c_out,
                            kh,
                            kw,
                            stride: *stride,
                            padding: *padding,
                            dilation: *dilation,
                            groups: *groups,
                            h_out,
                            w_out,
                            output_padding: *output_padding,
                        };
                        conv::conv_transpose2d::<$t>(
                            &s,
                            f.slice(input),
                            f.slice(weight),
                            b,
                            f.slice_mut(out),
                        );
                    } else {
                        let s =
                            conv2d_shape(input, weight, out, *stride, *padding, *dilation, *groups);
                        let epilogue = epilogue.as_deref();
                        let norm = epilogue.and_then(|e| e.norm.as_ref()).map(|nm| {
                            let (s, t) = batch_norm_scale_shift(f, nm, c_out);
                            let cast = |v: Vec<f64>| v.into_iter().map(|x| x as $t).collect();
                            (cast(s), cast(t))
                        });
                        let epi = conv::Epilogue {
                            scale_shift: norm
                                .as_ref()
                                .map(|(s, t): &(Vec<$t>, Vec<$t>)| (&s[..], &t[..])),
                            residual: epilogue
                                .and_then(|e| e.residual.as_ref())
                                .map(|r| f.slice::<$t>(r)),
                            relu: epilogue.is_some_and(|e| e.relu),
                        };
                        match weight_taps {
                            Some(t) => conv_shifted::conv2d_shifted_with::<$t>(
                                &s,
                                f.slice(input),
                                f.slice(t),
                                b,
                                f.slice_mut(out),
                                &epi,
                            ),
                            None => conv::conv2d_with::<$t>(
                                &s,
                                f.slice(input),
                                f.slice(weight),
                                b,
                                f.slice_mut(out),
                                &epi,
                            ),
                        }
                    }
                }};
            }
            match input.dtype {
                DType::F64 => run_conv!(f64),
                _ => run_conv!(f32),
            }
        }
        Instr::MaxPool2d {
            input,
            out,
            indices,
            kernel,
            stride,
            padding,
            dilation,
        } => {
            let s = pool_shape(input, out, *kernel, *stride, *padding, *dilation);
            let idx = indices.as_ref().map(|i| f.slice_mut::<i64>(i));
            match input.dtype {
                DType::F64 => pool::max_pool2d::<f64>(&s, f.slice(input), f.slice_mut(out), idx),
                _ => pool::max_pool2d::<f32>(&s, f.slice(input), f.slice_mut(out), idx),
            }
        }
        Instr::AvgPool2d {
            input,
            out,
            kernel,
            stride,
            padding,
            count_include_pad,
            divisor_override,
        } => {
            let s = pool_shape(input, out, *kernel, *stride, *padding, [1, 1]);
            match input.dtype {
                DType::F64 => pool::avg_pool2d::<f64>(
                    &s,
                    *count_include_pad,
                    *divisor_override,
                    f.slice(input),
                    f.slice_mut(out),
                ),
                _ => pool::avg_pool2d::<f32>(
                    &s,
                    *count_include_pad,
                    *divisor_override,
                    f.slice(input),
                    f.slice_mut(out),
                ),
            }
        }
        Instr::AdaptiveAvgPool2d { input, out } => {
            let planes = input.shape[0] * input.shape[1];
            let (h, w, ho, wo) = (input.shape[2], input.shape[3], out.shape[2], out.shape[3]);
            match input.dtype {
                DType::F64 => pool::adaptive_avg_pool2d::<f64>(
                    planes,
                    h,
                    w,
                    ho,
                    wo,
                    f.slice(input),
                    f.slice_mut(out),
                ),
                _ => pool::adaptive_avg_pool2d::<f32>(
                    planes,
                    h,
                    w,
                    ho,
                    wo,
                    f.slice(input),
                    f.slice_mut(out),
                ),
            }
        }
        Instr::IndexSelect {
            input,
            index,
            out,
            dim,
        } => {
            let (shape, dim) = if input.shape.is_empty() {
                (vec![1], 0)
            } else {
                (input.shape.clone(), *dim)
            };
            index::index_select(
                &f.view(input),
                &shape,
                dim,
                &f.view(index),
                index.shape[0],
                &f.view(out),
            )?;
        }
        Instr::Gather {
            input,
            index,
            out,
            dim,
        } => {
            index::gather(
                &f.view(input),
                &input.shape,
                &f.view(index),
                &f.view(out),
                &out.shape,
                *dim,
            )?;
        }
        Instr::Index {
            input,
            indices,
            out,
            first,
        } => {
            let iv: Vec<View> = indices.iter().map(|i| f.view(i)).collect();
            index::advanced_index(
                &f.view(input),
                &input.shape,
                &iv,
                &indices[0].shape,
                *first,
                &f.view(out),
            )?;
        }
        Instr::Scatter {
            out,
            index,
            src,
            dim,
            accumulate,
        } => {
            index::scatter(
                &f.view(out),
                &out.shape,
                &f.view(index),
                &f.view(src),
                &index.shape,
                *dim,
                *accumulate,
            )?;
        }
        Instr::IndexPut {
            out,
            indices,
            values,
            accumulate,
        } => {
            let iv: Vec<View> = indices.iter().map(|i| f.view(i)).collect();
            index::index_put(
                &f.view(out),
                &out.shape,
                &iv,
                &indices[0].shape,
                &f.view(values),
                *accumulate,
            )?;
        }
    }
    Ok(())
}

fn pool_shape(
    input: &Operand,
    out: &Operand,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
) -> pool::Pool2dShape {
    pool::Pool2dShape {
        planes: input.shape[0] * input.shape[1],
        h: input.shape[2],
        w: input.shape[3],
        kh: kernel[0],
        kw: kernel[1],
        stride,
        padding,
        dilation,
        h_out: out.shape[2],
        w_out: out.shape[3],
    }
}
