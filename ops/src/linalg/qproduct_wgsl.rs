//! A WGSL integer matrix product over strided operands ([`BatchedProduct`] layouts:
//! transposes and broadcast batches without copies) whose element reads are WGSL
//! expressions: QGemm (transposed operands) and DynamicQuantizeMatMul (A quantized
//! while it is read) build on it. One invocation per output element sums `s` (i32,
//! wrapping like the CPU's) over K, then runs the caller's epilogue.
use super::product::BatchedProduct;
use crate::wgsl::{self, Binding, Dispatch};
use crate::{OpError, Result};

/// What one product kernel reads and how.
pub(super) struct IntProduct<'a> {
    pub label: &'a str,
    pub p: &'a BatchedProduct,
    /// Buffers in binding order (`name`, element type, read-only) and their bindings.
    pub buffers: Vec<(String, &'static str, bool)>,
    pub bindings: Vec<Binding>,
    /// Extra WGSL functions.
    pub helpers: String,
    /// Statements before the loop (they may read `i`, `m`, `n`).
    pub prelude: String,
    /// The i32 value of A's element at index `ia` and of B's at `ib` (zero points
    /// already subtracted).
    pub a_elem: String,
    pub b_elem: String,
    /// Statements storing output `i` from the sum `s` (and `m`, `n`).
    pub epilogue: String,
}

impl IntProduct<'_> {
    pub fn dispatch(&self, workgroup: u32) -> Result<Dispatch> {
        let p = self.p;
        let (m, n, k) = (p.m, p.n, p.k);
        if k > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("{} with K = {k} on the GPU (at most {})", self.label, wgsl::MAX_LOOP_ITERATIONS)));
        }
        let helpers = format!(
            "{}{}{}",
            self.helpers,
            wgsl::offset_fn("a_batch", &p.batch, &p.a_batch_strides),
            wgsl::offset_fn("b_batch", &p.batch, &p.b_batch_strides)
        );
        let decl: Vec<(&str, &str, bool)> = self.buffers.iter().map(|(nm, t, r)| (nm.as_str(), *t, *r)).collect();
        let body = format!(
            "let n = i % {n}u;\n    let m = (i / {n}u) % {m}u;\n    let bi = i / {mn}u;\n\
             \x20   let oa = a_batch(bi) + m * {ars}u;\n    let ob = b_batch(bi) + n * {bcs}u;\n    {}\n    var s = 0i;\n\
             \x20   for (var kk = 0u; kk < {k}u; kk++) {{\n        let ia = oa + kk * {acs}u;\n        let ib = ob + kk * {brs}u;\n        s += ({}) * ({});\n    }}\n    {}",
            self.prelude,
            self.a_elem,
            self.b_elem,
            self.epilogue,
            n = n.max(1),
            m = m.max(1),
            mn = (m * n).max(1),
            ars = p.a.rs,
            acs = p.a.cs,
            brs = p.b.rs,
            bcs = p.b.cs,
        );
        Ok(wgsl::simple_kernel(self.label, p.batch_count() * m * n, workgroup, &decl, self.bindings.clone(), &helpers, &body))
    }
}
