//! Errors of the ONNX frontend. Each says which file, tensor or node is at fault; the
//! op-support errors list every problem of the model at once.

use kiln_graph::GraphError;
use std::fmt;
use std::path::PathBuf;
use thiserror::Error;

/// Why a model (or a tensor file) could not be imported.
#[derive(Debug, Error)]
pub enum ImportError {
    #[error("cannot access '{}': {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("'{source_name}' is not a valid ONNX {what}: {error}")]
    Decode { source_name: String, what: &'static str, error: prost::DecodeError },
    #[error("'{0}' holds no graph (ModelProto.graph is missing)")]
    NoGraph(String),
    #[error("tensor '{name}': {what}")]
    Tensor { name: String, what: String },
    #[error("tensor '{name}': external data: {what}")]
    ExternalData { name: String, what: String },
    #[error("invalid model: {0}")]
    Invalid(String),
    #[error("'{source_name}': ONNX IR version {version} is not one this Kiln knows (1 to {max}, from onnx {onnx})")]
    IrVersion { source_name: String, version: i64, max: i64, onnx: &'static str },
    #[error("'{source_name}': {what}")]
    Opset { source_name: String, what: String },
    /// A tensor or graph input of an element type Kiln does not represent (string,
    /// complex, float8, int4, ...).
    #[error("unsupported data type: {0}")]
    UnsupportedDtype(String),
    #[error("invalid graph: {0}")]
    Graph(#[from] GraphError),
    #[error("{}", UnsupportedTable(.0))]
    UnsupportedOps(Vec<UnsupportedOp>),
    #[error("{}", ProblemList(.0))]
    InvalidNodes(Vec<NodeProblem>),
}

/// The nodes of one (domain, op type, opset) that no registered operator implements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedOp {
    /// "" for the default domain (ai.onnx).
    pub domain: String,
    pub op_type: String,
    /// The model's opset for `domain`, if it imports one.
    pub opset: Option<i64>,
    /// How many nodes use it.
    pub count: usize,
    /// Names of the first few of those nodes.
    pub nodes: Vec<String>,
}

/// How many node names an [`UnsupportedOp`] keeps.
pub const EXAMPLE_NODES: usize = 3;

/// A node Kiln cannot build: a bad or unrepresentable attribute, or an op factory error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeProblem {
    pub node: String,
    pub op_type: String,
    pub domain: String,
    pub problem: String,
}

fn domain_label(d: &str) -> &str {
    if d.is_empty() {
        "ai.onnx"
    } else {
        d
    }
}

struct UnsupportedTable<'a>(&'a [UnsupportedOp]);

impl fmt::Display for UnsupportedTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ops = self.0;
        let total: usize = ops.iter().map(|o| o.count).sum();
        writeln!(
            f,
            "the model uses {} operator{} that Kiln does not support ({} node{}):",
            ops.len(),
            if ops.len() == 1 { "" } else { "s" },
            total,
            if total == 1 { "" } else { "s" }
        )?;
        let rows: Vec<[String; 5]> = ops
            .iter()
            .map(|o| {
                let mut names = o.nodes.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ");
                if o.count > o.nodes.len() {
                    names.push_str(", ...");
                }
                [
                    domain_label(&o.domain).to_string(),
                    o.op_type.clone(),
                    o.opset.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                    o.count.to_string(),
                    names,
                ]
            })
            .collect();
        let header = ["domain", "op", "opset", "nodes", "e.g."];
        let mut widths = header.map(str::len);
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, cells: [&str; 5]| {
            write!(f, "  ")?;
            for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
                if i + 1 == cells.len() {
                    write!(f, "{c}")?;
                } else if i == 2 || i == 3 {
                    write!(f, "{c:>w$}  ")?;
                } else {
                    write!(f, "{c:<w$}  ")?;
                }
            }
            Ok(())
        };
        line(f, header)?;
        for r in &rows {
            writeln!(f)?;
            line(f, [&r[0], &r[1], &r[2], &r[3], &r[4]])?;
        }
        if ops.iter().any(|o| !matches!(o.domain.as_str(), "" | "ai.onnx" | "ai.onnx.ml" | "ai.onnx.preview.training" | "com.microsoft")) {
            write!(f, "\n(ops of other domains are custom ops: give their manifest with --custom-op, or register them in the Registry; see docs/custom-ops.md)")?;
        }
        Ok(())
    }
}

struct ProblemList<'a>(&'a [NodeProblem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "{n} node{} cannot be built:", if n == 1 { "" } else { "s" })?;
        for p in self.0 {
            write!(f, "\n  node '{}' ({}", p.node, p.op_type)?;
            if !p.domain.is_empty() {
                write!(f, ", domain {}", p.domain)?;
            }
            write!(f, "): {}", p.problem)?;
        }
        Ok(())
    }
}
