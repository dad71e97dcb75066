//! The training step as one graph: forward, loss, backward, clipping and optimizer
//! update, for a fixed batch.
//!
//! Inputs: the model's inputs, the label, the optimizer's per-step scalars, then the
//! state (parameters, running statistics, optimizer slots). Outputs: the loss, the
//! prediction, then each state variable's next value (optionally the value as it was
//! when the loss is not finite). A runtime keeps the state between steps and feeds each
//! output back as the matching input.
//!
//! Gradients exist as values between backward and update ([`TrainingGraph::gradients`]):
//! the point where data-parallel training reduces them across workers.
use super::emit::Emit;
use super::loss::Loss;
use super::lower::{is_training_bn, lower};
use super::mixed::{self, MixedPrecision};
use super::optimizer::Optimizer;
use super::parallel::{self, DataParallel};
use super::{gradients, AutodiffError, Result};
use kiln_graph::{DType, Graph, Tensor, ValueId, ValueType};
use kiln_ops::{Registry, TensorType};
use std::collections::{HashMap, HashSet};

pub struct TrainConfig {
    /// The concrete type of each model input, by name (the batch fixed).
    pub inputs: Vec<(String, TensorType)>,
    /// The model output the loss reads (default: the first).
    pub output: Option<String>,
    pub loss: Loss,
    pub optimizer: Optimizer,
    pub trainable: Trainable,
    /// Each next state value is the value as it was unless the loss is finite: a step
    /// whose loss is NaN or infinite then changes nothing, even where the state never
    /// leaves the device. It costs a select per state variable; a runtime that keeps
    /// the state on the host can restore it there instead.
    pub keep_state_unless_finite: bool,
    /// Mixed precision (f16 products, dynamic loss scaling); for GPUs with SHADER_F16.
    /// It implies keeping the state when a gradient is not finite.
    pub mixed_precision: Option<MixedPrecision>,
    /// This worker's part of a data-parallel step ([`super::parallel`]): the graph then
    /// holds `kiln.AllReduce` nodes, and runs only where the registry binds a
    /// communicator.
    pub data_parallel: Option<DataParallel>,
}

