//! MatMulNBits (com.microsoft; attributes `K`, `N`, `bits` (2, 4 or 8), `block_size` (a
//! power of two, at least 16), `accuracy_level`): `Y = A x dequantize(B)^T + bias` with
//! B's `N x K` weights quantized in blocks of `block_size` along K. Inputs: `A` (f32,
//! `[..., K]`), `B` (uint8 `[N, k_blocks, block_size * bits / 8]`, codes packed low bits
//! first), `scales` (f32, `N * k_blocks`), `zero_points` (optional: uint8 packed like B,
//! `N * ceil(k_blocks * bits / 8)`, or f32 `N * k_blocks`; default `2^(bits-1)`), `g_idx`
//! (optional, int32 `[K]`: the block whose scale and zero point serve column k) and
//! `bias` (optional, f32 `[N]`). A weight is `(code - zero_point) * scale`.
//!
//! Arithmetic, as onnxruntime's CPU kernels: with `accuracy_level` 4 (int8 compute) and
//! integer zero points (and no g_idx), A is quantized per block of K as MLAS does it
//! (`scale = max|a| / 127`, `q = round_half_even(a * (127 / max|a|))`), each block's dot
//! product of the integer codes is exact, and the blocks add up in f32 scaled by
//! `a_scale * b_scale` — within ~1e-6 of onnxruntime, where an f32 product would differ
//! by ~1e-2. Otherwise the weights are dequantized and multiplied in f32 (summation
//! order differs from MLAS's: agreement to f32 rounding, not bit for bit). onnxruntime
//! applies int8 compute only to constant weights; here it follows the attribute alone.
//! onnxruntime 1.32 ignores packed uint8 zero points when `g_idx` is given (it uses the
//! default); this kernel applies them, as the operator's definition says.
use super::product::{BatchedProduct, Layout};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::quant::qlinear::MS_DOMAIN;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

#[derive(Debug, Clone)]
pub struct MatMulNBits {
    k: usize,
    n: usize,
    bits: usize,
    block_size: usize,
    accuracy_level: i64,
}

/// The weights ready for a product: dequantized f32 `[N, K]`, or for int8 compute the
/// shifted codes `[N, blocks * block_size]` (0 past K) and the scales `[N, blocks]`.
enum Weights {
    F32(Vec<f32>),
    Int8 { codes: Vec<i16>, scales: Vec<f32> },
}

impl MatMulNBits {
    fn parse(spec: &NodeSpec) -> Result<MatMulNBits> {
        let get = |name: &str| -> Result<usize> {
            let v = spec.int_opt(name)?.ok_or_else(|| spec.bad(name, "is required"))?;
            usize::try_from(v).map_err(|_| spec.bad(name, format!("must not be negative, got {v}")))
        };
        let (k, n, block_size) = (get("K")?, get("N")?, get("block_size")?);
        let bits = spec.int("bits", 4)?;
        if ![2, 4, 8].contains(&bits) {
            return Err(spec.bad("bits", format!("{bits} bits are not supported (2, 4 or 8)")));
        }
        if block_size < 16 || !block_size.is_power_of_two() {
            return Err(spec.bad("block_size", format!("must be a power of two and at least 16, got {block_size}")));
        }
        if spec.int("weight_prepacked", 0)? != 0 {
            return Err(OpError::Unsupported("MatMulNBits with weights prepacked for another execution provider (weight_prepacked != 0)".into()));
        }
        Ok(MatMulNBits { k, n, bits: bits as usize, block_size, accuracy_level: spec.int("accuracy_level", 0)? })
    }

    fn blocks(&self) -> usize {
        self.k.div_ceil(self.block_size)
    }

    /// Bytes of one block of codes.
    fn blob(&self) -> usize {
        self.block_size * self.bits / 8
    }

    /// Bytes of one row of packed zero points.
    fn zp_row(&self) -> usize {
        (self.blocks() * self.bits).div_ceil(8)
    }

    /// Whether this node computes as onnxruntime's int8 path: accuracy level 4, integer
    /// (or default) zero points, no g_idx.
    fn int8(&self, zp_is_float: bool, has_g_idx: bool) -> bool {
        self.accuracy_level == 4 && !zp_is_float && !has_g_idx
    }

    /// Code `j` (0-based bit position `j * bits`) of the packed bytes `bytes`.
    #[inline(always)]
    fn code(&self, bytes: &[u8], j: usize) -> i32 {
        let bit = j * self.bits;
        ((bytes[bit / 8] >> (bit % 8)) & ((1u16 << self.bits) - 1) as u8) as i32
    }

