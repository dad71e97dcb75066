//! Mixed precision: the chosen ops (products and convolutions by default) run in f16 with f32
//! master weights, and the loss is scaled dynamically so that small f16 gradients do
//! not flush to zero.
//!
//! - `autocast` rewrites each chosen node before differentiation: its f32 float inputs
//!   are cast to f16 (once per value), it computes in f16, and its result is cast back
//!   to f32 for the ops that need f32. Activations, elementwise arithmetic and reshapes
//!   whose float inputs are such f16 results (or weights) follow in f16, so f16 flows
//!   from one product to the next as under PyTorch's autocast; reductions,
//!   normalizations, softmax and losses read the f32 casts. The reverse sweep then
//!   differentiates through the casts, so the gradients of the f16 nodes are f16 too,
//!   and the gradients of the parameters arrive in f32.
//! - The step differentiates `loss * scale` and multiplies the gradients by `1/scale`.
//!   When any gradient is not finite the update is skipped (every state variable keeps
//!   its value) and the scale halves; after `growth_interval` finite steps in a row it
//!   doubles. Both the scale and the count of finite steps are state variables.
use super::emit::Emit;
use super::Result;
use kiln_graph::{Attr, DType, Node, ValueId};
use std::collections::HashMap;

/// How a training step uses f16.
#[derive(Clone, Debug, PartialEq)]
pub struct MixedPrecision {
    /// The op types (default domain) run in f16.
    pub ops: Vec<String>,
    /// The first loss scale.
    pub init_scale: f32,
    /// Finite steps in a row after which the scale doubles.
    pub growth_interval: u32,
}

impl Default for MixedPrecision {
    /// PyTorch's GradScaler defaults, and autocast's f16 list: products and convolutions.
    fn default() -> Self {
        MixedPrecision { ops: ["MatMul", "Gemm", "Conv", "ConvTranspose"].map(String::from).to_vec(), init_scale: 65536.0, growth_interval: 2000 }
    }
}

/// The float inputs of an op that autocast casts (all of them must be f32 or f16).
fn float_slots(op_type: &str) -> &'static [usize] {
    match op_type {
        "MatMul" => &[0, 1],
        "Gemm" | "Conv" | "ConvTranspose" => &[0, 1, 2],
        _ => &[],
    }
}

fn cast(e: &mut Emit, v: ValueId, to: DType) -> Result<ValueId> {
    e.op("Cast", &[v], &[("to", Attr::Int(to.onnx_code() as i64))])
}

/// Ops that run in f16 when their float inputs are f16 results of other f16 nodes or
/// weights (cast once), as autocast lets an op follow its inputs' type: activations,
/// elementwise arithmetic, max pooling (exact in any type) and reshaping between
/// products. Reductions, normalizations, softmax and losses stay f32.
const FOLLOWERS: &[&str] = &[
    "Relu", "LeakyRelu", "Tanh", "Sigmoid", "Erf", "Gelu", "Neg", "Add", "Sub", "Mul", "Div", "MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity",
];

