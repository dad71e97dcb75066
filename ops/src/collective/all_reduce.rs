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
use kiln_graph::Tensor;
use std::sync::Arc;

pub struct AllReduce {
    comm: Option<Arc<dyn Communicator>>,
    compressible: bool,
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
        let compressible = super::compressible(spec, "AllReduce")?;
        Ok(Box::new(AllReduce { comm: comm.clone(), compressible }) as Box<dyn Op>)
    });
}

impl Op for AllReduce {
    fn name(&self) -> &str {
        "AllReduce"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        super::float_inputs(inputs, 0, "AllReduce")
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
        let comm = self.comm.as_ref().ok_or_else(|| super::unbound("AllReduce"))?;
        let mut buf = super::pack(inputs, 0)?;
        let summed = if self.compressible { comm.all_reduce_compressible(&mut buf) } else { comm.all_reduce_sum(&mut buf) };
        summed.map_err(|what| OpError::invalid(format!("all-reduce of {} elements: {what}", buf.len())))?;
        super::unpack(&buf, outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::{bind, ALL_REDUCE_START, ALL_REDUCE_WAIT, DOMAIN};
    use kiln_graph::DType;
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
        fn start_all_reduce(&self, mut data: Vec<f32>, _compressible: bool) -> Result<u64, String> {
            self.all_reduce_sum(&mut data)?;
            self.seen.lock().unwrap().push(data);
            Ok(self.seen.lock().unwrap().len() as u64 - 1)
        }
        fn wait_all_reduce(&self, ticket: u64) -> Result<Vec<f32>, String> {
            Ok(self.seen.lock().unwrap()[ticket as usize].clone())
        }
    }

    fn node(n_inputs: usize) -> kiln_graph::Node {
        node_of("AllReduce", n_inputs)
    }

    fn node_of(op: &str, n_inputs: usize) -> kiln_graph::Node {
        kiln_graph::Node {
            name: "ar".into(),
            op_type: op.into(),
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

    /// Start hands the packed values over and returns a ticket; Wait returns the sums
    /// cut to its outputs' types (those of its value inputs).
    #[test]
    fn start_and_wait_split_the_reduction() {
        let fake = Arc::new(Fake { seen: Mutex::new(vec![]) });
        let mut r = Registry::builtin().clone();
        bind(&mut r, fake.clone());
        let (start, wait) = (node_of(ALL_REDUCE_START, 2), node_of(ALL_REDUCE_WAIT, 3));
        let start = r.create(&NodeSpec { node: &start, opset: 17, registry: None }).unwrap();
        let wait = r.create(&NodeSpec { node: &wait, opset: 17, registry: None }).unwrap();
        let a = Tensor::from_vec(&[2], vec![1f32, 2.]).unwrap();
        let b = Tensor::from_vec(&[1], vec![3f32]).unwrap();
        let (ta, tb) = (TensorType::of(&a), TensorType::of(&b));
        let st = start.infer(&[Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &tb, value: None })]).unwrap();
        assert_eq!(st, vec![TensorType::new(DType::I64, vec![])]);
        let mut ticket = vec![Tensor::zeros(DType::I64, &[])];
        start.cpu().unwrap().run(&[Some(&a), Some(&b)], &mut ticket).unwrap();
        let wt = wait.infer(&[Some(Arg { ty: &st[0], value: None }), Some(Arg { ty: &ta, value: None }), Some(Arg { ty: &tb, value: None })]).unwrap();
        assert_eq!(wt, vec![ta.clone(), tb.clone()]);
        let mut outs = vec![Tensor::zeros(DType::F32, &[2]), Tensor::zeros(DType::F32, &[1])];
        wait.cpu().unwrap().run(&[Some(&ticket[0]), Some(&a), Some(&b)], &mut outs).unwrap();
        assert_eq!(outs[0].as_slice::<f32>().unwrap(), &[101., 102.]);
        assert_eq!(outs[1].as_slice::<f32>().unwrap(), &[103.]);
        assert_eq!(start.schedule(), crate::Schedule::Early);
        assert_eq!(wait.schedule(), crate::Schedule::Late);
    }
}
