//! Custom ops from a manifest: a JSON file naming the op, its inputs, outputs and
//! attributes, its shape and dtype rules ([`rule`]), a WGSL kernel ([`wgsl`]) and
//! optionally a C kernel in a shared library ([`c_abi`]). [`CustomOp::load`] reads and
//! checks all of it (every mistake is an error naming the file and line);
//! [`CustomOp::register`] adds it to a [`Registry`]. [`CustomOpSource`] is the op as
//! text and bytes, which compiled artifacts embed so that they run without the files.
//!
//! Rust applications can instead implement [`crate::Op`] themselves (see
//! docs/custom-ops.md); both kinds of op run through the same passes and runtimes.

pub mod c_abi;
pub mod manifest;
pub mod rule;
pub mod wgsl;

use crate::{Arg, Cost, CpuKernel, NodeSpec, Op, OpError, Registry, Result, TensorType, TuneParam, TuneValues, WgslKernel, WgslProgram};
use kiln_graph::{Attr, DType};
use manifest::{AttrKind, Checked, DTypeRule, ShapeRule};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A custom op as text and bytes: what a compiled artifact embeds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CustomOpSource {
    /// Where the manifest was read from (for messages).
    pub manifest_path: String,
    pub manifest: String,
    /// The WGSL file's path (for messages) and text.
    pub wgsl: Option<(String, String)>,
    /// The CPU library's file name and bytes (hex).
    pub library: Option<(String, String)>,
}

/// A loaded, checked custom op.
#[derive(Clone)]
pub struct CustomOp {
    def: Arc<Def>,
}

struct Def {
    checked: Checked,
    source: CustomOpSource,
    library: Option<Arc<c_abi::Library>>,
}

impl std::fmt::Debug for CustomOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CustomOp({}.{} from {})", self.domain(), self.op_type(), self.def.source.manifest_path)
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| OpError::invalid(format!("cannot read {what} {}: {e}", path.display())))
}

