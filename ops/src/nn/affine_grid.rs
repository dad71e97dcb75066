//! AffineGrid (opset 20): the sampling grid GridSample reads, from affine matrices
//! `theta (N, 2, 3)` (2-D) or `(N, 3, 4)` (3-D) and an output `size` `(N, C, H, W)` or
//! `(N, C, D, H, W)` (a known value): `grid[n, (d,) h, w] = theta[n] @ (x_w, y_h,
//! (z_d,) 1)`, the normalised coordinates of each pixel in [-1, 1]; `align_corners`
//! puts -1 and 1 at the corner pixels' centres (`-1 + 2 i / (s - 1)`), else at the
//! image edges (`(2 i + 1) / s - 1`). A dim of size 1 sits at 0, except with
//! `align_corners`, where onnxruntime puts it at 1 (its linspace's end; the ONNX
//! reference gives -1, PyTorch 0): Kiln follows onnxruntime.
//!
//! WGSL: one invocation per output element (one coordinate of one pixel).
use crate::cpu::{self, CpuKernel};
use crate::op::{constant, expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};
use std::fmt::Write;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Debug)]
pub struct AffineGrid {
    align_corners: bool,
}

impl AffineGrid {
    /// (N, spatial sizes outermost first) after checking theta and size.
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<(usize, Vec<usize>)> {
        expect_dtype(inputs, 0, FLOATS)?;
        let theta = required(inputs, 0)?.dims();
        let size = constant(inputs, 1, "AffineGrid's size")?;
        if !size.dtype().is_int() {
            return Err(OpError::input(1, format!("AffineGrid's size must be an integer tensor, found {}", size.dtype())));
        }
        let size = size.to_i64_vec()?;
        if !(size.len() == 4 || size.len() == 5) || size.iter().any(|&s| s < 0) {
            return Err(OpError::input(1, format!("AffineGrid's size must be (N, C, H, W) or (N, C, D, H, W), found {size:?}")));
        }
        let r = size.len() - 2;
        if theta.len() != 3 || theta[1] != r || theta[2] != r + 1 {
            return Err(OpError::input(0, format!("AffineGrid's theta must have shape (N, {r}, {}) for a {r}-D size, found {theta:?}", r + 1)));
        }
        if size[0] != theta[0] as i64 {
            return Err(OpError::input(1, format!("AffineGrid's size[0] = {} must equal theta's batch {}", size[0], theta[0])));
        }
        let spatial = size[2..].iter().map(|&s| usize::try_from(s).map_err(|_| OpError::input(1, format!("size {s} is too large")))).collect::<Result<Vec<_>>>()?;
        Ok((theta[0], spatial))
    }

    /// The normalised coordinate of pixel `i` of a dim of `s` pixels.
    fn coordinate(&self, i: usize, s: usize) -> f64 {
        match (self.align_corners, s) {
            (true, 1) => 1.0,
            (true, _) => -1.0 + 2.0 * i as f64 / (s - 1) as f64,
            (false, _) => (2 * i + 1) as f64 / s as f64 - 1.0,
        }
    }

    /// The output dims: `(N, spatial..., r)`.
    fn out_dims(n: usize, spatial: &[usize]) -> Vec<usize> {
        std::iter::once(n).chain(spatial.iter().copied()).chain(std::iter::once(spatial.len())).collect()
    }
}

