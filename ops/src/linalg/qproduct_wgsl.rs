//! The WGSL integer matrix product behind every 8-bit product and convolution on the
//! GPU (MatMulInteger, QLinearMatMul, MatMulIntegerToFloat, QGemm,
//! DynamicQuantizeMatMul, ConvInteger, QLinearConv).
//!
//! Three dispatches. Two pack the operands: each row of A ([M, K]) and each column of
//! B ([K, N]) becomes K/4 words of four bytes along K (zeros past K) and the sum of its
//! bytes. Where one operand is unsigned and the other signed, the unsigned one is
//! packed as `byte - 128` so both are signed. The product then runs `dot4I8Packed`
//! (or `dot4U8Packed` for two unsigned operands) over the words: WGSL's
//! `packed_4x8_integer_dot_product`, which naga turns into the hardware's dot-product
//! instruction where the adapter has one (SPIR-V `DotProduct`) and into exact shifts
//! and multiplies where it does not. The zero points and the -128 shifts come back
//! through the sums: with `a = a' + ca`, `b = b' + cb`,
//! `Σ(a - za)(b - zb) = Σa'b' + (cb - zb)·Σa' + (ca - za)·Σb' + K·(ca - za)(cb - zb)`,
//! all in wrapping i32 arithmetic, the CPU's.
//!
//! What an operand is comes from its caller as a WGSL function `raw(pb, r, k)` (its
//! integer at row `r`, depth `k` of packed matrix `pb`): a strided read for products,
//! a quantizing read for DynamicQuantizeMatMul, an im2col read that yields the zero
//! point in the padding for convolutions.
use crate::wgsl::{self, Binding, Dispatch};
use crate::{OpError, Result};
use std::fmt::Write;

/// A storage buffer of a dispatch: name, WGSL element type, what it binds. Inputs are
/// read-only, the rest read-write.
pub(crate) type Buffer = (String, &'static str, Binding);

/// One operand: `rows` rows (A's M, B's N) of K integers, in `batches` matrices.
pub(crate) struct IntOperand {
    pub rows: usize,
    pub batches: usize,
    /// WGSL expression of the matrix (0..batches) that output batch `bi` uses.
    pub batch_of: String,
    /// What `raw` reads, and WGSL defining `fn raw(pb: u32, r: u32, k: u32) -> i32`, an
    /// 8-bit value (in -128..=127 when `signed`, else 0..=255).
    pub buffers: Vec<Buffer>,
    pub helpers: String,
    pub signed: bool,
    /// i32 expression of the zero point of output element (`bi`, `m`, `n`, `i`).
    pub zero: String,
}

impl IntOperand {
    /// The matrices of an operand whose batch offsets are `strides` over the output's
    /// batch dims: one when it is broadcast over all of them.
    pub fn batching(batch_count: usize, strides: &[usize]) -> (usize, String) {
        if strides.iter().all(|&s| s == 0) {
            (1, "0u".into())
        } else {
            (batch_count, "bi".into())
        }
    }
}

/// A product of output `[batch, m, n]` (element `i = (bi·m + m)·n + n`).
pub(crate) struct IntProduct<'a> {
    pub label: &'a str,
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: IntOperand,
    pub b: IntOperand,
    /// Buffers of the product dispatch besides the packed operands (zero points,
    /// scales, the output) and its extra WGSL functions.
    pub buffers: Vec<Buffer>,
    pub helpers: String,
    /// Statements before the zero points and the epilogue (they may read `i`, `bi`,
    /// `m`, `n`).
    pub prelude: String,
    /// Statements storing output `i` from the exact sum `s`.
    pub epilogue: String,
    /// The first scratch buffer the packed operands may take (earlier ones are the
    /// caller's).
    pub scratch: usize,
}

/// A dispatch of `n` invocations over `buffers`.
fn kernel(label: &str, n: usize, wg: u32, buffers: &[Buffer], helpers: &str, body: &str) -> Dispatch {
    let decl: Vec<(&str, &str, bool)> = buffers.iter().map(|(nm, t, b)| (nm.as_str(), *t, matches!(b, Binding::Input(_)))).collect();
    wgsl::simple_kernel(label, n, wg, &decl, buffers.iter().map(|b| b.2).collect(), helpers, body)
}

