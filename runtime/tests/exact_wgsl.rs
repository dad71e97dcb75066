//! The exact WGSL arithmetic of the quantizing kernels (`kiln_ops::wgsl::EXACT_ARITHMETIC`)
//! on every GPU adapter: `q_div` is the correctly rounded quotient and `q_mul` the
//! product rounded on its own, bit for bit as the CPU computes them, over random
//! operands of every exponent, quotients near a rounding tie, and the special values
//! that fall back to WGSL's `/`. (A driver's own `/` may be 2.5 ulp off, and a fused
//! multiply-add rounds once: on such a GPU a quantized value near a half would come out
//! one step off the CPU's.)
mod common;
use common::*;
use kiln_graph::{DType, Graph, GraphBuilder, Shape, Tensor};
use kiln_ops::wgsl::{declare, grid_1d, Binding, Dispatch, EXACT_ARITHMETIC};
use kiln_ops::{Arg, NodeSpec, Op, Registry, TensorType, TuneValues, WgslKernel, WgslProgram};
use kiln_runtime::{Session, SessionOptions};

/// `quotient = q_div(a, b)`, `product = q_mul(a, b, i)`, on the GPU only.
#[derive(Debug)]
struct Exact;

impl Op for Exact {
    fn name(&self) -> &str {
        "Exact"
    }
    fn cpu(&self) -> Option<&dyn kiln_ops::CpuKernel> {
        None
    }
    fn infer(&self, inputs: &[Option<Arg>]) -> kiln_ops::Result<Vec<TensorType>> {
        let t = inputs[0].unwrap().ty.clone();
        Ok(vec![t.clone(), t])
    }
    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl WgslKernel for Exact {
    fn generate(&self, inputs: &[Option<Arg>], _outputs: &[TensorType], _tune: &TuneValues) -> kiln_ops::Result<WgslProgram> {
        let n = inputs[0].unwrap().ty.len();
        let (grid, index) = grid_1d(n, 64);
        let source = format!(
            "{}{EXACT_ARITHMETIC}@compute @workgroup_size(64)\nfn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n    {index}    \
             quotient[i] = q_div(a[i], b[i]);\n    product[i] = q_mul(a[i], b[i], i);\n}}\n",
            declare(&[("a", "f32", true), ("b", "f32", true), ("quotient", "f32", false), ("product", "f32", false)])
        );
        Ok(WgslProgram::single(Dispatch {
            label: "exact".into(),
            source,
            entry_point: "main".into(),
            workgroups: grid,
            bindings: vec![Binding::Input(0), Binding::Input(1), Binding::Output(0), Binding::Output(1)],
        }))
    }
}

fn graph(n: usize) -> Graph {
    let mut b = GraphBuilder::new("exact");
    let x = b.input("a", DType::F32, Shape(vec![n.into()]));
    let y = b.input("b", DType::F32, Shape(vec![n.into()]));
    let outs = b.node_multi("Exact", &[Some(x), Some(y)], &[], 2);
    b.rename(outs[0], "quotient");
    b.rename(outs[1], "product");
    b.output(outs[0]);
    b.output(outs[1]);
    let mut g = b.finish().unwrap();
    g.nodes[0].domain = "exact.test".into();
    g.opsets.insert(String::new(), 17);
    g
}

/// The operands: random normal floats of every exponent and sign, pairs whose quotient
/// lies within an ulp of a rounding tie (`a` = a tie times `b`, rounded), small
/// integers over the scales the quantizers divide by, and the special values.
fn operands() -> (Vec<f32>, Vec<f32>) {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut a, mut b) = (vec![], vec![]);
    for _ in 0..40_000 {
        let r = next();
        // Exponents 1..=254, any sign and significand.
        let f = |bits: u64| f32::from_bits(((bits as u32) & 0x807f_ffff) | ((1 + (bits >> 32) as u32 % 254) << 23));
        a.push(f(r));
        b.push(f(next()));
    }
    for _ in 0..40_000 {
        // b in [1, 2), a tie q + ulp/2 of a 24-bit q, times b: the quotient is a hair
        // from the tie, where a quotient 1 ulp off rounds the other way.
        let bb = 1.0 + (next() % (1 << 23)) as f64 / (1u64 << 23) as f64;
        let q = 1.0 + (next() % (1 << 23)) as f64 / (1u64 << 23) as f64;
        let tie = q + 0.5 / (1u64 << 23) as f64;
        let scale = (1u64 << (next() % 20)) as f64;
        a.push((tie * bb * scale) as f32);
        b.push((bb * scale / 8.0) as f32);
    }
    for k in 0..2_000 {
        // What the quantizers divide: integers and sums over positive scales.
        a.push((k as i32 - 1000) as f32 * 0.37);
        b.push(f32::from_bits(0x3c00_0000 + (next() as u32 % 0x0100_0000)));
    }
    for _ in 0..1_000 {
        // Equal significands: quotients that are powers of two.
        let r = next();
        let x = f32::from_bits((r as u32 & 0x007f_ffff) | (1 + (r >> 40) as u32 % 254) << 23);
        a.push(x);
        b.push(f32::from_bits((x.to_bits() & 0x807f_ffff) | (1 + (r >> 48) as u32 % 254) << 23));
    }
    let special = [0.0, -0.0, 1.0, -3.5, f32::MIN_POSITIVE, 1e-40, -1e-42, f32::MAX, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3e38, 1e-38];
    for &x in &special {
        for &y in &special {
            a.push(x);
            b.push(y);
        }
    }
    (a, b)
}

