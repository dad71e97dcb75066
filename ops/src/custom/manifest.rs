//! The manifest file of a custom op (JSON; see docs/custom-ops.md): its schema, and the
//! checks that turn every mistake into an error naming the file, the line and what was
//! expected.

use super::rule::Expr;
use kiln_graph::DType;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// The manifest format this Kiln reads.
pub const FORMAT: u32 = 1;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    #[serde(default = "format_one")]
    pub format: u32,
    pub domain: String,
    pub op_type: String,
    #[serde(default)]
    pub doc: String,
    pub inputs: Vec<InputDecl>,
    pub outputs: Vec<OutputDecl>,
    #[serde(default)]
    pub attributes: Vec<AttrDecl>,
    pub wgsl: Option<WgslDecl>,
    pub cpu: Option<CpuDecl>,
    pub cost: Option<CostDecl>,
}

fn format_one() -> u32 {
    FORMAT
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InputDecl {
    pub name: String,
    /// Accepted dtypes (short names: f32, i64, ...); default f32 only.
    #[serde(default = "f32_only")]
    pub dtypes: Vec<String>,
}

fn f32_only() -> Vec<String> {
    vec!["f32".into()]
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutputDecl {
    pub name: String,
    /// The name of an input (same dims), or one expression per dim.
    pub shape: ShapeDecl,
    /// The name of an input (same dtype), or a dtype name.
    pub dtype: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged, expecting = "a shape: the name of an input (same dims) or a list of dim expressions such as [\"x[0]\", \"x[1] * 2\"]")]
pub enum ShapeDecl {
    SameAs(String),
    Dims(Vec<String>),
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AttrKind {
    Int,
    Float,
    Ints,
    Floats,
    String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AttrDecl {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: AttrKind,
    /// The value when a node omits the attribute; none: the attribute is required.
    pub default: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WgslDecl {
    /// The WGSL file, relative to the manifest.
    pub file: String,
    #[serde(default = "main_entry")]
    pub entry_point: String,
    /// How many invocations to launch (an expression over inputs, outputs and integer
    /// attributes); default: the element count of the first output.
    pub invocations: Option<String>,
    #[serde(default = "workgroup_64")]
    pub workgroup_size: u32,
    /// Workgroup sizes the tuner may try (the kernel must use `KILN_WORKGROUP`).
    #[serde(default)]
    pub tune_workgroup_sizes: Vec<u32>,
}

fn main_entry() -> String {
    "main".into()
}
fn workgroup_64() -> u32 {
    64
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CpuDecl {
    /// The shared library, relative to the manifest.
    pub library: String,
    /// The exported C function (see `include/kiln_custom_op.h`).
    pub symbol: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CostDecl {
    /// Floating-point operations per application, an expression like `invocations`.
    pub flops: String,
}

/// A checked manifest: the parsed rules beside the declarations.
#[derive(Clone, Debug)]
pub struct Checked {
    pub manifest: Manifest,
    pub input_dtypes: Vec<Vec<DType>>,
    pub shapes: Vec<ShapeRule>,
    pub dtypes: Vec<DTypeRule>,
    pub invocations: Option<Expr>,
    pub flops: Option<Expr>,
}

#[derive(Clone, Debug)]
pub enum ShapeRule {
    SameAs(usize),
    Dims(Vec<Expr>),
}

#[derive(Clone, Copy, Debug)]
pub enum DTypeRule {
    SameAs(usize),
    Fixed(DType),
}

/// `path:line:col: what` for a position in the manifest text.
pub fn at(path: &str, line: usize, col: usize, what: impl std::fmt::Display) -> String {
    format!("{path}:{line}:{col}: {what}")
}

/// The line and column of the first JSON string `"needle"` in `text` (1, 1 if absent).
pub fn locate(text: &str, needle: &str) -> (usize, usize) {
    let quoted = serde_json::to_string(needle).unwrap_or_default();
    match text.find(&quoted) {
        Some(off) => {
            let line = text[..off].matches('\n').count() + 1;
            let col = off - text[..off].rfind('\n').map_or(0, |p| p + 1) + 1;
            (line, col)
        }
        None => (1, 1),
    }
}

/// The dtype with short name `name` (f32, i64, bool, ...): the 4-byte-or-narrower
/// dtypes a GPU kernel and a C kernel can both take, strings excluded.
pub fn dtype_named(name: &str) -> Option<DType> {
    DTYPES.into_iter().find(|d| d.name() == name)
}

const DTYPES: [DType; 13] = [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64, DType::Bool];

/// The accepted dtype names, for messages.
fn dtype_names() -> String {
    DTYPES.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
}

fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_') && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_') && !s.starts_with("__")
}

/// Parses and checks a manifest's text; errors name `path`, the line and what was
/// expected.
pub fn parse(text: &str, path: &str) -> Result<Checked, String> {
    let manifest: Manifest = serde_json::from_str(text).map_err(|e| {
        let msg = e.to_string();
        let msg = msg.rsplit_once(" at line ").map_or(msg.as_str(), |(m, _)| m).to_string();
        at(path, e.line(), e.column(), msg)
    })?;
    let err = |needle: &str, what: String| {
        let (l, c) = locate(text, needle);
        at(path, l, c, what)
    };
    if manifest.format != FORMAT {
        return Err(err("format", format!("manifest format {} is not supported (this Kiln reads format {FORMAT})", manifest.format)));
    }
    if crate::canonical_domain(&manifest.domain).is_empty() {
        return Err(err("domain", "a custom op needs a domain of its own (such as \"com.example\"), not ONNX's default domain".into()));
    }
    if manifest.op_type.is_empty() {
        return Err(err("op_type", "op_type must name the op (the node's op_type in the model)".into()));
    }
    if manifest.outputs.is_empty() {
        return Err(err("outputs", "expected at least one output".into()));
    }
    if manifest.wgsl.is_none() && manifest.cpu.is_none() {
        return Err(err("op_type", "the manifest names no kernel: expected a \"wgsl\" section, a \"cpu\" section, or both".into()));
    }
    // Names become WGSL constants and must be distinct.
    let mut seen = HashSet::new();
    let names = manifest.inputs.iter().map(|i| &i.name).chain(manifest.outputs.iter().map(|o| &o.name)).chain(manifest.attributes.iter().map(|a| &a.name));
    for name in names {
        if !is_identifier(name) || name.starts_with("kiln_") || name.starts_with("KILN_") {
            return Err(err(name, format!("'{name}' is not a usable name: expected letters, digits and '_' (a WGSL identifier not starting with kiln_)")));
        }
        if !seen.insert(name.as_str()) {
            return Err(err(name, format!("the name '{name}' is used twice (inputs, outputs and attributes need distinct names)")));
        }
    }
    let input_index = |n: &str| manifest.inputs.iter().position(|i| i.name == n);
    let mut input_dtypes = Vec::new();
    for i in &manifest.inputs {
        if i.dtypes.is_empty() {
            return Err(err(&i.name, format!("input '{}': dtypes is empty (expected some of {})", i.name, dtype_names())));
        }
        let ds = i.dtypes.iter().map(|d| dtype_named(d).ok_or_else(|| err(d, format!("input '{}': unknown dtype '{d}' (expected one of {})", i.name, dtype_names())))).collect::<Result<Vec<_>, _>>()?;
        input_dtypes.push(ds);
    }
    let int_attrs: Vec<&str> = manifest.attributes.iter().filter(|a| a.kind == AttrKind::Int).map(|a| a.name.as_str()).collect();
    // An expression: parsed, reading only `values` and integer attributes.
    let expression = |text_of: &str, values: &[&str], what: &str| -> Result<Expr, String> {
        let e = Expr::parse(text_of).map_err(|m| err(text_of, format!("{what}: '{text_of}' does not parse: {m}")))?;
        let (mut vs, mut attrs) = (vec![], vec![]);
        e.names(&mut vs, &mut attrs);
        if let Some(v) = vs.iter().find(|v| !values.contains(&v.as_str())) {
            return Err(err(text_of, format!("{what}: '{text_of}' reads '{v}', which is not {} (expected one of: {})", if values.len() > manifest.inputs.len() { "an input or output" } else { "an input" }, values.join(", "))));
        }
        if let Some(a) = attrs.iter().find(|a| !int_attrs.contains(&a.as_str())) {
            return Err(err(text_of, format!("{what}: '{text_of}' reads '{a}', which is not an integer attribute (integer attributes: {})", if int_attrs.is_empty() { "none".to_string() } else { int_attrs.join(", ") })));
        }
        Ok(e)
    };
    let inputs: Vec<&str> = manifest.inputs.iter().map(|i| i.name.as_str()).collect();
    let all: Vec<&str> = inputs.iter().copied().chain(manifest.outputs.iter().map(|o| o.name.as_str())).collect();
    let mut shapes = Vec::new();
    let mut dtypes = Vec::new();
    for o in &manifest.outputs {
        shapes.push(match &o.shape {
            ShapeDecl::SameAs(n) => ShapeRule::SameAs(input_index(n).ok_or_else(|| err(n, format!("output '{}': shape \"{n}\" names no input (expected an input's name, or a list of dim expressions)", o.name)))?),
            ShapeDecl::Dims(ds) => ShapeRule::Dims(ds.iter().map(|d| expression(d, &inputs, &format!("output '{}' shape", o.name))).collect::<Result<_, _>>()?),
        });
        dtypes.push(match (input_index(&o.dtype), dtype_named(&o.dtype)) {
            (Some(i), _) => DTypeRule::SameAs(i),
            (None, Some(d)) => DTypeRule::Fixed(d),
            (None, None) => return Err(err(&o.dtype, format!("output '{}': dtype '{}' is neither an input's name nor a dtype ({})", o.name, o.dtype, dtype_names()))),
        });
    }
    for a in &manifest.attributes {
        if let Some(d) = &a.default {
            if let Err(m) = super::attr_value(a.kind, d) {
                return Err(err(&a.name, format!("attribute '{}': default {d}: {m}", a.name)));
            }
        }
    }
    let mut invocations = None;
    if let Some(w) = &manifest.wgsl {
        for &size in std::iter::once(&w.workgroup_size).chain(&w.tune_workgroup_sizes) {
            if !(1..=256).contains(&size) {
                return Err(err("workgroup_size", format!("workgroup size {size} is outside 1..=256 (WebGPU's default limit)")));
            }
        }
        if !w.tune_workgroup_sizes.is_empty() && !w.tune_workgroup_sizes.contains(&w.workgroup_size) {
            return Err(err("tune_workgroup_sizes", format!("tune_workgroup_sizes {:?} must include the default workgroup_size {}", w.tune_workgroup_sizes, w.workgroup_size)));
        }
        if let Some(text_of) = &w.invocations {
            invocations = Some(expression(text_of, &all, "wgsl invocations")?);
        }
    }
    let flops = match &manifest.cost {
        Some(c) => Some(expression(&c.flops, &all, "cost flops")?),
        None => None,
    };
    Ok(Checked { manifest, input_dtypes, shapes, dtypes, invocations, flops })
}
