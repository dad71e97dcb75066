//! Einsum: a general tensor contraction written as an equation, e.g. `bij,bjk->bik`.
//! Supported: any number of operands, explicit (`->`) and implicit outputs (then the
//! output is the broadcast `...` dims followed by the labels used exactly once, in
//! alphabetical order), `...` (broadcasting, right-aligned), repeated labels within
//! one operand (diagonals, `ii->i`), sums over labels absent from the output, and
//! whitespace anywhere.
//!
//! Every label gets, per operand, the sum of the strides of the dims it labels (0 for
//! a broadcast size-1 dim), so diagonals and broadcasting need no special cases: an
//! output element is the sum, over all values of the contracted labels, of the
//! product of the operands at their offsets.
//!
//! CPU: that sum, in f64 (floats) or wrapping i64 (integers), parallel over outputs.
//! GPU: one invocation per output element loops over the contracted values; their
//! count must be at most [`wgsl::MAX_LOOP_ITERATIONS`], otherwise the kernel reports
//! an error.
use super::numeric::{store, Num, NUMERIC};
use crate::broadcast::strides;
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;
use std::fmt::Write;

/// One item of an operand's (or the output's) subscripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Item {
    Label(char),
    Ellipsis,
}

/// Label id of dim `e` (counted from the right end) of the broadcast `...` dims.
const ELLIPSIS_BASE: u32 = 1000;

#[derive(Debug)]
pub struct Einsum {
    equation: String,
    terms: Vec<Vec<Item>>,
    output: Option<Vec<Item>>,
}

fn parse_term(t: &str, equation: &str) -> Result<Vec<Item>> {
    let bad = |what: String| OpError::Attr { attr: "equation".into(), what: format!("{what} in '{equation}'") };
    let mut items = vec![];
    let mut rest = t;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("...") {
            if items.contains(&Item::Ellipsis) {
                return Err(bad(format!("'...' appears twice in term '{t}'")));
            }
            items.push(Item::Ellipsis);
            rest = &rest[3..];
        } else if c.is_ascii_alphabetic() {
            items.push(Item::Label(c));
            rest = &rest[1..];
        } else {
            return Err(bad(format!("unexpected character '{c}' in term '{t}'")));
        }
    }
    Ok(items)
}

/// A contraction planned for concrete input shapes.
#[derive(Debug)]
struct Plan {
    out_dims: Vec<usize>,
    sum_dims: Vec<usize>,
    /// Per operand: stride of each output label, and of each summed label.
    out_strides: Vec<Vec<usize>>,
    sum_strides: Vec<Vec<usize>>,
}

