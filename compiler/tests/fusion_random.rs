//! Fused kernels against their unfused form on random graphs and shapes: seeded random
//! networks of the patterns the fusion passes target (MatMul + bias + activation, with
//! a reshape in between or a residual add; elementwise chains over broadcast constants;
//! both GELU forms; scaled, masked attention; ResNet blocks with BatchNorm and residual
//! Convs) run with every pass, the device's
//! optional ones included, and with none, on the CPU and on the GPU.
use kiln_compiler::passes::{self, Target};
use kiln_graph::{Attr, DType, Graph, GraphBuilder, Tensor, ValueId};
use kiln_runtime::{DeviceChoice, Session, SessionOptions};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn tensor(&mut self, dims: &[usize], scale: f32) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| ((self.next() % 20001) as f32 / 10000.0 - 1.0) * scale).collect();
        Tensor::from_vec(dims, v).unwrap()
    }
}

fn scalar(b: &mut GraphBuilder, name: &str, v: f32) -> ValueId {
    b.constant(name, Tensor::scalar(v))
}

/// GELU written out as exporters do, in one of two operand orders.
fn gelu(b: &mut GraphBuilder, x: ValueId, tanh: bool, swap: bool) -> ValueId {
    let tag = format!("g{x}");
    let c = |b: &mut GraphBuilder, n: &str, v: f32| scalar(b, &format!("{n}_{tag}"), v);
    let one = c(b, "one", 1.0);
    let half = c(b, "half", 0.5);
    let inner = if tanh {
        let three = c(b, "three", 3.0);
        let cube = b.node("Pow", &[x, three], &[]);
        let k = c(b, "k", 0.044715);
        let t = b.node("Mul", &[cube, k], &[]);
        let s = b.node("Add", &[x, t], &[]);
        let k2 = c(b, "k2", 0.797_884_6);
        let u = b.node("Mul", &[k2, s], &[]);
        b.node("Tanh", &[u], &[])
    } else {
        let sqrt2 = c(b, "sqrt2", std::f32::consts::SQRT_2);
        let d = b.node("Div", &[x, sqrt2], &[]);
        b.node("Erf", &[d], &[])
    };
    let plus = if swap { b.node("Add", &[one, inner], &[]) } else { b.node("Add", &[inner, one], &[]) };
    if swap {
        let hx = b.node("Mul", &[half, x], &[]);
        b.node("Mul", &[hx, plus], &[])
    } else {
        let m = b.node("Mul", &[x, plus], &[]);
        b.node("Mul", &[m, half], &[])
    }
}

