//! TreeEnsemble (ai.onnx.ml 5): the sum (or average, minimum, maximum:
//! `aggregate_function` 1, 0, 2, 3) over trees of the leaf each row of `X` (`[N, F]`)
//! reaches, per target (`[N, n_targets]`, `X`'s dtype). Interior node `i` tests
//! feature `nodes_featureids[i]` against `nodes_splits[i]` with `nodes_modes[i]`
//! (<=, <, >=, >, ==, !=, or membership of its run of `membership_values`, runs
//! separated by NaN); NaN goes the true way where `nodes_missing_value_tracks_true`
//! says so. A branch leads to node `nodes_{true,false}nodeids[i]`, or to that leaf when
//! `nodes_{true,false}leafs[i]` is set. A root whose two branches are the same leaf is
//! a leaf tree (onnx.reference reads it as leaf `root`). Targets no leaf reaches stay
//! 0 (sum, average) or at the dtype's largest/smallest value (min, max), as the
//! reference. Only `post_transform` NONE is implemented.
//!
//! The ensemble is validated and flattened when the op is created (every index in
//! range, no cycles); both kernels walk it per (row, target), the GPU with the arrays
//! baked into the shader as constants.
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::{DType, Tensor};

/// An interior node.
#[derive(Clone, Debug)]
struct Branch {
    mode: u32,
    feature: usize,
    split: f64,
    /// The node's membership values (mode 6).
    members: Vec<f64>,
    nan_true: bool,
    /// Children: (index, is_leaf).
    yes: (usize, bool),
    no: (usize, bool),
}

#[derive(Debug)]
pub struct TreeEnsemble {
    nodes: Vec<Branch>,
    leaves: Vec<(usize, f64)>,
    /// Each tree's start: (index, is_leaf).
    roots: Vec<(usize, bool)>,
    targets: usize,
    aggregate: u32,
    /// Longest root-to-leaf path (interior nodes).
    depth: usize,
}

impl Branch {
    fn goes_true(&self, x: f64) -> bool {
        if x.is_nan() {
            return self.nan_true;
        }
        match self.mode {
            0 => x <= self.split,
            1 => x < self.split,
            2 => x >= self.split,
            3 => x > self.split,
            4 => x == self.split,
            5 => x != self.split,
            _ => self.members.contains(&x),
        }
    }
}

impl TreeEnsemble {
    fn leaf_of(&self, row: &[f64], root: (usize, bool)) -> (usize, f64) {
        let mut at = root;
        while !at.1 {
            let b = &self.nodes[at.0];
            at = if b.goes_true(row[b.feature]) { b.yes } else { b.no };
        }
        self.leaves[at.0]
    }

    fn features(&self) -> usize {
        self.nodes.iter().map(|b| b.feature + 1).max().unwrap_or(0)
    }

    fn initial(&self, dtype: DType) -> f64 {
        let big = if dtype == DType::F64 { f64::MAX } else if dtype == DType::F16 { 65504.0 } else { f32::MAX as f64 };
        match self.aggregate {
            2 => big,
            3 => -big,
            _ => 0.0,
        }
    }
}

