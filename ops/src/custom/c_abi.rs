//! The CPU side of a manifest op: a C function in a shared library, with the signature
//! of `include/kiln_custom_op.h` (the structs below mirror it).

use crate::{CpuKernel, OpError, Result};
use kiln_graph::{Attr, Tensor};
use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

/// A tensor as the C kernel sees it: row-major contiguous elements of `dtype` (ONNX
/// TensorProto codes); inputs are read-only.
#[repr(C)]
pub struct KilnTensorRef {
    pub data: *mut c_void,
    pub dtype: i32,
    pub rank: i32,
    pub dims: *const i64,
}

/// An attribute: `kind` is ONNX's AttributeProto type (1 float, 2 int, 3 string, 6
/// floats, 7 ints); the fields of other kinds are zero.
#[repr(C)]
pub struct KilnAttribute {
    pub name: *const c_char,
    pub kind: i32,
    pub i: i64,
    pub f: f64,
    pub s: *const c_char,
    pub ints: *const i64,
    pub floats: *const f64,
    pub len: i64,
}

/// `int32_t fn(inputs, n_inputs, outputs, n_outputs, attributes, n_attributes, error,
/// error_capacity)`: 0 on success, else non-zero with a NUL-terminated message in
/// `error`.
pub type KernelFn = unsafe extern "C" fn(*const KilnTensorRef, i64, *const KilnTensorRef, i64, *const KilnAttribute, i64, *mut c_char, i64) -> i32;

/// A loaded library and the kernel function it exports.
pub struct Library {
    // Keeps the code `function` points into mapped.
    _lib: libloading::Library,
    function: KernelFn,
}

impl Library {
    /// Loads `path` and finds `symbol` in it.
    pub fn open(path: &std::path::Path, symbol: &str) -> std::result::Result<Library, String> {
        // SAFETY: loading runs the library's initialisers; the user names the library
        // as the kernel of their op, as with onnxruntime's custom-op libraries.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        // SAFETY: the manifest declares the symbol as a kernel of the documented
        // signature (include/kiln_custom_op.h); a mismatch is the library's bug.
        let function = unsafe { lib.get::<KernelFn>(symbol.as_bytes()) }.map(|s| *s).map_err(|e| format!("{} does not export '{symbol}': {e}", path.display()))?;
        Ok(Library { _lib: lib, function })
    }
}

/// Owned attribute data, converted once per node.
struct OwnedAttr {
    name: CString,
    kind: i32,
    i: i64,
    f: f64,
    s: Option<CString>,
    ints: Vec<i64>,
    floats: Vec<f64>,
}

/// The CPU kernel of one node: the library's function and the node's attributes.
pub struct CKernel {
    library: Arc<Library>,
    op: String,
    attrs: Vec<OwnedAttr>,
}

impl CKernel {
    pub fn new(library: Arc<Library>, op: String, attrs: &[(String, Attr)]) -> Result<CKernel> {
        let cstr = |s: &str| CString::new(s).map_err(|_| OpError::invalid(format!("'{s}' contains a NUL byte")));
        let mut owned = Vec::new();
        for (name, a) in attrs {
            let mut o = OwnedAttr { name: cstr(name)?, kind: 0, i: 0, f: 0.0, s: None, ints: vec![], floats: vec![] };
            match a {
                Attr::Float(f) => (o.kind, o.f) = (1, *f as f64),
                Attr::Int(i) => (o.kind, o.i) = (2, *i),
                Attr::String(s) => (o.kind, o.s) = (3, Some(cstr(s)?)),
                Attr::Floats(v) => (o.kind, o.floats) = (6, v.iter().map(|&f| f as f64).collect()),
                Attr::Ints(v) => (o.kind, o.ints) = (7, v.clone()),
                other => return Err(OpError::Attr { attr: name.clone(), what: format!("a {} attribute cannot be passed to a C kernel", other.kind()) }),
            }
            owned.push(o);
        }
        Ok(CKernel { library, op, attrs: owned })
    }
}

impl CpuKernel for CKernel {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let in_dims: Vec<Vec<i64>> = inputs.iter().map(|t| t.map_or(vec![], |t| t.dims().iter().map(|&d| d as i64).collect())).collect();
        let out_dims: Vec<Vec<i64>> = outputs.iter().map(|t| t.dims().iter().map(|&d| d as i64).collect()).collect();
        let refs_in: Vec<KilnTensorRef> = inputs
            .iter()
            .zip(&in_dims)
            .map(|(t, d)| match t {
                Some(t) => KilnTensorRef { data: t.bytes().as_ptr() as *mut c_void, dtype: t.dtype().onnx_code(), rank: d.len() as i32, dims: d.as_ptr() },
                None => KilnTensorRef { data: std::ptr::null_mut(), dtype: 0, rank: -1, dims: std::ptr::null() },
            })
            .collect();
        let refs_out: Vec<KilnTensorRef> = outputs
            .iter_mut()
            .zip(&out_dims)
            .map(|(t, d)| KilnTensorRef { dtype: t.dtype().onnx_code(), rank: d.len() as i32, dims: d.as_ptr(), data: t.bytes_mut().as_mut_ptr() as *mut c_void })
            .collect();
        let attrs: Vec<KilnAttribute> = self
            .attrs
            .iter()
            .map(|a| KilnAttribute {
                name: a.name.as_ptr(),
                kind: a.kind,
                i: a.i,
                f: a.f,
                s: a.s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                ints: if a.ints.is_empty() { std::ptr::null() } else { a.ints.as_ptr() },
                floats: if a.floats.is_empty() { std::ptr::null() } else { a.floats.as_ptr() },
                len: a.ints.len().max(a.floats.len()) as i64,
            })
            .collect();
        let mut error = vec![0u8; 1024];
        // SAFETY: every pointer lives until the call returns: tensors' bytes (outputs
        // borrowed mutably, inputs shared and documented read-only), dims, attributes;
        // `error` has the capacity passed.
        let code = unsafe {
            (self.library.function)(
                refs_in.as_ptr(),
                refs_in.len() as i64,
                refs_out.as_ptr(),
                refs_out.len() as i64,
                attrs.as_ptr(),
                attrs.len() as i64,
                error.as_mut_ptr() as *mut c_char,
                error.len() as i64,
            )
        };
        if code != 0 {
            let end = error.iter().position(|&b| b == 0).unwrap_or(error.len());
            let msg = String::from_utf8_lossy(&error[..end]);
            return Err(OpError::invalid(format!("the CPU kernel of {} returned {code}{}", self.op, if msg.is_empty() { String::new() } else { format!(": {msg}") })));
        }
        Ok(())
    }
}
