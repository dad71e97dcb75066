//! Unique (opset 11): the distinct elements of `X` (flattened), or its distinct slices
//! along `axis`, with four outputs: `Y` the unique values (slices), `indices` (i64)
//! where each first occurs in X, `inverse_indices` (i64) the position in Y of every
//! element (slice) of X, and `counts` (i64). `sorted` 1 (the default): Y ascending
//! (slices compared lexicographically); 0: in order of first occurrence. Unsigned
//! integers compare as unsigned; -0.0 equals 0.0 (the first occurrence is kept); NaNs
//! equal each other and sort after every number (onnxruntime's handling of NaN is
//! unspecified: its ordered map treats NaN as equal to everything).
//!
//! Like NonZero, the output shapes depend on the input's values: inference needs them
//! (a constant, or a graph input the session binds by value), and the CPU kernel
//! computes and replaces its outputs from the values it is given. There is no GPU
//! kernel.
use super::numeric::split_at_axis;
use crate::cpu::{self, CpuKernel};
use crate::op::{constant, required};
use crate::wgsl::WgslKernel;
use crate::{norm_axis, Arg, NodeSpec, Op, OpError, Registry, Result, TensorType};
use kiln_graph::Tensor;
use std::cmp::Ordering;

#[derive(Debug)]
pub struct Unique {
    axis: Option<i64>,
    sorted: bool,
}

/// X's elements, widened so that comparisons are exact.
enum Values {
    F(Vec<f64>),
    I(Vec<i64>),
    U(Vec<u64>),
}

impl Values {
    fn of(t: &Tensor) -> Result<Values> {
        Ok(if t.dtype().is_float() {
            Values::F(t.to_f64_vec())
        } else if t.dtype().is_signed() {
            Values::I(t.to_i64_vec()?)
        } else {
            // u64 round-trips through its i64 bit pattern; bool reads as 0/1.
            Values::U(t.to_i64_vec()?.into_iter().map(|v| v as u64).collect())
        })
    }

    fn cmp(&self, a: usize, b: usize) -> Ordering {
        match self {
            Values::F(v) => match (v[a].is_nan(), v[b].is_nan()) {
                (false, false) => v[a].partial_cmp(&v[b]).unwrap_or(Ordering::Equal),
                (x, y) => x.cmp(&y),
            },
            Values::I(v) => v[a].cmp(&v[b]),
            Values::U(v) => v[a].cmp(&v[b]),
        }
    }
}

/// What Unique found: the chosen slices of X in Y's order, and the other outputs.
struct Found {
    y_dims: Vec<usize>,
    /// (outer, slices, inner) of X split at the axis (flattened: (1, len, 1)).
    split: (usize, usize, usize),
    picked: Vec<usize>,
    inverse: Vec<i64>,
    counts: Vec<i64>,
}

impl Unique {
    fn axis(&self, rank: usize) -> Result<Option<usize>> {
        self.axis.map(|a| norm_axis(a, rank)).transpose()
    }

    fn find(&self, x: &Tensor) -> Result<Found> {
        let axis = self.axis(x.rank())?;
        let (outer, n, inner) = match axis {
            Some(a) => split_at_axis(x.dims(), a),
            None => (1, x.len(), 1),
        };
        let vals = Values::of(x)?;
        // Slices compare element by element in row-major order of (outer, inner).
        let cmp = |p: usize, q: usize| -> Ordering {
            for o in 0..outer {
                for r in 0..inner {
                    let c = vals.cmp((o * n + p) * inner + r, (o * n + q) * inner + r);
                    if c != Ordering::Equal {
                        return c;
                    }
                }
            }
            Ordering::Equal
        };
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&p, &q| cmp(p, q)); // stable: equal slices stay by index
        // Groups of equal slices, in ascending order, each led by its first occurrence.
        let mut groups: Vec<(usize, Vec<usize>)> = vec![];
        for &p in &order {
            match groups.last_mut() {
                Some((lead, members)) if cmp(*lead, p) == Ordering::Equal => members.push(p),
                _ => groups.push((p, vec![p])),
            }
        }
        if !self.sorted {
            groups.sort_by_key(|g| g.0);
        }
        let mut inverse = vec![0i64; n];
        for (k, (_, members)) in groups.iter().enumerate() {
            for &m in members {
                inverse[m] = k as i64;
            }
        }
        let y_dims = match axis {
            Some(a) => {
                let mut d = x.dims().to_vec();
                d[a] = groups.len();
                d
            }
            None => vec![groups.len()],
        };
        Ok(Found {
            y_dims,
            split: (outer, n, inner),
            picked: groups.iter().map(|g| g.0).collect(),
            counts: groups.iter().map(|g| g.1.len() as i64).collect(),
            inverse,
        })
    }

    /// The four outputs.
    fn outputs(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let f = self.find(x)?;
        let (outer, n, inner) = f.split;
        let size = x.dtype().size();
        let src = x.bytes();
        let mut y = Vec::with_capacity(outer * f.picked.len() * inner * size);
        for o in 0..outer {
            for &p in &f.picked {
                y.extend_from_slice(&src[(o * n + p) * inner * size..][..inner * size]);
            }
        }
        let picked: Vec<i64> = f.picked.iter().map(|&p| p as i64).collect();
        Ok(vec![
            Tensor::from_bytes(x.dtype(), &f.y_dims, &y)?,
            Tensor::from_slice(&[picked.len()], &picked)?,
            Tensor::from_slice(&[n], &f.inverse)?,
            Tensor::from_slice(&[f.counts.len()], &f.counts)?,
        ])
    }
}

