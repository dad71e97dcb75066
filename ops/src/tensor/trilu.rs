//! Trilu: keeps the upper (`upper=1`, `col - row >= k`) or lower (`col - row <= k`)
//! triangle of the last two dims and zeroes the rest. `k` is an optional constant
//! scalar input (default 0).
use super::common::opt_const_ints;
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct Trilu {
    upper: bool,
}

impl Trilu {
    /// (rows, cols, k) of the matrices of input 0.
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<(usize, usize, i64)> {
        let x = required(inputs, 0)?;
        if x.rank() < 2 {
            return Err(OpError::input(0, format!("Trilu needs a tensor of rank >= 2, found shape {:?}", x.dims())));
        }
        let k = match opt_const_ints(inputs, 1, "k")? {
            None => 0,
            Some(v) if v.len() == 1 => v[0],
            Some(v) => return Err(OpError::input(1, format!("k must be a single integer, found {} values", v.len()))),
        };
        let r = x.rank();
        Ok((x.dims()[r - 2], x.dims()[r - 1], k))
    }

    fn keep(&self, row: usize, col: usize, k: i64) -> bool {
        let d = col as i64 - row as i64;
        if self.upper {
            d >= k
        } else {
            d <= k
        }
    }
}

impl Op for Trilu {
    fn name(&self) -> &str {
        "Trilu"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        self.plan(inputs)?;
        Ok(vec![required(inputs, 0)?.ty.clone()])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Trilu {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (rows, cols, k) = super::common::tensor_args(inputs, |a| self.plan(a))?;
        let x = cpu::input(inputs, 0)?;
        let es = x.dtype().size();
        let row_bytes = cols * es;
        let src = x.bytes();
        let dst = outputs[0].bytes_mut();
        if row_bytes == 0 || dst.is_empty() {
            return Ok(());
        }
        cpu::par_chunks_mut(dst, row_bytes, cols, |r0, part| {
            for (r, out) in part.chunks_mut(row_bytes).enumerate() {
                let g = r0 + r;
                let row = g % rows;
                let s = &src[g * row_bytes..(g + 1) * row_bytes];
                for col in 0..cols {
                    let e = &mut out[col * es..(col + 1) * es];
                    if self.keep(row, col, k) {
                        e.copy_from_slice(&s[col * es..(col + 1) * es]);
                    } else {
                        e.fill(0);
                    }
                }
            }
        });
        Ok(())
    }
}

impl WgslKernel for Trilu {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (rows, cols, k) = self.plan(inputs)?;
        let ty = wgsl::elem(outputs[0].dtype);
        let cmp = if self.upper { ">=" } else { "<=" };
        let k = k.clamp(i32::MIN as i64 / 2, i32::MAX as i64 / 2);
        let body = format!(
            "let col = i32(i % {c}u);\n    let row = i32((i / {c}u) % {r}u);\n    \
             dst[i] = select({zero}, src[i], col - row {cmp} {k}i);",
            c = cols.max(1),
            r = rows.max(1),
            zero = wgsl::literal(ty, 0.0)
        );
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "Trilu",
            outputs[0].len(),
            wg,
            &[("src", ty, true), ("dst", ty, false)],
            vec![Binding::Input(0), Binding::Output(0)],
            "",
            &body,
        )))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Trilu", |spec| {
        let upper = spec.int("upper", 1)?;
        if upper != 0 && upper != 1 {
            return Err(spec.bad("upper", format!("must be 0 or 1, found {upper}")));
        }
        Ok(Box::new(Trilu { upper: upper == 1 }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    fn reference(x: &[f64], dims: &[usize], upper: bool, k: i64) -> Vec<f64> {
        let (r, c) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        x.iter()
            .enumerate()
            .map(|(i, &v)| {
                let (col, row) = ((i % c) as i64, ((i / c) % r) as i64);
                let keep = if upper { col - row >= k } else { col - row <= k };
                if keep {
                    v
                } else {
                    0.0
                }
            })
            .collect()
    }

    #[test]
    fn trilu_matches_reference() {
        for dims in [vec![4usize, 5], vec![2, 3, 7, 3], vec![1, 1], vec![5, 1]] {
            let x = iota_f32(&dims);
            for upper in [0i64, 1] {
                for k in [-7i64, -1, 0, 2, 9] {
                    let op = make("Trilu", 14, &[("upper", Attr::Int(upper))], 2, 1).unwrap();
                    let kt = Tensor::scalar(k);
                    let got = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&kt)], &[1]), &[]).unwrap();
                    assert_eq!(got[0].to_f64_vec(), reference(&x.to_f64_vec(), &dims, upper == 1, k), "{dims:?} {upper} {k}");
                    let xi = Tensor::from_f64(DType::I64, &dims, &x.to_f64_vec()).unwrap();
                    let got = run(op.as_ref(), &as_inputs(&[Some(&xi), Some(&kt)], &[1]), &[]).unwrap();
                    assert_eq!(got[0].to_f64_vec(), reference(&x.to_f64_vec(), &dims, upper == 1, k));
                }
            }
        }
        // k omitted
        let op = make("Trilu", 14, &[], 1, 1).unwrap();
        let x = iota_f32(&[3, 3]);
        assert_eq!(run(op.as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap()[0].to_f64_vec(), reference(&x.to_f64_vec(), &[3, 3], true, 0));
    }

    #[test]
    fn trilu_errors() {
        let op = make("Trilu", 14, &[], 2, 1).unwrap();
        let x = iota_f32(&[4]);
        let e = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&Tensor::scalar(0i64))], &[1]), &[]).unwrap_err().to_string();
        assert!(e.contains("rank >= 2"), "{e}");
        let x = iota_f32(&[2, 2]);
        let e = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&Tensor::scalar(0i64))], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("k must be known"), "{e}");
        assert!(make("Trilu", 14, &[("upper", Attr::Int(3))], 1, 1).is_err());
    }
}
