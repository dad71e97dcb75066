//! Tuning keys: what a measured choice depends on. A key is the op (domain and type),
//! its attributes in canonical text, its input types (dtype, dims, and whether constant;
//! small constants by value), the device's fingerprint, and the kernel's version. Two
//! steps with equal keys get the same choice; anything that could change the best
//! choice, or what a choice means, changes the key.
//!
//! Kernel version: for a WGSL kernel, a hash of the source it generates at its default
//! parameters (a changed generator changes it); for a CPU kernel, `kiln_ops::SOURCE_HASH`
//! (every source file of kiln-ops, hashed at build time), plus the op's name.
use super::hash;
use kiln_graph::{Attr, Node};
use kiln_ops::{Arg, WgslProgram};
use std::fmt::Write;

/// Constants up to this many elements are part of a key by value (shape arguments,
/// pads, scales); larger ones (weights) by type only.
const SMALL_CONSTANT: usize = 16;

/// The device a choice was measured on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceFingerprint {
    /// `cpu` or `gpu`.
    pub kind: &'static str,
    /// A short human-readable name (CPU model, adapter name).
    pub name: String,
    /// Everything that identifies the device, in canonical text.
    pub text: String,
}

impl DeviceFingerprint {
    /// This machine's CPU: vendor, model, ISA features and the thread count.
    pub fn cpu() -> DeviceFingerprint {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split_once(':').map(|(_, v)| v.trim().to_string()))
                .unwrap_or_default()
        };
        let vendor = field("vendor_id");
        let model = match field("model name") {
            m if m.is_empty() => std::env::consts::ARCH.to_string(),
            m => m,
        };
        let features = kiln_ops::cpu::CpuFeatures::get().names().join(",");
        let threads = rayon::current_num_threads();
        DeviceFingerprint {
            kind: "cpu",
            name: format!("{model} ({threads} threads)"),
            text: format!("cpu; vendor {vendor}; model {model}; {}; isa {features}; threads {threads}", std::env::consts::ARCH),
        }
    }

    /// A GPU adapter: vendor and device ids, backend, driver and driver version.
    pub fn gpu(info: &wgpu::AdapterInfo) -> DeviceFingerprint {
        DeviceFingerprint {
            kind: "gpu",
            name: format!("{} ({:?})", info.name, info.backend),
            text: format!(
                "gpu; vendor {:#06x}; device {:#06x}; backend {:?}; name {}; driver {}; driver info {}",
                info.vendor, info.device, info.backend, info.name, info.driver, info.driver_info
            ),
        }
    }

    /// 16 hex digits identifying the fingerprint.
    pub fn id(&self) -> String {
        hash::hex(self.text.as_bytes())
    }

    /// A file name stem for this device's database: kind, readable name, id.
    pub fn file_stem(&self) -> String {
        let mut name: String = self.name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
        while name.contains("--") {
            name = name.replace("--", "-");
        }
        let name: String = name.trim_matches('-').chars().take(40).collect();
        format!("{}-{}-{}", self.kind, name.trim_end_matches('-'), self.id())
    }
}

/// The kernel version of a generated WGSL program: a hash of its dispatches' sources,
/// entry points and grids.
pub fn wgsl_version(program: &WgslProgram) -> String {
    let mut text = String::new();
    for d in &program.dispatches {
        let _ = write!(text, "{}\0{}\0{:?}\0{:?}\0", d.source, d.entry_point, d.workgroups, d.bindings);
    }
    let _ = write!(text, "{:?}", program.scratch_bytes);
    format!("wgsl-{}", hash::hex(text.as_bytes()))
}

/// The kernel version of a CPU kernel of op `op_name`.
pub fn cpu_version(op_name: &str) -> String {
    format!("cpu-{}-{}", kiln_ops::SOURCE_HASH, hash::hex(op_name.as_bytes()))
}

/// Canonical text of a node's attributes (sorted by name; floats exact; tensors by
/// dtype, dims and a hash of their bytes).
pub fn attrs_text(node: &Node) -> String {
    let mut s = String::new();
    for (k, a) in &node.attrs {
        if !s.is_empty() {
            s.push(',');
        }
        let _ = match a {
            Attr::Int(v) => write!(s, "{k}={v}"),
            Attr::Float(v) => write!(s, "{k}={:08x}f", v.to_bits()),
            Attr::String(v) => write!(s, "{k}={v:?}"),
            Attr::Tensor(t) => write!(s, "{k}=tensor({}{:?}#{})", t.dtype(), t.dims(), hash::hex(t.bytes())),
            Attr::Ints(v) => write!(s, "{k}={v:?}"),
            Attr::Floats(v) => write!(s, "{k}=[{}]", v.iter().map(|f| format!("{:08x}f", f.to_bits())).collect::<Vec<_>>().join(",")),
            Attr::Strings(v) => write!(s, "{k}={v:?}"),
            Attr::Graph(g) => write!(s, "{k}=graph#{}", hash::hex(format!("{g:?}").as_bytes())),
            Attr::Type(t) => write!(s, "{k}=type({t})"),
        };
    }
    s
}