impl CustomOp {
    /// Reads the manifest at `path`, the WGSL file and the library it names (relative to
    /// the manifest's folder), and checks them.
    pub fn load(path: impl AsRef<Path>) -> Result<CustomOp> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = String::from_utf8(read(path, "the custom-op manifest")?).map_err(|_| OpError::invalid(format!("{shown}: not UTF-8 text")))?;
        let checked = manifest::parse(&text, &shown).map_err(OpError::Invalid)?;
        // Files named by the manifest are relative to its folder; the library's path is
        // made absolute, as the loader searches system folders for a bare name.
        let dir = path.parent().unwrap_or(Path::new(""));
        let wgsl = match &checked.manifest.wgsl {
            Some(w) => {
                let p = dir.join(&w.file);
                let src = String::from_utf8(read(&p, "the WGSL kernel")?).map_err(|_| OpError::invalid(format!("{}: not UTF-8 text", p.display())))?;
                Some((p.display().to_string(), src))
            }
            None => None,
        };
        check_kernel_source(&checked, wgsl.as_ref())?;
        let (library, embedded) = match &checked.manifest.cpu {
            Some(c) => {
                let p: PathBuf = std::path::absolute(dir.join(&c.library)).map_err(|e| OpError::invalid(format!("{shown}: cpu: library {}: {e}", c.library)))?;
                let bytes = read(&p, "the CPU kernel library")?;
                let lib = c_abi::Library::open(&p, &c.symbol).map_err(|m| OpError::invalid(format!("{shown}: cpu: {m}")))?;
                let name = p.file_name().map_or_else(|| c.library.clone(), |n| n.to_string_lossy().into_owned());
                (Some(Arc::new(lib)), Some((name, hex(&bytes))))
            }
            None => (None, None),
        };
        let source = CustomOpSource { manifest_path: shown, manifest: text, wgsl, library: embedded };
        Ok(CustomOp { def: Arc::new(Def { checked, source, library }) })
    }

    /// Rebuilds an op from its embedded form (a compiled artifact's); the library, if
    /// any, is written to the temporary folder once and loaded from there.
    pub fn from_source(source: &CustomOpSource) -> Result<CustomOp> {
        let checked = manifest::parse(&source.manifest, &source.manifest_path).map_err(OpError::Invalid)?;
        check_kernel_source(&checked, source.wgsl.as_ref())?;
        let library = match (&checked.manifest.cpu, &source.library) {
            (Some(c), Some((name, hexed))) => {
                let bytes = unhex(hexed).ok_or_else(|| OpError::invalid(format!("{}: the embedded library {name} is corrupt", source.manifest_path)))?;
                let path = std::env::temp_dir().join(format!("kiln-custom-op-{:016x}-{name}", fnv1a(&bytes)));
                if std::fs::read(&path).ok().as_deref() != Some(bytes.as_slice()) {
                    // Written under a unique name, then renamed: concurrent loads never
                    // see a half-written library.
                    let tmp = path.with_extension(format!("{}.part", std::process::id()));
                    std::fs::write(&tmp, &bytes).and_then(|_| std::fs::rename(&tmp, &path)).map_err(|e| OpError::invalid(format!("cannot write the embedded library {name} to {}: {e}", path.display())))?;
                }
                Some(Arc::new(c_abi::Library::open(&path, &c.symbol).map_err(|m| OpError::invalid(format!("{}: cpu: {m}", source.manifest_path)))?))
            }
            (Some(_), None) => return Err(OpError::invalid(format!("{}: the manifest names a CPU library, but none is embedded", source.manifest_path))),
            _ => None,
        };
        Ok(CustomOp { def: Arc::new(Def { checked, source: source.clone(), library }) })
    }


    pub fn domain(&self) -> &str {
        &self.def.checked.manifest.domain
    }
    pub fn op_type(&self) -> &str {
        &self.def.checked.manifest.op_type
    }
    /// The op as text and bytes (what an artifact embeds).
    pub fn source(&self) -> &CustomOpSource {
        &self.def.source
    }
    pub fn has_cpu_kernel(&self) -> bool {
        self.def.library.is_some()
    }
    pub fn has_gpu_kernel(&self) -> bool {
        self.def.source.wgsl.is_some()
    }

    /// Adds the op to `registry` (replacing an op of the same domain and type).
    pub fn register(&self, registry: &mut Registry) {
        let def = self.def.clone();
        registry.register(self.domain(), self.op_type(), move |spec| Ok(Box::new(ManifestOp::new(def.clone(), spec)?) as Box<dyn Op>));
    }
}

