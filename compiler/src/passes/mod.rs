//! Graph passes: each a named function `(&mut Graph, &mut PassContext) -> changes`,
//! testable alone, run in order by [`optimize`]. The [`PassContext`] carries the
//! registry (custom ops included) and the value types, inferred once per pipeline.
mod algebraic;
mod broadcast_expand;
mod context;
mod cse;
mod eliminate_dead;
mod eliminate_identity;
mod fold_batchnorm;
mod fold_constants;
mod fuse_activation;
mod fuse_attention;
mod fuse_bias;
mod fuse_elementwise;
mod fuse_gelu;
mod fuse_layernorm;
mod fuse_matmul_integer;
mod fuse_qdq;
mod fuse_residual;
mod layout_nchwc;
mod layout_nhwc_int8;

pub use algebraic::simplify_algebra;
pub use broadcast_expand::broadcast_expand;
pub use context::PassContext;
pub use cse::eliminate_common_subexpressions;
pub use eliminate_dead::eliminate_dead;
pub use eliminate_identity::eliminate_identity;
pub use fold_batchnorm::fold_batchnorm;
pub use fold_constants::fold_constants;
pub use fuse_activation::fuse_activation;
pub use fuse_attention::fuse_attention;
pub use fuse_bias::fuse_bias;
pub use fuse_elementwise::fuse_elementwise;
pub use fuse_gelu::fuse_gelu;
pub use fuse_layernorm::fuse_layernorm;
pub use fuse_matmul_integer::fuse_matmul_integer;
pub use fuse_qdq::fuse_qdq;
pub use fuse_residual::{fuse_conv_residual, fuse_residual};
pub use layout_nchwc::layout_nchwc;
pub use layout_nhwc_int8::layout_nhwc_int8;

use kiln_graph::{Graph, NodeId, ValueId};

/// A graph pass: its name and the function that applies it, returning how many
/// rewrites it made.
pub struct Pass {
    pub name: &'static str,
    pub run: fn(&mut Graph, &mut PassContext) -> usize,
}

/// The passes [`optimize`] runs, in order.
pub const PASSES: &[Pass] = &[
    Pass { name: "eliminate-identity", run: eliminate_identity },
    Pass { name: "fuse-qdq", run: fuse_qdq },
    Pass { name: "fold-constants", run: fold_constants },
    Pass { name: "fold-batchnorm", run: fold_batchnorm },
    Pass { name: "cse", run: eliminate_common_subexpressions },
    Pass { name: "simplify-algebra", run: simplify_algebra },
    Pass { name: "broadcast-expand", run: broadcast_expand },
    Pass { name: "eliminate-dead", run: eliminate_dead },
    Pass { name: "fuse-layernorm", run: fuse_layernorm },
    Pass { name: "fuse-bias", run: fuse_bias },
    Pass { name: "fuse-matmul-integer", run: fuse_matmul_integer },
    Pass { name: "fuse-gelu", run: fuse_gelu },
    Pass { name: "fuse-residual", run: fuse_residual },
    Pass { name: "fuse-conv-residual", run: fuse_conv_residual },
    Pass { name: "fuse-activation", run: fuse_activation },
    Pass { name: "fuse-elementwise", run: fuse_elementwise },
];

/// Tested passes that are not in [`PASSES`] because they are faster on one device only,
/// each with the default pass it runs before when enabled (`KILN_ENABLE_PASSES`), until
/// the cost model can choose per device:
/// - `fuse-attention`: a little faster on the CPU (median of 6 medians of 300 runs:
///   bert_tiny 2.97 against 3.12 ms, gpt2_tiny 3.51 against 3.61 ms, batch 1, sequence
///   128), slower on lavapipe (bert_tiny 145-174 against 122 ms, gpt2_tiny ~270 against
///   ~245 ms: the Attention softmax and weighted-sum WGSL are not register-blocked like
///   the unfused MatMuls).
/// - `layout-nchwc`: CPU convolutions in the channel-blocked layout (CPU kernels only);
///   anchored at the end (`""`): it runs after every default pass. On the CPU, 5
///   alternating pairs of `kiln bench`: squeezenet1_1 0.94x, resnet18 0.91x,
///   mobilenet_v2 1.00x of the time without it.
/// - `layout-nhwc-int8`: 8-bit convolution chains channels-last (CPU kernels only),
///   anchored at the end.
pub const OPTIONAL_PASSES: &[(Pass, &str)] = &[
    (Pass { name: "fuse-attention", run: fuse_attention }, "fuse-bias"),
    (Pass { name: "layout-nchwc", run: layout_nchwc }, ""),
    (Pass { name: "layout-nhwc-int8", run: layout_nhwc_int8 }, ""),
];

