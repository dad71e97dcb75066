//! Channels-last layout for 8-bit convolution chains on the CPU (`layout-nhwc-int8`):
//! QLinearConv chains run on `[N, H, W, C]` values, as onnxruntime's NHWC transformer
//! runs them, and the graph transposes only where a chain meets the rest of it. A
//! pointwise convolution is then the plain product of pixel rows by the filters (no
//! per-run transpose of the activations into pixel-major words, no transposing
//! epilogue), and a depthwise one sums contiguous runs of channels.
//!
//! - A QLinearConv (2-D, constant filters) that the CPU's channels-last kernels take —
//!   depthwise with one channel per group, or ungrouped with at least 4 output channels
//!   — gets `kiln_channels_last = 1`; over an input that is not channels-last, an
//!   ungrouped one gets `kiln_channels_last = 2` (it reads the planes, writes pixels:
//!   a stem over the model's input) and a depthwise one a `Transpose` (perm 0, 2, 3, 1)
//!   of its input.
//! - com.microsoft QLinearAdd of two values of one type, one of them channels-last, runs
//!   channels-last (the other gets a `Transpose` if it has none);
//!   QLinearGlobalAveragePool of a channels-last value gets `channels_last = 1`.
//! - A channels-last value read by anything else, or a graph output, gets one
//!   `Transpose` (perm 0, 3, 1, 2) that writes the original value (name and type
//!   unchanged).
//!
//! A convolution over a channels-first input whose readers all stay channels-first (a
//! stem before a MaxPool) stays channels-first, and fewer than three convolutions that
//! would convert leave the graph as it is: the transposes would cost more than they
//! save.
use super::{producers, PassContext};
use kiln_graph::{Attr, DType, Graph, Node, Shape, ValueId, ValueType};

/// The attribute QLinearConv reads (see kiln-ops' `qlinear_conv`).
const CHANNELS_LAST_ATTR: &str = "kiln_channels_last";
/// The fewest converting convolutions worth the transposes.
const MIN_CONVS: usize = 3;

/// Rewrites chains of 8-bit convolutions into the channels-last layout; returns how
/// many nodes now compute in it.
pub fn layout_nhwc_int8(g: &mut Graph, cx: &mut PassContext) -> usize {
    let types = cx.types(g).to_vec();
    let Ok(order) = g.validate() else { return 0 };
    let ty = |v: ValueId| types.get(v).cloned().flatten();
    // last[v]: v's producer computes it channels-last.
    let mut last = vec![false; g.values.len()];
    let mut converted = vec![];
    let mut convs = 0;
    for n in order {
        let node = &g.nodes[n];
        let Some(out) = node.outputs.first().copied().filter(|_| node.outputs.len() == 1) else { continue };
        if ty(out).and_then(|t| channels_last_type(&t)).is_none() {
            continue;
        }
        let data = |i: usize| node.inputs.get(i).copied().flatten();
        let ok = match (node.domain.as_str(), node.op_type.as_str()) {
            ("", "QLinearConv") => conv_converts(g, node, &types),
            ("com.microsoft", "QLinearAdd") => match (data(0), data(3)) {
                (Some(a), Some(b)) => (last[a] || last[b]) && ty(a) == ty(b) && ty(a) == ty(out),
                _ => false,
            },
            ("com.microsoft", "QLinearGlobalAveragePool") => data(0).is_some_and(|x| last[x]) && matches!(node.attr("channels_last"), None | Some(Attr::Int(0))),
            _ => false,
        };
        if ok {
            convs += (node.op_type == "QLinearConv") as usize;
            last[out] = true;
            converted.push(n);
        }
    }
    // A convolution over a channels-first input whose readers all stay channels-first
    // (a stem before a MaxPool) would only add two transposes: it stays as it is.
    let mut readers = vec![vec![]; g.values.len()];
    for (n, node) in g.nodes.iter().enumerate() {
        for &v in node.inputs.iter().flatten() {
            readers[v].push(n);
        }
    }
    let mut is_converted = vec![false; g.nodes.len()];
    converted.iter().for_each(|&n| is_converted[n] = true);
    for &n in converted.iter().rev() {
        let node = &g.nodes[n];
        let (x, out) = (node.inputs[0].expect("a converted node reads x"), node.outputs[0]);
        let isolated = node.op_type == "QLinearConv" && !last[x] && !g.outputs.contains(&out) && readers[out].iter().all(|&r| !is_converted[r]);
        if isolated {
            is_converted[n] = false;
            last[out] = false;
            convs -= 1;
        }
    }
    converted.retain(|&n| is_converted[n]);
    if convs < MIN_CONVS {
        return 0;
    }
    // The channels-last twin of every such value; readers that stay channels-first
    // read the original, now written by a Transpose.
    let mut twin: Vec<Option<ValueId>> = vec![None; g.values.len()];
    for v in 0..last.len() {
        if last[v] {
            let t = ty(v).and_then(|t| channels_last_type(&t));
            twin[v] = Some(g.add_value(format!("{}.nhwc", g.values[v].name), t));
        }
    }
    let prod = producers(g);
    let mut first_needed = vec![false; g.values.len()];
    let mut to_last: Vec<(ValueId, ValueId)> = vec![];
    let next_value = g.values.len();
    for (n, node) in g.nodes.iter_mut().enumerate() {
        if is_converted[n] {
            // The data inputs: x of QLinearConv and QLinearGlobalAveragePool, A and B of
            // QLinearAdd (the rest are scales, zero points, filters and biases).
            let data: &[usize] = if node.op_type == "QLinearAdd" { &[0, 3] } else { &[0] };
            // An ungrouped convolution over a channels-first input reads it as it is and
            // writes channels-last (`kiln_channels_last = 2`): its kernel repacks the
            // input planes either way, so a transpose would be wasted.
            let reads_first = node.op_type == "QLinearConv" && node.inputs[0].is_some_and(|x| twin[x].is_none()) && matches!(node.attr("group"), None | Some(Attr::Int(1)));
            for &i in data.iter().filter(|_| !reads_first) {
                let Some(x) = node.inputs[i] else { continue };
                node.inputs[i] = Some(match twin[x] {
                    Some(t) => t,
                    None => match to_last.iter().find(|(p, _)| *p == x) {
                        Some(&(_, t)) => t,
                        None => {
                            let t = next_value + to_last.len();
                            to_last.push((x, t));
                            t
                        }
                    },
                });
            }
            node.outputs[0] = twin[node.outputs[0]].expect("a converted node's output is channels-last");
            let attr = if node.op_type == "QLinearConv" { CHANNELS_LAST_ATTR } else { "channels_last" };
            if node.op_type != "QLinearAdd" {
                node.attrs.insert(attr.into(), Attr::Int(if reads_first { 2 } else { 1 }));
            }
        } else {
            for x in node.inputs.iter().flatten() {
                first_needed[*x] |= last[*x];
            }
        }
    }
    for &o in &g.outputs {
        first_needed[o] |= last[o];
    }
    for (x, t) in to_last {
        let vt = ty(x).and_then(|t| channels_last_type(&t));
        let id = g.add_value(format!("{}.nhwc", g.values[x].name), vt);
        debug_assert_eq!(id, t);
        g.nodes.push(transpose(&format!("{}.ToNhwc", g.values[x].name), x, id, [0, 2, 3, 1]));
    }
    for v in 0..first_needed.len() {
        if first_needed[v] {
            let t = twin[v].expect("channels-last");
            let name = prod[v].map_or(g.values[v].name.clone(), |p| g.nodes[p].name.clone());
            g.nodes.push(transpose(&format!("{name}.FromNhwc"), t, v, [0, 3, 1, 2]));
        }
    }
    converted.len()
}

