//! Chains: `k` applications of a body as one graph, the values one application carries
//! into the next wired through, so that a [`super::BodyRunner`] runs `k` iterations of
//! a loop whose trip count is known as one piece of work (on a GPU: one submit instead
//! of `k`, with the carried values staying on the device between iterations).
use kiln_graph::{Attr, DType, Graph, Node, Tensor, ValueId, ValueType};
use std::collections::HashMap;

/// How body input `j` of every application is fed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Feed {
    /// Loop-carried value `c`: the chain's input for the first application, then body
    /// output `carried_out[c]` of the previous one.
    Carried(usize),
    /// A chain input of its own per application (a Scan's slice).
    PerApplication,
    /// One chain input that every application reads (an outer value).
    Shared,
    /// Loop's iteration number: the chain's input `i0` plus the application's index.
    Iteration,
    /// Loop's condition: always true inside a chain.
    True,
}

/// The chain of `k` applications of `body`. Chain inputs, in order: `i0` (when a feed
/// is [`Feed::Iteration`]), the carried values' initial values, for each application
/// its [`Feed::PerApplication`] inputs, then the shared ones. Chain outputs: the last
/// application's carried values (body outputs `carried_out`), then for each
/// application its body outputs `emitted`. `None` when the body has nested subgraphs
/// (they name the body's values, which the chain renames).
pub(crate) fn chain(body: &Graph, k: usize, feeds: &[Feed], carried_out: &[usize], emitted: &[usize]) -> Option<Graph> {
    if body.nodes.iter().any(|n| n.attrs.values().any(|a| matches!(a, Attr::Graph(_)))) || feeds.len() != body.inputs.len() {
        return None;
    }
    let mut g = Graph::new(format!("{} x{k}", body.name));
    g.opsets = body.opsets.clone();
    let ty = |v: ValueId| body.values[v].ty.clone();
    let input = |g: &mut Graph, name: String, t: Option<ValueType>| {
        let v = g.add_value(name, t);
        g.inputs.push(v);
        v
    };
    let i0 = feeds.contains(&Feed::Iteration).then(|| input(&mut g, "i0".into(), Some(ValueType::new(DType::I64, kiln_graph::Shape::default()))));
    let mut carried: Vec<ValueId> = vec![];
    for (j, f) in feeds.iter().enumerate() {
        if let Feed::Carried(c) = f {
            carried.resize(carried.len().max(c + 1), usize::MAX);
            carried[*c] = input(&mut g, body.values[body.inputs[j]].name.clone(), ty(body.inputs[j]));
        }
    }
    let mut per_application: Vec<Vec<ValueId>> = vec![];
    for a in 0..k {
        let ins = feeds.iter().enumerate().filter(|(_, f)| **f == Feed::PerApplication).map(|(j, _)| input(&mut g, format!("{}#{a}", body.values[body.inputs[j]].name), ty(body.inputs[j]))).collect();
        per_application.push(ins);
    }
    let shared: HashMap<usize, ValueId> =
        feeds.iter().enumerate().filter(|(_, f)| **f == Feed::Shared).map(|(j, _)| (j, input(&mut g, body.values[body.inputs[j]].name.clone(), ty(body.inputs[j])))).collect();
    // The body's constants, once.
    let mut constants: HashMap<ValueId, ValueId> = HashMap::new();
    for (&v, t) in &body.initializers {
        let c = g.add_value(format!("{}#const", body.values[v].name), ty(v));
        g.initializers.insert(c, t.clone());
        constants.insert(v, c);
    }
    let truth = g.add_value("cond#true", Some(ValueType::new(DType::Bool, kiln_graph::Shape::default())));
    g.initializers.insert(truth, Tensor::from_bools(&[], &[true]).ok()?);
    let mut outputs_per_application: Vec<Vec<ValueId>> = vec![];
    for a in 0..k {
        let mut map: HashMap<ValueId, ValueId> = constants.clone();
        let mut next_per = per_application[a].iter();
        for (j, f) in feeds.iter().enumerate() {
            let v = match f {
                Feed::Carried(c) => carried[*c],
                Feed::PerApplication => *next_per.next()?,
                Feed::Shared => shared[&j],
                Feed::True => truth,
                Feed::Iteration => match (a, i0) {
                    (0, Some(i0)) => i0,
                    (_, Some(i0)) => {
                        let step = g.add_value(format!("i#{a}#step"), None);
                        g.initializers.insert(step, Tensor::scalar(a as i64));
                        let i = g.add_value(format!("i#{a}"), None);
                        g.nodes.push(Node { name: format!("i#{a}"), op_type: "Add".into(), domain: String::new(), attrs: Default::default(), inputs: vec![Some(i0), Some(step)], outputs: vec![i] });
                        i
                    }
                    (_, None) => return None,
                },
            };
            map.insert(body.inputs[j], v);
        }
        for n in &body.nodes {
            let inputs = n.inputs.iter().map(|i| match i { None => Some(None), Some(v) => map.get(v).map(|&x| Some(x)) }).collect::<Option<Vec<_>>>()?;
            let outputs: Vec<ValueId> = n.outputs.iter().map(|&o| g.add_value(format!("{}#{a}", body.values[o].name), ty(o))).collect();
            for (&o, &v) in n.outputs.iter().zip(&outputs) {
                map.insert(o, v);
            }
            g.nodes.push(Node { name: format!("{}#{a}", n.name), inputs, outputs, ..n.clone() });
        }
        let outs = body.outputs.iter().map(|o| map.get(o).copied()).collect::<Option<Vec<_>>>()?;
        for (c, &o) in carried_out.iter().enumerate() {
            carried[c] = outs[o];
        }
        outputs_per_application.push(emitted.iter().map(|&o| outs[o]).collect());
    }
    // Outputs, each a value of its own that no input or constant is.
    let mut wanted: Vec<ValueId> = carried;
    wanted.extend(outputs_per_application.into_iter().flatten());
    for v in wanted {
        let reused = g.outputs.contains(&v) || g.inputs.contains(&v) || g.initializers.contains_key(&v);
        let out = if reused {
            let o = g.add_value(format!("{}#out{}", g.values[v].name, g.outputs.len()), g.values[v].ty.clone());
            g.nodes.push(Node { name: format!("out#{}", g.outputs.len()), op_type: "Identity".into(), domain: String::new(), attrs: Default::default(), inputs: vec![Some(v)], outputs: vec![o] });
            o
        } else {
            v
        };
        g.outputs.push(out);
    }
    g.validate().ok()?;
    Some(g)
}