/// Names (comma-separated) of default passes [`optimize`] skips, to measure or bisect
/// one pass without rebuilding.
pub const SKIP_PASSES_ENV: &str = "KILN_SKIP_PASSES";

/// Names (comma-separated) of [`OPTIONAL_PASSES`] that [`optimize`] runs.
pub const ENABLE_PASSES_ENV: &str = "KILN_ENABLE_PASSES";

/// The kind of device a graph is optimised for: some passes pay on one kind only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Unknown or several devices: the default passes only.
    Any,
    Cpu,
    Gpu,
}

/// Optional passes that run by default for one target (measured faster there; see
/// [`OPTIONAL_PASSES`]).
pub const TARGET_PASSES: &[(&str, Target)] = &[("fuse-attention", Target::Cpu), ("layout-nchwc", Target::Cpu), ("layout-nhwc-int8", Target::Cpu)];

/// The passes [`optimize_for`] runs for `target` given the skip and enable lists
/// (comma-separated names).
pub fn selected_passes(skip: &str, enable: &str, target: Target) -> Vec<&'static Pass> {
    selected_passes_chosen(skip, enable, target, &PassChoices::new())
}

/// Optional passes turned on (true) or off by name, for one graph on one device: a
/// graph-level tuned choice. Passes it does not name keep their target's default.
pub type PassChoices = std::collections::BTreeMap<String, bool>;

/// The optional passes a tuner may turn on or off for `target`, each with whether it
/// runs by default there: `fuse-attention` on every device kind, the layout passes on
/// the CPU only (their ops have CPU kernels only); none for [`Target::Any`].
pub fn tunable_passes(target: Target) -> Vec<(&'static str, bool)> {
    let cpu_only = ["layout-nchwc", "layout-nhwc-int8"];
    match target {
        Target::Any => vec![],
        _ => OPTIONAL_PASSES
            .iter()
            .map(|(p, _)| p.name)
            .filter(|name| target == Target::Cpu || !cpu_only.contains(name))
            .map(|name| (name, TARGET_PASSES.contains(&(name, target))))
            .collect(),
    }
}

/// [`selected_passes`] with the optional passes `choices` names turned on or off
/// (before the lists: `enable` and `skip` still win).
pub fn selected_passes_chosen(skip: &str, enable: &str, target: Target, choices: &PassChoices) -> Vec<&'static Pass> {
    let named = |list: &str, name: &str| list.split(',').any(|s| s.trim() == name);
    let by_default = |name: &str| choices.get(name).copied().unwrap_or_else(|| TARGET_PASSES.contains(&(name, target)));
    let wanted = |name: &str| named(enable, name) || by_default(name) && !named(skip, name);
    let mut out = vec![];
    for p in PASSES {
        out.extend(OPTIONAL_PASSES.iter().filter(|(o, before)| *before == p.name && wanted(o.name)).map(|(o, _)| o));
        if !named(skip, p.name) {
            out.push(p);
        }
    }
    out.extend(OPTIONAL_PASSES.iter().filter(|(o, before)| before.is_empty() && wanted(o.name)).map(|(o, _)| o));
    out
}

/// What one pass did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassReport {
    pub name: &'static str,
    pub changes: usize,
}

/// Runs the default passes in order, minus those named in `KILN_SKIP_PASSES`, plus the
/// optional ones named in `KILN_ENABLE_PASSES`.
pub fn optimize(graph: &mut Graph) -> Vec<PassReport> {
    optimize_for(graph, Target::Any)
}

/// [`optimize`], plus the passes that pay on `target` ([`TARGET_PASSES`]).
pub fn optimize_for(graph: &mut Graph, target: Target) -> Vec<PassReport> {
    optimize_with(graph, target, &mut PassContext::builtin())
}

/// [`optimize_for`] in a given context (a custom registry).
pub fn optimize_with(graph: &mut Graph, target: Target, cx: &mut PassContext) -> Vec<PassReport> {
    optimize_chosen(graph, target, cx, &PassChoices::new())
}

/// [`optimize_with`] with the target's optional passes turned on or off by `choices`
/// (a tuned choice; the environment's lists still apply on top).
pub fn optimize_chosen(graph: &mut Graph, target: Target, cx: &mut PassContext, choices: &PassChoices) -> Vec<PassReport> {
    let env = |name: &str| std::env::var(name).unwrap_or_default();
    selected_passes_chosen(&env(SKIP_PASSES_ENV), &env(ENABLE_PASSES_ENV), target, choices)
        .into_iter()
        .map(|p| {
            let changes = (p.run)(graph, cx);
            log::info!("pass {}: {changes} change(s)", p.name);
            PassReport { name: p.name, changes }
        })
        .collect()
}

