//! Channel-blocked layout for CPU convolutions (`layout-nchwc`): chains of 2-D f32
//! convolutions run in the NCHW8c layout (`[N, C/8, H, W, 8]`, eight channels per
//! pixel), which the CPU kernels compute in natively, and the graph converts only where
//! a chain meets the rest of it. Run last, after the epilogue fusions.
//!
//! - A Conv with constant weights and output channels a multiple of 8 becomes
//!   `kiln.ConvNchwc` with a blocked output. It reads a blocked input as it is, a plain
//!   one too when ungrouped (`kiln_input_blocked` = 0: a stem over 3 channels); a
//!   depthwise one converts only over a blocked input. A fused residual that is not
//!   blocked gets a `kiln.ToNchwc`.
//! - MaxPool and GlobalAveragePool of a blocked value become `kiln.MaxPoolNchwc` and
//!   `kiln.GlobalAveragePoolNchwc`.
//! - Elementwise activations, and Add/Sub/Mul/Div/Max/Min of two blocked values of one
//!   type, stay blocked, as does a Concat of blocked values along the channels.
//! - A blocked value read by anything else, or a graph output, gets one
//!   `kiln.FromNchwc` that writes the original value (its name and type unchanged).
use super::{producers, PassContext};
use kiln_graph::{Attr, Dim, DType, Graph, Node, Shape, ValueId, ValueType};
use kiln_ops::CONV_INPUT_BLOCKED_ATTR;

const BLOCK: usize = 8;

/// Activations that keep a blocked value blocked (one data input, elementwise).
const UNARY: &[&str] = &["Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Selu", "Softplus"];
/// Binary ops that keep two blocked values of one type blocked.
const BINARY: &[&str] = &["Add", "Sub", "Mul", "Div", "Max", "Min"];

/// Rewrites chains of CPU convolutions into the blocked layout; returns how many nodes
/// now compute in it.
pub fn layout_nchwc(g: &mut Graph, cx: &mut PassContext) -> usize {
    let types = cx.types(g).to_vec();
    let Ok(order) = g.validate() else { return 0 };
    let ty = |v: ValueId| types.get(v).cloned().flatten();
    // blocked[v]: v's producer computes it blocked.
    let mut blocked = vec![false; g.values.len()];
    let mut converted = vec![];
    for n in order {
        let node = &g.nodes[n];
        if !node.domain.is_empty() || node.outputs.len() != 1 || ty(node.outputs[0]).and_then(|t| blocked_type(&t)).is_none() {
            continue;
        }
        let data: Vec<ValueId> = node.inputs.iter().flatten().copied().collect();
        let is_blocked = |v: &ValueId| blocked[*v];
        let ok = match node.op_type.as_str() {
            "Conv" => conv_converts(g, node, &types, &blocked),
            op if UNARY.contains(&op) => node.inputs.first().copied().flatten().is_some_and(|x| blocked[x]) && node.inputs[1..].iter().flatten().all(|v| g.initializers.get(v).is_some_and(|t| t.len() == 1)),
            op if BINARY.contains(&op) => data.len() == 2 && data.iter().all(is_blocked) && ty(data[0]) == ty(data[1]),
            "MaxPool" | "GlobalAveragePool" => data.len() == 1 && blocked[data[0]],
            "Concat" => {
                let axis = match node.attr("axis") {
                    Some(Attr::Int(a)) => *a,
                    _ => i64::MIN,
                };
                (axis == 1 || axis == -3) && !data.is_empty() && data.iter().all(is_blocked)
            }
            _ => false,
        };
        if ok {
            blocked[node.outputs[0]] = true;
            converted.push(n);
        }
    }
    if converted.is_empty() {
        return 0;
    }
    // The blocked twin of every blocked value; readers that stay plain read the
    // original, now written by a FromNchwc.
    let mut twin: Vec<Option<ValueId>> = vec![None; g.values.len()];
    for v in 0..blocked.len() {
        if blocked[v] {
            let t = ty(v).and_then(|t| blocked_type(&t));
            twin[v] = Some(g.add_value(format!("{}.nchwc", g.values[v].name), t));
        }
    }
    let is_converted = {
        let mut c = vec![false; g.nodes.len()];
        converted.iter().for_each(|&n| c[n] = true);
        c
    };
    let prod = producers(g);
    let mut plain_needed = vec![false; g.values.len()];
    let mut to_blocked: Vec<(ValueId, ValueId)> = vec![];
    for (n, node) in g.nodes.iter_mut().enumerate() {
        if is_converted[n] {
            let x_blocked = node.inputs.first().copied().flatten().is_some_and(|x| blocked[x]);
            for (i, v) in node.inputs.iter_mut().enumerate() {
                let Some(x) = *v else { continue };
                if let Some(b) = twin[x] {
                    *v = Some(b);
                } else if node.op_type == "Conv" && i == 3 {
                    // A plain residual of a blocked Conv.
                    let b = match to_blocked.iter().find(|(p, _)| *p == x) {
                        Some(&(_, b)) => b,
                        None => {
                            let b = g.values.len() + to_blocked.len();
                            to_blocked.push((x, b));
                            b
                        }
                    };
                    *v = Some(b);
                }
            }
            let out = node.outputs[0];
            node.outputs[0] = twin[out].expect("a converted node's output is blocked");
            match node.op_type.as_str() {
                "Conv" => {
                    node.attrs.insert(CONV_INPUT_BLOCKED_ATTR.into(), Attr::Int(x_blocked as i64));
                    node.op_type = "ConvNchwc".into();
                    node.domain = "kiln".into();
                }
                "MaxPool" | "GlobalAveragePool" => {
                    node.attrs.remove("storage_order");
                    node.op_type = format!("{}Nchwc", node.op_type);
                    node.domain = "kiln".into();
                }
                "Concat" => {
                    node.attrs.insert("axis".into(), Attr::Int(1));
                }
                _ => {}
            }
        } else {
            for x in node.inputs.iter().flatten() {
                plain_needed[*x] |= blocked[*x];
            }
        }
    }
    for &o in &g.outputs {
        plain_needed[o] |= blocked[o];
    }
    for (x, b) in to_blocked {
        let t = ty(x).and_then(|t| blocked_type(&t));
        let id = g.add_value(format!("{}.nchwc", g.values[x].name), t);
        debug_assert_eq!(id, b);
        g.nodes.push(reorder("ToNchwc", &g.values[x].name, x, id));
    }
    for v in 0..plain_needed.len() {
        if plain_needed[v] {
            let b = twin[v].expect("blocked");
            let name = prod[v].map_or(g.values[v].name.clone(), |p| g.nodes[p].name.clone());
            g.nodes.push(reorder("FromNchwc", &name, b, v));
        }
    }
    converted.len()
}