/// A random network over `x: f32[batch, m, k]`; returns the graph and the input dims.
fn network(seed: u64) -> (Graph, Vec<usize>) {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let (batch, m, k, n) = (1 + r.below(3), 1 + r.below(37), 1 + r.below(33), 1 + r.below(40));
    let mut b = GraphBuilder::new("random");
    let x = b.input("x", DType::F32, vec![batch, m, k]);
    let w = b.constant("w", r.tensor(&[k, n], 0.5));
    let mut h = b.node("MatMul", &[x, w], &[]);
    if r.below(4) > 0 {
        let bias = b.constant("bias", r.tensor(&[n], 0.5));
        h = if r.below(2) == 0 { b.node("Add", &[h, bias], &[]) } else { b.node("Add", &[bias, h], &[]) };
    }
    if r.below(3) == 0 {
        // A residual of the output's shape from a parallel branch.
        let w2 = b.constant("w2", r.tensor(&[k, n], 0.5));
        let skip = b.node("MatMul", &[x, w2], &[]);
        h = b.node("Add", &[h, skip], &[]);
    }
    if r.below(3) == 0 {
        // Through a reshape, as GPT-2 exports its linear layers.
        let flat = b.constant("flat", Tensor::from_vec(&[2], vec![(batch * m) as i64, n as i64]).unwrap());
        h = b.node("Reshape", &[h, flat], &[]);
        let back = b.constant("back", Tensor::from_vec(&[3], vec![batch as i64, m as i64, n as i64]).unwrap());
        h = b.node("Reshape", &[h, back], &[]);
    }
    h = match r.below(5) {
        0 => b.node("Relu", &[h], &[]),
        1 => gelu(&mut b, h, false, r.below(2) == 0),
        2 => gelu(&mut b, h, true, r.below(2) == 0),
        3 => b.node("Sigmoid", &[h], &[]),
        _ => {
            let (lo, hi) = (scalar(&mut b, "lo", -0.5), scalar(&mut b, "hi", 0.75));
            b.node("Clip", &[h, lo, hi], &[])
        }
    };
    // An elementwise chain over constants of every broadcast layout.
    for i in 0..2 + r.below(4) {
        let dims: Vec<usize> = match r.below(4) {
            0 => vec![],
            1 => vec![n],
            2 => vec![m, 1],
            _ => vec![1, m, n],
        };
        let c = b.constant(&format!("c{i}"), r.tensor(&dims, 1.0));
        let op = ["Add", "Mul", "Sub", "Max", "Div"][r.below(5)];
        let c = if op == "Div" {
            let one = scalar(&mut b, &format!("one{i}"), 2.0);
            b.node("Add", &[c, one], &[])
        } else {
            c
        };
        h = b.node(op, &[h, c], &[]);
        if r.below(3) == 0 {
            h = b.node(["Tanh", "Neg", "Abs", "Exp"][r.below(4)], &[h], &[]);
            if r.below(2) == 0 {
                h = b.node("Tanh", &[h], &[]);
            }
        }
    }
    b.output(h);
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    (g, vec![batch, m, k])
}

/// A ResNet block over `x: f32[batch, c, h, w]`: Conv (+BatchNorm) + Relu, Conv, add the
/// skip, Relu; kernel 1 or 3, dense or depthwise.
fn resnet_block(seed: u64) -> (Graph, Vec<usize>) {
    let mut r = Rng(seed.wrapping_mul(0x5851_f42d_4c95_7f2d) | 1);
    let (batch, c, h, w) = (1 + r.below(2), 1 + r.below(6), 3 + r.below(10), 3 + r.below(10));
    let k = [1, 3][r.below(2)];
    let group = if r.below(3) == 0 { c } else { 1 };
    let mut b = GraphBuilder::new("resnet_block");
    let x = b.input("x", DType::F32, vec![batch, c, h, w]);
    let attrs = [("pads", Attr::Ints(vec![(k / 2) as i64; 4])), ("group", Attr::Int(group as i64))];
    let conv = |b: &mut GraphBuilder, r: &mut Rng, name: &str, input: ValueId| {
        let wt = b.constant(&format!("{name}_w"), r.tensor(&[c, c / group, k, k], 0.7));
        let bias = b.constant(&format!("{name}_b"), r.tensor(&[c], 0.3));
        b.node("Conv", &[input, wt, bias], &attrs)
    };
    let mut y = conv(&mut b, &mut r, "c1", x);
    if r.below(2) == 0 {
        let [scale, shift, mean] = [1.0, 0.3, 0.3].map(|s| b.constant(&format!("bn{s}_{}", r.below(1000)), r.tensor(&[c], s)));
        let var = b.constant("bn_var", Tensor::from_vec(&[c], (0..c).map(|i| 0.5 + i as f32 * 0.1).collect()).unwrap());
        y = b.node("BatchNormalization", &[y, scale, shift, mean, var], &[]);
    }
    let y = b.node("Relu", &[y], &[]);
    let z = conv(&mut b, &mut r, "c2", y);
    let s = if r.below(2) == 0 { b.node("Add", &[z, x], &[]) } else { b.node("Add", &[x, z], &[]) };
    let out = b.node("Relu", &[s], &[]);
    b.output(out);
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    (g, vec![batch, c, h, w])
}