/// How many nodes read each value, plus one for each graph output it is.
pub(crate) fn use_counts(g: &Graph) -> Vec<usize> {
    let mut uses = vec![0usize; g.values.len()];
    for n in &g.nodes {
        for v in n.inputs.iter().flatten() {
            uses[*v] += 1;
        }
    }
    for &o in &g.outputs {
        uses[o] += 1;
    }
    uses
}

/// The node producing each value.
pub(crate) fn producers(g: &Graph) -> Vec<Option<NodeId>> {
    let mut p = vec![None; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for &o in &n.outputs {
            p[o] = Some(i);
        }
    }
    p
}

/// Removes the nodes in `dead` (indices), keeping the order of the others.
pub(crate) fn remove_nodes(g: &mut Graph, dead: &[NodeId]) {
    let mut drop = vec![false; g.nodes.len()];
    for &n in dead {
        drop[n] = true;
    }
    let mut i = 0;
    g.nodes.retain(|_| {
        i += 1;
        !drop[i - 1]
    });
}

/// The scalar f32 value of a constant input, if it is one.
pub(crate) fn scalar_const(g: &Graph, v: Option<ValueId>) -> Option<f32> {
    let t = g.initializers.get(&v?)?;
    (t.len() == 1).then(|| t.to_f64_vec()[0] as f32)
}

/// For node `a` = `Add(x, y)` where one side is a plain MatMul's output `m` and the other,
/// `o`, passes `other_ok(m, o)`: (the MatMul node, `m`, `o`). Epilogue fusions start here.
pub(crate) fn matmul_plus(g: &Graph, prod: &[Option<NodeId>], a: NodeId, other_ok: impl Fn(ValueId, ValueId) -> bool) -> Option<(NodeId, ValueId, ValueId)> {
    let add = &g.nodes[a];
    if add.op_type != "Add" || !add.domain.is_empty() || add.inputs.len() != 2 {
        return None;
    }
    let (x, y) = (add.inputs.get(0).copied().flatten()?, add.inputs.get(1).copied().flatten()?);
    let is_mm = |v: ValueId| prod[v].filter(|&p| g.nodes[p].op_type == "MatMul" && g.nodes[p].domain.is_empty());
    [(x, y), (y, x)].into_iter().find_map(|(m, o)| Some((is_mm(m)?, m, o)).filter(|_| other_ok(m, o)))
}

/// Every reader of `from` (node inputs and graph outputs) reads `to` instead.
pub(crate) fn replace_uses(g: &mut Graph, from: ValueId, to: ValueId) {
    for n in &mut g.nodes {
        for v in n.inputs.iter_mut().flatten() {
            if *v == from {
                *v = to;
            }
        }
    }
    for o in &mut g.outputs {
        if *o == from {
            *o = to;
        }
    }
}

/// Makes node `n`'s output `out` disappear by passing `src` through: readers of `out`
/// read `src`. When `out` is a graph output (whose name the user sees), `src`'s
/// producer writes `out` directly instead. Returns false when neither is possible
/// (a graph input or a weight passed straight to an output).
pub(crate) fn bypass(g: &mut Graph, out: ValueId, src: ValueId) -> bool {
    if !g.outputs.contains(&out) {
        replace_uses(g, out, src);
        return true;
    }
    if g.outputs.contains(&src) || g.inputs.contains(&src) || g.initializers.contains_key(&src) {
        return false;
    }
    let Some(p) = g.nodes.iter().position(|n| n.outputs.contains(&src)) else { return false };
    for o in &mut g.nodes[p].outputs {
        if *o == src {
            *o = out;
        }
    }
    for n in &mut g.nodes {
        for v in n.inputs.iter_mut().flatten() {
            if *v == src {
                *v = out;
            }
        }
    }
    true
}