/// Validates the WGSL once at load, with placeholder types (rank-1 values of each
/// input's first dtype, attributes at their defaults or zero), so that mistakes show
/// before any model runs.
fn check_kernel_source(c: &Checked, wgsl: Option<&(String, String)>) -> Result<()> {
    let (w, (path, src)) = match (&c.manifest.wgsl, wgsl) {
        (None, None) => return Ok(()),
        (Some(w), Some(s)) => (w, s),
        (Some(_), None) => return Err(OpError::invalid("the manifest names a WGSL kernel, but its source is missing")),
        (None, Some((path, _))) => return Err(OpError::invalid(format!("{path}: a WGSL source without a \"wgsl\" section in the manifest"))),
    };
    let in_dtypes: Vec<DType> = c.input_dtypes.iter().map(|d| d[0]).collect();
    let mut values: Vec<wgsl::Value> = c.manifest.inputs.iter().zip(&in_dtypes).map(|(i, &dtype)| wgsl::Value { name: &i.name, dtype, dims: &[1] }).collect();
    for (o, rule) in c.manifest.outputs.iter().zip(&c.dtypes) {
        let dtype = match rule {
            DTypeRule::SameAs(i) => in_dtypes[*i],
            DTypeRule::Fixed(d) => *d,
        };
        values.push(wgsl::Value { name: &o.name, dtype, dims: &[1] });
    }
    let attrs: Vec<(String, Attr)> = c
        .manifest
        .attributes
        .iter()
        .map(|a| {
            let v = a.default.as_ref().and_then(|d| attr_value(a.kind, d).ok()).unwrap_or(match a.kind {
                AttrKind::Int => Attr::Int(0),
                AttrKind::Float => Attr::Float(0.0),
                AttrKind::Ints => Attr::Ints(vec![0]),
                AttrKind::Floats => Attr::Floats(vec![0.0]),
                AttrKind::String => Attr::String(String::new()),
            });
            (a.name.clone(), v)
        })
        .collect();
    let attr_refs: Vec<(&str, &Attr)> = attrs.iter().map(|(n, a)| (n.as_str(), a)).collect();
    for &size in std::iter::once(&w.workgroup_size).chain(&w.tune_workgroup_sizes) {
        let prelude = wgsl::prelude(&values, &attr_refs, size, 1, size as u64).map_err(|m| OpError::invalid(format!("{path}: {m}")))?;
        let full = format!("{src}{prelude}");
        wgsl::check(&full, src.len(), path, &w.entry_point, &values, c.manifest.inputs.len(), size).map_err(OpError::Invalid)?;
    }
    Ok(())
}

/// The value of a manifest's attribute default.
pub(crate) fn attr_value(kind: AttrKind, v: &serde_json::Value) -> std::result::Result<Attr, String> {
    let int = |v: &serde_json::Value| v.as_i64().ok_or_else(|| format!("expected an integer, found {v}"));
    let float = |v: &serde_json::Value| v.as_f64().map(|f| f as f32).ok_or_else(|| format!("expected a number, found {v}"));
    let list = |v: &serde_json::Value| v.as_array().cloned().ok_or_else(|| format!("expected a list, found {v}"));
    Ok(match kind {
        AttrKind::Int => Attr::Int(int(v)?),
        AttrKind::Float => Attr::Float(float(v)?),
        AttrKind::String => Attr::String(v.as_str().ok_or_else(|| format!("expected a string, found {v}"))?.to_string()),
        AttrKind::Ints => Attr::Ints(list(v)?.iter().map(int).collect::<std::result::Result<_, _>>()?),
        AttrKind::Floats => Attr::Floats(list(v)?.iter().map(float).collect::<std::result::Result<_, _>>()?),
    })
}

fn kind_matches(kind: AttrKind, a: &Attr) -> bool {
    matches!(
        (kind, a),
        (AttrKind::Int, Attr::Int(_)) | (AttrKind::Float, Attr::Float(_)) | (AttrKind::String, Attr::String(_)) | (AttrKind::Ints, Attr::Ints(_)) | (AttrKind::Floats, Attr::Floats(_))
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// The op of one node: the manifest and the node's attributes.
struct ManifestOp {
    def: Arc<Def>,
    attrs: Vec<(String, Attr)>,
    cpu: Option<c_abi::CKernel>,
}

impl std::fmt::Debug for ManifestOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.def.checked.manifest.domain, self.def.checked.manifest.op_type)
    }
}