    /// The weights from B, the scales, the zero points and g_idx.
    fn weights(&self, b: &Tensor, scales: &Tensor, zp: Option<&Tensor>, g_idx: Option<&Tensor>) -> Result<Weights> {
        let (n, k, nb, bs) = (self.n, self.k, self.blocks(), self.block_size);
        let (bv, sv) = (b.as_slice::<u8>()?, scales.as_slice::<f32>()?);
        let g: Option<Vec<usize>> = match g_idx {
            None => None,
            Some(g) => Some(
                g.as_slice::<i32>()?
                    .iter()
                    .map(|&v| usize::try_from(v).ok().filter(|&v| v < nb).ok_or_else(|| OpError::input(4, format!("g_idx value {v} is not a block index (0 to {})", nb - 1))))
                    .collect::<Result<_>>()?,
            ),
        };
        let default_zp = (1i32 << (self.bits - 1)) as f32;
        // The zero point of (row, block), as f32 (exact for integer ones).
        let zero = |row: usize, blk: usize| -> Result<f32> {
            Ok(match zp {
                None => default_zp,
                Some(z) if z.dtype() == DType::F32 => z.as_slice::<f32>()?[row * nb + blk],
                Some(z) => self.code(&z.as_slice::<u8>()?[row * self.zp_row()..], blk) as f32,
            })
        };
        let zp_float = zp.is_some_and(|z| z.dtype() == DType::F32);
        if self.int8(zp_float, g.is_some()) {
            let mut codes = vec![0i16; n * nb * bs];
            for row in 0..n {
                for blk in 0..nb {
                    let z = zero(row, blk)? as i32;
                    let bytes = &bv[(row * nb + blk) * self.blob()..];
                    for j in 0..bs.min(k - blk * bs) {
                        codes[(row * nb + blk) * bs + j] = (self.code(bytes, j) - z) as i16;
                    }
                }
            }
            return Ok(Weights::Int8 { codes, scales: sv[..n * nb].to_vec() });
        }
        let mut w = vec![0f32; n * k];
        for row in 0..n {
            for kk in 0..k {
                let (blk, j) = (kk / bs, kk % bs);
                let group = g.as_ref().map_or(blk, |g| g[kk]);
                let q = self.code(&bv[(row * nb + blk) * self.blob()..], j) as f32;
                w[row * k + kk] = (q - zero(row, group)?) * sv[row * nb + group];
            }
        }
        Ok(Weights::F32(w))
    }

    /// `y = a x weights^T + bias` for `a` of `rows x K`.
    fn product(&self, a: &[f32], w: &Weights, bias: Option<&[f32]>, y: &mut [f32]) -> Result<()> {
        let (n, k) = (self.n, self.k);
        let rows = y.len() / n.max(1);
        if rows * n == 0 {
            return Ok(());
        }
        let add_bias = |row_block: &mut [f32]| {
            if let Some(b) = bias {
                for r in row_block.chunks_mut(n) {
                    r.iter_mut().zip(b).for_each(|(v, &c)| *v += c);
                }
            }
        };
        match w {
            Weights::F32(w) => {
                let p = BatchedProduct { batch: vec![], a_batch_strides: vec![], b_batch_strides: vec![], m: rows, n, k, a: Layout::row_major(k), b: Layout { rs: 1, cs: k } };
                if k == 0 {
                    y.fill(0.0);
                    add_bias(y);
                    return Ok(());
                }
                p.run_f32_rows(a, w, y, 1.0, &|_, block| add_bias(block))
            }
            Weights::Int8 { codes, scales } => {
                let (nb, bs) = (self.blocks(), self.block_size);
                cpu::par_chunks_mut(y, n, 2 * k.max(1) * n, |first, part| {
                    let mut qa = vec![0i32; nb * bs];
                    let mut sa = vec![0f32; nb];
                    for (r, out) in part.chunks_mut(n).enumerate() {
                        let row = &a[(first + r) * k..][..k];
                        quantize_row(row, bs, &mut qa, &mut sa);
                        for (col, o) in out.iter_mut().enumerate() {
                            let mut acc = 0f32;
                            for blk in 0..nb {
                                let cb = &codes[(col * nb + blk) * bs..][..bs];
                                let dot: i32 = qa[blk * bs..][..bs].iter().zip(cb).map(|(&x, &c)| x * c as i32).sum();
                                acc += dot as f32 * (sa[blk] * scales[col * nb + blk]);
                            }
                            *o = acc;
                        }
                        add_bias(out);
                    }
                });
                Ok(())
            }
        }
    }

    fn run_with(&self, inputs: &[Option<&Tensor>], w: &Weights, out: &mut Tensor) -> Result<()> {
        let a = cpu::input(inputs, 0)?.as_slice::<f32>()?;
        let bias = match inputs.get(5).copied().flatten() {
            Some(b) => Some(b.as_slice::<f32>()?),
            None => None,
        };
        self.product(a, w, bias, out.as_mut_slice::<f32>()?)
    }
}

/// MLAS's int8 quantization of one row of A in blocks of `bs` (zero padded): per block
/// `scale = max|a| / 127` and codes `round_half_even(a * (127 / max|a|))`.
fn quantize_row(row: &[f32], bs: usize, q: &mut [i32], scales: &mut [f32]) {
    q.fill(0);
    for (blk, chunk) in row.chunks(bs).enumerate() {
        let amax = chunk.iter().fold(0f32, |m, &v| m.max(v.abs()));
        scales[blk] = amax / 127.0;
        let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for (o, &v) in q[blk * bs..].iter_mut().zip(chunk) {
            *o = (v * inv).round_ties_even() as i32;
        }
    }
}

/// MatMulNBits with its weights prepared once per plan (constant B, scales, zero points
/// and g_idx).
struct Prepared {
    op: MatMulNBits,
    weights: Weights,
}

impl CpuKernel for Prepared {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        self.op.run_with(inputs, &self.weights, &mut outputs[0])
    }
}