/// A stable text form of a graph, one node per line in topological order (values by
/// name, weights as dtype and dims): the golden files of the pass tests and
/// `kiln inspect` use it.
pub fn dump(g: &Graph) -> String {
    let name = |v: ValueId| g.values[v].name.clone();
    let mut out = String::new();
    let ins: Vec<String> = g.inputs.iter().map(|&v| format!("{}: {}", name(v), g.values[v].ty.as_ref().map(|t| t.to_string()).unwrap_or("?".into()))).collect();
    out += &format!("inputs: {}\n", ins.join(", "));
    let mut weights: Vec<(String, String)> = g.initializers.iter().map(|(&v, t)| (name(v), format!("{}{:?}", t.dtype(), t.dims()))).collect();
    weights.sort();
    for (n, t) in weights {
        out += &format!("weight {n}: {t}\n");
    }
    let order = g.validate().unwrap_or_else(|_| (0..g.nodes.len()).collect());
    for i in order {
        let n = &g.nodes[i];
        let ins: Vec<String> = n.inputs.iter().map(|v| v.map(name).unwrap_or_default()).collect();
        let outs: Vec<String> = n.outputs.iter().map(|&v| name(v)).collect();
        let attrs: Vec<String> = n.attrs.iter().map(|(k, a)| format!("{k}={}", attr_text(a))).collect();
        let op = if n.domain.is_empty() { n.op_type.clone() } else { format!("{}.{}", n.domain, n.op_type) };
        out += &format!("{} = {op}({}){}\n", outs.join(", "), ins.join(", "), if attrs.is_empty() { String::new() } else { format!(" {{{}}}", attrs.join(", ")) });
    }
    out += &format!("outputs: {}\n", g.outputs.iter().map(|&v| name(v)).collect::<Vec<_>>().join(", "));
    out
}

fn attr_text(a: &kiln_graph::Attr) -> String {
    use kiln_graph::Attr;
    match a {
        Attr::Int(i) => i.to_string(),
        Attr::Float(f) => format!("{f}"),
        Attr::String(s) => format!("{s:?}"),
        Attr::Ints(v) => format!("{v:?}"),
        Attr::Floats(v) => format!("{v:?}"),
        Attr::Strings(v) => format!("{v:?}"),
        Attr::Tensor(t) => format!("tensor {}{:?}", t.dtype(), t.dims()),
        Attr::Graph(g) => format!("graph '{}' ({} nodes)", g.name, g.nodes.len()),
        Attr::Type(t) => format!("type {t}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(skip: &str, enable: &str) -> Vec<&'static str> {
        selected_passes(skip, enable, Target::Any).into_iter().map(|p| p.name).collect()
    }

    #[test]
    fn target_passes_join_for_their_device_unless_skipped() {
        let cpu: Vec<&str> = selected_passes("", "", Target::Cpu).into_iter().map(|p| p.name).collect();
        assert!(cpu.contains(&"fuse-attention"));
        let gpu: Vec<&str> = selected_passes("", "", Target::Gpu).into_iter().map(|p| p.name).collect();
        assert!(!gpu.contains(&"fuse-attention"));
        let skipped: Vec<&str> = selected_passes("fuse-attention", "", Target::Cpu).into_iter().map(|p| p.name).collect();
        assert!(!skipped.contains(&"fuse-attention"));
    }

    #[test]
    fn chosen_passes_override_the_target_defaults_and_the_lists_override_them() {
        let on = |target: Target, choices: &[(&str, bool)], skip: &str| {
            let choices: PassChoices = choices.iter().map(|&(n, b)| (n.to_string(), b)).collect();
            selected_passes_chosen(skip, "", target, &choices).into_iter().map(|p| p.name).collect::<Vec<_>>()
        };
        assert!(!on(Target::Cpu, &[("layout-nchwc", false)], "").contains(&"layout-nchwc"));
        assert!(on(Target::Cpu, &[("fuse-attention", false)], "").contains(&"layout-nchwc"));
        let gpu = on(Target::Gpu, &[("fuse-attention", true)], "");
        assert_eq!(gpu.iter().position(|&p| p == "fuse-attention").unwrap() + 1, gpu.iter().position(|&p| p == "fuse-bias").unwrap());
        assert!(!on(Target::Gpu, &[("fuse-attention", true)], "fuse-attention").contains(&"fuse-attention"));
        // What a tuner may toggle: every optional pass on the CPU, at its default there;
        // no CPU-only layout on a GPU; nothing for an unknown device.
        assert_eq!(tunable_passes(Target::Cpu), OPTIONAL_PASSES.iter().map(|(p, _)| (p.name, true)).collect::<Vec<_>>());
        assert_eq!(tunable_passes(Target::Gpu), vec![("fuse-attention", false)]);
        assert!(tunable_passes(Target::Any).is_empty());
    }

    #[test]
    fn optional_passes_run_before_their_anchor_only_when_enabled() {
        let all = names("", "");
        assert_eq!(all, PASSES.iter().map(|p| p.name).collect::<Vec<_>>());
        let with = names("cse", "fuse-attention");
        assert!(!with.contains(&"cse"));
        let at = |n: &str| with.iter().position(|&p| p == n).unwrap();
        assert_eq!(at("fuse-attention") + 1, at("fuse-bias"));
        assert_eq!(with.len(), PASSES.len());
    }
}