/// Scaled, masked attention over `x: f32[batch, heads, seq, dim]` (x is Q, K and V).
fn attention(seed: u64) -> (Graph, Vec<usize>) {
    let mut r = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    let dims = vec![1 + r.below(2), 1 + r.below(3), 1 + r.below(40), 1 + r.below(24)];
    let mut b = GraphBuilder::new("attention");
    let x = b.input("x", DType::F32, dims.clone());
    let kt = b.node("Transpose", &[x], &[("perm", Attr::Ints(vec![0, 1, 3, 2]))]);
    let mut s = b.node("MatMul", &[x, kt], &[]);
    let scale = scalar(&mut b, "scale", 1.0 / (dims[3] as f32).sqrt());
    s = if r.below(2) == 0 { b.node("Mul", &[s, scale], &[]) } else { b.node("Div", &[s, scale], &[]) };
    if r.below(2) == 0 {
        let mask = b.constant("mask", r.tensor(&[1, 1, dims[2], dims[2]], 3.0));
        s = b.node("Add", &[s, mask], &[]);
    }
    let p = b.node("Softmax", &[s], &[("axis", Attr::Int(-1))]);
    let y = b.node("MatMul", &[p, x], &[]);
    b.output(y);
    let mut g = b.finish().unwrap();
    g.opsets.insert(String::new(), 17);
    (g, dims)
}

fn run(g: &Graph, device: DeviceChoice, x: &Tensor) -> (Tensor, usize) {
    let s = Session::new(g.clone(), SessionOptions::device(device)).unwrap();
    let (out, stats) = s.run_with_stats(&[("x", x)]).unwrap();
    (out.into_iter().next().unwrap(), stats.kernels)
}

fn check(make: fn(u64) -> (Graph, Vec<usize>), seeds: std::ops::Range<u64>, device: DeviceChoice, target: Target, tolerance: f64) -> (usize, usize) {
    let (mut before, mut after) = (0, 0);
    for seed in seeds {
        let (g, dims) = make(seed);
        let x = Rng(seed + 99).tensor(&dims, 1.5);
        let mut fused = g.clone();
        let env = |n: &str| std::env::var(n).unwrap_or_default();
        // Every optional pass too: they must be correct wherever they are enabled.
        let all: Vec<&str> = passes::OPTIONAL_PASSES.iter().map(|(p, _)| p.name).collect();
        let mut cx = passes::PassContext::builtin();
        for p in passes::selected_passes(&env(passes::SKIP_PASSES_ENV), &all.join(","), target) {
            (p.run)(&mut fused, &mut cx);
        }
        fused.validate().unwrap();
        let (want, k0) = run(&g, device.clone(), &x);
        let (got, k1) = run(&fused, device.clone(), &x);
        assert_eq!(got.dims(), want.dims(), "seed {seed}");
        let err = got.rel_l2_error(&want);
        assert!(err < tolerance, "seed {seed} on {device:?}: fused and unfused differ (rel L2 {err})\n{}", passes::dump(&fused));
        assert!(k1 <= k0, "seed {seed}: fusion added kernels ({k0} -> {k1})");
        (before, after) = (before + k0, after + k1);
    }
    println!("{device:?}: {before} kernels unfused, {after} fused");
    (before, after)
}

#[test]
fn fused_networks_match_their_unfused_form_on_the_cpu() {
    let (before, after) = check(network, 0..40, DeviceChoice::Cpu, Target::Cpu, 1e-5);
    assert!(after * 2 < before, "fusion should remove most kernels: {before} -> {after}");
    check(attention, 0..12, DeviceChoice::Cpu, Target::Cpu, 1e-5);
    let (before, after) = check(resnet_block, 0..16, DeviceChoice::Cpu, Target::Cpu, 1e-5);
    assert!(after * 2 < before, "a block should become two Convs: {before} -> {after}");
}

#[test]
fn fused_networks_match_their_unfused_form_on_the_gpu() {
    let (before, after) = check(network, 100..112, DeviceChoice::Gpu, Target::Gpu, 1e-4);
    assert!(after * 2 < before, "fusion should remove most kernels: {before} -> {after}");
    check(attention, 100..106, DeviceChoice::Gpu, Target::Gpu, 1e-4);
    check(resnet_block, 100..106, DeviceChoice::Gpu, Target::Gpu, 1e-4);
}