impl ManifestOp {
    fn new(def: Arc<Def>, spec: &NodeSpec) -> Result<ManifestOp> {
        let m = &def.checked.manifest;
        if let Some(unknown) = spec.node.attrs.keys().find(|k| !m.attributes.iter().any(|a| &a.name == *k)) {
            let declared: Vec<&str> = m.attributes.iter().map(|a| a.name.as_str()).collect();
            return Err(OpError::Attr { attr: unknown.clone(), what: format!("not declared by {} (declared: {})", def.source.manifest_path, if declared.is_empty() { "none".into() } else { declared.join(", ") }) });
        }
        let mut attrs = Vec::new();
        for a in &m.attributes {
            let v = match spec.node.attrs.get(&a.name) {
                Some(v) if kind_matches(a.kind, v) => v.clone(),
                Some(v) => return Err(OpError::Attr { attr: a.name.clone(), what: format!("expected {:?}, found {}", a.kind, v.kind()).to_lowercase() }),
                None => match &a.default {
                    Some(d) => attr_value(a.kind, d).map_err(|what| OpError::Attr { attr: a.name.clone(), what })?,
                    None => return Err(OpError::Attr { attr: a.name.clone(), what: format!("required (the manifest {} gives no default)", def.source.manifest_path) }),
                },
            };
            attrs.push((a.name.clone(), v));
        }
        if spec.n_outputs() != m.outputs.len() {
            return Err(OpError::invalid(format!("the node has {} outputs; {}.{} has {} (as its manifest declares)", spec.n_outputs(), m.domain, m.op_type, m.outputs.len())));
        }
        let cpu = match &def.library {
            Some(lib) => Some(c_abi::CKernel::new(lib.clone(), format!("{}.{}", m.domain, m.op_type), &attrs)?),
            None => None,
        };
        Ok(ManifestOp { def, attrs, cpu })
    }

    fn int_attr(&self, name: &str) -> Option<i64> {
        self.attrs.iter().find(|(n, _)| n == name).and_then(|(_, a)| if let Attr::Int(i) = a { Some(*i) } else { None })
    }

    /// Evaluates `e` over inputs, outputs (when given) and integer attributes.
    fn eval(&self, e: &rule::Expr, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Result<i64> {
        let scope = Scope { op: self, inputs, outputs };
        e.eval(&scope).map_err(OpError::invalid)
    }

    /// The values a kernel binds: inputs, then outputs.
    fn values<'a>(&'a self, inputs: &'a [Option<Arg>], outputs: &'a [TensorType]) -> Vec<wgsl::Value<'a>> {
        let m = &self.def.checked.manifest;
        let ins = m.inputs.iter().zip(inputs).map(|(d, a)| (d.name.as_str(), a.expect("inference checked every input").ty));
        let outs = m.outputs.iter().zip(outputs).map(|(d, t)| (d.name.as_str(), t));
        ins.chain(outs).map(|(name, t)| wgsl::Value { name, dtype: t.dtype, dims: &t.dims }).collect()
    }
}

struct Scope<'a> {
    op: &'a ManifestOp,
    inputs: &'a [Option<Arg<'a>>],
    outputs: &'a [TensorType],
}

impl rule::Scope for Scope<'_> {
    fn dims(&self, name: &str) -> Option<&[usize]> {
        let m = &self.op.def.checked.manifest;
        if let Some(i) = m.inputs.iter().position(|d| d.name == name) {
            return self.inputs.get(i).copied().flatten().map(|a| a.dims());
        }
        let o = m.outputs.iter().position(|d| d.name == name)?;
        self.outputs.get(o).map(|t| t.dims.as_slice())
    }
    fn attr(&self, name: &str) -> Option<i64> {
        self.op.int_attr(name)
    }
}

