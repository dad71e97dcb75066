//! Variants of a CPU kernel for one step: the op's kernel specialised by
//! `CpuKernel::prepare` with candidate values, run on the step's input types.
use super::measure::Variant;
use super::step::step_inputs;
use kiln_graph::Tensor;
use kiln_ops::infer::{Specialized, Step};
use kiln_ops::{Arg, CpuKernel, Op, TensorType, TuneValues};
use std::time::Instant;

/// A step's CPU kernel and the inputs its variants run on.
pub(crate) struct CpuBench<'a> {
    op: &'a dyn Op,
    args: Vec<Option<Arg<'a>>>,
    out_types: Vec<TensorType>,
    inputs: Vec<Option<Tensor>>,
}

impl<'a> CpuBench<'a> {
    pub fn new(op: &'a dyn Op, spec: &'a Specialized, step: &Step) -> Result<CpuBench<'a>, String> {
        let args = spec.args(&step.inputs);
        let out_types = step.outputs.iter().map(|&o| spec.ty(o).clone()).collect();
        let inputs = step_inputs(&args)?;
        Ok(CpuBench { op, args, out_types, inputs })
    }

    /// The variant with values `tune`.
    pub fn variant(&self, tune: &TuneValues) -> Result<Box<dyn Variant + '_>, String> {
        let base = self.op.cpu().ok_or("the op has no CPU kernel")?;
        let prepared = base.prepare(&self.args, &self.out_types, tune).map_err(|e| e.to_string())?;
        let outputs = self.out_types.iter().map(|t| Tensor::try_zeros(t.dtype, &t.dims).map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
        Ok(Box::new(CpuVariant { base, prepared, inputs: &self.inputs, outputs, zero: !self.op.overwrites_outputs() }))
    }
}

struct CpuVariant<'a> {
    base: &'a dyn CpuKernel,
    prepared: Option<Box<dyn CpuKernel>>,
    inputs: &'a [Option<Tensor>],
    outputs: Vec<Tensor>,
    /// The op relies on zeroed outputs (see `Op::overwrites_outputs`).
    zero: bool,
}

impl CpuVariant<'_> {
    fn run_once(&mut self) -> Result<(), String> {
        if self.zero {
            for o in &mut self.outputs {
                o.bytes_mut().fill(0);
            }
        }
        let ins: Vec<Option<&Tensor>> = self.inputs.iter().map(Option::as_ref).collect();
        let k = self.prepared.as_deref().unwrap_or(self.base);
        k.run(&ins, &mut self.outputs).map_err(|e| e.to_string())
    }
}

impl Variant for CpuVariant<'_> {
    fn outputs(&mut self) -> Result<Vec<Tensor>, String> {
        self.run_once()?;
        // Copies: the buffers are reused by later runs.
        self.outputs.iter().map(|t| Tensor::from_bytes(t.dtype(), t.dims(), t.bytes()).map_err(|e| e.to_string())).collect()
    }

    fn time(&mut self, reps: usize) -> Result<f64, String> {
        let t = Instant::now();
        for _ in 0..reps {
            self.run_once()?;
        }
        Ok(t.elapsed().as_secs_f64() / reps.max(1) as f64)
    }
}
