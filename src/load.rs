//! Opening a model the way every front end does (the CLI, the C API, the Python
//! package): a `.kiln` artifact as compiled, with the custom ops it embeds; an ONNX model
//! imported against the built-in ops plus the given custom ops, then optimised for the
//! target unless told not to.

use kiln_compiler::onnx::{self, ImportOptions};
use kiln_compiler::passes::{self, PassChoices, PassContext, PassReport, Target};
use kiln_graph::Graph;
use kiln_ops::custom::CustomOp;
use kiln_ops::Registry;
use kiln_runtime::artifact::{self, ArtifactInfo};
use std::path::Path;

/// Where a model comes from.
pub enum Source<'a> {
    /// `.kiln`: an artifact; anything else: ONNX.
    File(&'a Path),
    /// An artifact's bytes (recognised by its magic) or ONNX protobuf bytes.
    Bytes(&'a [u8]),
}

/// A model ready for a session.
pub struct Loaded {
    pub graph: Graph,
    /// The artifact's info, when the model was one.
    pub info: Option<ArtifactInfo>,
    /// The ops to create the graph's nodes from when custom ops take part (embedded or
    /// given); `None`: the built-in ops.
    pub registry: Option<Registry>,
    /// What each pass changed (empty for an artifact or without passes).
    pub passes: Vec<PassReport>,
    /// An ONNX model's structure hash (of the imported graph before any pass, weights by
    /// name, dtype and dims): what graph-level tuned choices are keyed by
    /// ([`crate::graph_tuning`]). None for an artifact, whose passes already ran.
    pub model_hash: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Import(#[from] onnx::ImportError),
    #[error(transparent)]
    Artifact(#[from] kiln_runtime::RuntimeError),
}

/// The built-in ops plus `ops` (on top of `base` when given); `None` when both are empty.
pub fn registry_with(base: Option<Registry>, ops: &[CustomOp]) -> Option<Registry> {
    if ops.is_empty() {
        return base;
    }
    let mut r = base.unwrap_or_else(|| Registry::builtin().clone());
    for op in ops {
        op.register(&mut r);
    }
    Some(r)
}

/// Opens `source`; `custom` ops join the embedded ones (replacing those of the same
/// domain and type). `optimize`: run the passes for `target` over an ONNX model.
pub fn load(source: Source, target: Target, optimize: bool, custom: &[CustomOp]) -> Result<Loaded, LoadError> {
    load_with(source, target, optimize.then(PassChoices::new).as_ref(), custom)
}

/// [`load`] with the target's optional passes turned on or off by `passes` (a graph-level
/// tuned choice; None: no passes at all).
pub fn load_with(source: Source, target: Target, passes: Option<&PassChoices>, custom: &[CustomOp]) -> Result<Loaded, LoadError> {
    let artifact = match source {
        Source::File(p) => p.extension().is_some_and(|e| e == "kiln"),
        Source::Bytes(b) => b.starts_with(artifact::MAGIC),
    };
    if artifact {
        let (graph, info) = match source {
            Source::File(p) => artifact::load(p)?,
            Source::Bytes(b) => artifact::load_bytes("<memory>", b.to_vec())?,
        };
        let embedded = info.registry()?;
        for op in custom {
            if embedded.as_ref().is_some_and(|r| r.supports(op.domain(), op.op_type())) {
                log::warn!("the custom op {} replaces the {}.{} the artifact embeds", op.source().manifest_path, op.domain(), op.op_type());
            }
        }
        return Ok(Loaded { graph, registry: registry_with(embedded, custom), info: Some(info), passes: vec![], model_hash: None });
    }
    let registry = registry_with(None, custom);
    let ops = registry.as_ref().unwrap_or_else(|| Registry::builtin());
    let options = ImportOptions::with_registry(ops);
    let mut graph = match source {
        Source::File(p) => onnx::import_file_with(p, &options)?,
        Source::Bytes(b) => onnx::import_bytes_with(b, None, &options)?,
    };
    let model_hash = Some(kiln_runtime::tune::content_hash(passes::dump(&graph).as_bytes()));
    let passes = match passes {
        Some(chosen) => passes::optimize_chosen(&mut graph, target, &mut PassContext::new(ops), chosen),
        None => vec![],
    };
    Ok(Loaded { graph, info: None, registry, passes, model_hash })
}

/// An ONNX model prepared for an artifact: symbols fixed, passes run, and the info the
/// artifact records (the device is the caller's to fill in).
pub struct Compiled {
    pub graph: Graph,
    pub registry: Option<Registry>,
    pub info: ArtifactInfo,
    /// [`Loaded::model_hash`].
    pub model_hash: Option<String>,
}

/// Imports `model`, fixes the symbolic dims named in `fix` (an unknown name is an
/// error naming the model's symbols), optimises for `target` with the optional passes
/// `chosen` turns on or off (empty: the target's defaults), and records the custom ops
/// the graph uses for embedding.
pub fn compile(model: &Path, target: Target, fix: &std::collections::HashMap<String, usize>, custom: &[CustomOp], chosen: &PassChoices) -> Result<Compiled, CompileError> {
    let Loaded { mut graph, registry, model_hash, .. } = load(Source::File(model), target, false, custom)?;
    let mut symbols: Vec<String> = graph.inputs.iter().filter_map(|&v| graph.values[v].ty.as_ref()).flat_map(|t| t.shape.symbols().map(String::from).collect::<Vec<_>>()).collect();
    symbols.sort();
    symbols.dedup();
    let mut fixed: Vec<(String, usize)> = fix.iter().map(|(k, v)| (k.clone(), *v)).collect();
    fixed.sort();
    for (name, _) in &fixed {
        if !symbols.contains(name) {
            return Err(CompileError::UnknownSymbol { name: name.clone(), symbols: if symbols.is_empty() { "none".into() } else { symbols.join(", ") } });
        }
    }
    for &v in &graph.inputs.clone() {
        if let Some(ty) = graph.values[v].ty.as_mut() {
            for d in ty.shape.0.iter_mut() {
                if let kiln_graph::Dim::Sym(s) = d {
                    if let Some(&n) = fix.get(s.as_str()) {
                        *d = kiln_graph::Dim::Fixed(n);
                    }
                }
            }
        }
    }
    let ops = registry.as_ref().unwrap_or_else(|| Registry::builtin());
    let passes = passes::optimize_chosen(&mut graph, target, &mut PassContext::new(ops), chosen);
    let used = |op: &&CustomOp| graph.nodes.iter().any(|n| kiln_ops::canonical_domain(&n.domain) == op.domain() && n.op_type == op.op_type());
    let info = ArtifactInfo {
        kiln_version: env!("CARGO_PKG_VERSION").into(),
        source: model.display().to_string(),
        fixed,
        passes: passes.iter().map(|r| (r.name.to_string(), r.changes)).collect(),
        custom_ops: custom.iter().filter(used).map(|op| op.source().clone()).collect(),
        ..Default::default()
    };
    Ok(Compiled { graph, registry, info, model_hash })
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("the model's inputs have no symbolic dim '{name}' to fix (they have: {symbols})")]
    UnknownSymbol { name: String, symbols: String },
}