impl Op for Unique {
    fn name(&self) -> &str {
        "Unique"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = required(inputs, 0)?;
        self.axis(x.rank())?;
        let v = constant(inputs, 0, "the input of Unique (its output shapes depend on its values)")?;
        Ok(self.outputs(v)?.iter().map(|t| TensorType::new(t.dtype(), t.dims())).collect())
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }
}

impl CpuKernel for Unique {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        for (out, t) in outputs.iter_mut().zip(self.outputs(x)?) {
            *out = t;
        }
        Ok(())
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Unique", |spec: &NodeSpec| {
        let sorted = match spec.int("sorted", 1)? {
            0 => false,
            1 => true,
            v => return Err(spec.bad("sorted", format!("must be 0 or 1, found {v}"))),
        };
        if spec.n_outputs() > 4 {
            return Err(OpError::invalid(format!("Unique has at most 4 outputs, the node has {}", spec.n_outputs())));
        }
        Ok(Box::new(Unique { axis: spec.int_opt("axis")?, sorted }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    /// Runs folded (the value known to inference) and as a run-time kernel given
    /// outputs of the wrong sizes; both must agree.
    fn unique(x: &Tensor, attrs: &[(&str, Attr)]) -> crate::Result<Vec<Tensor>> {
        let case = Case::new("Unique").opset(11).constant(x.clone()).attrs(attrs).outputs(4);
        let folded = case.run_cpu();
        let op = case.op()?;
        let mut outs = vec![Tensor::zeros(x.dtype(), &[1]), Tensor::zeros(DType::I64, &[9]), Tensor::zeros(DType::I64, &[0]), Tensor::zeros(DType::I64, &[2])];
        let run_time = op.cpu().unwrap().run(&[Some(x)], &mut outs).map(|_| outs);
        match (&folded, &run_time) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "folded and run-time outputs differ"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            _ => panic!("folded {folded:?} but at run time {run_time:?}"),
        }
        folded
    }

    fn check(got: &[Tensor], y: &Tensor, idx: &[i64], inv: &[i64], counts: &[i64]) {
        assert_eq!(&got[0], y);
        assert_eq!(got[1], i64_vec(idx));
        assert_eq!(got[2], i64_vec(inv));
        assert_eq!(got[3], i64_vec(counts));
    }

    /// Expected outputs from onnxruntime 1.32 (and, for NaN, numpy's np.unique).
    #[test]
    fn matches_onnxruntime() {
        let x = f32s(&[8], &[2.0, 1.0, 1.0, 3.0, 4.0, 3.0, -0.0, 0.0]);
        let got = unique(&x, &[]).unwrap();
        check(&got, &f32s(&[5], &[-0.0, 1.0, 2.0, 3.0, 4.0]), &[6, 1, 0, 3, 4], &[2, 1, 1, 3, 4, 3, 0, 0], &[2, 2, 1, 2, 1]);
        let got = unique(&x, &[("sorted", Attr::Int(0))]).unwrap();
        check(&got, &f32s(&[5], &[2.0, 1.0, 3.0, 4.0, -0.0]), &[0, 1, 3, 4, 6], &[0, 1, 1, 2, 3, 2, 4, 4], &[1, 2, 2, 1, 2]);
        let m = f32s(&[3, 3], &[1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 2.0, 3.0, 4.0]);
        for sorted in [0, 1] {
            let got = unique(&m, &[("axis", Attr::Int(0)), ("sorted", Attr::Int(sorted))]).unwrap();
            check(&got, &f32s(&[2, 3], &[1.0, 0.0, 0.0, 2.0, 3.0, 4.0]), &[0, 2], &[0, 0, 1], &[2, 1]);
        }
        let got = unique(&m, &[("axis", Attr::Int(1))]).unwrap();
        check(&got, &f32s(&[3, 3], &[0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 3.0, 4.0, 2.0]), &[1, 2, 0], &[2, 0, 1], &[1, 1, 1]);
        let got = unique(&m, &[("axis", Attr::Int(-1)), ("sorted", Attr::Int(0))]).unwrap();
        check(&got, &m, &[0, 1, 2], &[0, 1, 2], &[1, 1, 1]);
        // Integers: unsigned order, i64 beyond f64's exact range.
        let u = Tensor::from_slice(&[4], &[u64::MAX, 1, u64::MAX, 0]).unwrap();
        check(&unique(&u, &[]).unwrap(), &Tensor::from_slice(&[3], &[0u64, 1, u64::MAX]).unwrap(), &[3, 1, 0], &[2, 1, 2, 0], &[1, 1, 2]);
        let big = i64_vec(&[(1 << 60) + 1, 1 << 60, (1 << 60) + 1]);
        check(&unique(&big, &[]).unwrap(), &i64_vec(&[1 << 60, (1 << 60) + 1]), &[1, 0], &[1, 0, 1], &[1, 2]);
        let b = bools(&[2, 2], &[true, false, true, true]);
        check(&unique(&b, &[]).unwrap(), &bools(&[2], &[false, true]), &[1, 0], &[1, 0, 1, 1], &[1, 3]);
        // NaNs are one value, after the numbers (numpy's equal_nan).
        let n = f32s(&[4], &[f32::NAN, 1.0, f32::NAN, -1.0]);
        let got = unique(&n, &[]).unwrap();
        assert!(got[0].to_f64_vec()[2].is_nan());
        assert_eq!(got[2], i64_vec(&[2, 1, 2, 0]));
        // A scalar is one element; empty inputs; 3-D slices; bf16.
        check(&unique(&Tensor::scalar(5f32), &[]).unwrap(), &f32s(&[1], &[5.0]), &[0], &[0], &[1]);
        check(&unique(&f32s(&[0], &[]), &[]).unwrap(), &f32s(&[0], &[]), &[], &[], &[]);
        let got = unique(&f32s(&[2, 0], &[]), &[("axis", Attr::Int(0))]).unwrap();
        check(&got, &f32s(&[1, 0], &[]), &[0], &[0, 0], &[2]);
        let t = f32s(&[1, 6, 2], &[1.0, 1.0, 0.0, 1.0, 2.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]);
        let got = unique(&t, &[("axis", Attr::Int(1))]).unwrap();
        check(&got, &f32s(&[1, 3, 2], &[0.0, 1.0, 1.0, 1.0, 2.0, 1.0]), &[1, 0, 2], &[1, 0, 2, 0, 1, 0], &[3, 2, 1]);
        let got = unique(&cast(&f32s(&[4], &[2.0, 1.5, 2.0, -3.0]), DType::BF16), &[]).unwrap();
        assert_eq!(got[0], cast(&f32s(&[3], &[-3.0, 1.5, 2.0]), DType::BF16));
    }

    #[test]
    fn fewer_outputs_and_errors() {
        // A node with only Y: the kernel writes the outputs it is given.
        let x = f32s(&[3], &[2.0, 1.0, 2.0]);
        let case = Case::new("Unique").opset(11).constant(x.clone()).outputs(1);
        let mut outs = vec![Tensor::zeros(DType::F32, &[3])];
        case.op().unwrap().cpu().unwrap().run(&[Some(&x)], &mut outs).unwrap();
        assert_eq!(outs[0], f32s(&[2], &[1.0, 2.0]));
        let e = unique(&x, &[("axis", Attr::Int(1))]).unwrap_err().to_string();
        assert!(e.contains("axis 1 is out of range for rank 1"), "{e}");
        let e = Case::new("Unique").opset(11).input(x).outputs(4).run_cpu().unwrap_err().to_string();
        assert!(e.contains("must be known"), "{e}");
        assert!(make("Unique", 11, &[("sorted", Attr::Int(2))], 1, 4).is_err());
        assert!(make("Unique", 11, &[], 1, 5).is_err());
    }
}