/// Runs every node of `ops` in f16, and the nodes of [`FOLLOWERS`] whose float inputs
/// are f16 already or weights (`weights`: parameters and constants; a constant beyond
/// f16's range, an attention mask of -1e9 say, keeps its node in f32), so that f16 flows
/// from product to product (see the module docs). Returns how many nodes run in f16.
pub(super) fn autocast(e: &mut Emit, ops: &[String], weights: &std::collections::HashSet<ValueId>) -> Result<usize> {
    let order = e.graph.validate().map_err(|err| super::AutodiffError::Model(err.to_string()))?;
    let mut halves: HashMap<ValueId, ValueId> = HashMap::new();
    let mut count = 0;
    for k in order {
        let node = e.graph.nodes[k].clone();
        if !node.domain.is_empty() || node.outputs.len() != 1 {
            continue;
        }
        let y = node.outputs[0];
        let present: Vec<(usize, ValueId)> = if ops.iter().any(|o| *o == node.op_type) {
            float_slots(&node.op_type).iter().filter_map(|&i| node.inputs.get(i).copied().flatten().map(|v| (i, v))).collect()
        } else if FOLLOWERS.contains(&node.op_type.as_str()) {
            let floats: Vec<(usize, ValueId)> = node.inputs.iter().enumerate().filter_map(|(i, v)| v.map(|v| (i, v))).filter(|&(_, v)| e.dtype(v).is_float()).collect();
            // Only after an f16 result, and with nothing but f16 results and weights.
            let fits_f16 = |v: ValueId| e.value(v).is_none_or(|t| t.to_f64_vec().iter().all(|x| !x.is_finite() || x.abs() <= 65504.0));
            let follows = floats.iter().any(|(_, v)| halves.contains_key(v)) && floats.iter().all(|&(_, v)| halves.contains_key(&v) || (weights.contains(&v) && fits_f16(v)));
            if !follows {
                continue;
            }
            floats
        } else {
            continue;
        };
        if present.is_empty() || present.iter().any(|&(_, v)| e.dtype(v) != DType::F32) || e.dtype(y) != DType::F32 {
            continue;
        }
        e.set_scope(format!("{}/autocast", node.name));
        for (i, v) in present {
            let h = match halves.get(&v) {
                Some(&h) => h,
                None => {
                    let h = cast(e, v, DType::F16)?;
                    halves.insert(v, h);
                    h
                }
            };
            e.graph.nodes[k].inputs[i] = Some(h);
        }
        // The node now writes an f16 value (its op must take f16: checked here, naming
        // it); a Cast writes its old output from it.
        let mut ty = e.ty(y).clone();
        ty.dtype = DType::F16;
        let inferred = e.infer(&e.graph.nodes[k].clone())?;
        if inferred.first() != Some(&ty) {
            return Err(super::AutodiffError::Build { node: node.name.clone(), op: node.op_type.clone(), what: format!("in f16 it gives {inferred:?}, not {ty:?}") });
        }
        let y16 = e.value_of_type(&format!("{}:f16", e.graph.values[y].name), ty);
        e.graph.nodes[k].outputs[0] = y16;
        let name = format!("{}/autocast/to_f32", node.name);
        let attrs = [("to".to_string(), Attr::Int(DType::F32.onnx_code() as i64))].into_iter().collect();
        e.graph.nodes.push(Node { name, op_type: "Cast".into(), domain: String::new(), attrs, inputs: vec![Some(y16)], outputs: vec![y] });
        // A later f16 node reading `y` reads the f16 value itself.
        halves.insert(y, y16);
        count += 1;
    }
    e.set_scope("");
    Ok(count)
}

/// Whether every gradient is finite (a bool scalar): their squares summed in f32, which
/// is NaN or infinite exactly when one of them is (or, beyond 1e19, overflows).
pub(super) fn all_finite(e: &mut Emit, grads: &[ValueId]) -> Result<Option<ValueId>> {
    e.set_scope("loss_scale");
    match e.sum_of_squares(grads)? {
        Some(total) => Ok(Some(e.is_finite(total)?)),
        None => Ok(None),
    }
}

/// The next loss scale and count of finite steps in a row (f32 scalars).
pub(super) fn next_scale(e: &mut Emit, scale: ValueId, good: ValueId, finite: ValueId, growth_interval: u32) -> Result<(ValueId, ValueId)> {
    e.set_scope("loss_scale");
    let one = e.scalar(1.0, DType::F32);
    let zero = e.scalar(0.0, DType::F32);
    let good1 = e.add(good, one)?;
    let interval = e.scalar(growth_interval as f64, DType::F32);
    let grow = e.op("GreaterOrEqual", &[good1, interval], &[])?;
    let doubled = e.scale(scale, 2.0)?;
    let halved = e.scale(scale, 0.5)?;
    let scale_ok = e.op("Where", &[grow, doubled, scale], &[])?;
    let good_ok = e.op("Where", &[grow, zero, good1], &[])?;
    let scale_next = e.op("Where", &[finite, scale_ok, halved], &[])?;
    let good_next = e.op("Where", &[finite, good_ok, zero], &[])?;
    Ok((scale_next, good_next))
}
