//! `kiln inspect`: what the compiler made of a model: a per-node table (op, fused group,
//! device, output shape, FLOPs, bytes), what each pass changed, the memory plan, and a
//! Graphviz drawing of the optimised graph.
use crate::io;
use anyhow::{Context, Result};
use kiln::graph::Graph;
use kiln::runtime::{DeviceChoice, Session, SessionOptions};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The model (.onnx or .kiln).
    model: PathBuf,
    /// The device the table and memory plan are for (cpu, gpu, auto, gpu:N, ...).
    #[arg(long, default_value = "cpu")]
    device: DeviceChoice,
    /// Show what each graph pass changed (an .onnx model only).
    #[arg(long)]
    passes: bool,
    /// Write a Graphviz DOT drawing of the optimised graph to FILE.
    #[arg(long)]
    dot: Option<PathBuf>,
    /// Size of a symbolic dim for the FLOPs/bytes columns, NAME=VALUE (default 1).
    #[arg(long = "dim")]
    dims: Vec<String>,
    /// CPU worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// A custom op's manifest, for models that use it (repeatable).
    #[arg(long = "custom-op", value_name = "MANIFEST")]
    custom_ops: Vec<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The nodes of `g` as `op name` lines (for pass diffs).
fn node_lines(g: &Graph) -> BTreeSet<String> {
    g.nodes.iter().map(|n| format!("{} {}", n.op_type, n.name)).collect()
}

/// What a node stands for besides itself: fused nodes, epilogues.
fn group(n: &kiln::graph::Node) -> String {
    let mut parts = vec![];
    if let Some(kiln::graph::Attr::Strings(f)) = n.attrs.get("kiln_fused_nodes") {
        parts.push(format!("{} fused", f.len()));
    }
    if n.attrs.contains_key("kiln_bias") {
        parts.push("+bias".into());
    }
    if n.attrs.contains_key("kiln_residual") {
        parts.push("+residual".into());
    }
    if let Some(kiln::graph::Attr::String(a)) = n.attrs.get("kiln_activation") {
        parts.push(format!("+{a}"));
    }
    parts.join(" ")
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1}G", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1}M", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1}K", n as f64 / 1024.0),
        n => n.to_string(),
    }
}