/// Canonical text of a step's inputs: `f32[1,3,8,8]` for a value computed at run time,
/// `const f32[16,3,3,3]` for a constant, `const i64[2]#HASH` for a small constant.
pub fn inputs_text(inputs: &[Option<Arg>]) -> String {
    let parts: Vec<String> = inputs
        .iter()
        .map(|a| match a {
            None => "none".into(),
            Some(a) => match a.value {
                None => format!("{}{:?}", a.dtype(), a.dims()),
                Some(t) if t.len() <= SMALL_CONSTANT => format!("const {}{:?}#{}", a.dtype(), a.dims(), hash::hex(t.bytes())),
                Some(_) => format!("const {}{:?}", a.dtype(), a.dims()),
            },
        })
        .collect();
    parts.join(",")
}

/// What one measured choice is keyed by.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TuneKey {
    /// `domain:op_type` (`:Conv` for the default domain).
    pub op: String,
    pub attrs: String,
    pub inputs: String,
    /// [`DeviceFingerprint::id`].
    pub device: String,
    /// [`wgsl_version`] or [`cpu_version`].
    pub kernel: String,
}

impl TuneKey {
    pub fn new(node: &Node, inputs: &[Option<Arg>], device: &DeviceFingerprint, kernel: String) -> TuneKey {
        TuneKey {
            op: format!("{}:{}", node.domain, node.op_type),
            attrs: attrs_text(node),
            inputs: inputs_text(inputs),
            device: device.id(),
            kernel,
        }
    }

    /// The key of a graph-level choice (which optional passes run): the model's content
    /// hash and the pass target in place of the op's inputs and attributes, `version`
    /// (the compiler's and the kernels' source hashes) in place of the kernel's.
    pub fn graph(model_hash: &str, target: &str, device: &DeviceFingerprint, version: String) -> TuneKey {
        TuneKey { op: "kiln:passes".into(), attrs: format!("target={target}"), inputs: format!("model#{model_hash}"), device: device.id(), kernel: version }
    }

    /// The canonical text the database stores: `op | attrs | inputs | device | kernel`.
    pub fn text(&self) -> String {
        format!("{} | {} | {} | {} | {}", self.op, self.attrs, self.inputs, self.device, self.kernel)
    }

    /// A short form for reports: op type and input types (without value hashes).
    pub fn summary(&self) -> String {
        let inputs: Vec<&str> = self.inputs.split(',').map(|p| p.split('#').next().unwrap_or(p)).collect();
        format!("{}({})", self.op.trim_start_matches(':'), inputs.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_graph::{DType, Tensor};
    use kiln_ops::TensorType;

    #[test]
    fn keys_change_with_what_changes_a_choice() {
        let mut node = Node { name: "n".into(), op_type: "Conv".into(), domain: String::new(), attrs: Default::default(), inputs: vec![], outputs: vec![] };
        node.attrs.insert("group".into(), Attr::Int(1));
        let x = TensorType::new(DType::F32, vec![1, 3, 8, 8]);
        let w = Tensor::zeros(DType::F32, &[4, 3, 3, 3]);
        let wt = TensorType::new(DType::F32, vec![4, 3, 3, 3]);
        let args = [Some(Arg { ty: &x, value: None }), Some(Arg { ty: &wt, value: Some(&w) })];
        let cpu = DeviceFingerprint::cpu();
        let k = TuneKey::new(&node, &args, &cpu, cpu_version("Conv"));
        assert!(k.text().contains("f32[1, 3, 8, 8],const f32[4, 3, 3, 3]"), "{}", k.text());
        assert_eq!(k, TuneKey::new(&node, &args, &cpu, cpu_version("Conv")));
        let mut other = node.clone();
        other.attrs.insert("group".into(), Attr::Int(3));
        assert_ne!(k, TuneKey::new(&other, &args, &cpu, cpu_version("Conv")));
        let y = TensorType::new(DType::F32, vec![2, 3, 8, 8]);
        let args2 = [Some(Arg { ty: &y, value: None }), args[1]];
        assert_ne!(k, TuneKey::new(&node, &args2, &cpu, cpu_version("Conv")));
        let other_dev = DeviceFingerprint { text: cpu.text.replace("threads", "threads 99"), ..cpu.clone() };
        assert_ne!(k.text(), TuneKey::new(&node, &args, &other_dev, cpu_version("Conv")).text());
        assert!(cpu.file_stem().starts_with("cpu-") && !cpu.file_stem().contains(' '), "{}", cpu.file_stem());
        // The CPU kernel version carries the hash of kiln-ops' sources.
        assert_eq!(kiln_ops::SOURCE_HASH.len(), 16);
        assert!(kiln_ops::SOURCE_HASH.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(cpu_version("Conv").contains(kiln_ops::SOURCE_HASH));
        assert_ne!(cpu_version("Conv"), cpu_version("Gemm"));
        // Summaries leave value hashes out.
        let small = Tensor::from_slice(&[2], &[1i64, 2]).unwrap();
        let st = TensorType::new(DType::I64, vec![2]);
        let k2 = TuneKey::new(&node, &[Some(Arg { ty: &st, value: Some(&small) })], &cpu, cpu_version("Conv"));
        assert!(k2.text().contains('#') && !k2.summary().contains('#'), "{}", k2.summary());
    }
}
