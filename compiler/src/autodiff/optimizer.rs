//! Optimizers as graph ops: each parameter's update is a chain of elementwise Kiln ops
//! (the fusion pass makes it one kernel). Values that change from step to step (the
//! scheduled learning rate, Adam's bias corrections) are scalar inputs of the training
//! graph, computed on the host by [`Optimizer::hyper_inputs`], in f64 then rounded, as
//! PyTorch computes them.
use super::emit::Emit;
use super::Result;
use kiln_graph::{DType, ValueId};

#[derive(Clone, Debug, PartialEq)]
pub enum OptimizerKind {
    /// SGD with momentum (0 for none) and Nesterov's variant. Weight decay is added to
    /// the gradient (PyTorch's convention).
    Sgd { momentum: f32, nesterov: bool },
    /// Layer-wise adaptive rate scaling over SGD with momentum: each parameter's step
    /// is scaled by `trust * |w| / (|g| + weight_decay * |w|)`. Parameters of one
    /// dimension (biases, normalisation scales) take plain momentum SGD, as usual.
    Lars { momentum: f32, trust: f32 },
    /// Adam; weight decay (if any) added to the gradient.
    Adam { beta1: f32, beta2: f32, eps: f32 },
    /// Adam with decoupled weight decay: `w *= 1 - lr * weight_decay` first.
    AdamW { beta1: f32, beta2: f32, eps: f32 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Optimizer {
    pub kind: OptimizerKind,
    pub weight_decay: f32,
    /// Gradients scaled down together when their global L2 norm exceeds this.
    pub clip_norm: Option<f32>,
}

/// The scalar inputs of a training graph that the host sets before each step.
pub const LR: &str = "kiln.lr";
const ADAM_STEP: &str = "kiln.adam_step_size";
const ADAM_BC2_SQRT: &str = "kiln.adam_bias_correction2_sqrt";
const ADAMW_DECAY: &str = "kiln.adamw_decay";

impl Optimizer {
    pub fn new(kind: OptimizerKind) -> Optimizer {
        Optimizer { kind, weight_decay: 0.0, clip_norm: None }
    }

    /// The optimizer state kept per parameter (momentum buffers, Adam's moments).
    pub fn slots(&self) -> &'static [&'static str] {
        match self.kind {
            OptimizerKind::Sgd { momentum, .. } if momentum == 0.0 => &[],
            OptimizerKind::Sgd { .. } | OptimizerKind::Lars { .. } => &["momentum"],
            OptimizerKind::Adam { .. } | OptimizerKind::AdamW { .. } => &["exp_avg", "exp_avg_sq"],
        }
    }

    /// The names of the per-step scalar inputs.
    pub fn hyper_names(&self) -> Vec<&'static str> {
        match self.kind {
            OptimizerKind::Sgd { .. } | OptimizerKind::Lars { .. } => vec![LR],
            OptimizerKind::Adam { .. } => vec![ADAM_STEP, ADAM_BC2_SQRT],
            OptimizerKind::AdamW { .. } => vec![ADAM_STEP, ADAM_BC2_SQRT, ADAMW_DECAY],
        }
    }

    /// The values of [`Self::hyper_names`] for optimizer step `step` (1 for the first)
    /// at learning rate `lr`.
    pub fn hyper_inputs(&self, step: u64, lr: f64) -> Vec<(&'static str, f32)> {
        match self.kind {
            OptimizerKind::Sgd { .. } | OptimizerKind::Lars { .. } => vec![(LR, lr as f32)],
            OptimizerKind::Adam { beta1, beta2, .. } | OptimizerKind::AdamW { beta1, beta2, .. } => {
                let t = step as i32;
                let bc1 = 1.0 - (beta1 as f64).powi(t);
                let bc2 = 1.0 - (beta2 as f64).powi(t);
                let mut v = vec![(ADAM_STEP, (lr / bc1) as f32), (ADAM_BC2_SQRT, bc2.sqrt() as f32)];
                if matches!(self.kind, OptimizerKind::AdamW { .. }) {
                    v.push((ADAMW_DECAY, (1.0 - lr * self.weight_decay as f64) as f32));
                }
                v
            }
        }
    }

    /// Scales every gradient by `min(1, clip / (global norm + 1e-6))` (PyTorch's
    /// `clip_grad_norm_`).
    pub fn clip(&self, e: &mut Emit, grads: &[ValueId]) -> Result<Vec<ValueId>> {
        let Some(max) = self.clip_norm else { return Ok(grads.to_vec()) };
        e.set_scope("clip");
        let Some(total) = e.sum_of_squares(grads)? else { return Ok(vec![]) };
        let dtype = e.dtype(total);
        let norm = e.op("Sqrt", &[total], &[])?;
        let eps = e.scalar(1e-6, dtype);
        let den = e.add(norm, eps)?;
        let maxv = e.scalar(max as f64, dtype);
        let ratio = e.div(maxv, den)?;
        let one = e.scalar(1.0, dtype);
        let coef = e.op("Min", &[ratio, one], &[])?;
        grads.iter().map(|&g| e.mul(g, coef)).collect()
    }