pub fn main(args: Args) -> Result<()> {
    let is_onnx = args.model.extension().and_then(|e| e.to_str()) != Some("kiln");
    let mut pass_report: Vec<(String, usize, Vec<String>, Vec<String>)> = vec![];
    let (graph, registry) = if is_onnx && args.passes {
        let custom = io::custom_ops(&args.custom_ops)?;
        let source = kiln::load::Source::File(&args.model);
        let kiln::load::Loaded { graph: mut g, registry, .. } = kiln::load::load(source, kiln::compiler::passes::Target::Any, false, &custom).with_context(|| format!("cannot import {}", args.model.display()))?;
        let ops = registry.as_ref().unwrap_or_else(|| kiln::ops::Registry::builtin());
        let env = |name: &str| std::env::var(name).unwrap_or_default();
        let passes = kiln::compiler::passes::selected_passes(
            &env(kiln::compiler::passes::SKIP_PASSES_ENV),
            &env(kiln::compiler::passes::ENABLE_PASSES_ENV),
            io::pass_target(&args.device)?,
        );
        let mut cx = kiln::compiler::passes::PassContext::new(ops);
        for p in passes {
            let before = node_lines(&g);
            let changes = (p.run)(&mut g, &mut cx);
            let after = node_lines(&g);
            let removed = before.difference(&after).cloned().collect();
            let added = after.difference(&before).cloned().collect();
            pass_report.push((p.name.to_string(), changes, removed, added));
        }
        (g, registry)
    } else {
        let loaded = io::load_model(&args.model, false, io::pass_target(&args.device)?, &args.custom_ops)?;
        (loaded.graph, loaded.registry)
    };
    let types = kiln::ops::infer::value_types(&graph, registry.as_ref().unwrap_or_else(|| kiln::ops::Registry::builtin()));
    let session = Session::new(graph.clone(), SessionOptions { threads: args.threads, registry, ..SessionOptions::device(args.device.clone()) })
        .with_context(|| format!("cannot prepare {} for device '{}'", args.model.display(), args.device))?;
    let inputs = io::complete_inputs(&session, vec![], &io::parse_dims(&args.dims)?, io::memory_limit(None), 0)?;
    let refs: Vec<(&str, &kiln::graph::Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let report = session.report(&refs)?;
    let (_, stats) = session.run_with_stats(&refs)?;
    let device = session.device_name();
    let order = graph.validate()?;
    let devices: Vec<String> = report.iter().map(|r| r.device.clone().unwrap_or_else(|| "host (folded)".to_string())).collect();
    let rows: Vec<(String, String, String, String, u64, u64)> = order
        .iter()
        .zip(&report)
        .map(|(&n, r)| {
            let node = &graph.nodes[n];
            let shape = node.outputs.first().and_then(|&o| types[o].as_ref()).map(|t| t.to_string()).unwrap_or_else(|| "?".into());
            (node.name.clone(), node.op_type.clone(), group(node), shape, r.cost.flops, r.cost.bytes)
        })
        .collect();
    // The model's signature: input and output names with their (symbolic) types.
    let signature = |values: Vec<(String, String)>| values.into_iter().map(|(name, ty)| serde_json::json!({"name": name, "type": ty})).collect::<Vec<_>>();
    let input_sig: Vec<(String, String)> = session.inputs().into_iter().map(|(n, ty)| (n, ty.to_string())).collect();
    let output_sig: Vec<(String, String)> = graph.outputs.iter().map(|&o| (graph.values[o].name.clone(), types[o].as_ref().map_or_else(|| "?".to_string(), |t| t.to_string()))).collect();
    if let Some(path) = &args.dot {
        std::fs::write(path, dot(&graph, &device)).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        let nodes: Vec<serde_json::Value> = rows
            .iter()
            .zip(&devices)
            .map(|((name, op, group, shape, flops, bytes), dev)| serde_json::json!({"node": name, "op": op, "fused": group, "device": dev, "shape": shape, "flops": flops, "bytes": bytes}))
            .collect();
        let passes: Vec<serde_json::Value> = pass_report.iter().map(|(n, c, r, a)| serde_json::json!({"pass": n, "changes": c, "removed": r, "added": a})).collect();
        let memory = stats.memory.map(|m| serde_json::json!({"planned_bytes": m.planned, "lower_bound_bytes": m.lower_bound, "unshared_bytes": m.unshared, "in_place_steps": m.in_place}));
        println!("{}", serde_json::json!({"model": args.model, "device": device, "inputs": signature(input_sig), "outputs": signature(output_sig),
            "nodes": nodes, "passes": passes, "kernels_per_run": stats.kernels, "memory": memory}));
        return Ok(());
    }
    for (title, sig) in [("inputs", &input_sig), ("outputs", &output_sig)] {
        println!("{title}:");
        for (name, ty) in sig {
            println!("  {name}: {ty}");
        }
    }
    if !pass_report.is_empty() {
        println!("passes:");
        for (name, changes, removed, added) in &pass_report {
            println!("  {name}: {changes} change(s), {} node(s) removed, {} added", removed.len(), added.len());
            for r in removed.iter().take(8) {
                println!("    - {r}");
            }
            for a in added.iter().take(8) {
                println!("    + {a}");
            }
            if removed.len() > 8 || added.len() > 8 {
                println!("    ...");
            }
        }
    }
    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(4).clamp(4, 48);
    println!("{:w$}  {:18} {:14} {:24} {:>9} {:>9}  device", "node", "op", "fused", "shape", "flops", "bytes");
    for ((name, op, group, shape, flops, bytes), dev) in rows.iter().zip(&devices) {
        let name: String = if name.len() > w { format!("..{}", &name[name.len() - (w - 2)..]) } else { name.clone() };
        println!("{name:w$}  {op:18} {group:14} {shape:24} {:>9} {:>9}  {dev}", human(*flops), human(*bytes));
    }
    let total_flops: u64 = rows.iter().map(|r| r.4).sum();
    println!("{} nodes, {} kernels per run on {device}, {} FLOPs per run", rows.len(), stats.kernels, human(total_flops));
    if let Some(m) = stats.memory {
        println!(
            "memory plan: {} bytes of intermediates, {:.2}x the lower bound ({} bytes); {} bytes unshared; {} steps in place",
            m.planned,
            m.planned as f64 / m.lower_bound.max(1) as f64,
            m.lower_bound,
            m.unshared,
            m.in_place
        );
    }
    if let Some(path) = &args.dot {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Graphviz DOT of the graph: one box per node, edges for values, the device as a cluster.
fn dot(g: &Graph, device: &str) -> String {
    let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let mut out = String::from("digraph kiln {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
    let _ = writeln!(out, "  subgraph cluster_device {{\n    label=\"{}\";\n    style=rounded;", esc(device));
    for (i, n) in g.nodes.iter().enumerate() {
        let extra = group(n);
        let color = if n.domain == "kiln" || !extra.is_empty() { ", style=filled, fillcolor=\"#ffe8c0\"" } else { "" };
        let _ = writeln!(out, "    n{i} [label=\"{}\\n{}{}\"{color}];", esc(&n.op_type), esc(&n.name), if extra.is_empty() { String::new() } else { format!("\\n{}", esc(&extra)) });
    }
    out += "  }\n";
    for (k, &v) in g.inputs.iter().enumerate() {
        let _ = writeln!(out, "  in{k} [label=\"{}\", shape=ellipse];", esc(&g.values[v].name));
    }
    for (k, &v) in g.outputs.iter().enumerate() {
        let _ = writeln!(out, "  out{k} [label=\"{}\", shape=ellipse];", esc(&g.values[v].name));
    }
    let producer = |v: usize| g.nodes.iter().position(|n| n.outputs.contains(&v));
    for (i, n) in g.nodes.iter().enumerate() {
        for v in n.inputs.iter().flatten() {
            if let Some(p) = producer(*v) {
                let _ = writeln!(out, "  n{p} -> n{i};");
            } else if let Some(k) = g.inputs.iter().position(|x| x == v) {
                let _ = writeln!(out, "  in{k} -> n{i};");
            }
        }
    }
    for (k, &v) in g.outputs.iter().enumerate() {
        if let Some(p) = producer(v) {
            let _ = writeln!(out, "  n{p} -> out{k};");
        }
    }
    out += "}\n";
    out
}