impl Einsum {
    fn parse(equation: &str) -> Result<Einsum> {
        let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq.as_str(), None),
        };
        let terms = lhs.split(',').map(|t| parse_term(t, equation)).collect::<Result<Vec<_>>>()?;
        let output = rhs.map(|r| parse_term(r, equation)).transpose()?;
        if let Some(out) = &output {
            for (k, it) in out.iter().enumerate() {
                if let Item::Label(c) = it {
                    if out[..k].contains(it) {
                        return Err(OpError::Attr { attr: "equation".into(), what: format!("output label '{c}' repeats in '{equation}'") });
                    }
                    if !terms.iter().any(|t| t.contains(it)) {
                        return Err(OpError::Attr { attr: "equation".into(), what: format!("output label '{c}' is in no input of '{equation}'") });
                    }
                }
            }
        }
        Ok(Einsum { equation: equation.to_string(), terms, output })
    }

    fn plan(&self, inputs: &[Option<Arg>]) -> Result<Plan> {
        let n = self.terms.len();
        let shapes: Vec<&[usize]> = (0..n).map(|i| required(inputs, i).map(|a| a.dims())).collect::<Result<_>>()?;
        if inputs.iter().flatten().count() != n {
            return Err(OpError::invalid(format!("equation '{}' has {n} operands but {} inputs are given", self.equation, inputs.iter().flatten().count())));
        }
        let dtype = expect_dtype(inputs, 0, &NUMERIC)?;
        for i in 1..n {
            if required(inputs, i)?.dtype() != dtype {
                return Err(OpError::input(i, format!("dtype {} differs from input 0's {dtype}", required(inputs, i)?.dtype())));
            }
        }
        // Labels of every dim of every operand.
        let mut ell_rank = 0;
        for (i, (t, s)) in self.terms.iter().zip(&shapes).enumerate() {
            let letters = t.iter().filter(|x| **x != Item::Ellipsis).count();
            let has_ell = t.contains(&Item::Ellipsis);
            if s.len() < letters || (!has_ell && s.len() != letters) {
                return Err(OpError::input(i, format!("shape {s:?} does not match subscripts of {letters} labels{} in '{}'", if has_ell { " and '...'" } else { "" }, self.equation)));
            }
            if has_ell {
                ell_rank = ell_rank.max(s.len() - letters);
            }
        }
        let mut labels: Vec<Vec<u32>> = vec![];
        let mut sizes: Vec<(u32, usize)> = vec![];
        for (i, (t, s)) in self.terms.iter().zip(&shapes).enumerate() {
            let letters = t.iter().filter(|x| **x != Item::Ellipsis).count();
            let ell = s.len() - letters;
            let mut ls = vec![];
            for it in t {
                match it {
                    Item::Label(c) => ls.push(*c as u32),
                    Item::Ellipsis => ls.extend((0..ell).map(|e| ELLIPSIS_BASE + (ell_rank - ell + e) as u32)),
                }
            }
            for (&l, &d) in ls.iter().zip(s.iter()) {
                match sizes.iter_mut().find(|(x, _)| *x == l) {
                    None => sizes.push((l, d)),
                    Some((_, size)) if *size == d => {}
                    Some((_, size)) if l >= ELLIPSIS_BASE && (*size == 1 || d == 1) => *size = (*size).max(d),
                    Some((_, size)) => {
                        let name = if l >= ELLIPSIS_BASE { "a '...' dim".to_string() } else { format!("label '{}'", char::from_u32(l).unwrap_or('?')) };
                        return Err(OpError::input(i, format!("{name} has size {d} here but {size} elsewhere (shape {s:?}, equation '{}')", self.equation)));
                    }
                }
            }
            labels.push(ls);
        }
        let ell_labels: Vec<u32> = (0..ell_rank).map(|e| ELLIPSIS_BASE + e as u32).collect();
        let out_labels: Vec<u32> = match &self.output {
            Some(out) => {
                let mut v = vec![];
                for it in out {
                    match it {
                        Item::Label(c) => v.push(*c as u32),
                        Item::Ellipsis => v.extend(&ell_labels),
                    }
                }
                v
            }
            None => {
                let mut once: Vec<u32> = sizes
                    .iter()
                    .map(|&(l, _)| l)
                    .filter(|&l| l < ELLIPSIS_BASE && labels.iter().flatten().filter(|&&x| x == l).count() == 1)
                    .collect();
                once.sort_unstable();
                ell_labels.iter().copied().chain(once).collect()
            }
        };
        let size_of = |l: u32| sizes.iter().find(|(x, _)| *x == l).map(|(_, s)| *s).unwrap_or(1);
        let sum_labels: Vec<u32> = sizes.iter().map(|&(l, _)| l).filter(|l| !out_labels.contains(l)).collect();
        let stride_of = |i: usize, l: u32| -> usize {
            let st = strides(shapes[i]);
            labels[i].iter().zip(shapes[i]).zip(&st).filter(|((&x, &d), _)| x == l && !(d == 1 && size_of(l) > 1)).map(|(_, &s)| s).sum()
        };
        Ok(Plan {
            out_dims: out_labels.iter().map(|&l| size_of(l)).collect(),
            sum_dims: sum_labels.iter().map(|&l| size_of(l)).collect(),
            out_strides: (0..n).map(|i| out_labels.iter().map(|&l| stride_of(i, l)).collect()).collect(),
            sum_strides: (0..n).map(|i| sum_labels.iter().map(|&l| stride_of(i, l)).collect()).collect(),
        })
    }
}

/// Offsets (one per operand) of every combination of `dims` (row-major) under `strides`.
fn offset_table(dims: &[usize], strides: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let count: usize = dims.iter().product();
    strides
        .iter()
        .map(|st| {
            (0..count)
                .map(|mut c| {
                    let mut off = 0;
                    for d in (0..dims.len()).rev() {
                        off += (c % dims[d]) * st[d];
                        c /= dims[d];
                    }
                    off
                })
                .collect()
        })
        .collect()
}

