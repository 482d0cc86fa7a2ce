//! Matrices in GGUF's tensor types, computed in as stored: the weights stay the file's bytes (mapped,
//! not copied, when the caller lends them) and each product dequantizes in registers.
//!
//! - [`blocks`]: the types, their block layouts and the decoder every path is checked against;
//! - [`acts`]: activation rows quantized the way each type's products take them;
//! - [`dequant`]: rows to f32 at speed (prompts dequantize each row once);
//! - [`dot`]: the portable row products (the baseline path);
//! - `dot_avx2`: the AVX2 row products (also run at the AVX-512 level);
//! - `dot_tokens`: the 32-element types' row products against several tokens at once;
//! - [`interleaved`]: Q4_0, Q4_1 and Q8_0 regrouped sixteen rows to a register, and
//!   `dot_interleaved`, their products against one or several tokens (x86), and
//!   `prompt_interleaved`, against a prompt's f32 tokens;
//! - [`kprefill`]: the K-quants' products with many tokens (a prompt) in integers.

pub mod acts;
pub mod blocks;
pub mod dequant;
pub mod dot;
#[cfg(target_arch = "x86_64")]
pub mod dot_avx2;
#[cfg(target_arch = "x86_64")]
pub mod dot_interleaved;
#[cfg(target_arch = "x86_64")]
pub mod dot_tokens;
pub mod interleaved;
pub mod kprefill;
#[cfg(target_arch = "x86_64")]
pub mod prompt_interleaved;

use std::any::Any;
use std::ops::Range;

pub use blocks::GgmlType;

use super::row_blocks::par_rows_tokens;

/// Bytes a matrix reads: its own, or memory lent by an owner (a mapped file) kept alive with them.
pub struct WeightBytes {
    ptr: *const u8,
    len: usize,
    _owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: the bytes are never written after construction, and the owner is Send + Sync
unsafe impl Send for WeightBytes {}
unsafe impl Sync for WeightBytes {}

impl WeightBytes {
    pub fn owned(bytes: Vec<u8>) -> WeightBytes {
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        // moving the Vec into the box moves its header, not its heap buffer
        WeightBytes {
            ptr,
            len,
            _owner: Box::new(bytes),
        }
    }