impl Op for AffineGrid {
    fn name(&self) -> &str {
        "AffineGrid"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let (n, spatial) = self.plan(inputs)?;
        Ok(vec![TensorType::new(required(inputs, 0)?.dtype(), Self::out_dims(n, &spatial))])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for AffineGrid {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (n, spatial) = crate::tensor::tensor_args(inputs, |a| self.plan(a))?;
        let theta = cpu::input(inputs, 0)?;
        let tv = theta.to_f64_vec();
        let r = spatial.len();
        let pixels: usize = spatial.iter().product();
        let mut y = Vec::with_capacity(n * pixels * r);
        for b in 0..n {
            let t = &tv[b * r * (r + 1)..][..r * (r + 1)];
            for p in 0..pixels {
                // Coordinates innermost first: x (width), y (height), z (depth).
                let mut rem = p;
                let mut coords = vec![0.0; r];
                for (k, &s) in spatial.iter().enumerate().rev() {
                    coords[r - 1 - k] = self.coordinate(rem % s, s);
                    rem /= s;
                }
                for row in t.chunks(r + 1) {
                    y.push(row[..r].iter().zip(&coords).map(|(a, c)| a * c).sum::<f64>() + row[r]);
                }
            }
        }
        outputs[0] = Tensor::from_f64(theta.dtype(), &Self::out_dims(n, &spatial), &y)?;
        Ok(())
    }
}

impl WgslKernel for AffineGrid {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (_, spatial) = self.plan(inputs)?;
        let len = outputs[0].len();
        if len == 0 {
            return Ok(WgslProgram::default());
        }
        let r = spatial.len();
        let f = |v: f64| wgsl::literal("f32", v);
        let mut body = format!("let k = i % {r}u;\n    var rem = i / {r}u;\n");
        for (k, &s) in spatial.iter().enumerate().rev() {
            let c = r - 1 - k;
            let _ = writeln!(body, "    let p{c} = f32(rem % {s}u);\n    rem = rem / {s}u;");
            let coord = match (self.align_corners, s) {
                (true, 1) => f(1.0),
                (true, _) => format!("-1.0 + p{c} * {}", f(2.0 / (s - 1) as f64)),
                (false, _) => format!("(2.0 * p{c} + 1.0) / {} - 1.0", f(s as f64)),
            };
            let _ = writeln!(body, "    let c{c} = {coord};");
        }
        let _ = writeln!(body, "    let row = (rem * {r}u + k) * {}u;", r + 1);
        let terms: Vec<String> = (0..r).map(|c| format!("theta[row + {c}u] * c{c}")).collect();
        let _ = write!(body, "    y[i] = {} + theta[row + {r}u];", terms.join(" + "));
        let wg = tune.get(&wgsl::workgroup_param());
        let buffers = [("theta", "f32", true), ("y", "f32", false)];
        Ok(WgslProgram::single(wgsl::simple_kernel(self.name(), len, wg, &buffers, vec![Binding::Input(0), Binding::Output(0)], "", &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "AffineGrid", |spec: &NodeSpec| match spec.int("align_corners", 0)? {
        0 => Ok(Box::new(AffineGrid { align_corners: false })),
        1 => Ok(Box::new(AffineGrid { align_corners: true })),
        v => Err(spec.bad("align_corners", format!("must be 0 or 1, found {v}"))),
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    fn grid(theta: Tensor, size: &[i64], align: i64) -> Case {
        Case::new("AffineGrid").opset(20).input(theta).constant(i64_vec(size)).attr("align_corners", Attr::Int(align))
    }

    /// Outputs of onnxruntime 1.32 (2-D with batch 2 at size 2x3; 3-D at 2x1x3, its
    /// middle dim of size 1).
    #[test]
    fn matches_onnxruntime() {
        let th2 = f32s(&[2, 2, 3], &[1.0, 0.2, 0.1, 0.3, 1.0, -0.2, 0.5, -0.4, 0.25, 0.125, 0.75, 0.5]);
        let th3 = f32s(&[1, 3, 4], &[1.0, 0.2, 0.1, 0.3, 0.3, 1.0, -0.2, 0.1, 0.1, 0.2, 0.9, -0.5]);
        #[rustfmt::skip]
        let cases: [(i64, bool, &[f64]); 4] = [
            (0, false, &[-0.6666667, -0.9, 0.0, -0.7, 0.6666667, -0.5, -0.4666667, 0.09999998, 0.2, 0.3, 0.8666667, 0.5000001, 0.1166667, 0.04166666, 0.45, 0.125, 0.7833334, 0.2083333, -0.2833334, 0.7916666, 0.05, 0.875, 0.3833333, 0.9583334]),
            (0, true, &[-0.4166667, -1.490116e-08, -1.016667, 0.25, 0.2, -0.95, 0.9166667, 0.4, -0.8833333, -0.3166667, -0.2, -0.1166667, 0.35, 0.0, -0.05000001, 1.016667, 0.2, 0.01666665]),
            (1, false, &[-1.1, -1.5, -0.1, -1.2, 0.9, -0.9, -0.7, 0.5, 0.3, 0.8, 1.3, 1.1, 0.15, -0.375, 0.65, -0.25, 1.15, -0.125, -0.65, 1.125, -0.15, 1.25, 0.35, 1.375]),
            (1, true, &[-0.6, 1.0, -1.3, 0.4, 1.3, -1.2, 1.4, 1.6, -1.1, -0.4, 0.6, 0.5, 0.6, 0.9, 0.6, 1.6, 1.2, 0.7]),
        ];
        for (align, three_d, want) in cases {
            let c = if three_d { grid(th3.clone(), &[1, 1, 2, 1, 3], align) } else { grid(th2.clone(), &[2, 3, 2, 3], align) };
            let y = c.run_cpu().unwrap().remove(0);
            assert_eq!(y.dims(), if three_d { &[1, 2, 1, 3, 3][..] } else { &[2, 2, 3, 2][..] });
            assert_close(&y, want, 1e-6, &format!("align_corners {align} 3-D {three_d}"));
            let y64 = c.with_floats_as(DType::F64).run_cpu().unwrap().remove(0);
            assert_close(&y64, want, 1e-6, "f64");
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let th2 = rand_f32(&[2, 2, 3], 1);
        let err = |c: Case| c.run_cpu().unwrap_err().to_string();
        let e = err(grid(th2.clone(), &[1, 3, 2, 3], 0));
        assert!(e.contains("size[0] = 1 must equal theta's batch 2"), "{e}");
        let e = err(grid(th2.clone(), &[2, 3, 2, 3, 4], 0));
        assert!(e.contains("theta must have shape (N, 3, 4) for a 3-D size"), "{e}");
        let e = err(grid(th2.clone(), &[2, 3, 2], 0));
        assert!(e.contains("size must be (N, C, H, W) or (N, C, D, H, W)"), "{e}");
        let e = Case::new("AffineGrid").opset(20).input(th2).input(i64_vec(&[2, 3, 2, 3])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("size must be known"), "{e}");
        assert!(make("AffineGrid", 20, &[("align_corners", Attr::Int(2))], 2, 1).is_err());
    }
}
