//! `.kiln` artifacts: a compiled graph that loads without the compiler or protobuf.
//!
//! Layout (all integers little-endian):
//!
//! | bytes            | content                                                     |
//! |------------------|-------------------------------------------------------------|
//! | 0..8             | magic `KILNART\0`                                            |
//! | 8..12            | format version (u32), [`FORMAT`]                             |
//! | 12..20           | header length H (u64)                                        |
//! | 20..24           | CRC-32 of the header                                         |
//! | 24..24+H         | header: JSON ([`Header`]): graph, weight table, metadata     |
//! | padded to 64     | weights: raw bytes, each weight at a 64-byte aligned offset  |
//! | padded to 64     | optional: the GPU driver's pipeline cache of the stored WGSL |
//!
//! The header records the CRC-32 and length of the weight blob and, when present, the
//! pipeline cache's length, CRC-32 and key (the adapter and driver that wrote it).
//! Loading maps the file, checks magic, version, every checksum and offset, and rebuilds
//! the graph; no ONNX parsing, no graph passes. A pipeline cache is only an accelerator:
//! a device whose key differs ignores it ([`crate::Session::use_pipeline_cache`]), but
//! cache bytes that fail their checksum are an error like any other corruption.
//!
//! Compatibility rule: a runtime writes the artifact format it was built with
//! ([`FORMAT`]); any change to the layout or to the header's meaning bumps it, and an
//! artifact of another format is refused with a message that says to recompile it.
//! Exceptions: format 3 (before tuned choices, `ArtifactInfo::tuning`) is still read, as
//! an artifact without tuned choices, and format 4 (before subgraph attributes) as it
//! is; the layout is otherwise the same. Format 5 artifacts (before embedded custom
//! ops, `ArtifactInfo::custom_ops`) are read as artifacts without custom ops.
use crate::{Result, RuntimeError};
use kiln_graph::{Attr, DType, Graph, Node, Tensor, ValueInfo, ValueType};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

/// The artifact format this runtime writes and reads.
pub const FORMAT: u32 = 6;
/// Older formats this runtime still reads (format 5 only added subgraph attributes,
/// format 6 embedded custom ops).
const READS_ALSO: &[u32] = &[3, 4, 5];
/// The first bytes of every artifact.
pub const MAGIC: &[u8; 8] = b"KILNART\0";
const ALIGN: usize = 64;
const PREFIX: usize = 24;

/// What a `.kiln` file says besides the graph.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ArtifactInfo {
    /// The Kiln version that wrote it.
    pub kiln_version: String,
    /// The source model file.
    pub source: String,
    /// The device it was compiled for (`cpu`, `gpu`, an adapter name, `auto`).
    pub device: String,
    /// Symbols fixed at compile time (`--fix NAME=VALUE`).
    pub fixed: Vec<(String, usize)>,
    /// What each graph pass changed.
    pub passes: Vec<(String, usize)>,
    /// The GPU driver's cache of those kernels' pipelines, made by `kiln compile` on the
    /// target adapter when it supports pipeline caching: loading on the same adapter and
    /// driver skips most of the pipelines' compile time. Stored after the weights, not
    /// in the JSON header.
    #[serde(skip)]
    pub pipeline_cache: Option<crate::PipelineCacheData>,
    /// Tuned kernel choices (`kiln compile --tune`), by tuning key text: a session on the
    /// device they were measured on uses them before any database
    /// ([`crate::Tuning::embedded`]); on other devices their keys never match.
    /// Format 4; empty in format 3 artifacts.
    #[serde(default)]
    pub tuning: BTreeMap<String, crate::tune::TuneEntry>,
    /// The custom ops the graph uses, as loaded from their manifests (manifest, WGSL,
    /// CPU library): loading rebuilds them ([`ArtifactInfo::registry`]), so the
    /// artifact runs without the files. Format 6; empty before.
    #[serde(default)]
    pub custom_ops: Vec<kiln_ops::custom::CustomOpSource>,
}