impl Op for TreeEnsemble {
    fn name(&self) -> &str {
        "TreeEnsemble"
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let dtype = expect_dtype(inputs, 0, &[DType::F32, DType::F64, DType::F16])?;
        match *required(inputs, 0)?.dims() {
            [n, f] if f >= self.features() => Ok(vec![TensorType::new(dtype, vec![n, self.targets])]),
            ref d => Err(OpError::input(0, format!("expected [N, F] with F >= {} (the features the trees test), found {d:?}", self.features()))),
        }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for TreeEnsemble {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let (n, f) = match *x.dims() {
            [n, f] => (n, f),
            _ => return Err(OpError::input(0, "expected [N, F]")),
        };
        let v = x.to_f64_vec();
        let mut y = vec![self.initial(x.dtype()); n * self.targets];
        let trees = self.roots.len() as f64;
        for r in 0..n {
            let out = &mut y[r * self.targets..(r + 1) * self.targets];
            for &root in &self.roots {
                let (t, w) = self.leaf_of(&v[r * f..(r + 1) * f], root);
                out[t] = match self.aggregate {
                    0 => out[t] + w / trees,
                    2 => out[t].min(w),
                    3 => out[t].max(w),
                    _ => out[t] + w,
                };
            }
        }
        outputs[0] = Tensor::from_f64(x.dtype(), &[n, self.targets], &y)?;
        Ok(())
    }
}

impl WgslKernel for TreeEnsemble {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let x = required(inputs, 0)?;
        let f = x.dims().get(1).copied().unwrap_or(0);
        let members: usize = self.nodes.iter().map(|b| b.members.len()).sum();
        let work = self.roots.len() * (self.depth + 1) * (members + 2);
        if work > wgsl::MAX_LOOP_ITERATIONS {
            return Err(OpError::Unsupported(format!("TreeEnsemble: {work} loop iterations per output exceed one GPU invocation's budget")));
        }
        let lit = const_f32;
        let list = |ty: &str, v: Vec<String>| {
            let v = if v.is_empty() { vec![if ty == "f32" { "0.0".to_string() } else { format!("{ty}(0)") }] } else { v };
            format!("array<{ty}, {}>({})", v.len(), v.join(", "))
        };
        let code = |c: (usize, bool)| (c.0 * 2 + c.1 as usize).to_string() + "u";
        let mut member_values = vec![];
        let mut member_ranges = vec![];
        for b in &self.nodes {
            member_ranges.push(format!("vec2<u32>({}u, {}u)", member_values.len(), member_values.len() + b.members.len()));
            member_values.extend(b.members.iter().map(|&m| lit(m)));
        }
        let helpers = format!(
            "var<private> MODE = {};\nvar<private> FEAT = {};\nvar<private> SPLIT = {};\nvar<private> NANT = {};\nvar<private> YES = {};\nvar<private> NO = {};\nvar<private> MR = {};\nvar<private> MV = {};\n\
             var<private> LT = {};\nvar<private> LW = {};\nvar<private> ROOTS = {};\n",
            list("u32", self.nodes.iter().map(|b| format!("{}u", b.mode)).collect()),
            list("u32", self.nodes.iter().map(|b| format!("{}u", b.feature)).collect()),
            list("f32", self.nodes.iter().map(|b| lit(b.split)).collect()),
            list("u32", self.nodes.iter().map(|b| format!("{}u", b.nan_true as u32)).collect()),
            list("u32", self.nodes.iter().map(|b| code(b.yes)).collect()),
            list("u32", self.nodes.iter().map(|b| code(b.no)).collect()),
            list("vec2<u32>", member_ranges),
            list("f32", member_values),
            list("u32", self.leaves.iter().map(|l| format!("{}u", l.0)).collect()),
            list("f32", self.leaves.iter().map(|l| lit(l.1)).collect()),
            list("u32", self.roots.iter().map(|&r| code(r)).collect()),
        );
        let combine = match self.aggregate {
            0 => format!("acc = acc + LW[leaf] / {};", lit(self.roots.len() as f64)),
            2 => "acc = min(acc, LW[leaf]);".into(),
            3 => "acc = max(acc, LW[leaf]);".into(),
            _ => "acc = acc + LW[leaf];".into(),
        };
        let body = format!(
            "let goal = i % {targets}u;\n    let row = (i / {targets}u) * {f}u;\n    var acc = {init};\n    \
             for (var t = 0u; t < {trees}u; t = t + 1u) {{\n        var at = ROOTS[t];\n        \
             for (var step = 0u; step <= {depth}u && (at & 1u) == 0u; step = step + 1u) {{\n            let k = at >> 1u;\n            \
             let v = x[row + FEAT[k]];\n            var yes = false;\n            let m = MODE[k];\n            \
             if ((bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u) {{ yes = NANT[k] == 1u; }}\n            else if (m == 0u) {{ yes = v <= SPLIT[k]; }}\n            \
             else if (m == 1u) {{ yes = v < SPLIT[k]; }}\n            else if (m == 2u) {{ yes = v >= SPLIT[k]; }}\n            \
             else if (m == 3u) {{ yes = v > SPLIT[k]; }}\n            else if (m == 4u) {{ yes = v == SPLIT[k]; }}\n            \
             else if (m == 5u) {{ yes = v != SPLIT[k]; }}\n            \
             else {{ for (var j = MR[k].x; j < MR[k].y; j = j + 1u) {{ if (MV[j] == v) {{ yes = true; }} }} }}\n            \
             at = select(NO[k], YES[k], yes);\n        }}\n        let leaf = at >> 1u;\n        \
             if (LT[leaf] == goal) {{ {combine} }}\n    }}\n    y[i] = acc;",
            targets = self.targets,
            init = lit(self.initial(outputs[0].dtype).clamp(f32::MIN as f64, f32::MAX as f64)),
            trees = self.roots.len(),
            depth = self.depth,
        );
        Ok(WgslProgram::single(wgsl::simple_kernel(
            "TreeEnsemble",
            outputs[0].len(),
            tune.get(&wgsl::workgroup_param()),
            &[("x", "f32", true), ("y", "f32", false)],
            vec![Binding::Input(0), Binding::Output(0)],
            &helpers,
            &body,
        )))
    }
}