    /// The update of one parameter: its new value and its slots' new values.
    /// `hyper` holds the values of [`Self::hyper_names`], in that order.
    pub fn update(&self, e: &mut Emit, param: ValueId, grad: ValueId, slots: &[ValueId], hyper: &[ValueId]) -> Result<(ValueId, Vec<ValueId>)> {
        let dtype = e.dtype(param);
        let wd = self.weight_decay as f64;
        let decayed = |e: &mut Emit, g: ValueId| -> Result<ValueId> {
            if wd == 0.0 {
                return Ok(g);
            }
            let d = e.scale(param, wd)?;
            e.add(g, d)
        };
        match self.kind {
            OptimizerKind::Sgd { momentum, nesterov } => {
                let lr = hyper[0];
                let d = decayed(e, grad)?;
                let (step, new_slots) = if momentum == 0.0 {
                    (d, vec![])
                } else {
                    let b = e.scale(slots[0], momentum as f64)?;
                    let buf = e.add(b, d)?;
                    let step = if nesterov {
                        let m = e.scale(buf, momentum as f64)?;
                        e.add(d, m)?
                    } else {
                        buf
                    };
                    (step, vec![buf])
                };
                let s = e.mul(step, lr)?;
                Ok((e.sub(param, s)?, new_slots))
            }
            OptimizerKind::Lars { momentum, trust } => {
                let lr = hyper[0];
                let d = decayed(e, grad)?;
                let d = if e.rank(param) > 1 { lars_scale(e, param, grad, d, trust as f64, wd, dtype)? } else { d };
                let b = e.scale(slots[0], momentum as f64)?;
                let buf = e.add(b, d)?;
                let s = e.mul(buf, lr)?;
                Ok((e.sub(param, s)?, vec![buf]))
            }
            OptimizerKind::Adam { beta1, beta2, eps } | OptimizerKind::AdamW { beta1, beta2, eps } => {
                let (step_size, bc2_sqrt) = (hyper[0], hyper[1]);
                let adamw = matches!(self.kind, OptimizerKind::AdamW { .. });
                let (p, g) = if adamw {
                    (if wd != 0.0 { e.mul(param, hyper[2])? } else { param }, grad)
                } else {
                    (param, decayed(e, grad)?)
                };
                // m += (g - m) (1 - beta1); v = v beta2 + (1 - beta2) g^2
                let gm = e.sub(g, slots[0])?;
                let gm = e.scale(gm, 1.0 - beta1 as f64)?;
                let m = e.add(slots[0], gm)?;
                let vb = e.scale(slots[1], beta2 as f64)?;
                let g2 = e.mul(g, g)?;
                let g2 = e.scale(g2, 1.0 - beta2 as f64)?;
                let v = e.add(vb, g2)?;
                // p -= step_size * m / (sqrt(v) / sqrt(bc2) + eps)
                let sv = e.op("Sqrt", &[v], &[])?;
                let den = e.div(sv, bc2_sqrt)?;
                let epsv = e.scalar(eps as f64, dtype);
                let den = e.add(den, epsv)?;
                let q = e.div(m, den)?;
                let s = e.mul(q, step_size)?;
                Ok((e.sub(p, s)?, vec![m, v]))
            }
        }
    }
}

/// LARS: `d * trust * |w| / (|g| + wd |w|)`, or `d` where either norm is 0.
fn lars_scale(e: &mut Emit, w: ValueId, g: ValueId, d: ValueId, trust: f64, wd: f64, dtype: DType) -> Result<ValueId> {
    let norm = |e: &mut Emit, v: ValueId| -> Result<ValueId> {
        let sq = e.mul(v, v)?;
        let all: Vec<usize> = (0..e.rank(v)).collect();
        let s = e.reduce_sum(sq, &all, false)?;
        e.op("Sqrt", &[s], &[])
    };
    let wn = norm(e, w)?;
    let gn = norm(e, g)?;
    let wdw = e.scale(wn, wd)?;
    let den = e.add(gn, wdw)?;
    let num = e.scale(wn, trust)?;
    let ratio = e.div(num, den)?;
    let zero = e.scalar(0.0, dtype);
    let one = e.scalar(1.0, dtype);
    let wpos = e.op("Greater", &[wn, zero], &[])?;
    let gpos = e.op("Greater", &[gn, zero], &[])?;
    let both = e.op("And", &[wpos, gpos], &[])?;
    let r = e.op("Where", &[both, ratio, one], &[])?;
    e.mul(d, r)
}