impl ArtifactInfo {
    /// The built-in ops plus the embedded custom ops; `None` when there are none.
    pub fn registry(&self) -> Result<Option<kiln_ops::Registry>> {
        if self.custom_ops.is_empty() {
            return Ok(None);
        }
        let mut r = kiln_ops::Registry::builtin().clone();
        for s in &self.custom_ops {
            kiln_ops::custom::CustomOp::from_source(s).map_err(|e| RuntimeError::Artifact(format!("embeds the custom op of {}, which does not load: {e}", s.manifest_path)))?.register(&mut r);
        }
        Ok(Some(r))
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    info: ArtifactInfo,
    graph: GraphRecord,
    weights_len: u64,
    weights_crc: u32,
    /// The pipeline cache section, after the weights (at the next 64-byte boundary).
    pipeline_cache: Option<CacheRecord>,
}

#[derive(Serialize, Deserialize)]
struct CacheRecord {
    key: String,
    len: u64,
    crc: u32,
}

#[derive(Serialize, Deserialize)]
struct GraphRecord {
    name: String,
    values: Vec<(String, Option<ValueType>)>,
    nodes: Vec<NodeRecord>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    opsets: BTreeMap<String, i64>,
    weights: Vec<WeightRecord>,
}

#[derive(Serialize, Deserialize)]
struct NodeRecord {
    name: String,
    op_type: String,
    domain: String,
    attrs: BTreeMap<String, AttrRecord>,
    inputs: Vec<Option<usize>>,
    outputs: Vec<usize>,
}

#[derive(Serialize, Deserialize)]
enum AttrRecord {
    Int(i64),
    Float(f32),
    String(String),
    /// A small tensor attribute, kept in the header.
    Tensor { dtype: DType, dims: Vec<usize>, bytes: Vec<u8> },
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Strings(Vec<String>),
    /// A subgraph (If/Loop/Scan bodies), with its weights in the header. Format 5.
    Graph(Box<SubgraphRecord>),
    /// A value type (Optional's `type`).
    Type(kiln_graph::ValueType),
}

#[derive(Serialize, Deserialize)]
struct SubgraphRecord {
    name: String,
    values: Vec<(String, Option<ValueType>)>,
    nodes: Vec<NodeRecord>,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    opsets: BTreeMap<String, i64>,
    /// Weights by value: dtype, dims, bytes.
    weights: Vec<(usize, DType, Vec<usize>, Vec<u8>)>,
    outer_inputs: usize,
}

#[derive(Serialize, Deserialize)]
struct WeightRecord {
    value: usize,
    dtype: DType,
    dims: Vec<usize>,
    offset: u64,
    len: u64,
}

fn bad(path: &Path, what: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Artifact(format!("{}: {what}", path.display()))
}

/// The first string tensor of `graph` (an initializer or a node's attribute, subgraphs
/// included), named.
fn string_tensor(graph: &Graph) -> Option<String> {
    if let Some((&v, _)) = graph.initializers.iter().find(|(_, t)| t.dtype().is_string()) {
        return Some(format!("constant '{}'", graph.values[v].name));
    }
    graph.nodes.iter().find_map(|n| {
        n.attrs.iter().find_map(|(k, a)| match a {
            Attr::Tensor(t) if t.dtype().is_string() => Some(format!("attribute '{k}' of node '{}'", n.name)),
            Attr::Graph(g) => string_tensor(g),
            _ => None,
        })
    })
}

fn attr_record(a: &Attr) -> AttrRecord {
    match a {
        Attr::Int(v) => AttrRecord::Int(*v),
        Attr::Float(v) => AttrRecord::Float(*v),
        Attr::String(v) => AttrRecord::String(v.clone()),
        Attr::Tensor(t) => AttrRecord::Tensor { dtype: t.dtype(), dims: t.dims().to_vec(), bytes: t.bytes().to_vec() },
        Attr::Ints(v) => AttrRecord::Ints(v.clone()),
        Attr::Floats(v) => AttrRecord::Floats(v.clone()),
        Attr::Strings(v) => AttrRecord::Strings(v.clone()),
        Attr::Type(t) => AttrRecord::Type(t.clone()),
        Attr::Graph(g) => {
            let mut ids: Vec<usize> = g.initializers.keys().copied().collect();
            ids.sort_unstable();
            let weights = ids.into_iter().map(|v| { let t = &g.initializers[&v]; (v, t.dtype(), t.dims().to_vec(), t.bytes().to_vec()) }).collect();
            AttrRecord::Graph(Box::new(SubgraphRecord {
                name: g.name.clone(),
                values: g.values.iter().map(|v| (v.name.clone(), v.ty.clone())).collect(),
                nodes: g.nodes.iter().map(node_record).collect(),
                inputs: g.inputs.clone(),
                outputs: g.outputs.clone(),
                opsets: g.opsets.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                weights,
                outer_inputs: g.outer_inputs,
            }))
        }
    }
}

fn node_record(n: &Node) -> NodeRecord {
    NodeRecord {
        name: n.name.clone(),
        op_type: n.op_type.clone(),
        domain: n.domain.clone(),
        attrs: n.attrs.iter().map(|(k, a)| (k.clone(), attr_record(a))).collect(),
        inputs: n.inputs.clone(),
        outputs: n.outputs.clone(),
    }
}

/// A node from its record; every value id is checked against the graph's `n_values`.
fn node(n: NodeRecord, n_values: usize) -> std::result::Result<Node, String> {
    for v in n.inputs.iter().flatten().chain(&n.outputs) {
        if *v >= n_values {
            return Err(format!("node '{}' refers to value {v} of {n_values}", n.name));
        }
    }
    let attrs = n.attrs.into_iter().map(|(k, a)| attr(a).map(|a| (k, a))).collect::<std::result::Result<_, _>>().map_err(|e| format!("node '{}': {e}", n.name))?;
    Ok(Node { name: n.name, op_type: n.op_type, domain: n.domain, attrs, inputs: n.inputs, outputs: n.outputs })
}

fn subgraph(r: SubgraphRecord) -> std::result::Result<Graph, String> {
    let n_values = r.values.len();
    let mut g = Graph::new(r.name);
    g.values = r.values.into_iter().map(|(name, ty)| ValueInfo { name, ty }).collect();
    if let Some(v) = r.inputs.iter().chain(&r.outputs).find(|&&v| v >= n_values) {
        return Err(format!("subgraph '{}': an input or output refers to value {v} of {n_values}", g.name));
    }
    if r.outer_inputs > r.inputs.len() {
        return Err(format!("subgraph '{}': {} outer inputs of {}", g.name, r.outer_inputs, r.inputs.len()));
    }
    g.inputs = r.inputs;
    g.outputs = r.outputs;
    g.outer_inputs = r.outer_inputs;
    g.opsets = r.opsets.into_iter().collect();
    for n in r.nodes {
        let n = node(n, n_values).map_err(|e| format!("subgraph '{}': {e}", g.name))?;
        g.nodes.push(n);
    }
    for (v, dtype, dims, bytes) in r.weights {
        if v >= n_values {
            return Err(format!("subgraph '{}': a weight refers to value {v} of {n_values}", g.name));
        }
        let t = Tensor::from_bytes(dtype, &dims, &bytes).map_err(|e| format!("subgraph '{}': weight '{}': {e}", g.name, g.values[v].name))?;
        g.initializers.insert(v, t);
    }
    g.validate().map_err(|e| format!("subgraph '{}': {e}", g.name))?;
    Ok(g)
}

fn attr(r: AttrRecord) -> std::result::Result<Attr, String> {
    Ok(match r {
        AttrRecord::Int(v) => Attr::Int(v),
        AttrRecord::Float(v) => Attr::Float(v),
        AttrRecord::String(v) => Attr::String(v),
        AttrRecord::Tensor { dtype, dims, bytes } => Attr::Tensor(Tensor::from_bytes(dtype, &dims, &bytes).map_err(|e| e.to_string())?),
        AttrRecord::Ints(v) => Attr::Ints(v),
        AttrRecord::Floats(v) => Attr::Floats(v),
        AttrRecord::Strings(v) => Attr::Strings(v),
        AttrRecord::Type(t) => Attr::Type(t),
        AttrRecord::Graph(g) => Attr::Graph(Arc::new(subgraph(*g)?)),
    })
}

/// Writes `graph` (and `info`) as a `.kiln` artifact.
/// String tensors (constants, attributes) have no bytes to map: such graphs are refused.
pub fn save(path: &Path, graph: &Graph, info: &ArtifactInfo) -> Result<()> {
    if let Some(what) = string_tensor(graph) {
        return Err(bad(path, format!("{what} is a string tensor; artifacts hold byte weights only (run the .onnx model instead)")));
    }
    let mut ids: Vec<usize> = graph.initializers.keys().copied().collect();
    ids.sort_unstable();
    let mut blob: Vec<u8> = vec![];
    let mut weights = vec![];
    for v in ids {
        let t = &graph.initializers[&v];
        blob.resize(blob.len().next_multiple_of(ALIGN), 0);
        weights.push(WeightRecord { value: v, dtype: t.dtype(), dims: t.dims().to_vec(), offset: blob.len() as u64, len: t.bytes().len() as u64 });
        blob.extend_from_slice(t.bytes());
    }
    let record = GraphRecord {
        name: graph.name.clone(),
        values: graph.values.iter().map(|v| (v.name.clone(), v.ty.clone())).collect(),
        nodes: graph.nodes.iter().map(node_record).collect(),
        inputs: graph.inputs.clone(),
        outputs: graph.outputs.clone(),
        opsets: graph.opsets.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        weights,
    };
    let cache = info.pipeline_cache.as_ref();
    let header = Header {
        info: info.clone(),
        graph: record,
        weights_len: blob.len() as u64,
        weights_crc: crc32fast::hash(&blob),
        pipeline_cache: cache.map(|c| CacheRecord { key: c.key.clone(), len: c.data.len() as u64, crc: crc32fast::hash(&c.data) }),
    };
    let json = serde_json::to_vec(&header).map_err(|e| bad(path, format!("cannot encode the header: {e}")))?;
    let cache_len = cache.map_or(0, |c| c.data.len() + ALIGN);
    let mut out = Vec::with_capacity(PREFIX + json.len() + ALIGN + blob.len() + cache_len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&json).to_le_bytes());
    out.extend_from_slice(&json);
    out.resize(out.len().next_multiple_of(ALIGN), 0);
    out.extend_from_slice(&blob);
    if let Some(c) = cache {
        out.resize(out.len().next_multiple_of(ALIGN), 0);
        out.extend_from_slice(&c.data);
    }
    std::fs::write(path, out).map_err(|e| bad(path, format!("cannot write: {e}")))
}