/// A WGSL f32 literal usable in a constant initializer (no `bitcast`): the shortest
/// decimal that reads back as the same f32; infinities become the largest finite
/// values and NaN 0 (only membership nodes hold NaN splits, and never read them).
fn const_f32(v: f64) -> String {
    let f = v as f32;
    let f = if f.is_nan() { 0.0 } else { f.clamp(f32::MIN, f32::MAX) };
    format!("{f:?}f")
}

/// A list of ints given as ints or as an integer tensor (`nodes_modes` is a uint8
/// tensor); empty when absent.
fn int_list(spec: &NodeSpec, name: &str) -> Result<Vec<i64>> {
    match spec.tensor_opt(name) {
        Ok(Some(t)) => Ok(t.to_i64_vec()?),
        _ => spec.ints(name, &[]),
    }
}

/// Reads a list attribute of ints as indices below `bound`.
fn indices(spec: &NodeSpec, name: &str, bound: usize) -> Result<Vec<usize>> {
    int_list(spec, name)?
        .into_iter()
        .map(|v| usize::try_from(v).ok().filter(|&i| i < bound).ok_or_else(|| spec.bad(name, format!("index {v} is outside [0, {bound})"))))
        .collect()
}

fn floats(spec: &NodeSpec, name: &str) -> Result<Option<Vec<f64>>> {
    Ok(match spec.tensor_opt(name)? {
        Some(t) => Some(t.to_f64_vec()),
        None => spec.floats_opt(name)?.map(|v| v.into_iter().map(|x| x as f64).collect()),
    })
}