impl Op for MatMulNBits {
    fn name(&self) -> &str {
        "MatMulNBits"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_dtype(inputs, 0, &[DType::F32])?;
        let a = required(inputs, 0)?.dims();
        if a.last() != Some(&self.k) {
            return Err(OpError::input(0, format!("A's last dim must be K = {}, got shape {a:?}", self.k)));
        }
        let (n, nb) = (self.n, self.blocks());
        let len = |i: usize, dtypes: &[DType], want: usize, what: &str| -> Result<()> {
            let Some(t) = inputs.get(i).copied().flatten() else { return Ok(()) };
            expect_dtype(inputs, i, dtypes)?;
            if t.ty.len() != want {
                return Err(OpError::input(i, format!("{what} must have {want} elements, got shape {:?}", t.dims())));
            }
            Ok(())
        };
        required(inputs, 1)?;
        len(1, &[DType::U8], n * nb * self.blob(), &format!("B ([N, k_blocks, blob] = [{n}, {nb}, {}])", self.blob()))?;
        required(inputs, 2)?;
        len(2, &[DType::F32], n * nb, &format!("scales ([N, k_blocks] = [{n}, {nb}])"))?;
        if let Some(z) = inputs.get(3).copied().flatten() {
            match z.dtype() {
                DType::U8 => len(3, &[DType::U8], n * self.zp_row(), &format!("packed zero points ([N, ceil(k_blocks * bits / 8)] = [{n}, {}])", self.zp_row()))?,
                _ => len(3, &[DType::F32], n * nb, &format!("zero points ([N, k_blocks] = [{n}, {nb}])"))?,
            }
        }
        len(4, &[DType::I32], self.k, &format!("g_idx ([K] = [{}])", self.k))?;
        len(5, &[DType::F32], n, &format!("bias ([N] = [{n}])"))?;
        let mut dims = a.to_vec();
        *dims.last_mut().unwrap_or(&mut 0) = n;
        Ok(vec![TensorType::new(DType::F32, dims)])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        Cost { flops: 2 * (outputs[0].len() * self.k) as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for MatMulNBits {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let opt = |i: usize| inputs.get(i).copied().flatten();
        let w = self.weights(cpu::input(inputs, 1)?, cpu::input(inputs, 2)?, opt(3), opt(4))?;
        self.run_with(inputs, &w, &mut outputs[0])
    }

    fn prepare(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], _tune: &TuneValues) -> Result<Option<Box<dyn CpuKernel>>> {
        let value = |i: usize| inputs.get(i).copied().flatten().map(|a| a.value);
        let (Some(Some(b)), Some(Some(s))) = (value(1), value(2)) else { return Ok(None) };
        let (zp, g) = (value(3), value(4));
        if zp == Some(None) || g == Some(None) {
            return Ok(None);
        }
        let weights = self.weights(b, s, zp.flatten(), g.flatten())?;
        Ok(Some(Box::new(Prepared { op: self.clone(), weights })))
    }
}

impl WgslKernel for MatMulNBits {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let opt = |i: usize| inputs.get(i).copied().flatten();
        let (k, n, nb, bs, bits) = (self.k, self.n, self.blocks(), self.block_size, self.bits);
        let zp_float = opt(3).is_some_and(|z| z.dtype() == DType::F32);
        let int8 = self.int8(zp_float, opt(4).is_some());
        let loops = if int8 { 2 * k } else { k };
        if loops > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("MatMulNBits with K = {k} on the GPU (at most {})", wgsl::MAX_LOOP_ITERATIONS / if int8 { 2 } else { 1 })));
        }
        let mut buffers = vec![("a", "f32", true), ("b", "u32", true), ("scales", "f32", true)];
        let mut bindings = vec![Binding::Input(0), Binding::Input(1), Binding::Input(2)];
        let zero = match opt(3) {
            None => wgsl::literal("f32", (1u32 << (bits - 1)) as f64),
            Some(_) if zp_float => {
                buffers.push(("zp", "f32", true));
                bindings.push(Binding::Input(3));
                "zp[n * NB + g]".into()
            }
            Some(_) => {
                buffers.push(("zp", "u32", true));
                bindings.push(Binding::Input(3));
                format!("f32(code(zp[n * {}u + g * BITS / 8u], g))", self.zp_row())
            }
        };
        let group = if opt(4).is_some() {
            buffers.push(("g_idx", "i32", true));
            bindings.push(Binding::Input(4));
            "min(u32(max(g_idx[kk], 0i)), NB - 1u)"
        } else {
            "kk / BS"
        };
        let bias = if opt(5).is_some() {
            buffers.push(("bias", "f32", true));
            bindings.push(Binding::Input(5));
            " + bias[n]"
        } else {
            ""
        };
        buffers.push(("y", "f32", false));
        bindings.push(Binding::Output(0));
        let helpers = format!(
            "const K = {k}u;\nconst N = {}u;\nconst NB = {nb}u;\nconst BS = {bs}u;\nconst BITS = {bits}u;\nconst BLOB = {}u;\n\
             // Code j of a row of packed bytes whose byte holding it is `byte`.\n\
             fn code(byte: u32, j: u32) -> u32 {{ return (byte >> ((j * BITS) % 8u)) & {}u; }}\n\
             fn weight_code(n: u32, kk: u32) -> u32 {{\n    let blk = kk / BS; let j = kk % BS;\n    return code(b[(n * NB + blk) * BLOB + j * BITS / 8u], j);\n}}\n",
            n.max(1),
            self.blob(),
            (1u32 << bits) - 1
        );
        let body = if int8 {
            format!(
                "let n = i % N; let r = i / N;\n    var acc = 0.0;\n\
                 \x20   for (var blk = 0u; blk < NB; blk++) {{\n\
                 \x20       let k0 = blk * BS; let k1 = min(k0 + BS, K); let g = blk;\n\
                 \x20       var amax = 0.0;\n\
                 \x20       for (var kk = k0; kk < k1; kk++) {{ amax = max(amax, abs(a[r * K + kk])); }}\n\
                 \x20       let inv = select(0.0, 127.0 / amax, amax != 0.0);\n\
                 \x20       let z = i32({zero});\n        var dot = 0i;\n\
                 \x20       for (var kk = k0; kk < k1; kk++) {{\n\
                 \x20           dot += i32(round(a[r * K + kk] * inv)) * (i32(weight_code(n, kk)) - z);\n        }}\n\
                 \x20       acc = acc + f32(dot) * ((amax / 127.0) * scales[n * NB + blk]);\n    }}\n\
                 \x20   y[i] = acc{bias};"
            )
        } else {
            format!(
                "let n = i % N; let r = i / N;\n    var acc = 0.0;\n\
                 \x20   for (var kk = 0u; kk < K; kk++) {{\n\
                 \x20       let g = {group};\n\
                 \x20       let w = (f32(weight_code(n, kk)) - {zero}) * scales[n * NB + g];\n\
                 \x20       acc = acc + a[r * K + kk] * w;\n    }}\n\
                 \x20   y[i] = acc{bias};"
            )
        };
        Ok(WgslProgram::single(wgsl::simple_kernel("MatMulNBits", outputs[0].len(), tune.get(&wgsl::workgroup_param()), &buffers, bindings, &helpers, &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "MatMulNBits", |spec| Ok(Box::new(MatMulNBits::parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::quant::qlinear::test_util::*;
    use crate::testing::{compare, Input};
    use kiln_graph::{Attr, Tensor};

    fn floats(dims: &[usize], bits: &[u32]) -> Tensor {
        Tensor::from_vec(dims, bits.iter().map(|&b| f32::from_bits(b)).collect()).unwrap()
    }

    fn nbits(attrs: &[(&str, Attr)], a: Tensor, b: Tensor, scales: Tensor, zp: Option<Tensor>, bias: Option<Tensor>) -> Tensor {
        let opt = |t: Option<Tensor>| t.map_or(Input::Omitted, Input::Const);
        let c = ms("MatMulNBits").attrs(attrs).input(a).constant(b).constant(scales).inputs([opt(zp), Input::Omitted, opt(bias)]);
        // The CPU kernel as a plan runs it (weights prepared once) and as it is.
        let prepared = crate::testing::run_cpu_variants(c.op().unwrap().as_ref(), &c.inputs).unwrap();
        let plain = c.run_cpu().unwrap().remove(0);
        for (name, outs) in prepared {
            assert_eq!(outs[0].as_slice::<f32>().unwrap(), plain.as_slice::<f32>().unwrap(), "{name}");
        }
        plain
    }

    /// Within f32 rounding of onnxruntime's result (its summation order is MLAS's own).
    fn close(got: &Tensor, want: &Tensor) {
        compare(got, want, 1e-6).unwrap();
    }

    /// onnxruntime 1.32's outputs for the same inputs (weights constant, as in models).
    #[test]
    fn matches_onnxruntime() {
        // 4-bit, K not a multiple of the block, packed zero points, a bias.
        let y = nbits(
            &[("K", Attr::Int(40)), ("N", Attr::Int(5)), ("bits", Attr::Int(4)), ("block_size", Attr::Int(16)), ("accuracy_level", Attr::Int(0))],
            floats(&[3, 40], &[0x3ea59f35, 0x3f6adf3a, 0xbf0ab10f, 0xbf43aaf3, 0xbf8037ad, 0x3f48bd01, 0x3fcff740, 0x3dae14a1, 0xbffd4325, 0xbf023a47, 0x3eef9da1, 0x3e981323, 0x3dbfed69, 0x3f7d22d7, 0x3f6d37aa, 0xbfab9e8a, 0x3ede9034, 0xbf3d58b9, 0x3e6e6b74, 0x3f9f38c4, 0x3fea6a7e, 0x3f33330d, 0xbf01704b, 0xbeb3d83b, 0x3f087770, 0xbf7ce9cb, 0xbd8a9139, 0x3f1adcdb, 0x3f6b22c1, 0xbe9818a5, 0x3ebd555d, 0x3fae672a, 0x3e9c49ee, 0xbfdbb229, 0x3e5b7815, 0x3e80bb52, 0xbed7c570, 0x3d300d98, 0xbfbcf78a, 0x3f9f8000, 0x3ed7d690, 0xbf0b2472, 0x3e714489, 0x3e07a65f, 0xbf5d1c04, 0xc02ab321, 0xc0363c7e, 0x4001655e, 0xbf8f4260, 0xbe96bd6e, 0x3f12502b, 0xbeb93a87, 0x3f988985, 0xbf72dc03, 0x3f101937, 0xc00592fc, 0x3f36fc74, 0x3f300d6e, 0x3ebbe24b, 0x3e9a3434, 0x3e895d72, 0x3f5d3639, 0x3f76634c, 0xbf71c30d, 0x3f875c18, 0xbf7293d4, 0x3e2890a0, 0xbe8162bd, 0x3ef60d19, 0xbea9f581, 0x3ecf4c29, 0xbef52c23, 0xbf757065, 0x3f88ad21, 0x3f12928c, 0x3f03920b, 0x3f74de04, 0xbf87a55e, 0x3f6a17ee, 0xbf873dcc, 0x3ec2f121, 0xbe371187, 0x3e8b2cfc, 0x3f32874a, 0x3caedfc4, 0xbf6bae05, 0x3f6dffaf, 0x3f96ac40, 0x3f2f677e, 0x3f84b353, 0xbfe1acfd, 0x3d93b1c4, 0xbde9af65, 0xbffa2318, 0x3ddead96, 0x3b58d5ed, 0xbfc0d10c, 0xbf57085c, 0x3dae3d40, 0x3f1a12e3, 0x3f352312, 0xbf8d7d04, 0xbf89d946, 0xbf01677c, 0xbd4c7e1e, 0xbf133713, 0xbe44880a, 0x3f35b0ed, 0x3f2f38b5, 0x3e0d6cb1, 0xbf9214ea, 0xbefb6660, 0x3f10542f, 0x3f5ec555, 0x3f87f854, 0xbf87d344, 0xbeedb745, 0xbf9ae28b, 0xc03c4079, 0xbf8bc5ec]),
            u8s(&[5, 3, 8], &[214, 79, 145, 202, 186, 238, 222, 235, 0, 108, 123, 30, 10, 210, 244, 197, 95, 191, 79, 184, 79, 199, 253, 243, 225, 237, 189, 137, 225, 30, 89, 155, 121, 193, 62, 7, 38, 246, 34, 59, 96, 146, 200, 25, 224, 203, 93, 56, 144, 147, 78, 36, 197, 170, 192, 59, 185, 16, 3, 41, 201, 132, 154, 148, 163, 84, 191, 2, 97, 14, 33, 228, 149, 192, 152, 159, 193, 152, 128, 142, 150, 80, 173, 100, 161, 124, 186, 188, 11, 197, 236, 84, 191, 208, 117, 44, 186, 218, 79, 50, 199, 137, 14, 61, 61, 156, 136, 140, 80, 106, 129, 145, 153, 188, 249, 188, 120, 251, 42, 252]),
            floats(&[5, 3], &[0x3d619e79, 0x3d5b27fe, 0x3db0fc01, 0x3d84b1ab, 0x3dabead3, 0x3d30f601, 0x3d750bc3, 0x3d8c12b7, 0x3d000cc0, 0x3da14525, 0x3cc49296, 0x3cb41a3e, 0x3d0c55cc, 0x3da9c3e6, 0x3d58415a]),
            Some(u8s(&[5, 2], &[21, 3, 113, 10, 61, 14, 144, 10, 28, 9])),
            Some(floats(&[5], &[0x3fc395c3, 0x3efa2d00, 0x3fa72fd3, 0x3fb95045, 0x3f6faafb])),
        );
        close(&y, &floats(&[3, 5], &[0x40ace5ff, 0x40193ec6, 0x3f9e22cb, 0x40903f77, 0x403e1c3e, 0x4007174d, 0xbfd8e1d8, 0x4080377a, 0xc0a8e5d1, 0x4090a7ca, 0xbf5e5d2a, 0x3fba39c3, 0xbb9ce500, 0x401b9f8c, 0xc0209dcb]));
        // the same at accuracy level 4 (int8 compute).
        let y = nbits(
            &[("K", Attr::Int(40)), ("N", Attr::Int(5)), ("bits", Attr::Int(4)), ("block_size", Attr::Int(16)), ("accuracy_level", Attr::Int(4))],
            floats(&[3, 40], &[0xbf0b0bfb, 0xbf0024c4, 0x3dfb2164, 0x3f890cda, 0xbfd9f33d, 0x3fcffce8, 0xbf43df6a, 0xbf7ed68c, 0x3e015192, 0x3f2bda1f, 0x402d23f2, 0x3f650dad, 0xbf18b24b, 0xbe56efa3, 0xbf764924, 0x3f268f87, 0x3f528dd6, 0xbeae294a, 0x3f9020d7, 0xbfd924ec, 0xbef957a9, 0xbf6efefd, 0xbf197ea4, 0xbfd2c5a5, 0x3f71dae1, 0xbf76f781, 0xbe13cbc4, 0x3f96029f, 0x3fcc79b7, 0x3f95cf7f, 0xc00fb9fa, 0xbea2013a, 0xbeba7656, 0xbf329ec8, 0xbf4c739a, 0xbf111aea, 0x3f133524, 0xbef3ae62, 0xbfae36a8, 0xbfcc0da4, 0x3e0628c7, 0xbfde7a32, 0x3f30a242, 0xbf023739, 0xbf04793c, 0x3e6032f7, 0xbebdd14e, 0x3f339fc9, 0xbfa5ec1f, 0xbfe9e355, 0x3ffb04a4, 0x3e27efb4, 0xc025ef44, 0x3fd95029, 0xbfb6391c, 0x40039a81, 0x3fe8be59, 0x3f6181a5, 0x3adbbc5a, 0xbf604f25, 0x3f75162a, 0xbecd5b0e, 0x3f8ba95c, 0xbe8f4b6f, 0xbfca74e1, 0xbf340a2a, 0x3d81ace9, 0xbefbc982, 0x3e12b311, 0xbf6cbdde, 0x3fd02227, 0xbf059f91, 0x3f076287, 0xbfd663d8, 0x3f571125, 0x3fc802be, 0x3f1d7e07, 0xbe6fed7a, 0xbf6bba80, 0x3f1f3358, 0x3f189897, 0xbfa5c76e, 0x3cfe210d, 0x3f0f546c, 0xbf449b3f, 0x3f2030bb, 0xbe82d18f, 0x3fbcd460, 0xbfa1557e, 0x3f0ac295, 0x3e0adc77, 0xbfef249d, 0xbf6b32a0, 0xbf5824b1, 0x3f734fe1, 0xbeb0c13c, 0x3bcff0dc, 0x3e27c89a, 0x4026c8d5, 0xbe67816d, 0x3ffa6ce2, 0xbe32ec30, 0xbfc93543, 0xbf4ed881, 0xbf9e6dd7, 0xbeb952b7, 0xbfbac023, 0xbf68a15a, 0x3ff6cd59, 0x3e7f6581, 0x3eb06f78, 0x3feab5ca, 0xbfd31179, 0x3f138d8a, 0xbeee17ac, 0xbcc72833, 0xbf2d601f, 0x3e0208b4, 0x3f9f96d8, 0x3f9ba168]),
            u8s(&[5, 3, 8], &[115, 104, 243, 232, 33, 180, 253, 21, 124, 58, 129, 87, 104, 119, 147, 116, 187, 121, 134, 87, 247, 103, 120, 46, 208, 201, 209, 81, 15, 170, 72, 76, 88, 13, 206, 47, 176, 166, 35, 59, 25, 245, 66, 8, 145, 76, 231, 65, 76, 68, 152, 75, 214, 35, 104, 123, 13, 147, 22, 251, 225, 160, 30, 165, 173, 205, 155, 47, 163, 119, 67, 82, 116, 101, 34, 152, 94, 136, 242, 2, 236, 69, 161, 125, 175, 41, 241, 51, 43, 11, 65, 79, 162, 79, 202, 71, 188, 28, 1, 2, 95, 222, 157, 64, 56, 36, 249, 65, 172, 65, 52, 195, 238, 229, 196, 21, 54, 184, 58, 134]),
            floats(&[5, 3], &[0x3d92baa8, 0x3d57b63d, 0x3cffa2b0, 0x3da82602, 0x3d506572, 0x3d47c3d5, 0x3d4c652f, 0x3db15f18, 0x3d9c84cd, 0x3dbe1c23, 0x3c948be4, 0x3d13f3b4, 0x3d43b235, 0x3d1c8dbd, 0x3db3ac00]),
            Some(u8s(&[5, 2], &[139, 8, 112, 13, 19, 5, 181, 0, 221, 6])),
            Some(floats(&[5], &[0xbf1c20e4, 0x3d6733e0, 0x3f9dcfd9, 0xbf94ec71, 0x3da5f87b])),
        );
        close(&y, &floats(&[3, 5], &[0x3e3be310, 0x40a3ef17, 0xc05c7311, 0xbfe5d063, 0x3f69a0a8, 0x3f01a9a0, 0xbf31806a, 0x3f90fb0a, 0xbe7f39c0, 0xbeb7f5b2, 0xbf434c5a, 0xc025065c, 0x40198e9b, 0xc084b600, 0xc0303f56]));
        // 4-bit, f32 zero points (f32 compute even at accuracy level 4).
        let y = nbits(
            &[("K", Attr::Int(32)), ("N", Attr::Int(5)), ("bits", Attr::Int(4)), ("block_size", Attr::Int(16)), ("accuracy_level", Attr::Int(4))],
            floats(&[2, 32], &[0xbfbaac39, 0xbedc61f4, 0xbf147829, 0xbeef9e3a, 0xbf85eafc, 0x3f4332ac, 0xbdec6b7e, 0x3fdefc1a, 0xbfaea92f, 0x3dfaf666, 0xbfa3dec3, 0x3e6b3ab9, 0x3f955c68, 0xbf9221ff, 0x3f7d5b06, 0xbf50decc, 0xbf929d5c, 0x3ea71b48, 0x3f3f06bb, 0x3e08468e, 0x3e9f92ec, 0xbd092c7e, 0xbf022a24, 0xc0099c4f, 0xbebcc44d, 0xbf342986, 0x3f0ce744, 0xbf53e2e6, 0x4000e24e, 0x3f1eb911, 0xbed7cd37, 0x3f28314b, 0xbe7d32cf, 0x3fa4fb05, 0xbed78cbc, 0x3fb831b9, 0xbf882976, 0x3de17980, 0xbd7a35b7, 0xbf64d62c, 0xbea2abb7, 0x3c8b4f8f, 0xbf9798a4, 0xbf591222, 0x3efcb905, 0xbf432e19, 0x3fcb8269, 0x3fcb327a, 0xbeee292a, 0x3eb983d7, 0x3f09c8e4, 0x3f39d1ef, 0xbf0786d8, 0x3f3fe323, 0xbf06e51e, 0xbdbedec8, 0x3fa01b78, 0xbda0efb7, 0xbf75bcec, 0xbf11c43c, 0x3ea66003, 0xbf424477, 0xbf7818d7, 0x3e1d042a]),
            u8s(&[5, 2, 8], &[217, 84, 29, 202, 184, 176, 34, 241, 195, 166, 93, 96, 180, 149, 10, 232, 123, 77, 223, 12, 171, 60, 76, 202, 121, 237, 199, 220, 234, 140, 165, 118, 123, 79, 13, 84, 252, 145, 219, 200, 160, 35, 53, 193, 224, 247, 97, 16, 227, 146, 122, 47, 47, 51, 194, 180, 116, 226, 232, 36, 214, 105, 205, 174, 14, 51, 240, 21, 146, 173, 249, 54, 171, 57, 81, 215, 77, 207, 223, 116]),
            floats(&[5, 2], &[0x3d3bed8d, 0x3db6f77b, 0x3d3ad622, 0x3dc85c9b, 0x3cf1a7d1, 0x3d698ee8, 0x3d660801, 0x3d2692be, 0x3cd8f4bb, 0x3d21680f]),
            Some(floats(&[5, 2], &[0x412d30cf, 0x40ae82cb, 0x40ee6f63, 0x40ecec6f, 0x41174914, 0x40db8d63, 0x40b2f55d, 0x4151f3e5, 0x4154eca9, 0x410a0c16])),
            None,
        );
        close(&y, &floats(&[2, 5], &[0x3fbb1a8e, 0xc03fe3b4, 0xbffdf2d2, 0xbf6c44eb, 0x3f357c5e, 0x3f11b5a9, 0x3f12a818, 0xbf35b7fe, 0x3f95ed09, 0xbf48672b]));
        // 8-bit, uint8 zero points.
        let y = nbits(
            &[("K", Attr::Int(48)), ("N", Attr::Int(5)), ("bits", Attr::Int(8)), ("block_size", Attr::Int(16)), ("accuracy_level", Attr::Int(0))],
            floats(&[2, 48], &[0xbe8df80a, 0x3d542952, 0xbfdf2c9c, 0x3e8aad79, 0x3fadd41c, 0xbf4ac632, 0x3ef8e436, 0xbf08a578, 0x3f02829c, 0x3f377201, 0xbfbb017d, 0xbf6947a9, 0xbf42066e, 0xbe5ca90e, 0x3fa68189, 0x3cff2109, 0x3dfe1077, 0x3e393420, 0xbf29729a, 0x3f8984b0, 0x3f01ec2d, 0x3f471adb, 0x3e80041b, 0xbfb0f6cb, 0x3f077486, 0xbf239e40, 0xbf6bc626, 0x402c25f6, 0x3f6a5311, 0xbed856b9, 0x3f5378e9, 0x3f8d49d1, 0x3e63f993, 0xbecef67d, 0x3f7ba400, 0x3f422df8, 0x3f2fe01f, 0xbfd7299c, 0x3ee013f4, 0x40041e27, 0xbf8c2d00, 0xbed3e029, 0xbf4cc29d, 0xbf03c3d3, 0xbe21d1e4, 0x4001aeff, 0xbe9f8117, 0x3fcdb651, 0xbf762aff, 0x3f21f823, 0xbd69b9cc, 0xbedaa54f, 0x3e8fcd06, 0x3fac9eaf, 0x3ecc71a1, 0x3f2b41fb, 0x3db43214, 0x3efce9ca, 0x3ed799d4, 0x3f57cea2, 0xbde3666c, 0xbf157571, 0xbee8f186, 0xbef2cca9, 0x3f102602, 0xbf499545, 0x3f3ff6dc, 0x3e894ae6, 0x3fa610b6, 0x3e72841e, 0x3f8e100a, 0x3eee7087, 0x3e5bd9af, 0xbe8d9c21, 0x3f00a564, 0x3df701c5, 0xbf1a7a48, 0xbef0ff88, 0xbff69bff, 0x3f98d1cf, 0x3f962f4d, 0xbee9dba1, 0xbfa0ab7e, 0x3f33169e, 0x3f923267, 0xbc25a837, 0xbf265e8d, 0x3fa60008, 0x3f690a90, 0x3f86a626, 0x3ff61812, 0xbc896bc3, 0x3e3dbdcb, 0x4002dcf9, 0x3f5e243e, 0x40209104]),
            u8s(&[5, 3, 16], &[26, 196, 95, 200, 6, 211, 133, 183, 133, 77, 209, 104, 248, 211, 113, 172, 254, 187, 5, 193, 116, 152, 107, 97, 130, 192, 83, 218, 208, 177, 190, 123, 182, 68, 238, 42, 155, 179, 186, 92, 240, 100, 209, 220, 9, 99, 75, 127, 112, 113, 89, 199, 133, 223, 167, 144, 8, 159, 197, 191, 218, 77, 235, 121, 245, 196, 152, 11, 54, 7, 224, 76, 103, 98, 186, 32, 117, 14, 153, 71, 169, 167, 35, 47, 47, 103, 25, 170, 241, 136, 124, 77, 232, 197, 233, 198, 216, 50, 129, 236, 194, 199, 203, 78, 199, 160, 244, 65, 81, 35, 24, 158, 88, 67, 113, 212, 162, 93, 214, 250, 222, 103, 48, 78, 172, 118, 170, 239, 96, 49, 202, 112, 97, 112, 49, 138, 104, 173, 126, 173, 141, 117, 80, 126, 168, 233, 61, 182, 117, 169, 112, 32, 90, 124, 253, 218, 122, 142, 210, 121, 66, 167, 48, 42, 188, 102, 174, 62, 131, 224, 35, 234, 108, 228, 95, 80, 183, 233, 35, 27, 185, 24, 97, 37, 189, 126, 40, 104, 230, 50, 164, 233, 31, 51, 244, 238, 24, 56, 232, 137, 213, 255, 52, 37, 126, 65, 156, 126, 107, 78, 36, 159, 63, 136, 4, 182, 238, 244, 24, 223, 10, 239, 41, 164, 12, 18, 219, 47, 26, 225, 104, 32, 166, 62, 105, 149, 178, 46, 89, 253]),
            floats(&[5, 3], &[0x3c2bfe32, 0x3d81f487, 0x3dc7fb8e, 0x3c4772aa, 0x3d03b3be, 0x3cc8afeb, 0x3cb39e53, 0x3dc2958e, 0x3da1d9ba, 0x3d479db9, 0x3d9bc8af, 0x3cd27f75, 0x3dc57a4f, 0x3d6d6e14, 0x3d32742d]),
            Some(u8s(&[5, 3], &[195, 93, 36, 56, 52, 170, 152, 170, 221, 120, 183, 12, 243, 47, 68])),
            Some(floats(&[5], &[0xbfbbeeef, 0xbe49d123, 0xbf53362e, 0xc0453b9e, 0x3e5a3e5b])),
        );
        close(&y, &floats(&[2, 5], &[0x4236395f, 0xc11c5afc, 0xc1e58937, 0xc05d8feb, 0x427a499f, 0x42a04221, 0x4143032c, 0xc2a5a792, 0x416e4e72, 0xc14912c5]));
        // 2-bit, default zero points, a 3-D A, int8 compute.
        let y = nbits(
            &[("K", Attr::Int(64)), ("N", Attr::Int(5)), ("bits", Attr::Int(2)), ("block_size", Attr::Int(32)), ("accuracy_level", Attr::Int(4))],
            floats(&[2, 1, 64], &[0x3dd12c10, 0x3e68e048, 0xbcc6853a, 0x3e3f477c, 0xbf80c05c, 0xc004c3f7, 0xbf096f3b, 0xbebc4ecc, 0xbe6a9cae, 0xbf841f19, 0xbf9ee464, 0x4000d05c, 0x3f4147e3, 0x3eae9cee, 0x3e31f3be, 0xbf207365, 0xbe04f10b, 0x3f929ece, 0x3f811e9a, 0xbf0e8efc, 0xbef3f95f, 0xbf03d370, 0xbf31e9ab, 0x3f6c0e91, 0x3f271b9a, 0x3ea64c50, 0xbf16e1f3, 0x3fa19446, 0x3d09f044, 0xc01f41fc, 0x3fa2b866, 0x3e7253c5, 0xbf156a16, 0x3fa806d7, 0xc0155e37, 0xbf2697f6, 0x3f2f111f, 0xbf365d9f, 0x40024a52, 0x3ffdb970, 0x3e94e373, 0x3e6e1aae, 0x3fdda91c, 0x3f23df75, 0xbf837568, 0xbe715327, 0xbf5b4379, 0x3f2123df, 0x3e4a664d, 0x3fb65e3c, 0x3e9121e1, 0xbf3d62bb, 0xbf8bae4a, 0x3fc46f3f, 0x3fa686f4, 0xbf4f6a19, 0xbfb9a7da, 0xbfc5f173, 0x3f82359a, 0xbeb1bb5b, 0x3feb0704, 0xbec4f812, 0xbe875c17, 0xbe5f61d0, 0x3f26559e, 0x3fe3a05d, 0xbf67d476, 0x3f541820, 0x3fb8bbcf, 0xbdd906f9, 0xbeade1aa, 0x3f92e360, 0xbf0ca8a7, 0xbe6522fe, 0xbf63e56e, 0xbeeb8e43, 0x3ea99f6c, 0x3edc0207, 0xbe26f973, 0x3e16a57e, 0xbf9f9d88, 0x40082565, 0xbf845249, 0x3f0fbae5, 0xbf408839, 0x3d19483d, 0xbfff25b7, 0xbf2ae0d8, 0xbf9b38f6, 0x3eaf4ec7, 0x3de53f5f, 0xbf69974b, 0xbf7a4ae8, 0x3ed56d57, 0xbefa648e, 0x3f1677e5, 0x3e92cb27, 0xbef0e4e2, 0xbe8dfa38, 0xbfed7bb0, 0xbcc7dee4, 0xbe72c88c, 0xbce7e8f9, 0x3fbaffb1, 0x3e0d6fd1, 0x3c705ca4, 0xbb9eb273, 0xbed948fc, 0x3fb5a861, 0xbcf8b5fa, 0x3fa2eb7f, 0x3f365a7b, 0xbf3b1873, 0x3e66fcc6, 0x3f902613, 0xbeb35cc8, 0x3dc804e6, 0xbe5185db, 0xbe396836, 0x3f4b0821, 0xbf4c7996, 0xbe9c855a, 0x3e33afdd, 0xc026a2f3, 0xbe9aa8c0, 0x3ddb4cd1, 0x3ec9fe4f, 0xbf23d29d]),
            u8s(&[5, 2, 8], &[101, 49, 128, 241, 236, 46, 23, 123, 179, 175, 189, 211, 6, 19, 77, 139, 163, 138, 189, 89, 255, 173, 138, 36, 23, 184, 204, 60, 212, 218, 24, 34, 38, 68, 40, 94, 73, 245, 137, 139, 97, 124, 198, 245, 71, 83, 240, 161, 158, 113, 134, 251, 43, 153, 23, 41, 47, 200, 69, 48, 129, 45, 83, 173, 2, 252, 187, 204, 133, 60, 213, 111, 145, 103, 172, 201, 210, 145, 88, 169]),
            floats(&[5, 2], &[0x3ccbb17e, 0x3da53662, 0x3d91e0f7, 0x3dab14e3, 0x3cf8d7c4, 0x3dbe6d6a, 0x3dad3e4b, 0x3d62feae, 0x3d58b6c4, 0x3cc93fe8]),
            None,
            None,
        );
        close(&y, &floats(&[2, 1, 5], &[0xbecabb44, 0x3ca02670, 0xbf03f3f6, 0x3ed6949c, 0xbf40c57c, 0x3cc07e90, 0x3f2a9dce, 0xbe8a9066, 0x3e8fb76c, 0xbeac6d9a]));
    }

    #[test]
    fn bad_inputs_are_errors() {
        let attrs = [("K", Attr::Int(16)), ("N", Attr::Int(2)), ("block_size", Attr::Int(16))];
        let c = ms("MatMulNBits").attrs(&attrs).input(Tensor::from_vec(&[1, 16], vec![0f32; 16]).unwrap()).constant(u8s(&[2, 1, 8], &[0; 16])).constant(Tensor::from_vec(&[3], vec![1f32; 3]).unwrap());
        let e = c.run_cpu().unwrap_err().to_string();
        assert!(e.contains("input 2") && e.contains("scales"), "{e}");
        let c = ms("MatMulNBits").attrs(&attrs).input(Tensor::from_vec(&[1, 15], vec![0f32; 15]).unwrap()).constant(u8s(&[2, 1, 8], &[0; 16])).constant(Tensor::from_vec(&[2], vec![1f32; 2]).unwrap());
        assert!(c.run_cpu().unwrap_err().to_string().contains("K = 16"));
        let c = ms("MatMulNBits").attrs(&[("K", Attr::Int(16)), ("N", Attr::Int(2)), ("block_size", Attr::Int(24))]);
        assert!(c.op().unwrap_err().to_string().contains("power of two"));
        let c = ms("MatMulNBits").attrs(&[("K", Attr::Int(16)), ("N", Attr::Int(2)), ("block_size", Attr::Int(16)), ("bits", Attr::Int(3))]);
        assert!(c.op().unwrap_err().to_string().contains("bits"));
    }
}
