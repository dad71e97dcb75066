//! Helpers shared by the tensor ops: reading constant integer inputs, a plain-copy
//! kernel (for views), and test utilities.
use crate::cpu::{self, CpuKernel};
use crate::op::constant;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, OpError, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

/// The constant integer input `i` as i64 values (shape, axes, pads, starts, ...).
pub(crate) fn const_ints(inputs: &[Option<Arg>], i: usize, what: &str) -> Result<Vec<i64>> {
    let t = constant(inputs, i, what)?;
    if !t.dtype().is_int() {
        return Err(OpError::input(i, format!("{what} must be an integer tensor, found {}", t.dtype())));
    }
    Ok(t.to_i64_vec()?)
}

/// Optional constant integer input `i` (None when omitted).
pub(crate) fn opt_const_ints(inputs: &[Option<Arg>], i: usize, what: &str) -> Result<Option<Vec<i64>>> {
    match inputs.get(i).copied().flatten() {
        None => Ok(None),
        Some(_) => const_ints(inputs, i, what).map(Some),
    }
}

/// Calls `f` with `inputs` seen as [`Arg`]s whose values are all known (at run time
/// every input is concrete), so a CPU kernel can reuse the op's planning code.
pub(crate) fn tensor_args<R>(inputs: &[Option<&Tensor>], f: impl FnOnce(&[Option<Arg>]) -> R) -> R {
    let types: Vec<Option<TensorType>> = inputs.iter().map(|t| t.map(|t| TensorType::new(t.dtype(), t.dims()))).collect();
    let args: Vec<Option<Arg>> =
        inputs.iter().zip(&types).map(|(t, ty)| ty.as_ref().map(|ty| Arg { ty, value: *t })).collect();
    f(&args)
}

/// Normalises a list of possibly negative axes against `rank`, rejecting duplicates.
pub(crate) fn norm_axes(axes: &[i64], rank: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = crate::norm_axis(a, rank)?;
        if out.contains(&n) {
            return Err(OpError::invalid(format!("axis {a} is repeated in axes {axes:?}")));
        }
        out.push(n);
    }
    Ok(out)
}

/// Copies input 0 to output 0 unchanged (bytes), whatever the dims say: the kernel of
/// view ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity).
pub(crate) struct CopyKernel;

impl CpuKernel for CopyKernel {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let out = &mut outputs[0];
        if x.bytes().len() != out.bytes().len() {
            return Err(OpError::invalid(format!(
                "copy of {}{:?} into {}{:?}: sizes differ",
                x.dtype(),
                x.dims(),
                out.dtype(),
                out.dims()
            )));
        }
        *out = x.reshaped(out.dims())?;
        Ok(())
    }
}

impl WgslKernel for CopyKernel {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let ty = wgsl::elem(outputs[0].dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "copy",
            outputs[0].len(),
            wg,
            &[("src", ty, true), ("dst", ty, false)],
            vec![Binding::Input(0), Binding::Output(0)],
            "",
            "dst[i] = src[i];",
        )))
    }
}

pub(crate) static COPY: CopyKernel = CopyKernel;

/// A module-scope WGSL constant array `name` holding `values` (stored as u32 bit
/// patterns, since WGSL constant expressions cannot bitcast) and a function
/// `fn name_at(k: u32) -> ty` reading element k in element type `ty` (f32/i32/u32).
pub(crate) fn baked_array(name: &str, ty: &str, values: &[f64]) -> String {
    let bits: Vec<String> = values
        .iter()
        .map(|&v| {
            let b = match ty {
                "f32" => (v as f32).to_bits(),
                "i32" => v.clamp(i32::MIN as f64, i32::MAX as f64) as i32 as u32,
                _ => v.clamp(0.0, u32::MAX as f64) as u32,
            };
            format!("{b}u")
        })
        .collect();
    let body = if bits.is_empty() { "0u".to_string() } else { bits.join(", ") };
    format!(
        "const {name} = array<u32, {n}>({body});\nfn {name}_at(k: u32) -> {ty} {{ return bitcast<{ty}>({name}[k]); }}\n",
        n = values.len().max(1)
    )
}

#[cfg(test)]
pub(crate) mod testing {
    //! Builds ops through the registry and runs them: CPU results, with every
    //! generated WGSL dispatch validated by naga.
    use crate::{Arg, NodeSpec, Op, Registry, Result, TensorType, TuneValues};
    use kiln_graph::{Attr, Node, Tensor};

    /// An op of type `op` at `opset` with `n_in` inputs (all present) and `n_out` outputs.
    pub fn make(op: &str, opset: i64, attrs: &[(&str, Attr)], n_in: usize, n_out: usize) -> Result<Box<dyn Op>> {
        let node = Node {
            name: "n".into(),
            op_type: op.into(),
            domain: String::new(),
            attrs: attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            inputs: (0..n_in).map(Some).collect(),
            outputs: (n_in..n_in + n_out).collect(),
        };
        Registry::builtin().create(&NodeSpec::new(&node, opset))
    }

    /// Runs `op` on `inputs`; inputs flagged in `consts` are given to inference as
    /// constants. Validates the WGSL (when the op has a kernel) and returns the CPU outputs.
    pub fn run(op: &dyn Op, inputs: &[Option<&Tensor>], consts: &[usize]) -> Result<Vec<Tensor>> {
        let types: Vec<Option<TensorType>> =
            inputs.iter().map(|t| t.map(|t| TensorType::new(t.dtype(), t.dims()))).collect();
        let args: Vec<Option<Arg>> = inputs
            .iter()
            .zip(&types)
            .enumerate()
            .map(|(i, (t, ty))| {
                ty.as_ref().map(|ty| Arg { ty, value: if consts.contains(&i) { *t } else { None } })
            })
            .collect();
        let out_types = op.infer(&args)?;
        if let Some(w) = op.wgsl() {
            let prog = w.generate(&args, &out_types, &TuneValues::default())?;
            for d in &prog.dispatches {
                crate::wgsl::testing::validate(&d.source);
            }
        }
        let mut outs: Vec<Tensor> = out_types.iter().map(|t| Tensor::zeros(t.dtype, &t.dims)).collect();
        op.cpu().expect("op has a CPU kernel").run(inputs, &mut outs)?;
        for (o, t) in outs.iter().zip(&out_types) {
            assert_eq!(o.dims(), t.dims.as_slice(), "CPU output dims differ from inferred");
            assert_eq!(o.dtype(), t.dtype);
        }
        Ok(outs)
    }

    pub fn i64s(dims: &[usize], v: &[i64]) -> Tensor {
        Tensor::from_slice(dims, v).unwrap()
    }

    pub fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_slice(dims, v).unwrap()
    }

    /// 0, 1, 2, ... as f32 of the given dims.
    pub fn iota_f32(dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        f32s(dims, &(0..n).map(|v| v as f32).collect::<Vec<_>>())
    }

    pub fn iota_i64(dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        i64s(dims, &(0..n as i64).collect::<Vec<_>>())
    }

    pub fn ints(v: &[i64]) -> Attr {
        Attr::Ints(v.to_vec())
    }
}