fn parse(spec: &NodeSpec) -> Result<TreeEnsemble> {
    if spec.int("post_transform", 0)? != 0 {
        return Err(OpError::Unsupported("TreeEnsemble with a post_transform other than NONE (0)".into()));
    }
    let aggregate = spec.int("aggregate_function", 1)?;
    if !(0..=3).contains(&aggregate) {
        return Err(spec.bad("aggregate_function", format!("expected 0 to 3, found {aggregate}")));
    }
    let targets = spec.int_opt("n_targets")?.ok_or_else(|| spec.bad("n_targets", "the attribute is required"))?;
    let targets = usize::try_from(targets).ok().filter(|&t| (1..=1 << 20).contains(&t)).ok_or_else(|| spec.bad("n_targets", format!("expected 1 to 2^20, found {targets}")))?;
    let weights = floats(spec, "leaf_weights")?.ok_or_else(|| spec.bad("leaf_weights", "the attribute is required"))?;
    let leaf_targets = indices(spec, "leaf_targetids", targets)?;
    if leaf_targets.len() != weights.len() {
        return Err(spec.bad("leaf_targetids", format!("{} target ids for {} leaf weights", leaf_targets.len(), weights.len())));
    }
    let leaves: Vec<(usize, f64)> = leaf_targets.into_iter().zip(weights).collect();
    let modes = int_list(spec, "nodes_modes")?;
    let n = modes.len();
    let splits = floats(spec, "nodes_splits")?.unwrap_or_default();
    let features = indices(spec, "nodes_featureids", 1 << 24)?;
    let (true_leaf, false_leaf) = (int_list(spec, "nodes_trueleafs")?, int_list(spec, "nodes_falseleafs")?);
    let (true_ids, false_ids) = (int_list(spec, "nodes_truenodeids")?, int_list(spec, "nodes_falsenodeids")?);
    let nan_true = match int_list(spec, "nodes_missing_value_tracks_true")? {
        v if v.is_empty() => vec![0; n],
        v => v,
    };
    for (name, len) in [("nodes_splits", splits.len()), ("nodes_featureids", features.len()), ("nodes_trueleafs", true_leaf.len()), ("nodes_falseleafs", false_leaf.len()), ("nodes_truenodeids", true_ids.len()), ("nodes_falsenodeids", false_ids.len()), ("nodes_missing_value_tracks_true", nan_true.len())] {
        if len != n {
            return Err(spec.bad(name, format!("{len} values for {n} nodes")));
        }
    }
    let child = |name: &str, id: i64, leaf: i64| -> Result<(usize, bool)> {
        let leaf = leaf != 0;
        let bound = if leaf { leaves.len() } else { n };
        usize::try_from(id).ok().filter(|&i| i < bound).map(|i| (i, leaf)).ok_or_else(|| spec.bad(name, format!("{} {id} is outside [0, {bound})", if leaf { "leaf" } else { "node" })))
    };
    let mut members = floats(spec, "membership_values")?.unwrap_or_default().into_iter();
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let mode = u32::try_from(modes[i]).ok().filter(|&m| m <= 6).ok_or_else(|| spec.bad("nodes_modes", format!("mode {} is not 0 to 6", modes[i])))?;
        let set = if mode == 6 { members.by_ref().take_while(|v| !v.is_nan()).collect() } else { vec![] };
        nodes.push(Branch {
            mode,
            feature: features[i],
            split: splits[i],
            members: set,
            nan_true: nan_true[i] != 0,
            yes: child("nodes_truenodeids", true_ids[i], true_leaf[i])?,
            no: child("nodes_falsenodeids", false_ids[i], false_leaf[i])?,
        });
    }
    let roots: Vec<(usize, bool)> = indices(spec, "tree_roots", n.max(leaves.len()))?
        .into_iter()
        .map(|r| {
            let leaf = r < n && nodes[r].yes.1 && nodes[r].no.1 && true_ids[r] == false_ids[r];
            if leaf && r >= leaves.len() {
                return Err(spec.bad("tree_roots", format!("leaf root {r} is outside the {} leaves", leaves.len())));
            }
            if !leaf && r >= n {
                return Err(spec.bad("tree_roots", format!("root {r} is outside the {n} nodes")));
            }
            Ok((r, leaf))
        })
        .collect::<Result<_>>()?;
    // Depth of every node, refusing cycles (a node met again on its own path).
    fn depth(nodes: &[Branch], at: (usize, bool), path: &mut Vec<bool>) -> Option<usize> {
        if at.1 {
            return Some(0);
        }
        if path[at.0] {
            return None;
        }
        path[at.0] = true;
        let d = depth(nodes, nodes[at.0].yes, path)?.max(depth(nodes, nodes[at.0].no, path)?) + 1;
        path[at.0] = false;
        Some(d)
    }
    let mut path = vec![false; n];
    let mut max_depth = 0;
    for &r in &roots {
        if n > 4096 {
            return Err(OpError::Unsupported(format!("TreeEnsemble of {n} nodes (at most 4096)")));
        }
        max_depth = max_depth.max(depth(&nodes, r, &mut path).ok_or_else(|| spec.bad("nodes_truenodeids", "the nodes form a cycle"))?);
    }
    Ok(TreeEnsemble { nodes, leaves, roots, targets, aggregate: aggregate as u32, depth: max_depth })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("ai.onnx.ml", "TreeEnsemble", |spec| Ok(Box::new(parse(spec)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    fn ensemble(modes: &[i64], splits: &[f32], weights: &[f32], targets: &[i64], n_targets: i64) -> Case {
        Case::new("TreeEnsemble").domain("ai.onnx.ml").opset(5).attrs(&[
            ("aggregate_function", Attr::Int(1)),
            ("leaf_targetids", ints(targets)),
            ("leaf_weights", Attr::Tensor(f32s(&[weights.len()], weights))),
            ("n_targets", Attr::Int(n_targets)),
            ("nodes_falseleafs", ints(&[0, 1, 1])),
            ("nodes_falsenodeids", ints(&[2, 2, 3])),
            ("nodes_featureids", ints(&[0, 0, 0])),
            ("nodes_modes", ints(modes)),
            ("nodes_splits", Attr::Tensor(f32s(&[3], splits))),
            ("nodes_trueleafs", ints(&[0, 1, 1])),
            ("nodes_truenodeids", ints(&[1, 0, 1])),
            ("post_transform", Attr::Int(0)),
            ("tree_roots", ints(&[0])),
        ])
    }

    #[test]
    fn single_tree_and_set_membership_match_onnx() {
        // onnx's test_ai_onnx_ml_tree_ensemble_single_tree and _set_membership (their
        // expected outputs from onnx.reference).
        let x = Tensor::from_slice(&[3, 2], &[1.2f64, 3.4, -0.12, 1.66, 4.14, 1.77]).unwrap();
        let got = ensemble(&[0, 0, 0], &[3.14, 1.2, 4.2], &[5.23, 12.12, -12.23, 7.21], &[0, 1, 0, 1], 2).input(x).run_cpu().unwrap();
        assert_close(&got[0], &[5.23, 0.0, 5.23, 0.0, 0.0, 12.12], 1e-6, "single tree");
        let members = f32s(&[8], &[1.2, 3.7, 8.0, 9.0, f32::NAN, 12.0, 7.0, f32::NAN]);
        let x = f32s(&[6, 1], &[1.2, 3.4, -0.12, f32::NAN, 12.0, 7.0]);
        let case = ensemble(&[0, 6, 6], &[11.0, 232344.0, f32::NAN], &[1.0, 10.0, 1000.0, 100.0], &[0, 1, 2, 3], 4).attr("membership_values", Attr::Tensor(members)).attr("nodes_falseleafs", ints(&[1, 0, 1])).input(x);
        let want = [1., 0., 0., 0., 0., 0., 0., 100., 0., 0., 0., 100., 0., 0., 1000., 0., 0., 0., 1000., 0., 0., 10., 0., 0.];
        assert_close(&case.run_cpu().unwrap()[0], &want, 0.0, "set membership");
        // A child index past the nodes is refused when the op is made.
        let bad = ensemble(&[0, 0, 0], &[1.0, 2.0, 3.0], &[1.0; 4], &[0, 1, 0, 1], 2).attr("nodes_truenodeids", ints(&[1, 0, 9])).input(f32s(&[1, 1], &[0.0]));
        assert!(bad.run_cpu().is_err());
    }
}