impl IntProduct<'_> {
    /// Words per packed row.
    fn words(&self) -> usize {
        self.k.div_ceil(4)
    }

    /// The dispatches (pack A, pack B, product) and the sizes in bytes of the scratch
    /// buffers they add from `self.scratch` on.
    pub fn program(&self, wg: u32) -> Result<(Vec<Dispatch>, Vec<u64>)> {
        let words = self.words();
        if words > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("{} with K = {} on the GPU (at most {})", self.label, self.k, 4 * wgsl::MAX_LOOP_ITERATIONS)));
        }
        // Both unsigned: dot4U8Packed. Else the unsigned one (if any) is shifted.
        let unsigned = !self.a.signed && !self.b.signed;
        let shift = |o: &IntOperand| !unsigned && !o.signed;
        let ops = [(&self.a, "A", self.m), (&self.b, "B", self.n)];
        let mut dispatches = vec![];
        let mut sizes = vec![];
        for (o, (op, name, rows)) in ops.iter().enumerate() {
            debug_assert_eq!(op.rows, *rows);
            let count = op.batches * op.rows;
            sizes.push(4 * (count * (words + 1)) as u64);
            let mut buffers = op.buffers.clone();
            buffers.push(("packed".into(), "u32", Binding::Scratch(self.scratch + o)));
            let value = if shift(op) { "raw(pb, r, k) - 128i" } else { "raw(pb, r, k)" };
            let mut body = format!("let r = i % {rows}u;\n    let pb = i / {rows}u;\n    var sum = 0i;\n    for (var w = 0u; w < {words}u; w++) {{\n        var word = 0u;\n");
            for j in 0..4 {
                let _ = writeln!(body, "        {{ let k = w * 4u + {j}u; if (k < {}u) {{ let v = {value}; sum += v; word |= (bitcast<u32>(v) & 0xffu) << {}u; }} }}", self.k, 8 * j);
            }
            let _ = write!(body, "        packed[i * {words}u + w] = word;\n    }}\n    packed[{} + i] = bitcast<u32>(sum);", count * words);
            dispatches.push(kernel(&format!("{} pack {name}", self.label), count, wg, &buffers, &op.helpers, &body));
        }
        let (m, n) = (self.m.max(1), self.n.max(1));
        let (ca, cb) = (if shift(&self.a) { 128 } else { 0 }, if shift(&self.b) { 128 } else { 0 });
        let dot = if unsigned { "bitcast<i32>(dot4U8Packed(pa[ra + w], pb[rb + w]))" } else { "dot4I8Packed(pa[ra + w], pb[rb + w])" };
        let mut buffers = vec![("pa".to_string(), "u32", Binding::Scratch(self.scratch)), ("pb".to_string(), "u32", Binding::Scratch(self.scratch + 1))];
        buffers.extend(self.buffers.iter().cloned());
        let body = format!(
            "let n = i % {n}u;\n    let m = (i / {n}u) % {m}u;\n    let bi = i / {mn}u;\n\
             \x20   let ia = ({ba}) * {m}u + m;\n    let ib = ({bb}) * {n}u + n;\n\
             \x20   let ra = ia * {words}u;\n    let rb = ib * {words}u;\n    var s = 0i;\n\
             \x20   for (var w = 0u; w < {words}u; w++) {{ s += {dot}; }}\n    {prelude}\n\
             \x20   let ea = {ca}i - ({za});\n    let eb = {cb}i - ({zb});\n\
             \x20   s += eb * bitcast<i32>(pa[{sa} + ia]) + ea * bitcast<i32>(pb[{sb} + ib]) + {k}i * ea * eb;\n    {{ {epilogue} }}",
            mn = m * n,
            ba = self.a.batch_of,
            bb = self.b.batch_of,
            prelude = self.prelude,
            za = self.a.zero,
            zb = self.b.zero,
            sa = self.a.batches * self.a.rows * words,
            sb = self.b.batches * self.b.rows * words,
            k = self.k,
            epilogue = self.epilogue,
        );
        dispatches.push(kernel(self.label, self.batch * self.m * self.n, wg, &buffers, &self.helpers, &body));
        Ok((dispatches, sizes))
    }
}

/// The `raw` function of a strided operand stored in buffer `name`: matrix `pb` starts
/// at `{name}_batch(pb)` (a function the caller defines), row `r` at `r * rs`, depth
/// `k` at `k * cs`.
pub(crate) fn strided_raw(name: &str, rs: usize, cs: usize) -> String {
    format!("fn raw(pb: u32, r: u32, k: u32) -> i32 {{ return i32({name}[{name}_batch(pb) + r * {rs}u + k * {cs}u]); }}\n")
}
