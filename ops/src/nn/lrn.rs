//! LRN (local response normalisation across channels) of `X (N, C, ..)`:
//! `y = x / (bias + alpha / size * sum(x[c'] ^ 2))^beta` over the channels
//! `c - floor((size - 1) / 2) ..= c + ceil((size - 1) / 2)` that exist. WGSL: one
//! invocation per element with a loop over at most `size` channels.
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Cost, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

#[derive(Debug)]
pub struct Lrn {
    alpha: f32,
    beta: f32,
    bias: f32,
    size: usize,
}

impl Lrn {
    /// (channels, spatial size) of `X`.
    fn layout(dims: &[usize]) -> Result<(usize, usize)> {
        if dims.len() < 3 {
            return Err(OpError::input(0, format!("expected (N, C, D1, ..), found shape {dims:?}")));
        }
        Ok((dims[1], dims[2..].iter().product()))
    }

    /// Channels below and above `c` in the window.
    fn reach(&self) -> (usize, usize) {
        ((self.size - 1) / 2, self.size / 2)
    }
}

impl Op for Lrn {
    fn name(&self) -> &str {
        "LRN"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, FLOATS)?;
        let x = required(inputs, 0)?;
        Self::layout(x.dims())?;
        Ok(vec![TensorType::new(dtype, x.dims())])
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        Cost { flops: (2 * self.size as u64 + 4) * outputs[0].len() as u64, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for Lrn {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let (c, spatial) = Self::layout(x.dims())?;
        let (below, above) = self.reach();
        let v = x.to_f64_vec();
        let k = self.alpha as f64 / self.size as f64;
        let y: Vec<f64> = (0..v.len())
            .map(|i| {
                let ch = (i / spatial) % c;
                let base = i - ch * spatial;
                let sum: f64 = (ch.saturating_sub(below)..(ch + above + 1).min(c)).map(|q| v[base + q * spatial].powi(2)).sum();
                v[i] / (self.bias as f64 + k * sum).powf(self.beta as f64)
            })
            .collect();
        outputs[0] = Tensor::from_f64(x.dtype(), x.dims(), &y)?;
        Ok(())
    }
}

impl WgslKernel for Lrn {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (c, spatial) = Self::layout(required(inputs, 0)?.dims())?;
        let (below, above) = self.reach();
        let n = outputs[0].len();
        if n == 0 {
            return Ok(WgslProgram::default());
        }
        let lit = |v: f64| wgsl::literal("f32", v);
        let body = format!(
            "let ch = (i / {spatial}u) % {c}u;\n    let base = i - ch * {spatial}u;\n    let lo = select(0u, ch - {below}u, ch >= {below}u);\n    \
             let hi = min(ch + {}u, {c}u);\n    var sum = 0.0;\n    {}    y[i] = x[i] / pow({} + {} * sum, {});",
            above + 1,
            wgsl::for_loop("q", "lo", "hi", "1u", &format!("let v = x[base + q * {spatial}u];\nsum = sum + v * v;")),
            lit(self.bias as f64),
            lit(self.alpha as f64 / self.size as f64),
            lit(self.beta as f64),
        );
        let wg = tune.get(&wgsl::workgroup_param());
        let buffers = [("x", "f32", true), ("y", "f32", false)];
        Ok(WgslProgram::single(wgsl::simple_kernel("LRN", n, wg, &buffers, vec![Binding::Input(0), Binding::Output(0)], "", &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "LRN", |spec: &NodeSpec| {
        let size = spec.int_opt("size")?.ok_or_else(|| spec.bad("size", "the attribute is required"))?;
        if size <= 0 || size as usize > wgsl::MAX_LOOP_ITERATIONS {
            return Err(spec.bad("size", format!("expected a window of 1..={} channels, found {size}", wgsl::MAX_LOOP_ITERATIONS)));
        }
        Ok(Box::new(Lrn { alpha: spec.float("alpha", 1e-4)?, beta: spec.float("beta", 0.75)?, bias: spec.float("bias", 1.0)?, size: size as usize }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close, as_inputs, make, rand_f32, run};
    use kiln_graph::Attr;

    #[test]
    fn lrn_matches_a_reference() {
        for (dims, size) in [(vec![2usize, 5, 3, 4], 3i64), (vec![1, 7, 5], 4), (vec![2, 3, 2, 2], 1), (vec![1, 4, 3, 3], 9)] {
            let x = rand_f32(&dims, 2);
            let attrs = [("size", Attr::Int(size)), ("alpha", Attr::Float(0.3)), ("beta", Attr::Float(0.6)), ("bias", Attr::Float(1.5))];
            let y = run(make("LRN", 19, &attrs, 1, 1).unwrap().as_ref(), &as_inputs(&[Some(&x)], &[]), &[]).unwrap().remove(0);
            let (c, sp): (usize, usize) = (dims[1], dims[2..].iter().product());
            let xv = x.to_f64_vec();
            let (lo, hi) = ((size as f64 - 1.0) / 2.0, (size as f64 - 1.0) / 2.0);
            let want: Vec<f64> = (0..xv.len())
                .map(|i| {
                    let ch = ((i / sp) % c) as i64;
                    let base = i - ch as usize * sp;
                    let sum: f64 = (0..c as i64).filter(|&q| q >= ch - lo.floor() as i64 && q <= ch + hi.ceil() as i64).map(|q| xv[base + q as usize * sp].powi(2)).sum();
                    xv[i] / (1.5f32 as f64 + 0.3f32 as f64 / size as f64 * sum).powf(0.6f32 as f64)
                })
                .collect();
            assert_close(&y, &want, 1e-5, &format!("LRN {dims:?} size {size}"));
        }
        assert!(make("LRN", 19, &[], 1, 1).unwrap_err().to_string().contains("size"));
    }
}