/// Equal bits, or both NaN; where an operand or the exact result is subnormal, a GPU
/// that flushes subnormals may give a zero of the same sign instead.
fn same(got: f32, want: f32, operands: [f32; 2]) -> bool {
    let sub = |v: f32| v != 0.0 && v.is_subnormal();
    got.to_bits() == want.to_bits()
        || (got.is_nan() && want.is_nan())
        || ((sub(want) || operands.iter().any(|&v| sub(v))) && got == 0.0 && got.is_sign_negative() == want.is_sign_negative())
        || (operands.iter().any(|&v| sub(v)) && (got.is_nan() || got.is_infinite() || want.is_infinite() || want == 0.0))
}

#[test]
fn exact_division_and_unfused_products_match_the_cpu_bit_for_bit_on_every_gpu() {
    let mut registry = Registry::builtin().clone();
    registry.register("exact.test", "Exact", |_: &NodeSpec| Ok(Box::new(Exact)));
    let (a, b) = operands();
    let n = a.len();
    let gpus: Vec<&TestDevice> = devices().iter().filter(|d| !d.is_cpu()).collect();
    assert!(!gpus.is_empty());
    for d in gpus {
        let mut options = SessionOptions::device(d.choice.clone());
        options.registry = Some(registry.clone());
        let session = Session::new(graph(n), options).unwrap_or_else(|e| panic!("{}: {e}", d.label));
        let (ta, tb) = (Tensor::from_vec(&[n], a.clone()).unwrap(), Tensor::from_vec(&[n], b.clone()).unwrap());
        let outs = session.run(&[("a", &ta), ("b", &tb)]).unwrap_or_else(|e| panic!("{}: {e}", d.label));
        let (q, p) = (outs[0].as_slice::<f32>().unwrap(), outs[1].as_slice::<f32>().unwrap());
        let mut bad = vec![];
        for i in 0..n {
            if !same(q[i], a[i] / b[i], [a[i], b[i]]) {
                bad.push(format!("{:e} / {:e}: got {:e} ({:#010x}), want {:e} ({:#010x})", a[i], b[i], q[i], q[i].to_bits(), a[i] / b[i], (a[i] / b[i]).to_bits()));
            }
            if !same(p[i], a[i] * b[i], [a[i], b[i]]) {
                bad.push(format!("{:e} * {:e}: got {:e}, want {:e}", a[i], b[i], p[i], a[i] * b[i]));
            }
        }
        assert!(bad.is_empty(), "{}: {} of {n} results differ from the CPU's, e.g.:\n{}", d.label, bad.len(), bad[..bad.len().min(12)].join("\n"));
    }
}