/// Reads a `.kiln` artifact: the graph, ready for [`crate::Session::new`], and its info.
pub fn load(path: &Path) -> Result<(Graph, ArtifactInfo)> {
    let file = crate::file::open_regular(path).map_err(|e| bad(path, format!("cannot open: {e}")))?;
    // SAFETY: the map is read-only. The weights read it in place for as long as they
    // live, so the file must not be modified while a graph or session loaded from it is
    // in use (the checksums below catch changes made before loading).
    let map: Arc<memmap2::Mmap> = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| bad(path, format!("cannot map: {e}")))?);
    parse(path, map)
}

/// Reads a `.kiln` artifact held in memory (weights read it in place where aligned);
/// `label` names it in errors.
pub fn load_bytes(label: &str, bytes: Vec<u8>) -> Result<(Graph, ArtifactInfo)> {
    parse(Path::new(label), Arc::new(bytes))
}

fn parse(path: &Path, map: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Result<(Graph, ArtifactInfo)> {
    let bytes: &[u8] = (*map).as_ref();
    if bytes.len() < PREFIX || &bytes[..8] != MAGIC {
        return Err(bad(path, "not a Kiln artifact (bad magic; compile one with `kiln compile MODEL.onnx -o MODEL.kiln`)"));
    }
    let format = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if format != FORMAT && !READS_ALSO.contains(&format) {
        return Err(bad(path, format!("artifact format {format}, but this Kiln ({}) reads formats {FORMAT} and {READS_ALSO:?} only: recompile the model with this version's `kiln compile`", env!("CARGO_PKG_VERSION"))));
    }
    let header_len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
    let header_crc = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes"));
    let header_end = usize::try_from(header_len).ok().and_then(|h| h.checked_add(PREFIX)).filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad(path, format!("truncated: the header needs {header_len} bytes, the file has {}", bytes.len())))?;
    let json = &bytes[PREFIX..header_end];
    if crc32fast::hash(json) != header_crc {
        return Err(bad(path, "corrupted: the header's checksum does not match"));
    }
    let header: Header = serde_json::from_slice(json).map_err(|e| bad(path, format!("corrupted header: {e}")))?;
    let start = header_end.next_multiple_of(ALIGN);
    let blob = usize::try_from(header.weights_len).ok().and_then(|l| Some(start..start.checked_add(l)?)).filter(|r| r.end <= bytes.len())
        .ok_or_else(|| bad(path, format!("truncated: the weights need {} bytes after offset {start}, the file has {}", header.weights_len, bytes.len())))?;
    let (blob_start, blob_end) = (blob.start, blob.end);
    let blob = &bytes[blob];
    if crc32fast::hash(blob) != header.weights_crc {
        return Err(bad(path, "corrupted: the weights' checksum does not match"));
    }
    let mut info = header.info;
    if let Some(c) = header.pipeline_cache {
        let start = blob_end.next_multiple_of(ALIGN);
        let range = usize::try_from(c.len).ok().and_then(|l| Some(start..start.checked_add(l)?)).filter(|r| r.end <= bytes.len())
            .ok_or_else(|| bad(path, format!("truncated: the pipeline cache needs {} bytes after offset {start}, the file has {}", c.len, bytes.len())))?;
        let data = &bytes[range];
        if crc32fast::hash(data) != c.crc {
            return Err(bad(path, "corrupted: the pipeline cache's checksum does not match"));
        }
        info.pipeline_cache = Some(crate::PipelineCacheData { key: c.key, data: data.to_vec() });
    }
    let g = header.graph;
    let n_values = g.values.len();
    let check = |v: usize, what: &str| if v < n_values { Ok(v) } else { Err(bad(path, format!("corrupted: {what} refers to value {v} of {n_values}"))) };
    let mut graph = Graph::new(g.name);
    graph.values = g.values.into_iter().map(|(name, ty)| ValueInfo { name, ty }).collect();
    for &v in g.inputs.iter().chain(&g.outputs) {
        check(v, "a graph input or output")?;
    }
    graph.inputs = g.inputs;
    graph.outputs = g.outputs;
    graph.opsets = g.opsets.into_iter().collect::<HashMap<_, _>>();
    for n in g.nodes {
        graph.nodes.push(node(n, n_values).map_err(|e| bad(path, format!("corrupted: {e}")))?);
    }
    // Weights start 64-byte aligned and never overlap (an edited header that shifts a
    // weight would otherwise read garbage, or alias another weight, in place).
    let mut placed: Vec<(std::ops::Range<usize>, usize)> = Vec::with_capacity(g.weights.len());
    for w in g.weights {
        let v = check(w.value, "a weight")?;
        let name = &graph.values[v].name;
        let range = usize::try_from(w.offset).ok().zip(usize::try_from(w.len).ok()).and_then(|(o, l)| Some(o..o.checked_add(l)?)).filter(|r| r.end <= blob.len());
        let range = range.ok_or_else(|| bad(path, format!("corrupted: weight '{name}' lies outside the weight blob")))?;
        if range.start % ALIGN != 0 {
            return Err(bad(path, format!("corrupted: weight '{name}' starts at offset {}, which is not {ALIGN}-byte aligned", range.start)));
        }
        if graph.initializers.contains_key(&v) {
            return Err(bad(path, format!("corrupted: weight '{name}' is stored twice")));
        }
        placed.push((range.clone(), v));
        let expected = w.dims.iter().try_fold(w.dtype.size(), |a, &d| a.checked_mul(d));
        if expected != Some(range.len()) {
            return Err(bad(path, format!("corrupted: weight '{}' has {} bytes for a {} tensor of shape {:?}", graph.values[v].name, range.len(), w.dtype, w.dims)));
        }
        // Weights read the mapped file in place (no copy).
        let t = Tensor::from_shared(w.dtype, &w.dims, map.clone(), blob_start + range.start).map_err(|e| bad(path, format!("weight '{}': {e}", graph.values[v].name)))?;
        graph.initializers.insert(v, t);
    }
    placed.sort_by_key(|(r, _)| (r.start, r.end));
    for pair in placed.windows(2) {
        let ((a, va), (b, vb)) = (&pair[0], &pair[1]);
        if !a.is_empty() && !b.is_empty() && b.start < a.end {
            return Err(bad(path, format!(
                "corrupted: weights '{}' (bytes {}..{}) and '{}' (bytes {}..{}) overlap",
                graph.values[*va].name, a.start, a.end, graph.values[*vb].name, b.start, b.end
            )));
        }
    }
    graph.validate()?;
    Ok((graph, info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_graph::{GraphBuilder, Shape};

    fn graph() -> Graph {
        let mut b = GraphBuilder::new("tiny");
        let x = b.input("x", DType::F32, Shape(vec!["n".into(), 3usize.into()]));
        let w = b.constant("w", Tensor::from_vec(&[3], vec![1f32, 2.0, 3.0]).unwrap());
        let idx = b.constant("idx", Tensor::from_vec(&[2], vec![0i64, 2]).unwrap());
        let y = b.node("Mul", &[x, w], &[("note", Attr::Tensor(Tensor::scalar(7i32))), ("list", Attr::Floats(vec![0.5]))]);
        let z = b.node("Gather", &[y, idx], &[("axis", Attr::Int(1))]);
        b.output(z);
        let mut g = b.finish().unwrap();
        g.opsets.insert(String::new(), 17);
        g
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("kiln-artifact-{}-{name}", std::process::id()))
    }

    #[test]
    fn string_tensors_are_refused_by_name() {
        let strings = || Tensor::from_strings(&[1], vec!["a".into()]).unwrap();
        let mut g = graph();
        let w = g.find_value("w").unwrap();
        g.initializers.insert(w, strings());
        let p = tmp("strings.kiln");
        let e = save(&p, &g, &ArtifactInfo::default()).unwrap_err().to_string();
        assert!(e.contains("constant 'w'") && e.contains("string tensor"), "{e}");
        let mut g = graph();
        g.nodes[0].attrs.insert("note".into(), Attr::Tensor(strings()));
        let e = save(&p, &g, &ArtifactInfo::default()).unwrap_err().to_string();
        assert!(e.contains("attribute 'note'") && e.contains("string tensor"), "{e}");
        assert!(!p.exists());
    }

    #[test]
    fn round_trip_keeps_the_graph() {
        let g = graph();
        let p = tmp("rt.kiln");
        let info = ArtifactInfo { kiln_version: "test".into(), device: "cpu".into(), fixed: vec![("n".into(), 2)], ..Default::default() };
        save(&p, &g, &info).unwrap();
        let (back, info2) = load(&p).unwrap();
        assert_eq!(info2, info);
        assert_eq!(back.nodes, g.nodes);
        assert_eq!(back.values, g.values);
        assert_eq!((back.inputs.clone(), back.outputs.clone()), (g.inputs.clone(), g.outputs.clone()));
        for (v, t) in &g.initializers {
            assert_eq!(back.initializers[v].bytes(), t.bytes());
            assert_eq!(back.initializers[v].dims(), t.dims());
        }
        std::fs::remove_file(p).ok();
    }

    #[test]
    fn a_pipeline_cache_round_trips_after_the_weights_and_is_checked() {
        let p = tmp("cache.kiln");
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let info = ArtifactInfo { pipeline_cache: Some(crate::PipelineCacheData { key: "vulkan 1 2; driver".into(), data: data.clone() }), ..Default::default() };
        save(&p, &graph(), &info).unwrap();
        let good = std::fs::read(&p).unwrap();
        assert_eq!(&good[good.len() - data.len()..], &data[..]);
        assert_eq!((good.len() - data.len()) % ALIGN, 0, "the cache starts 64-byte aligned");
        assert_eq!(load(&p).unwrap().1, info);
        // Without a cache, nothing follows the weights.
        save(&p, &graph(), &ArtifactInfo::default()).unwrap();
        assert_eq!(load(&p).unwrap().1.pipeline_cache, None);
        for (bytes, want) in [
            ({ let mut b = good.clone(); let n = b.len(); b[n - 10] ^= 4; b }, "pipeline cache's checksum"),
            (good[..good.len() - 1].to_vec(), "truncated: the pipeline cache"),
        ] {
            std::fs::write(&p, &bytes).unwrap();
            let e = load(&p).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("cache.kiln"), "{want}: {e}");
        }
        std::fs::remove_file(&p).ok();
    }

    #[test]
    fn tuned_choices_round_trip_and_format_3_still_reads() {
        let p = tmp("tuned.kiln");
        let mut info = ArtifactInfo { device: "cpu".into(), ..Default::default() };
        let values = [("workgroup".to_string(), 128u32)].into_iter().collect();
        info.tuning.insert("k | a | f32[2] | dev | kern".into(), crate::tune::TuneEntry { values, default_ms: 2.0, best_ms: 1.0, summary: "Op(f32[2])".into() });
        save(&p, &graph(), &info).unwrap();
        assert_eq!(load(&p).unwrap().1, info);
        // A format 3 file: no `tuning` in the header.
        let good = std::fs::read(&p).unwrap();
        let mut old = with_header(&good, |h| {
            h["info"].as_object_mut().unwrap().remove("tuning");
        });
        old[8..12].copy_from_slice(&3u32.to_le_bytes());
        std::fs::write(&p, &old).unwrap();
        let (_, back) = load(&p).unwrap();
        assert!(back.tuning.is_empty());
        assert_eq!(back.device, "cpu");
        // Format 2 is refused with the advice to recompile.
        old[8..12].copy_from_slice(&2u32.to_le_bytes());
        std::fs::write(&p, &old).unwrap();
        let e = load(&p).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("artifact format 2") && e.contains("recompile"), "{e}");
        std::fs::remove_file(&p).ok();
    }

    /// `bytes` (a valid artifact) with its JSON header edited by `edit` and every
    /// checksum and offset made consistent again: corruption no checksum can catch.
    fn with_header(bytes: &[u8], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        let header_len = u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
        let header_end = PREFIX + header_len;
        let mut header: serde_json::Value = serde_json::from_slice(&bytes[PREFIX..header_end]).unwrap();
        let blob_start = header_end.next_multiple_of(ALIGN);
        let blob = &bytes[blob_start..blob_start + header["weights_len"].as_u64().unwrap() as usize];
        edit(&mut header);
        let json = serde_json::to_vec(&header).unwrap();
        let mut out = bytes[..12].to_vec();
        out.extend_from_slice(&(json.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&json).to_le_bytes());
        out.extend_from_slice(&json);
        out.resize(out.len().next_multiple_of(ALIGN), 0);
        out.extend_from_slice(blob);
        out
    }

    #[test]
    fn misaligned_and_overlapping_weights_are_refused() {
        let p = tmp("weights.kiln");
        save(&p, &graph(), &ArtifactInfo::default()).unwrap();
        let good = std::fs::read(&p).unwrap();
        // The header rewrite itself keeps a loadable file.
        std::fs::write(&p, with_header(&good, |_| {})).unwrap();
        load(&p).unwrap();
        let weight = |h: &mut serde_json::Value, name: &str| -> usize {
            let values = h["graph"]["values"].as_array().unwrap();
            let v = values.iter().position(|x| x[0] == name).unwrap();
            h["graph"]["weights"].as_array().unwrap().iter().position(|w| w["value"] == v).unwrap()
        };
        let cases: Vec<(Box<dyn Fn(&mut serde_json::Value)>, &str)> = vec![
            // 'w' (12 bytes at 0) moved to offset 4: in the blob, but shifted by one f32.
            (Box::new(|h| { let i = weight(h, "w"); h["graph"]["weights"][i]["offset"] = 4.into(); }), "'w' starts at offset 4, which is not 64-byte aligned"),
            // 'idx' (16 bytes at 64) moved onto 'w'.
            (Box::new(|h| { let i = weight(h, "idx"); h["graph"]["weights"][i]["offset"] = 0.into(); }), "overlap"),
            // One value stored twice.
            (Box::new(|h| { let i = weight(h, "w"); let w = h["graph"]["weights"][i].clone(); h["graph"]["weights"].as_array_mut().unwrap().push(w); }), "'w' is stored twice"),
        ];
        for (edit, want) in cases {
            std::fs::write(&p, with_header(&good, edit)).unwrap();
            let e = load(&p).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("weights.kiln"), "{want}: {e}");
        }
        std::fs::remove_file(&p).ok();
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_not_read() {
        let p = tmp("fifo.kiln");
        if std::process::Command::new("mkfifo").arg(&p).status().is_ok_and(|s| s.success()) {
            let e = load(&p).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains("FIFO") && e.contains("fifo.kiln"), "{e}");
            std::fs::remove_file(&p).ok();
        }
    }

    #[test]
    fn damaged_files_are_clear_errors() {
        let p = tmp("bad.kiln");
        save(&p, &graph(), &ArtifactInfo::default()).unwrap();
        let good = std::fs::read(&p).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..good.len() - 3].to_vec(), "truncated"),
            (good[..30].to_vec(), "truncated"),
            ({ let mut b = good.clone(); let n = b.len(); b[n - 1] ^= 1; b }, "weights' checksum"),
            ({ let mut b = good.clone(); b[40] ^= 1; b }, "header's checksum"),
            ({ let mut b = good.clone(); b[8] = 99; b }, "artifact format 99"),
            (b"PK\x03\x04 not kiln at all".to_vec(), "not a Kiln artifact"),
            (vec![], "not a Kiln artifact"),
        ];
        for (bytes, want) in cases {
            std::fs::write(&p, &bytes).unwrap();
            let e = load(&p).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("bad.kiln"), "{want}: {e}");
        }
        std::fs::remove_file(&p).ok();
        assert!(load(&p).map(|_| ()).unwrap_err().to_string().contains("cannot open"));
    }
}