/// Which initializers train. BatchNormalization's running statistics never do (the
/// forward pass updates them).
#[derive(Clone, Debug, PartialEq)]
pub enum Trainable {
    /// Every float initializer the loss depends on. Beware: an importer that turns
    /// Constant nodes into initializers makes them trainable too; prefer `Among` with
    /// the model's declared initializers.
    All,
    /// The float initializers of this list that the loss depends on (the others are
    /// left alone, with a warning): an ONNX model's declared initializers.
    Among(Vec<String>),
    /// Exactly these: one the loss does not depend on is an error.
    Exactly(Vec<String>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateKind {
    /// A trained parameter.
    Parameter,
    /// A value the forward pass updates (BatchNormalization's running statistics).
    Buffer,
    /// Optimizer state of a parameter.
    Slot { param: String, slot: &'static str },
    /// Mixed precision's loss scale, or its count of finite steps in a row.
    LossScale,
}

#[derive(Clone, Debug)]
pub struct StateVar {
    /// The graph input that holds the current value (a parameter's initializer name).
    pub name: String,
    pub kind: StateKind,
    /// The graph output that holds the value after the step.
    pub next: String,
    /// The value before the first step.
    pub initial: Tensor,
}

pub struct TrainingGraph {
    pub graph: Graph,
    /// The model's inputs, as the training graph names them.
    pub data_inputs: Vec<String>,
    /// The label input (integer classes or a float target, as the loss says).
    pub label: String,
    pub label_type: TensorType,
    /// The optimizer's per-step scalar inputs ([`Optimizer::hyper_inputs`]).
    pub hyper: Vec<String>,
    pub state: Vec<StateVar>,
    /// Output names of the loss and the prediction.
    pub loss: String,
    pub prediction: String,
    /// The prediction's type for this batch.
    pub prediction_type: TensorType,
    /// Each parameter's gradient (names of values of `graph`), in reverse layer order:
    /// the values data parallelism sums across workers, before clipping and the
    /// finiteness checks ([`TrainingGraph::split_at_gradients`]). With
    /// [`TrainConfig::data_parallel`], this worker's own, before the sum.
    pub gradients: Vec<(String, String)>,
    /// The int64 scalar input that seeds training-mode dropout, when there is some: a
    /// new value each step gives new masks.
    pub dropout_seed: Option<String>,
    /// With mixed precision, the outputs [`STEP_APPLIED`] and [`STEP_LOSS_SCALE`]: a step
    /// whose gradients were not finite applied nothing, and the next one runs at half
    /// the scale.
    pub mixed_precision: Option<(String, String)>,
}

pub const LABEL: &str = "kiln.label";
pub const LOSS: &str = "kiln.loss";
/// With data parallelism: this worker's own mean loss (the step's loss output is the
/// global batch's).
pub const LOCAL_LOSS: &str = "kiln.local_loss";
/// Mixed precision's state (f32 scalars): the loss scale and the finite steps in a row.
pub const LOSS_SCALE: &str = "kiln.loss_scale";
pub const LOSS_SCALE_GOOD_STEPS: &str = "kiln.loss_scale_good_steps";
/// Mixed precision's outputs: whether the step applied its update (bool), and the
/// loss scale it used.
pub const STEP_APPLIED: &str = "kiln.step_applied";
pub const STEP_LOSS_SCALE: &str = "kiln.step_loss_scale";

fn model_err(what: impl Into<String>) -> AutodiffError {
    AutodiffError::Model(what.into())
}

/// Builds the training graph of `forward`.
pub fn build(forward: &Graph, config: &TrainConfig, registry: &Registry) -> Result<TrainingGraph> {
    if forward.opset() < 13 {
        return Err(model_err(format!("training needs a model of opset 13 or later; this one is opset {}", forward.opset())));
    }
    let mut g = forward.clone();
    let pred = match &config.output {
        Some(name) => *g.outputs.iter().find(|&&o| g.values[o].name == *name).ok_or_else(|| {
            model_err(format!("the model has no output '{name}' (its outputs: {})", names(&g, &g.outputs)))
        })?,
        None => *g.outputs.first().ok_or_else(|| model_err("the model has no output"))?,
    };

    // Buffers: the running statistics of BatchNormalization in training mode that it
    // updates (outputs 1 and 2 present).
    let mut buffers: Vec<(ValueId, ValueId, usize)> = vec![]; // (initializer, node, output index)
    for (k, n) in g.nodes.iter().enumerate() {
        if n.op_type == "BatchNormalization" && n.domain.is_empty() && is_training_bn(n) {
            for (slot, out) in [(3, 1), (4, 2)] {
                if let (Some(Some(v)), Some(_)) = (n.inputs.get(slot), n.outputs.get(out)) {
                    if g.initializers.contains_key(v) {
                        buffers.push((*v, k, out));
                    }
                }
            }
        }
    }
    let buffer_set: HashSet<ValueId> = buffers.iter().map(|b| b.0).collect();
    let float_init = |g: &Graph, name: &str| -> Result<ValueId> {
        let v = g.find_value(name).filter(|v| g.initializers.contains_key(v)).ok_or_else(|| model_err(format!("'{name}' is not an initializer of the model")))?;
        if !g.initializers[&v].dtype().is_float() {
            return Err(model_err(format!("'{name}' is {}, only float initializers train", g.initializers[&v].dtype())));
        }
        Ok(v)
    };
    let mut params: Vec<ValueId> = match &config.trainable {
        Trainable::Exactly(list) => list.iter().map(|name| float_init(&g, name)).collect::<Result<_>>()?,
        Trainable::Among(list) => {
            let mut v: Vec<ValueId> = list.iter().filter_map(|n| g.find_value(n)).filter(|v| g.initializers.get(v).is_some_and(|t| t.dtype().is_float()) && !buffer_set.contains(v)).collect();
            v.sort_unstable();
            v.dedup();
            v
        }
        Trainable::All => {
            let mut v: Vec<ValueId> = g.initializers.iter().filter(|(v, t)| t.dtype().is_float() && !buffer_set.contains(v)).map(|(v, _)| *v).collect();
            v.sort_unstable();
            v
        }
    };
    // Parameters and buffers become inputs (state), so nothing that reads them folds.
    let mut initial: HashMap<ValueId, Tensor> = HashMap::new();
    for &v in params.iter().chain(buffers.iter().map(|b| &b.0)) {
        if let Some(t) = g.initializers.remove(&v) {
            g.values[v].ty = Some(ValueType::new(t.dtype(), t.dims()));
            g.inputs.push(v);
            initial.insert(v, t);
        }
    }
    let data_inputs: Vec<ValueId> = g.inputs.iter().copied().filter(|v| !initial.contains_key(v)).collect();
    for (name, _) in &config.inputs {
        if !data_inputs.iter().any(|&v| g.values[v].name == *name) {
            return Err(model_err(format!("the model has no input '{name}' (its inputs: {})", names(&g, &data_inputs))));
        }
    }
    let mut input_types = vec![];
    for &v in &g.inputs {
        let ty = match initial.get(&v) {
            Some(t) => TensorType::new(t.dtype(), t.dims().to_vec()),
            None => {
                let name = &g.values[v].name;
                let ty = config.inputs.iter().find(|(n, _)| n == name).map(|(_, t)| t.clone()).ok_or_else(|| model_err(format!("no type given for the model's input '{name}'")))?;
                g.values[v].ty = Some(ValueType::new(ty.dtype, ty.dims.clone()));
                ty
            }
        };
        input_types.push(ty);
    }

    // Types of every value for this batch, and the shape computations folded: a probe
    // with BatchNormalization in inference form (its training form has no kernel).
    let mut probe = g.clone();
    probe.outputs = vec![pred];
    let (spec, order) = specialize_forward(&probe, &input_types, registry)?;
    let live: HashSet<usize> = spec.steps.iter().map(|s| s.node).collect();
    g.nodes = order.iter().filter(|n| live.contains(n)).map(|&n| g.nodes[n].clone()).collect();
    for (v, t) in spec.constants {
        g.values[v].ty = Some(ValueType::new(t.dtype(), t.dims()));
        g.initializers.insert(v, t);
    }

    // Every value the sweep may read has its concrete type (the running-statistic
    // outputs of BatchNormalization excepted: lowering replaces them).
    let typed = |v: usize| spec.types.get(v).is_some_and(|t| t.is_some()) || g.initializers.contains_key(&v);
    for n in &g.nodes {
        let stats = if n.op_type == "BatchNormalization" && is_training_bn(n) { &n.outputs[1.min(n.outputs.len())..] } else { &[][..] };
        let untyped = n.inputs.iter().flatten().chain(n.outputs.iter().filter(|o| !stats.contains(o))).find(|&&v| !typed(v));
        if let Some(&v) = untyped {
            return Err(model_err(format!("node '{}' ({}): value '{}' has no type for this batch", n.name, n.op_type, g.values[v].name)));
        }
    }
    if !typed(pred) {
        return Err(model_err(format!("the output '{}' has no type for this batch", g.values[pred].name)));
    }

    let dp = config.data_parallel.as_ref();
    if let Some(dp) = dp {
        dp.check()?;
    }
    let mut e = Emit::new(&mut g, spec.types, registry);
    let lowered = lower(&mut e, dp.filter(|dp| dp.sync_batch_norm))?;
    let subst = lowered.subst;
    let pred = *subst.get(&pred).unwrap_or(&pred);
    if let Some(mp) = &config.mixed_precision {
        let weights: HashSet<ValueId> = params.iter().copied().chain(e.graph.initializers.keys().copied()).collect();
        let n = mixed::autocast(&mut e, &mp.ops, &weights)?;
        log::info!("mixed precision: {n} node(s) run in f16 (the products and convolutions of {:?}, and the ops between them)", mp.ops);
    }

    // Parameters the loss does not depend on are left out (or refused, when named).
    let reached = reaching(e.graph, pred);
    let (used, unused): (Vec<ValueId>, Vec<ValueId>) = params.iter().partition(|v| reached.contains(v));
    if !unused.is_empty() {
        let list = names(e.graph, &unused);
        if matches!(config.trainable, Trainable::Exactly(_)) {
            return Err(model_err(format!("the loss does not depend on {list}")));
        }
        log::warn!("not trained (the loss does not depend on them): {list}");
        for v in &unused {
            let t = initial.remove(v).expect("a parameter");
            e.graph.inputs.retain(|i| i != v);
            e.graph.initializers.insert(*v, t);
        }
    }
    params = used;

    let pred_ty = e.ty(pred).clone();
    e.graph.values[pred].ty = Some(ValueType::new(pred_ty.dtype, pred_ty.dims.clone()));
    let (label, label_type) = match config.loss.label_type(pred_ty.dtype, &pred_ty.dims) {
        Some((ldtype, ldims)) => {
            let label_type = TensorType::new(ldtype, ldims);
            let label = e.value_of_type(LABEL, label_type.clone());
            e.graph.inputs.push(label);
            (label, label_type)
        }
        None => {
            // The model's own loss: its label is one of its inputs.
            let Loss::ModelOutput { label: name } = &config.loss else { unreachable!("only a model's own loss has no label type") };
            let v = data_inputs.iter().copied().find(|&v| e.graph.values[v].name == *name).ok_or_else(|| model_err(format!("the model has no input '{name}' for the label (its inputs: {})", names(e.graph, &data_inputs))))?;
            (v, e.ty(v).clone())
        }
    };
    let mut loss = config.loss.emit(&mut e, pred, label)?;
    // The value differentiated: the loss, or with data parallelism this worker's share
    // of the global loss (whose sum over workers is reported as the loss).
    let mut objective = loss;
    if let Some(dp) = dp {
        e.set_scope("data_parallel");
        e.graph.values[loss].name = LOCAL_LOSS.into();
        let weight = e.scalar(dp.weight(), e.dtype(loss));
        objective = e.mul(loss, weight)?;
        loss = parallel::all_reduce(&mut e, &[objective], false)?[0];
    }
    e.graph.values[loss].name = LOSS.into();

    // With mixed precision, the gradients of `loss * scale`, unscaled.
    let scaler = match &config.mixed_precision {
        Some(mp) => {
            let ty = TensorType::new(DType::F32, vec![]);
            let scale = e.value_of_type(LOSS_SCALE, ty.clone());
            let good = e.value_of_type(LOSS_SCALE_GOOD_STEPS, ty);
            e.graph.inputs.extend([scale, good]);
            e.set_scope("loss_scale");
            let scaled = e.mul(objective, scale)?;
            Some((mp, scale, good, scaled))
        }
        None => None,
    };
    let order = e.graph.validate().map_err(|err| model_err(err.to_string()))?;
    let grads = match scaler {
        Some((_, scale, _, scaled)) => {
            let grads = gradients(&mut e, &order, scaled, &params)?;
            e.set_scope("loss_scale");
            let one = e.scalar(1.0, DType::F32);
            let inv = e.div(one, scale)?;
            grads.iter().map(|&g| if e.dtype(g) == DType::F32 { e.mul(g, inv) } else { Ok(g) }).collect::<Result<Vec<_>>>()?
        }
        None => gradients(&mut e, &order, objective, &params)?,
    };
    // Where data parallelism sums the gradients across workers (before the finiteness
    // check and the clipping, which must see the summed gradients).
    let reducible = grads.clone();
    let grads = match dp {
        Some(dp) => {
            e.set_scope("data_parallel");
            parallel::reduce_gradients(&mut e, &grads, dp.bucket_bytes, dp.overlap)?
        }
        None => grads,
    };
    let grads_finite = match scaler {
        Some(_) => mixed::all_finite(&mut e, &grads)?,
        None => None,
    };
    let grads = config.optimizer.clip(&mut e, &grads)?;

    let opt = &config.optimizer;
    let hyper: Vec<ValueId> = opt
        .hyper_names()
        .into_iter()
        .map(|name| {
            let v = e.value_of_type(name, TensorType::new(DType::F32, vec![]));
            e.graph.inputs.push(v);
            v
        })
        .collect();
    let mut state = vec![];
    let mut outputs = vec![loss, pred];
    // With `keep_state_unless_finite`, a step whose loss is NaN or infinite changes
    // nothing: every next value is the state as it was unless the loss is finite.
    e.set_scope("update");
    let finite = if config.keep_state_unless_finite || scaler.is_some() {
        let ok = e.is_finite(loss)?;
        Some(match grads_finite {
            Some(g) => e.op("And", &[ok, g], &[])?,
            None => ok,
        })
    } else {
        None
    };
    // Mixed precision: whether this step applied its update (read by the runtime), and
    // the loss scale it used.
    let mut applied = None;
    if let (Some((mp, scale, good, _)), Some(f)) = (scaler, finite) {
        let (scale_next, good_next) = mixed::next_scale(&mut e, scale, good, f, mp.growth_interval)?;
        for (next, name, init) in [(scale_next, LOSS_SCALE, mp.init_scale), (good_next, LOSS_SCALE_GOOD_STEPS, 0.0)] {
            let next_name = format!("{name}:next");
            e.graph.values[next].name = next_name.clone();
            outputs.push(next);
            state.push(StateVar { name: name.into(), kind: StateKind::LossScale, next: next_name, initial: Tensor::scalar(init) });
        }
        let flag = e.op("Identity", &[f], &[])?;
        e.graph.values[flag].name = STEP_APPLIED.into();
        let used = e.op("Identity", &[scale], &[])?;
        e.graph.values[used].name = STEP_LOSS_SCALE.into();
        outputs.extend([flag, used]);
        applied = Some((STEP_APPLIED.to_string(), STEP_LOSS_SCALE.to_string()));
    }
    let mut next_of = |e: &mut Emit, input: ValueId, next: ValueId, kind: StateKind, initial: Tensor, state: &mut Vec<StateVar>| -> Result<()> {
        let name = e.graph.values[input].name.clone();
        let next_name = format!("{name}:next");
        let kept = match finite {
            Some(f) => e.op("Where", &[f, next, input], &[])?,
            None => next,
        };
        e.graph.values[kept].name = next_name.clone();
        outputs.push(kept);
        state.push(StateVar { name, kind, next: next_name, initial });
        Ok(())
    };
    for (&p, &gr) in params.iter().zip(&grads) {
        let pname = e.graph.values[p].name.clone();
        e.set_scope(format!("{pname}/update"));
        let slots: Vec<(ValueId, &'static str)> = opt
            .slots()
            .iter()
            .map(|&s| {
                let ty = e.ty(p).clone();
                let v = e.value_of_type(&format!("{pname}:{s}"), ty);
                e.graph.inputs.push(v);
                (v, s)
            })
            .collect();
        let slot_values: Vec<ValueId> = slots.iter().map(|s| s.0).collect();
        let (new_p, new_slots) = opt.update(&mut e, p, gr, &slot_values, &hyper)?;
        let t = initial.remove(&p).expect("a parameter");
        let (dtype, dims) = (t.dtype(), t.dims().to_vec());
        next_of(&mut e, p, new_p, StateKind::Parameter, t, &mut state)?;
        for ((sv, sname), ns) in slots.into_iter().zip(new_slots) {
            next_of(&mut e, sv, ns, StateKind::Slot { param: pname.clone(), slot: sname }, Tensor::zeros(dtype, &dims), &mut state)?;
        }
    }
    for (v, node, out) in &buffers {
        let Some(t) = initial.remove(v) else { continue };
        let bn_out = forward.nodes[*node].outputs[*out];
        let next = *subst.get(&bn_out).ok_or_else(|| model_err(format!("running statistic '{}' has no update", forward.values[*v].name)))?;
        next_of(&mut e, *v, next, StateKind::Buffer, t, &mut state)?;
    }
    let gradients: Vec<(String, String)> = params.iter().zip(&reducible).rev().map(|(&p, &gr)| (e.graph.values[p].name.clone(), e.graph.values[gr].name.clone())).collect();
    drop(e);
    g.outputs = outputs;
    g.validate().map_err(|err| model_err(err.to_string()))?;
    Ok(TrainingGraph {
        data_inputs: data_inputs.iter().filter(|&&v| v != label).map(|&v| g.values[v].name.clone()).collect(),
        label: g.values[label].name.clone(),
        label_type,
        prediction_type: pred_ty,
        hyper: opt.hyper_names().into_iter().map(String::from).collect(),
        loss: LOSS.into(),
        prediction: g.values[pred].name.clone(),
        state,
        gradients,
        dropout_seed: lowered.seed.map(|_| super::lower::DROPOUT_SEED.to_string()),
        mixed_precision: applied,
        graph: g,
    })
}

/// Specialises a forward graph for concrete input types (every value typed, shape
/// computations folded), BatchNormalization and Dropout in training mode taken in
/// their inference forms (same output types; their training forms have no kernel). Returns the
/// specialisation and the topological order of `g`'s nodes.
pub fn specialize_forward(g: &Graph, input_types: &[TensorType], registry: &Registry) -> Result<(kiln_ops::infer::Specialized, Vec<usize>)> {
    let mut probe = g.clone();
    for n in &mut probe.nodes {
        // Dropout in inference form (the identity): the same output types.
        if n.op_type == "Dropout" && n.domain.is_empty() && n.inputs.len() > 2 {
            n.inputs.truncate(2);
        }
        if n.op_type == "BatchNormalization" && n.domain.is_empty() && is_training_bn(n) {
            n.attrs.remove("training_mode");
            let stats = n.outputs.split_off(1);
            probe.outputs.retain(|o| !stats.contains(o));
        }
    }
    let ops = kiln_ops::infer::create_ops(&probe, registry).map_err(|e| model_err(e.to_string()))?;
    let order = probe.validate().map_err(|e| model_err(e.to_string()))?;
    let no_values = vec![None; input_types.len()];
    let spec = kiln_ops::infer::specialize(&probe, &ops, &order, input_types, &no_values, kiln_ops::infer::Limits::default()).map_err(|e| model_err(e.into_error().to_string()))?;
    Ok((spec, order))
}

fn names(g: &Graph, vs: &[ValueId]) -> String {
    vs.iter().map(|&v| format!("'{}'", g.values[v].name)).collect::<Vec<_>>().join(", ")
}

/// Every value `target` depends on.
fn reaching(g: &Graph, target: ValueId) -> HashSet<ValueId> {
    let mut producer: HashMap<ValueId, usize> = HashMap::new();
    for (k, n) in g.nodes.iter().enumerate() {
        for &o in &n.outputs {
            producer.insert(o, k);
        }
    }
    let mut seen = HashSet::from([target]);
    let mut stack = vec![target];
    while let Some(v) = stack.pop() {
        if let Some(&k) = producer.get(&v) {
            for &i in g.nodes[k].inputs.iter().flatten() {
                if seen.insert(i) {
                    stack.push(i);
                }
            }
        }
    }
    seen
}
