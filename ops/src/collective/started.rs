//! kiln.AllReduceStart and kiln.AllReduceWait: the all-reduce split in two, so that
//! the work scheduled between them (the rest of a backward pass) overlaps the
//! reduction. Start packs its f32 inputs, hands them to the [`Communicator`] and
//! returns an int64 ticket; Wait takes the ticket and the same values (for their types
//! only) and returns the sums.
use super::Communicator;
use crate::cpu::CpuKernel;
use crate::wgsl::WgslKernel;
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, Schedule, TensorType};
use kiln_graph::{DType, Tensor};
use std::sync::Arc;

pub struct Started {
    wait: bool,
    compressible: bool,
    comm: Option<Arc<dyn Communicator>>,
}

impl std::fmt::Debug for Started {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({})", self.name(), if self.comm.is_some() { "bound" } else { "unbound" })
    }
}

pub(super) fn register(r: &mut Registry, comm: Option<Arc<dyn Communicator>>) {
    for (op, wait) in [(super::ALL_REDUCE_START, false), (super::ALL_REDUCE_WAIT, true)] {
        let comm = comm.clone();
        r.register(super::DOMAIN, op, move |spec: &NodeSpec| {
            let compressible = if wait {
                if let Some(name) = spec.node.attrs.keys().next() {
                    return Err(OpError::Attr { attr: name.clone(), what: format!("{op} takes no attributes") });
                }
                false
            } else {
                super::compressible(spec, op)?
            };
            Ok(Box::new(Started { wait, compressible, comm: comm.clone() }) as Box<dyn Op>)
        });
    }
}

impl Op for Started {
    fn name(&self) -> &str {
        if self.wait {
            super::ALL_REDUCE_WAIT
        } else {
            super::ALL_REDUCE_START
        }
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        if !self.wait {
            super::float_inputs(inputs, 0, self.name())?;
            return Ok(vec![TensorType::new(DType::I64, vec![])]);
        }
        let ticket = crate::required(inputs, 0)?;
        if ticket.dtype() != DType::I64 || ticket.ty.len() != 1 {
            return Err(OpError::input(0, format!("the ticket of an AllReduceStart (an int64 scalar); found {}", ticket.ty)));
        }
        super::float_inputs(inputs, 1, self.name())
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

    fn varies_between_runs(&self) -> bool {
        true
    }

    fn schedule(&self) -> Schedule {
        if self.wait {
            Schedule::Late
        } else {
            Schedule::Early
        }
    }
}

impl CpuKernel for Started {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let comm = self.comm.as_ref().ok_or_else(|| super::unbound(self.name()))?;
        if !self.wait {
            let buf = super::pack(inputs, 0)?;
            let n = buf.len();
            let ticket = comm.start_all_reduce(buf, self.compressible).map_err(|what| OpError::invalid(format!("starting an all-reduce of {n} elements: {what}")))?;
            outputs[0].as_mut_slice::<i64>()?[0] = ticket as i64;
            return Ok(());
        }
        let ticket = crate::cpu::input(inputs, 0)?.to_i64_vec()?[0];
        let buf = comm.wait_all_reduce(ticket as u64).map_err(|what| OpError::invalid(format!("waiting for all-reduce {ticket}: {what}")))?;
        super::unpack(&buf, outputs)
    }
}
