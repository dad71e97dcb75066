//! kiln.AllReduce: each output is the sum over the workers of the matching input.
//!
//! Variadic: one node reduces a whole bucket of values (a data-parallel step's
//! gradients, a BatchNormalization's statistics) as one message: the inputs are packed
//! into one buffer, reduced by the bound [`Communicator`], and unpacked. Inputs f32, of
//! any shapes; outputs of the inputs' types. No attributes.
use super::Communicator;
use crate::cpu::CpuKernel;
use crate::wgsl::WgslKernel;
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor};
use std::sync::Arc;

pub struct AllReduce {
    comm: Option<Arc<dyn Communicator>>,
}

impl std::fmt::Debug for AllReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.comm {
            Some(c) => write!(f, "AllReduce(rank {} of {})", c.rank(), c.size()),
            None => write!(f, "AllReduce(unbound)"),
        }
    }
}

pub(super) fn register(r: &mut Registry, comm: Option<Arc<dyn Communicator>>) {
    r.register(super::DOMAIN, super::ALL_REDUCE, move |spec: &NodeSpec| {
        if let Some(name) = spec.node.attrs.keys().next() {
            return Err(OpError::Attr { attr: name.clone(), what: "AllReduce takes no attributes".into() });
        }
        Ok(Box::new(AllReduce { comm: comm.clone() }) as Box<dyn Op>)
    });
}

impl Op for AllReduce {
    fn name(&self) -> &str {
        "AllReduce"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        if inputs.is_empty() {
            return Err(OpError::invalid("AllReduce needs at least one input"));
        }
        inputs
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let a = a.as_ref().ok_or_else(|| OpError::input(i, "is missing (every input of AllReduce is required)"))?;
                if a.dtype() != DType::F32 || !a.ty.is_tensor() {
                    return Err(OpError::input(i, format!("AllReduce sums f32 tensors; found {}", a.ty)));
                }
                Ok(a.ty.clone())
            })
            .collect()
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    /// Its result depends on the other workers, not on its inputs alone.
    fn varies_between_runs(&self) -> bool {
        true
    }
}

impl CpuKernel for AllReduce {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let comm = self.comm.as_ref().ok_or_else(|| {
            OpError::Unsupported("kiln.AllReduce needs a communicator: it runs in data-parallel training (a distributed Trainer, `kiln train --distributed`), whose registry binds one".into())
        })?;
        let parts: Vec<&[f32]> = (0..inputs.len()).map(|i| crate::cpu::input(inputs, i)?.as_slice::<f32>().map_err(|e| OpError::input(i, e.to_string()))).collect::<Result<_>>()?;
        let mut buf: Vec<f32> = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for p in &parts {
            buf.extend_from_slice(p);
        }
        comm.all_reduce_sum(&mut buf).map_err(|what| OpError::invalid(format!("all-reduce of {} elements: {what}", buf.len())))?;
        let mut at = 0;
        for out in outputs.iter_mut() {
            let o = out.as_mut_slice::<f32>()?;
            o.copy_from_slice(&buf[at..at + o.len()]);
            at += o.len();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::{bind, DOMAIN};
    use std::sync::Mutex;

    /// A communicator of one worker that records what it was asked to reduce and adds
    /// a fixed "other worker" to it.
    struct Fake {
        seen: Mutex<Vec<Vec<f32>>>,
    }
    impl Communicator for Fake {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            2
        }
        fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), String> {
            self.seen.lock().unwrap().push(data.to_vec());
            data.iter_mut().for_each(|v| *v += 100.0);
            Ok(())
        }
    }

    fn node(n_inputs: usize) -> kiln_graph::Node {
        kiln_graph::Node {
            name: "ar".into(),
            op_type: "AllReduce".into(),
            domain: DOMAIN.into(),
            attrs: Default::default(),
            inputs: (0..n_inputs).map(Some).collect(),
            outputs: (10..10 + n_inputs).collect(),
        }
    }


    #[test]
    fn one_message_per_node_and_outputs_in_input_order() {
        let fake = Arc::new(Fake { seen: Mutex::new(vec![]) });
        let mut r = Registry::builtin().clone();
        bind(&mut r, fake.clone());
        let n = node(2);
        let op = r.create(&NodeSpec { node: &n, opset: 17, registry: None }).unwrap();
        let a = Tensor::from_vec(&[2, 2], vec![1f32, 2., 3., 4.]).unwrap();
        let b = Tensor::from_vec(&[1], vec![5f32]).unwrap();
        let (ta, tb) = (TensorType::of(&a), TensorType::of(&b));
        let types = op.infer(&[Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &tb, value: None })]).unwrap();
        assert_eq!(types, vec![TensorType::of(&a), TensorType::of(&b)]);
        let mut outs: Vec<Tensor> = types.iter().map(|t| Tensor::zeros(t.dtype, &t.dims)).collect();
        op.cpu().unwrap().run(&[Some(&a), Some(&b)], &mut outs).unwrap();
        assert_eq!(fake.seen.lock().unwrap().as_slice(), &[vec![1f32, 2., 3., 4., 5.]]);
        assert_eq!(outs[0].as_slice::<f32>().unwrap(), &[101., 102., 103., 104.]);
        assert_eq!(outs[1].as_slice::<f32>().unwrap(), &[105.]);
        assert!(op.varies_between_runs());
    }

    #[test]
    fn unbound_or_wrong_inputs_are_clear_errors() {
        let n = node(1);
        let op = Registry::builtin().create(&NodeSpec { node: &n, opset: 17, registry: None }).unwrap();
        let a = Tensor::from_vec(&[1], vec![1f32]).unwrap();
        let mut outs = vec![Tensor::zeros(DType::F32, &[1])];
        let err = op.cpu().unwrap().run(&[Some(&a)], &mut outs).unwrap_err().to_string();
        assert!(err.contains("needs a communicator"), "{err}");
        let i = Tensor::from_vec(&[1], vec![1i64]).unwrap();
        let ti = TensorType::of(&i);
        let err = op.infer(&[Some(Arg { ty: &ti, value: None })]).unwrap_err().to_string();
        assert!(err.contains("sums f32"), "{err}");
        assert!(op.infer(&[]).is_err());
    }
}