fn reorder(op: &str, name: &str, x: ValueId, y: ValueId) -> Node {
    Node { name: format!("{name}.{op}"), op_type: op.into(), domain: "kiln".into(), attrs: Default::default(), inputs: vec![Some(x)], outputs: vec![y] }
}

/// The blocked type of an f32 `[N, C, H, W]` value with C a known multiple of 8.
fn blocked_type(t: &ValueType) -> Option<ValueType> {
    let d = &t.shape.0;
    let c = d.get(1)?.fixed()?;
    (t.dtype == DType::F32 && d.len() == 4 && c % BLOCK == 0).then(|| {
        let mut dims = vec![d[0].clone(), Dim::Fixed(c / BLOCK), d[2].clone(), d[3].clone(), Dim::Fixed(BLOCK)];
        dims.shrink_to_fit();
        ValueType::new(DType::F32, Shape(dims))
    })
}

/// Whether a Conv node computes blocked: constant 4-D f32 weights, output channels a
/// multiple of 8 (checked by the caller through its output type), ungrouped, or
/// depthwise over a blocked input.
fn conv_converts(g: &Graph, node: &Node, types: &[Option<ValueType>], blocked: &[bool]) -> bool {
    let (Some(x), Some(w)) = (node.inputs.first().copied().flatten(), node.inputs.get(1).copied().flatten()) else { return false };
    let Some(wt) = g.initializers.get(&w) else { return false };
    let Some(xt) = types.get(x).cloned().flatten() else { return false };
    let wd = wt.dims();
    if wt.dtype() != DType::F32 || wd.len() != 4 || xt.shape.0.len() != 4 || node.inputs.len() > 4 {
        return false;
    }
    let group = match node.attr("group") {
        Some(Attr::Int(g)) => *g,
        None => 1,
        _ => return false,
    };
    let c = xt.shape.0[1].fixed();
    group == 1 || (blocked[x] && wd[1] == 1 && c == Some(wd[0]) && group == wd[0] as i64)
}