    /// `len` bytes at `ptr`, which stay valid and unchanged while `owner` lives.
    ///
    /// # Safety
    /// As stated: `owner` must keep `ptr..ptr + len` readable and unwritten until it is dropped.
    pub unsafe fn lent(
        ptr: *const u8,
        len: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> WeightBytes {
        WeightBytes {
            ptr,
            len,
            _owner: owner,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: see the constructors
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A weight matrix `[n, k]` stored row after row as GGUF type `kind`, its rows optionally read in
/// another order (row `r` is stored row `order[r]`: llama.cpp stores Llama's q and k projections with
/// each head's rows interleaved for its rotary pairing, and reading them back in order costs nothing).
pub struct GgmlMatrix {
    pub kind: GgmlType,
    pub n: usize,
    pub k: usize,
    storage: Storage,
    order: Option<Vec<u32>>,
}

/// How a matrix holds its weights.
enum Storage {
    /// row after row, as the file stores them
    Rows(WeightBytes),
    /// regrouped for the x86 kernels (see [`interleaved`]); rows already in their reading order
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Interleaved(interleaved::Interleaved),
}

impl GgmlMatrix {
    /// Checks that `bytes` hold exactly `n` rows of `k` elements of `kind`.
    pub fn new(
        kind: GgmlType,
        n: usize,
        k: usize,
        bytes: WeightBytes,
    ) -> Result<GgmlMatrix, String> {
        if n == 0 || k == 0 {
            return Err(format!(
                "a {} matrix needs rows and columns, got {n}x{k}",
                kind.name()
            ));
        }
        let block = kind.block_len().max(acts::act_form(kind).block());
        if !k.is_multiple_of(block) {
            return Err(format!(
                "{} rows are whole blocks of {block} elements; a row of {k} is not",
                kind.name()
            ));
        }
        let want = n
            .checked_mul(kind.row_bytes(k))
            .ok_or_else(|| format!("{n}x{k} {} is too large", kind.name()))?;
        if bytes.len != want {
            return Err(format!(
                "{n}x{k} {} takes {want} bytes, got {}",
                kind.name(),
                bytes.len
            ));
        }
        Ok(GgmlMatrix {
            kind,
            n,
            k,
            storage: Storage::Rows(bytes),
            order: None,
        })
    }

    /// The same matrix with row `r` read from stored row `order[r]` (`order` a permutation of `0..n`).
    pub fn with_row_order(mut self, order: Vec<u32>) -> Result<GgmlMatrix, String> {
        let mut seen = vec![false; self.n];
        for &r in &order {
            match seen.get_mut(r as usize) {
                Some(s) if !*s => *s = true,
                _ => {
                    return Err(format!(
                        "a row order must be a permutation of 0..{}",
                        self.n
                    ))
                }
            }
        }
        if order.len() != self.n {
            return Err(format!(
                "a row order must be a permutation of 0..{}",
                self.n
            ));
        }
        self.order = Some(order);
        Ok(self)
    }

    /// The same matrix regrouped for the x86 kernels where the running level has them for its
    /// type (see [`interleaved`]): the weights move into memory of their own, the same bytes in
    /// another order, and the lent ones are let go. Unchanged otherwise.
    pub fn interleaved_for_this_cpu(self) -> GgmlMatrix {
        #[cfg(target_arch = "x86_64")]
        if dot_interleaved::takes(self.kind) {
            let packed = interleaved::Interleaved::pack(self.kind, self.n, self.k, |r| self.row(r));
            return GgmlMatrix {
                kind: self.kind,
                n: self.n,
                k: self.k,
                storage: Storage::Interleaved(packed),
                order: None,
            };
        }
        self
    }

    /// [`GgmlMatrix::interleaved_for_this_cpu`] for weights lent from a read-only file mapping: once
    /// regrouped, the lent range's whole pages are handed back to the kernel (`MADV_DONTNEED`: a
    /// file page read again comes back from the file), so that a loaded model holds its weights once,
    /// not as the file's pages and their regrouped copy.
    ///
    /// # Safety
    /// The lent bytes must be a view of a read-only file mapping (never of anonymous memory, whose
    /// pages `MADV_DONTNEED` would zero).
    pub unsafe fn interleaved_from_file(self) -> GgmlMatrix {
        let lent = match &self.storage {
            Storage::Rows(bytes) => (bytes.ptr as usize, bytes.len),
            Storage::Interleaved(_) => return self,
        };
        let m = self.interleaved_for_this_cpu();
        if m.is_interleaved() {
            release_pages(lent.0, lent.1);
        }
        m
    }

    /// Whether the weights are regrouped (see [`GgmlMatrix::interleaved_for_this_cpu`]).
    /// Whether products of several tokens with this matrix read them in pairs
    /// ([`acts::PairedGroup`]): the stored rows of the types the pair kernels take, from AVX2 up.
    pub fn reads_pairs(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            !self.is_interleaved() && crate::isa::avx2() && dot_tokens::takes(self.kind)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    pub fn is_interleaved(&self) -> bool {
        matches!(self.storage, Storage::Interleaved(_))
    }

    /// The regrouped weights, where they are (see [`GgmlMatrix::interleaved_for_this_cpu`]).
    pub fn interleaved(&self) -> Option<&interleaved::Interleaved> {
        match &self.storage {
            Storage::Interleaved(m) => Some(m),
            Storage::Rows(_) => None,
        }
    }

    /// Bytes the weights take.
    pub fn nbytes(&self) -> usize {
        match &self.storage {
            Storage::Rows(bytes) => bytes.len,
            Storage::Interleaved(m) => m.nbytes(),
        }
    }

    /// Row `r`'s bytes, of a matrix stored row after row (a regrouped one has no row of its own:
    /// see [`GgmlMatrix::dequantize_rows`]).
    pub fn row(&self, r: usize) -> &[u8] {
        let Storage::Rows(bytes) = &self.storage else {
            panic!("a regrouped matrix has no stored rows");
        };
        let r = self.order.as_ref().map_or(r, |o| o[r] as usize);
        let len = self.kind.row_bytes(self.k);
        &bytes.as_slice()[r * len..(r + 1) * len]
    }

    /// Rows `rows` as f32, `[rows.len(), k]` into `out`.
    pub fn dequantize_rows(&self, rows: Range<usize>, out: &mut [f32]) {
        assert!(rows.end <= self.n, "rows out of range");
        assert_eq!(out.len(), rows.len() * self.k, "output length");
        if let Storage::Interleaved(m) = &self.storage {
            return m.dequantize_rows(rows, out);
        }
        for (r, dst) in rows.zip(out.chunks_exact_mut(self.k)) {
            dequant::dequantize_row_fast(self.kind, self.row(r), dst);
        }
    }

    /// Row `r` times activations `a` (made by [`acts::quantize_for`] for this matrix's type), on
    /// the best path the ISA level allows.
    pub fn row_dot(&self, r: usize, a: &acts::Acts) -> f32 {
        let mut out = [0f32];
        self.rows_into(r..r + 1, a, &mut out);
        out[0]
    }

    /// Rows `rows` times activations `a` into `out` (one value per row), on the best path the ISA
    /// level allows: the type is dispatched once for the range.
    pub fn rows_into(&self, rows: Range<usize>, a: &acts::Acts, out: &mut [f32]) {
        assert!(rows.end <= self.n, "rows out of range");
        assert_eq!(out.len(), rows.len(), "output length");
        assert_eq!(
            a.form,
            acts::act_form(self.kind),
            "activations in the weights' form"
        );
        #[cfg(target_arch = "x86_64")]
        if let Storage::Interleaved(m) = &self.storage {
            return dot_interleaved::rows_tokens(m, rows, std::slice::from_ref(a), out);
        }
        #[cfg(target_arch = "x86_64")]
        if crate::isa::avx2() {
            // SAFETY: the CPU has AVX2, FMA and F16C (the level includes them), and AVX-512 VNNI where
            // that copy runs; `a` is a whole row's activations in the type's form (checked above)
            unsafe {
                if crate::isa::avx512() && vnni() {
                    dot_avx2::rows_dot_vnni(self, rows, a, out);
                } else {
                    dot_avx2::rows_dot(self, rows, a, out);
                }
            }
            return;
        }
        for (o, r) in out.iter_mut().zip(rows) {
            *o = dot::row_dot(self.kind, self.row(r), a);
        }
    }

    /// Bytes one row takes (what a product reads per row).
    pub fn row_bytes(&self) -> usize {
        self.kind.row_bytes(self.k)
    }

    /// Rows `rows` against each of several activation rows: `out[t · rows.len() + i]` is row
    /// `rows.start + i` times token `t`, the value [`GgmlMatrix::rows_into`] gives. Every token runs
    /// over the rows before the caller's next block of them, which it keeps small enough to stay in
    /// cache (see [`crate::kernels::row_blocks`]); the 32-element types decode each block of weights once for all
    /// the tokens (`dot_tokens`).
    pub fn rows_tokens_into(&self, rows: Range<usize>, acts: &acts::TokenActs, out: &mut [f32]) {
        let len = rows.len();
        assert!(rows.end <= self.n, "rows out of range");
        assert_eq!(out.len(), acts.rows.len() * len, "output length");
        assert_eq!(
            acts.form,
            acts::act_form(self.kind),
            "activations in the weights' form"
        );
        #[cfg(target_arch = "x86_64")]
        if let Storage::Interleaved(m) = &self.storage {
            return dot_interleaved::rows_tokens(m, rows, &acts.rows, out);
        }
        #[cfg(target_arch = "x86_64")]
        if crate::isa::avx2() && dot_tokens::takes(self.kind) && !acts.groups.is_empty() {
            // SAFETY: the CPU has what each kernel names (the levels include AVX2, FMA and F16C;
            // VNNI checked); the type is one they take, `acts` is in its form, paired, and `out` is
            // as long as they write (checked above)
            unsafe {
                if crate::isa::avx512() && vnni() {
                    dot_tokens::rows_tokens_zmm_vnni(self, rows, acts, out);
                } else if crate::isa::avx512() {
                    dot_tokens::rows_tokens_zmm(self, rows, acts, out);
                } else {
                    dot_tokens::rows_tokens_ymm(self, rows, acts, out);
                }
            }
            return;
        }
        for (a, dst) in acts.rows.iter().zip(out.chunks_exact_mut(len.max(1))) {
            self.rows_into(rows.clone(), a, dst);
        }
    }

    /// `out[t·n + r] = Σ_j x[t·k + j] · W[r, j]` for `t` in `0..tokens`, rows split between threads.
    pub fn matmul(&self, x: &[f32], tokens: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        assert_eq!(x.len(), tokens * k, "input length");
        assert_eq!(out.len(), tokens * n, "output length");
        if tokens >= super::qprefill::MIN_TOKENS {
            // many tokens against the same rows: dequantized rows times f32 tokens (see `qprefill`)
            return super::qprefill::matmul_sources(&[self], x, tokens, &mut [out]);
        }
        let form = acts::act_form(self.kind);
        let quantized = acts::TokenActs::quantize_rows(form, x, tokens, self.reads_pairs());
        par_rows_tokens(n, self.row_bytes(), tokens, out, |rows, got| {
            self.rows_tokens_into(rows, &quantized, got)
        });
    }
}

/// Hands the whole pages inside `start..start + len` back to the kernel.
///
/// # Safety
/// The range must be a read-only file mapping that nothing reads again but through the mapping.
unsafe fn release_pages(start: usize, len: usize) {
    #[cfg(unix)]
    {
        let page = match libc::sysconf(libc::_SC_PAGESIZE) {
            p if p > 0 => p as usize,
            _ => return,
        };
        let lo = start.next_multiple_of(page);
        let hi = (start + len) / page * page;
        if hi > lo {
            // a hint: if the kernel refuses it, the pages stay (memory, not correctness)
            libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED);
        }
    }
    #[cfg(not(unix))]
    let _ = (start, len);
}

/// Whether the CPU has AVX-512 VNNI (with VL, which the 256-bit `vpdpbusd` needs).
#[cfg(target_arch = "x86_64")]
fn vnni() -> bool {
    use std::sync::OnceLock;
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
    })
}

#[cfg(test)]
pub(crate) mod tests;