impl Op for ManifestOp {
    fn name(&self) -> &str {
        &self.def.checked.manifest.op_type
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let c = &self.def.checked;
        let m = &c.manifest;
        let names: Vec<&str> = m.inputs.iter().map(|i| i.name.as_str()).collect();
        if inputs.len() != m.inputs.len() {
            return Err(OpError::invalid(format!("expected {} inputs ({}), found {}", m.inputs.len(), names.join(", "), inputs.len())));
        }
        for (i, (a, allowed)) in inputs.iter().zip(&c.input_dtypes).enumerate() {
            let a = a.ok_or_else(|| OpError::input(i, format!("'{}' is required", names[i])))?;
            if !a.ty.is_tensor() {
                return Err(OpError::input(i, format!("'{}' must be a tensor, found {}", names[i], a.ty)));
            }
            if !allowed.contains(&a.dtype()) {
                let list: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
                return Err(OpError::input(i, format!("'{}' has dtype {}; the manifest allows {}", names[i], a.dtype(), list.join(", "))));
            }
        }
        let mut out = Vec::new();
        for ((o, shape), dtype) in m.outputs.iter().zip(&c.shapes).zip(&c.dtypes) {
            let dims = match shape {
                ShapeRule::SameAs(i) => inputs[*i].expect("checked above").dims().to_vec(),
                ShapeRule::Dims(es) => es
                    .iter()
                    .map(|e| {
                        let v = self.eval(e, inputs, &[])?;
                        usize::try_from(v).map_err(|_| OpError::invalid(format!("output '{}': dim '{e}' is {v}, not a size", o.name)))
                    })
                    .collect::<Result<Vec<_>>>()?,
            };
            let dtype = match dtype {
                DTypeRule::SameAs(i) => inputs[*i].expect("checked above").dtype(),
                DTypeRule::Fixed(d) => *d,
            };
            out.push(TensorType::new(dtype, dims));
        }
        Ok(out)
    }

    fn cost(&self, inputs: &[Option<Arg>], outputs: &[TensorType]) -> Cost {
        let flops = match &self.def.checked.flops {
            Some(e) => self.eval(e, inputs, outputs).map_or(0, |v| v.max(0) as u64),
            None => outputs.iter().map(|o| o.len() as u64).sum(),
        };
        Cost { flops, bytes: Cost::io_bytes(inputs, outputs) }
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        self.cpu.as_ref().map(|k| k as &dyn CpuKernel)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        self.def.source.wgsl.as_ref().map(|_| self as &dyn WgslKernel)
    }
}

impl WgslKernel for ManifestOp {
    fn params(&self, _inputs: &[Option<Arg>], _outputs: &[TensorType]) -> Vec<TuneParam> {
        let w = self.def.checked.manifest.wgsl.as_ref().expect("a WGSL kernel has its section");
        if w.tune_workgroup_sizes.is_empty() {
            vec![]
        } else {
            vec![TuneParam { name: "workgroup", default: w.workgroup_size, candidates: w.tune_workgroup_sizes.clone() }]
        }
    }

    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let c = &self.def.checked;
        let w = c.manifest.wgsl.as_ref().expect("a WGSL kernel has its section");
        let (path, src) = self.def.source.wgsl.as_ref().expect("a WGSL kernel has its source");
        let workgroup = self.params(inputs, outputs).first().map_or(w.workgroup_size, |p| tune.get(p));
        let n = match &c.invocations {
            Some(e) => self.eval(e, inputs, outputs)?,
            None => outputs[0].len() as i64,
        };
        let n = u32::try_from(n).map_err(|_| OpError::invalid(format!("{n} invocations: expected 0..=4294967295")))?;
        let (grid, _) = crate::wgsl::grid_1d(n as usize, workgroup);
        let values = self.values(inputs, outputs);
        let attrs: Vec<(&str, &Attr)> = self.attrs.iter().map(|(n, a)| (n.as_str(), a)).collect();
        let prelude = wgsl::prelude(&values, &attrs, workgroup, n as u64, grid[0] as u64 * workgroup as u64).map_err(OpError::invalid)?;
        let source = format!("{src}{prelude}");
        wgsl::check(&source, src.len(), path, &w.entry_point, &values, c.manifest.inputs.len(), workgroup).map_err(OpError::Invalid)?;
        let bindings = (0..inputs.len()).map(crate::Binding::Input).chain((0..outputs.len()).map(crate::Binding::Output)).collect();
        Ok(WgslProgram::single(crate::Dispatch { label: format!("{}.{}", c.manifest.domain, c.manifest.op_type), source, entry_point: w.entry_point.clone(), workgroups: grid, bindings }))
    }
}

#[cfg(test)]
mod tests;