fn transpose(name: &str, x: ValueId, y: ValueId, perm: [i64; 4]) -> Node {
    let mut attrs = kiln_graph::Attributes::default();
    attrs.insert("perm".into(), Attr::Ints(perm.to_vec()));
    Node { name: name.into(), op_type: "Transpose".into(), domain: String::new(), attrs, inputs: vec![Some(x)], outputs: vec![y] }
}

/// The channels-last type of an 8-bit `[N, C, H, W]` value.
fn channels_last_type(t: &ValueType) -> Option<ValueType> {
    let d = &t.shape.0;
    (matches!(t.dtype, DType::U8 | DType::I8) && d.len() == 4).then(|| ValueType::new(t.dtype, Shape(vec![d[0].clone(), d[2].clone(), d[3].clone(), d[1].clone()])))
}

/// Whether a QLinearConv takes a channels-last kernel: 2-D, constant 4-D filters,
/// known input channels, and depthwise with one channel per group, or ungrouped with at
/// least 4 output channels (the packed kernel; a stem over 3 channels too: transposing
/// its small input costs less than transposing its output).
fn conv_converts(g: &Graph, node: &Node, types: &[Option<ValueType>]) -> bool {
    let (Some(x), Some(w)) = (node.inputs.first().copied().flatten(), node.inputs.get(3).copied().flatten()) else { return false };
    let Some(wt) = g.initializers.get(&w) else { return false };
    let Some(xt) = types.get(x).cloned().flatten() else { return false };
    // Already channels-last (the pass ran before): its x is not `[N, C, H, W]`.
    if !matches!(node.attr(CHANNELS_LAST_ATTR), None | Some(Attr::Int(0))) {
        return false;
    }
    // The kernels take constant filter zero points.
    if node.inputs.get(5).copied().flatten().is_some_and(|z| !g.initializers.contains_key(&z)) {
        return false;
    }
    let wd = wt.dims();
    let Some(c) = xt.shape.0.get(1).and_then(|d| d.fixed()) else { return false };
    if wd.len() != 4 || xt.shape.0.len() != 4 {
        return false;
    }
    let group = match node.attr("group") {
        Some(Attr::Int(g)) => *g as usize,
        None => 1,
        _ => return false,
    };
    (group > 1 && group == c && wd[0] == c && wd[1] == 1) || (group == 1 && wd[0] >= 4)
}
