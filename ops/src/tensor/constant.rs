//! Constant (a value held in attributes) and ConstantOfShape (a filled tensor of a
//! constant shape).
use super::common::{baked_array, const_ints};
use crate::cpu::CpuKernel;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

/// Constants larger than this are not baked into WGSL (the compiler folds them into
/// weights instead, so the GPU never needs to run them).
const MAX_BAKED: usize = 1024;


#[derive(Debug)]
pub struct Constant {
    value: Tensor,
}

impl Constant {
    fn parse(spec: &NodeSpec) -> Result<Constant> {
        let value = if let Some(t) = spec.tensor_opt("value")? {
            t
        } else if let Some(v) = spec.float_opt("value_float")? {
            Tensor::scalar(v)
        } else if let Some(v) = spec.floats_opt("value_floats")? {
            Tensor::from_slice(&[v.len()], &v)?
        } else if let Some(v) = spec.int_opt("value_int")? {
            Tensor::scalar(v)
        } else if let Some(v) = spec.ints_opt("value_ints")? {
            Tensor::from_slice(&[v.len()], &v)?
        } else {
            for a in ["value_string", "value_strings", "sparse_value"] {
                if spec.has(a) {
                    return Err(OpError::Unsupported(format!("Constant with attribute '{a}'")));
                }
            }
            return Err(spec.bad("value", "Constant needs one of value, value_float(s), value_int(s)"));
        };
        Ok(Constant { value })
    }
}

impl Op for Constant {
    fn name(&self) -> &str {
        "Constant"
    }

    fn infer(&self, _inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        Ok(vec![TensorType::new(self.value.dtype(), self.value.dims())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        if self.value.len() <= MAX_BAKED {
            Some(self)
        } else {
            None
        }
    }

    fn eval_from_types(&self, _inputs: &[Option<Arg>]) -> Option<Result<Vec<Tensor>>> {
        Some(Ok(vec![self.value.clone()]))
    }
}

impl CpuKernel for Constant {
    fn run(&self, _inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        outputs[0] = self.value.clone();
        Ok(())
    }
}

impl WgslKernel for Constant {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let ty = wgsl::elem(outputs[0].dtype);
        let n = self.value.len();
        if n > MAX_BAKED {
            return Err(OpError::Unsupported(format!("a Constant of {n} elements on the GPU (fold it into a weight)")));
        }
        let helpers = baked_array("VALUES", ty, &self.value.to_f64_vec());
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "Constant",
            n,
            wg,
            &[("dst", ty, false)],
            vec![Binding::Output(0)],
            &helpers,
            "dst[i] = VALUES_at(i);",
        )))
    }
}

/// ConstantOfShape: a tensor of the constant shape in input 0, filled with `value`.
#[derive(Debug)]
pub struct ConstantOfShape {
    value: Tensor,
}

impl Op for ConstantOfShape {
    fn name(&self) -> &str {
        "ConstantOfShape"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let shape = const_ints(inputs, 0, "ConstantOfShape's shape")?;
        if let Some(d) = shape.iter().find(|&&d| d < 0) {
            return Err(OpError::input(0, format!("negative dim {d} in shape {shape:?}")));
        }
        Ok(vec![TensorType::new(self.value.dtype(), shape.iter().map(|&d| d as usize).collect::<Vec<_>>())])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for ConstantOfShape {
    fn run(&self, _inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let v = self.value.bytes();
        for chunk in outputs[0].bytes_mut().chunks_mut(v.len()) {
            chunk.copy_from_slice(v);
        }
        Ok(())
    }
}

impl WgslKernel for ConstantOfShape {
    fn generate(&self, _inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let ty = wgsl::elem(outputs[0].dtype);
        let wg = tune.get(&wgsl::workgroup_param());
        let body = format!("dst[i] = {};", wgsl::literal(ty, self.value.to_f64_vec()[0]));
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "ConstantOfShape",
            outputs[0].len(),
            wg,
            &[("dst", ty, false)],
            vec![Binding::Output(0)],
            "",
            &body,
        )))
    }
}

fn parse_constant_of_shape(spec: &NodeSpec) -> Result<ConstantOfShape> {
    let value = match spec.tensor_opt("value")? {
        None => Tensor::scalar(0f32),
        Some(t) if t.len() == 1 => t.reshaped(&[])?,
        Some(t) => return Err(spec.bad("value", format!("expected one element, found shape {:?}", t.dims()))),
    };
    Ok(ConstantOfShape { value })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "Constant", |spec| Ok(Box::new(Constant::parse(spec)?)));
    r.register("", "ConstantOfShape", |spec| Ok(Box::new(parse_constant_of_shape(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    #[test]
    fn constants() {
        let v = iota_f32(&[2, 3]);
        let c = make("Constant", 13, &[("value", Attr::Tensor(v.clone()))], 0, 1).unwrap();
        assert_eq!(run(c.as_ref(), &as_inputs(&[], &[]), &[]).unwrap()[0], v);
        assert_eq!(c.eval_from_types(&[]).unwrap().unwrap()[0], v);
        let c = make("Constant", 13, &[("value_ints", ints(&[3, -1]))], 0, 1).unwrap();
        assert_eq!(run(c.as_ref(), &as_inputs(&[], &[]), &[]).unwrap()[0], i64s(&[2], &[3, -1]));
        let c = make("Constant", 13, &[("value_float", Attr::Float(2.5))], 0, 1).unwrap();
        assert_eq!(run(c.as_ref(), &as_inputs(&[], &[]), &[]).unwrap()[0], Tensor::scalar(2.5f32));
        let b = Tensor::from_bools(&[2], &[true, false]).unwrap();
        let c = make("Constant", 13, &[("value", Attr::Tensor(b.clone()))], 0, 1).unwrap();
        assert_eq!(run(c.as_ref(), &as_inputs(&[], &[]), &[]).unwrap()[0], b);
        assert!(make("Constant", 13, &[], 0, 1).is_err());
        let big = make("Constant", 13, &[("value", Attr::Tensor(iota_f32(&[2000])))], 0, 1).unwrap();
        assert!(big.wgsl().is_none());
    }

    #[test]
    fn constant_of_shape() {
        let shape = i64s(&[3], &[2, 1, 3]);
        let c = make("ConstantOfShape", 9, &[("value", Attr::Tensor(i64s(&[1], &[7])))], 1, 1).unwrap();
        let out = run(c.as_ref(), &as_inputs(&[Some(&shape)], &[0]), &[]).unwrap();
        assert_eq!(out[0], i64s(&[2, 1, 3], &[7; 6]));
        let d = make("ConstantOfShape", 9, &[], 1, 1).unwrap();
        let out = run(d.as_ref(), &as_inputs(&[Some(&i64s(&[0], &[]))], &[0]), &[]).unwrap();
        assert_eq!(out[0], Tensor::scalar(0f32));
        let b = make("ConstantOfShape", 9, &[("value", Attr::Tensor(Tensor::from_bools(&[1], &[true]).unwrap()))], 1, 1).unwrap();
        let out = run(b.as_ref(), &as_inputs(&[Some(&i64s(&[1], &[5]))], &[0]), &[]).unwrap();
        assert_eq!(out[0].dtype(), DType::Bool);
        assert_eq!(out[0].bytes(), &[1; 5]);
        assert!(run(d.as_ref(), &as_inputs(&[Some(&i64s(&[1], &[-2]))], &[0]), &[]).is_err());
    }
}