impl Op for Einsum {
    fn name(&self) -> &str {
        "Einsum"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let p = self.plan(inputs)?;
        Ok(vec![TensorType::new(required(inputs, 0)?.dtype(), p.out_dims)])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> crate::Cost {
        let sum: usize = self.plan(inputs).map(|p| p.sum_dims.iter().product()).unwrap_or(1);
        let flops = outputs.iter().map(|o| o.len() as u64).sum::<u64>() * sum as u64 * self.terms.len() as u64;
        crate::Cost { flops, bytes: crate::Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Einsum {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let p = super::common::tensor_args(inputs, |a| self.plan(a))?;
        let n = self.terms.len();
        let ops: Vec<Num> = (0..n).map(|i| cpu::input(inputs, i).map(Num::of)).collect::<Result<_>>()?;
        let outs = offset_table(&p.out_dims, &p.out_strides);
        let sums = offset_table(&p.sum_dims, &p.sum_strides);
        let n_out: usize = p.out_dims.iter().product();
        let n_sum: usize = p.sum_dims.iter().product();
        let result = if let Num::F(_) = ops[0] {
            let vals: Vec<&[f64]> = ops.iter().map(|o| if let Num::F(v) = o { v.as_slice() } else { &[][..] }).collect();
            let mut y = vec![0.0f64; n_out];
            cpu::par_chunks_mut(&mut y, 1, n_sum * n, |o0, part| {
                for (j, out) in part.iter_mut().enumerate() {
                    let o = o0 + j;
                    let mut acc = 0.0;
                    for c in 0..n_sum {
                        acc += (0..n).map(|k| vals[k][outs[k][o] + sums[k][c]]).product::<f64>();
                    }
                    *out = acc;
                }
            });
            Num::F(y)
        } else {
            let vals: Vec<&[i64]> = ops.iter().map(|o| if let Num::I(v) = o { v.as_slice() } else { &[][..] }).collect();
            let mut y = vec![0i64; n_out];
            for (o, out) in y.iter_mut().enumerate() {
                let mut acc = 0i64;
                for c in 0..n_sum {
                    acc = acc.wrapping_add((0..n).fold(1i64, |a, k| a.wrapping_mul(vals[k][outs[k][o] + sums[k][c]])));
                }
                *out = acc;
            }
            Num::I(y)
        };
        let (dtype, dims) = (outputs[0].dtype(), outputs[0].dims().to_vec());
        store(&mut outputs[0], result.into_tensor(dtype, &dims)?)
    }
}

impl WgslKernel for Einsum {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let p = self.plan(inputs)?;
        let n = self.terms.len();
        let n_sum: usize = p.sum_dims.iter().product();
        if n_sum > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!(
                "Einsum '{}' sums {n_sum} products per output element; the GPU kernel does that in one invocation, \
                 at most {}; run this model on the CPU",
                self.equation,
                wgsl::MAX_LOOP_ITERATIONS
            )));
        }
        if n + 1 > 31 {
            return Err(OpError::Unsupported(format!("Einsum with {n} operands needs more than 31 GPU bindings")));
        }
        let ty = wgsl::elem(outputs[0].dtype);
        let mut body = String::from("var r = i;\n");
        for k in 0..n {
            let _ = writeln!(body, "    var b{k} = 0u;");
        }
        for d in (0..p.out_dims.len()).rev() {
            let _ = writeln!(body, "    let o{d} = r % {s}u;\n    r = r / {s}u;", s = p.out_dims[d].max(1));
            for k in 0..n {
                if p.out_strides[k][d] != 0 {
                    let _ = writeln!(body, "    b{k} = b{k} + o{d} * {}u;", p.out_strides[k][d]);
                }
            }
        }
        let _ = writeln!(body, "    var acc = {};\n    for (var c = 0u; c < {n_sum}u; c = c + 1u) {{\n        var q = c;", wgsl::literal(ty, 0.0));
        for k in 0..n {
            let _ = writeln!(body, "        var f{k} = b{k};");
        }
        for d in (0..p.sum_dims.len()).rev() {
            let _ = writeln!(body, "        let s{d} = q % {s}u;\n        q = q / {s}u;", s = p.sum_dims[d].max(1));
            for k in 0..n {
                if p.sum_strides[k][d] != 0 {
                    let _ = writeln!(body, "        f{k} = f{k} + s{d} * {}u;", p.sum_strides[k][d]);
                }
            }
        }
        let product: Vec<String> = (0..n).map(|k| format!("in{k}[f{k}]")).collect();
        let _ = write!(body, "        acc = acc + {};\n    }}\n    out[i] = acc;", product.join(" * "));
        let names: Vec<String> = (0..n).map(|k| format!("in{k}")).collect();
        let mut buffers: Vec<(&str, &str, bool)> = names.iter().map(|s| (s.as_str(), ty, true)).collect();
        buffers.push(("out", ty, false));
        let mut b: Vec<Binding> = (0..n).map(Binding::Input).collect();
        b.push(Binding::Output(0));
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel("Einsum", outputs[0].len(), wg, &buffers, b, "", &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Einsum", |spec| {
        let eq = spec.string_opt("equation")?.ok_or_else(|| spec.bad("equation", "is required"))?;
        let op = Einsum::parse(&eq)?;
        if op.terms.len() != spec.n_inputs() {
            return Err(spec.bad("equation", format!("'{eq}' has {} operands but the node has {} inputs", op.terms.len(), spec.n_inputs())));
        }
        Ok(Box::new(op))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    fn ein(eq: &str, n: usize) -> Box<dyn crate::Op> {
        make("Einsum", 12, &[("equation", Attr::String(eq.into()))], n, 1).unwrap()
    }

    fn rand(dims: &[usize], seed: usize) -> Tensor {
        let n: usize = dims.iter().product();
        f32s(dims, &(0..n).map(|i| (((i + seed) * 37 % 23) as f32 - 11.0) / 7.0).collect::<Vec<_>>())
    }

    fn close(a: &Tensor, b: &[f64]) {
        let av = a.to_f64_vec();
        assert_eq!(av.len(), b.len());
        for (x, y) in av.iter().zip(b) {
            assert!((x - y).abs() < 1e-4 * (1.0 + y.abs()), "{av:?} vs {b:?}");
        }
    }

    #[test]
    fn einsum_common_patterns() {
        let (a, b) = (rand(&[2, 3, 4], 1), rand(&[2, 4, 5], 2));
        let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
        // batched matmul
        let got = run(ein("bij,bjk->bik", 2).as_ref(), &as_inputs(&[Some(&a), Some(&b)], &[]), &[]).unwrap().remove(0);
        let mut want = vec![0.0; 2 * 3 * 5];
        for bb in 0..2 {
            for i in 0..3 {
                for k in 0..5 {
                    want[(bb * 3 + i) * 5 + k] = (0..4).map(|j| av[(bb * 3 + i) * 4 + j] * bv[(bb * 4 + j) * 5 + k]).sum();
                }
            }
        }
        assert_eq!(got.dims(), &[2, 3, 5]);
        close(&got, &want);
        // the same with ellipsis and whitespace
        close(&run(ein(" ...ij , ...jk -> ...ik", 2).as_ref(), &as_inputs(&[Some(&a), Some(&b)], &[]), &[]).unwrap()[0], &want);
        // implicit output: "ij,jk" -> "ik"
        let (m, n) = (rand(&[3, 4], 3), rand(&[4, 2], 4));
        let (mv, nv) = (m.to_f64_vec(), n.to_f64_vec());
        let w: Vec<f64> = (0..6).map(|e| (0..4).map(|j| mv[(e / 2) * 4 + j] * nv[j * 2 + e % 2]).sum()).collect();
        close(&run(ein("ij,jk", 2).as_ref(), &as_inputs(&[Some(&m), Some(&n)], &[]), &[]).unwrap()[0], &w);
        // implicit output is alphabetical: "ba" -> "ab" is a transpose
        let t = run(ein("ba", 1).as_ref(), &as_inputs(&[Some(&m)], &[]), &[]).unwrap().remove(0);
        assert_eq!(t.dims(), &[4, 3]);
        // attention scores bhid,bhjd->bhij
        let (q, k) = (rand(&[1, 2, 3, 4], 5), rand(&[1, 2, 5, 4], 6));
        let (qv, kv) = (q.to_f64_vec(), k.to_f64_vec());
        let mut w = vec![0.0; 2 * 3 * 5];
        for h in 0..2 {
            for i in 0..3 {
                for j in 0..5 {
                    w[(h * 3 + i) * 5 + j] = (0..4).map(|d| qv[(h * 3 + i) * 4 + d] * kv[(h * 5 + j) * 4 + d]).sum();
                }
            }
        }
        close(&run(ein("bhid,bhjd->bhij", 2).as_ref(), &as_inputs(&[Some(&q), Some(&k)], &[]), &[]).unwrap()[0], &w);
    }

    #[test]
    fn einsum_diagonals_sums_scalars_and_ints() {
        let x = rand(&[3, 5, 5], 7);
        let xv = x.to_f64_vec();
        let diag: Vec<f64> = (0..15).map(|e| xv[(e / 5) * 25 + (e % 5) * 6]).collect();
        close(&run(ein("...ii ->...i", 1).as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0], &diag);
        let trace: Vec<f64> = (0..3).map(|b| (0..5).map(|i| xv[b * 25 + i * 6]).sum()).collect();
        close(&run(ein("bii->b", 1).as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0], &trace);
        let total: f64 = xv.iter().sum();
        let s = run(ein("ijk->", 1).as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap().remove(0);
        assert_eq!(s.dims(), &[] as &[usize]);
        close(&s, &[total]);
        let sc = Tensor::scalar(2.5f64);
        assert_eq!(run(ein("->", 1).as_ref(), &as_inputs(&[Some(&sc)], &[]), &[]).unwrap()[0], sc);
        let (u, v) = (Tensor::from_f64(DType::I64, &[4], &[1.0, -2.0, 3.0, 4.0]).unwrap(), Tensor::from_f64(DType::I64, &[4], &[5.0, 6.0, -7.0, 8.0]).unwrap());
        assert_eq!(run(ein("i,i", 2).as_ref(), &as_inputs(&[Some(&u), Some(&v)], &[]), &[]).unwrap()[0], Tensor::scalar(4i64));
        // outer product, three operands, broadcasting ellipsis
        let (p, q, r) = (rand(&[2], 1), rand(&[3], 2), rand(&[2, 1, 3], 3));
        let (pv, qv, rv) = (p.to_f64_vec(), q.to_f64_vec(), r.to_f64_vec());
        let w: Vec<f64> = (0..6).map(|e| pv[e / 3] * qv[e % 3] * rv[(e / 3) * 3 + e % 3]).collect();
        close(&run(ein("i,j,ikj->ij", 3).as_ref(), &as_inputs(&[Some(&p), Some(&q), Some(&r.reshaped(&[2, 1, 3]).unwrap())], &[]), &[]).unwrap()[0], &w);
        let (e1, e2) = (rand(&[2, 3], 4), rand(&[1, 3], 5));
        let (e1v, e2v) = (e1.to_f64_vec(), e2.to_f64_vec());
        let w: Vec<f64> = (0..2).map(|b| (0..3).map(|i| e1v[b * 3 + i] * e2v[i]).sum()).collect();
        close(&run(ein("...i,...i->...", 2).as_ref(), &as_inputs(&[Some(&e1), Some(&e2)], &[]), &[]).unwrap()[0], &w);
    }

    #[test]
    fn einsum_errors() {
        let x = rand(&[2, 3], 1);
        let e = run(ein("ij,jk->ik", 2).as_ref(), &as_inputs(&[Some(&x), Some(&rand(&[4, 2], 2))], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("label 'j' has size 4 here but 3"), "{e}");
        let e = run(ein("ijk->i", 1).as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("does not match subscripts"), "{e}");
        for bad in ["ij->ii", "ij->k", "i$->i", "......->"] {
            assert!(make("Einsum", 12, &[("equation", Attr::String(bad.into()))], 1, 1).is_err(), "{bad}");
        }
        assert!(make("Einsum", 12, &[("equation", Attr::String("i,j".into()))], 1, 1).is_err());
        // the GPU kernel refuses sums longer than the per-invocation loop limit
        let op = ein("ij->", 1);
        let t = crate::TensorType::new(DType::F32, vec![300, 300]);
        let args = [Some(crate::Arg { ty: &t, value: None })];
        let out = op.infer(&args).unwrap();
        let e = op.wgsl().unwrap().generate(&args, &out, &Default::default()).unwrap_err().to_string();
        assert!(e.contains("run this model on the CPU"), "{e}");
    }
}
