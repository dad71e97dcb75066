//! Kiln's C API: sessions from ONNX models or `.kiln` artifacts (a file or memory), their
//! inputs and outputs, runs with caller-owned buffers. `include/kiln.h` is generated from
//! this file by cbindgen (`tests/header.rs` keeps it current).
//!
//! Conventions: every function returns a [`KilnStatus`]; on failure
//! `kiln_last_error()` gives the message (per thread, valid until the thread's next call).
//! No panic crosses the boundary: one is caught and reported as `KILN_STATUS_PANIC`.
//! Dtypes are ONNX TensorProto codes (1 float, 6 int32, 7 int64, 9 bool, ...).
//!
//! Depends on kiln-graph, kiln-ops, kiln-runtime and kiln-compiler (ONNX models are
//! imported and optimised as the CLI does).
#![allow(clippy::missing_safety_doc)] // each function's doc comment says what it needs.

use kiln_graph::{DType, Dim, Tensor};
use kiln_runtime::{DeviceChoice, Session, SessionOptions};
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// Most dims a tensor of the C API has.
pub const KILN_MAX_RANK: usize = 8;

/// What a call did.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KilnStatus {
    Ok = 0,
    /// A null pointer, a bad string, an index out of range, a bad option.
    InvalidArgument = 1,
    /// The model does not load, import or compile (the message names the node or op).
    Model = 2,
    /// An input's name, dtype, shape or byte size is not what the model expects.
    Input = 3,
    /// The device cannot be opened, or does not exist.
    Device = 4,
    /// The run failed (the message names the node).
    Run = 5,
    /// An output buffer is too small: its `byte_size` now holds the size needed, its
    /// `dtype`, `rank` and `dims` the output's; nothing was written to it.
    BufferTooSmall = 6,
    /// Kiln panicked (a bug): the message says where.
    Panic = 7,
}

/// Options of a session; `kiln_session_options_default()` gives the defaults.
#[repr(C)]
pub struct KilnSessionOptions {
    /// "cpu", "gpu", "auto" (a hardware GPU if any, else the CPU), an adapter name or
    /// "gpu:N"; NULL: "auto".
    pub device: *const c_char,
    /// CPU worker threads; 0: one per core.
    pub threads: usize,
    /// Paths of custom-op manifests (docs/custom-ops.md) the model needs; may be NULL
    /// when `n_custom_ops` is 0.
    pub custom_ops: *const *const c_char,
    pub n_custom_ops: usize,
}

/// A model input or output: its name, dtype and dims (-1 for a symbolic dim; `rank` -1
/// when unknown). The name is owned by the session.
#[repr(C)]
pub struct KilnValueInfo {
    pub name: *const c_char,
    pub dtype: i32,
    pub rank: i32,
    pub dims: [i64; KILN_MAX_RANK],
}

/// A tensor in caller-owned memory.
///
/// As an input: `name`, `dtype`, `rank`, `dims` and `data` with `byte_size` bytes
/// (row-major, contiguous), read during the call only.
///
/// As an output: `name` (or NULL: the output at this position), `data` and its capacity
/// `byte_size`; the run writes the values and sets `dtype`, `rank`, `dims` and
/// `byte_size` (see `KILN_STATUS_BUFFER_TOO_SMALL`).
#[repr(C)]
pub struct KilnTensor {
    pub name: *const c_char,
    pub dtype: i32,
    pub rank: i32,
    pub dims: [i64; KILN_MAX_RANK],
    pub data: *mut c_void,
    pub byte_size: usize,
}

/// A session: an opaque handle.
pub struct KilnSession {
    session: Session,
    device: CString,
    inputs: Vec<(CString, i32, Option<Vec<i64>>)>,
    outputs: Vec<(CString, i32, Option<Vec<i64>>)>,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: impl Into<String>) {
    let msg = msg.into().replace('\0', " ");
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(msg).expect("NULs replaced"));
}

type Failure = (KilnStatus, String);

/// Runs `f`, catching panics; an error or panic is stored for `kiln_last_error`.
fn guard(f: impl FnOnce() -> Result<(), Failure>) -> KilnStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_error("");
            KilnStatus::Ok
        }
        Ok(Err((status, msg))) => {
            set_error(msg);
            status
        }
        Err(p) => {
            let what = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
            set_error(format!("Kiln panicked (a bug; please report it): {what}"));
            KilnStatus::Panic
        }
    }
}

fn invalid(msg: impl Into<String>) -> Failure {
    (KilnStatus::InvalidArgument, msg.into())
}

unsafe fn string<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: the caller passes a NUL-terminated string (the header says so).
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// The Kiln version, a static string.
#[no_mangle]
pub extern "C" fn kiln_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// The message of this thread's last failed call ("" after a success); valid until the
/// thread's next Kiln call.
#[no_mangle]
pub extern "C" fn kiln_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The default options: device "auto", one thread per core, no custom ops.
#[no_mangle]
pub extern "C" fn kiln_session_options_default() -> KilnSessionOptions {
    KilnSessionOptions { device: std::ptr::null(), threads: 0, custom_ops: std::ptr::null(), n_custom_ops: 0 }
}

use kiln::load::Source;

fn status_of(e: &kiln_runtime::RuntimeError) -> KilnStatus {
    use kiln_runtime::RuntimeError as E;
    match e {
        E::NoGpu(_) | E::GpuUnavailable(_) | E::Gpu(_) => KilnStatus::Device,
        E::UnknownInput { .. } | E::DuplicateInput(_) | E::MissingInput { .. } | E::InputMismatch { .. } => KilnStatus::Input,
        _ => KilnStatus::Model,
    }
}

unsafe fn open(source: Source, options: *const KilnSessionOptions) -> Result<KilnSession, Failure> {
    let defaults = kiln_session_options_default();
    // SAFETY: a non-null `options` points to a KilnSessionOptions (the header says so).
    let o = if options.is_null() { &defaults } else { unsafe { &*options } };
    let device: DeviceChoice = if o.device.is_null() {
        DeviceChoice::Auto
    } else {
        unsafe { string(o.device, "options.device") }?.parse().map_err(|e: String| invalid(format!("options.device: {e}")))?
    };
    if o.n_custom_ops > 0 && o.custom_ops.is_null() {
        return Err(invalid("options.custom_ops is NULL but n_custom_ops is not 0"));
    }
    let mut custom = Vec::new();
    for i in 0..o.n_custom_ops {
        // SAFETY: `custom_ops` holds `n_custom_ops` pointers (checked non-null above).
        let p = unsafe { string(*o.custom_ops.add(i), "options.custom_ops[i]") }?;
        custom.push(kiln_ops::custom::CustomOp::load(p).map_err(|e| (KilnStatus::Model, format!("custom op: {e}")))?);
    }
    let target = match kiln_runtime::device_kind(&device).map_err(|e| (status_of(&e), e.to_string()))? {
        kiln_runtime::DeviceKind::Cpu => kiln_compiler::passes::Target::Cpu,
        kiln_runtime::DeviceKind::Gpu => kiln_compiler::passes::Target::Gpu,
    };
    let kiln::load::Loaded { graph, registry, .. } = kiln::load::load(source, target, true, &custom).map_err(|e| (KilnStatus::Model, e.to_string()))?;
    let options = SessionOptions { device, threads: (o.threads > 0).then_some(o.threads), registry, ..Default::default() };
    let session = Session::new(graph, options).map_err(|e| (status_of(&e), e.to_string()))?;
    let dims_of = |shape: Option<&kiln_graph::Shape>| shape.map(|s| s.0.iter().map(|d| if let Dim::Fixed(n) = d { *n as i64 } else { -1 }).collect());
    let name = |n: &str| CString::new(n.replace('\0', " ")).expect("NULs replaced");
    let inputs = session.inputs().iter().map(|(n, t)| (name(n), t.dtype.onnx_code(), dims_of(Some(&t.shape)))).collect();
    let g = session.graph();
    let outputs = session
        .output_shapes()
        .iter()
        .zip(&g.outputs)
        .map(|((n, shape), &v)| (name(n), g.values[v].ty.as_ref().map_or(0, |t| t.dtype.onnx_code()), dims_of(shape.as_ref())))
        .collect();
    Ok(KilnSession { device: name(&session.device_name()), session, inputs, outputs })
}

unsafe fn create(source: Source, options: *const KilnSessionOptions, out: *mut *mut KilnSession) -> KilnStatus {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        let s = unsafe { open(source, options) }?;
        // SAFETY: `out` is a valid pointer to a pointer (checked non-null).
        unsafe { *out = Box::into_raw(Box::new(s)) };
        Ok(())
    })
}

/// Opens a session on an ONNX model (`.onnx`: imported and optimised for the device) or
/// a compiled artifact (`.kiln`). `options` may be NULL (the defaults). On success
/// `*out` holds the session; free it with `kiln_session_free`.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_create_from_file(path: *const c_char, options: *const KilnSessionOptions, out: *mut *mut KilnSession) -> KilnStatus {
    let p = match guard_value(|| unsafe { string(path, "path") }.map(|s| s.to_string())) {
        Ok(p) => p,
        Err(s) => return s,
    };
    unsafe { create(Source::File(Path::new(&p)), options, out) }
}

/// Opens a session on a model held in memory: ONNX protobuf bytes, or a `.kiln`
/// artifact's bytes (recognised by its magic). The bytes are copied or parsed during
/// the call; the caller may free them afterwards.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_create_from_memory(data: *const u8, len: usize, options: *const KilnSessionOptions, out: *mut *mut KilnSession) -> KilnStatus {
    if data.is_null() {
        set_error("data is NULL");
        return KilnStatus::InvalidArgument;
    }
    // SAFETY: `data` holds `len` readable bytes (the header says so).
    let bytes = unsafe { std::slice::from_raw_parts(data, len) };
    unsafe { create(Source::Bytes(bytes), options, out) }
}

fn guard_value<T>(f: impl FnOnce() -> Result<T, Failure>) -> Result<T, KilnStatus> {
    let mut v = None;
    let status = guard(|| {
        v = Some(f()?);
        Ok(())
    });
    v.ok_or(status)
}

/// Frees a session (NULL is ignored).
#[no_mangle]
pub unsafe extern "C" fn kiln_session_free(session: *mut KilnSession) {
    if !session.is_null() {
        // SAFETY: `session` came from `Box::into_raw` in a create function and is freed
        // once (the caller's duty, as with free()).
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(session) })));
    }
}

unsafe fn session_ref<'a>(s: *const KilnSession) -> Result<&'a KilnSession, Failure> {
    // SAFETY: a non-null session pointer came from a create function.
    unsafe { s.as_ref() }.ok_or_else(|| invalid("session is NULL"))
}

/// The device the session runs on (owned by the session), or NULL for a NULL session.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_device(session: *const KilnSession) -> *const c_char {
    unsafe { session.as_ref() }.map_or(std::ptr::null(), |s| s.device.as_ptr())
}

/// The number of model inputs (0 for a NULL session).
#[no_mangle]
pub unsafe extern "C" fn kiln_session_input_count(session: *const KilnSession) -> usize {
    unsafe { session.as_ref() }.map_or(0, |s| s.inputs.len())
}

/// The number of model outputs (0 for a NULL session).
#[no_mangle]
pub unsafe extern "C" fn kiln_session_output_count(session: *const KilnSession) -> usize {
    unsafe { session.as_ref() }.map_or(0, |s| s.outputs.len())
}

fn info(list: &[(CString, i32, Option<Vec<i64>>)], index: usize, what: &str, out: *mut KilnValueInfo) -> Result<(), Failure> {
    let (name, dtype, dims) = list.get(index).ok_or_else(|| invalid(format!("{what} index {index} is out of range (the model has {})", list.len())))?;
    if out.is_null() {
        return Err(invalid("out is NULL"));
    }
    let mut d = [0i64; KILN_MAX_RANK];
    let rank = match dims {
        Some(dims) if dims.len() <= KILN_MAX_RANK => {
            d[..dims.len()].copy_from_slice(dims);
            dims.len() as i32
        }
        Some(dims) => return Err(invalid(format!("{what} '{}' has rank {}; the C API handles rank {KILN_MAX_RANK} at most", name.to_string_lossy(), dims.len()))),
        None => -1,
    };
    // SAFETY: `out` points to a KilnValueInfo (checked non-null).
    unsafe { *out = KilnValueInfo { name: name.as_ptr(), dtype: *dtype, rank, dims: d } };
    Ok(())
}

/// Describes input `index` (0-based): name, dtype, dims.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_input_info(session: *const KilnSession, index: usize, out: *mut KilnValueInfo) -> KilnStatus {
    guard(|| info(&unsafe { session_ref(session) }?.inputs, index, "input", out))
}

/// Describes output `index` (0-based): name, dtype, dims (-1 where they depend on the
/// inputs' symbolic dims).
#[no_mangle]
pub unsafe extern "C" fn kiln_session_output_info(session: *const KilnSession, index: usize, out: *mut KilnValueInfo) -> KilnStatus {
    guard(|| info(&unsafe { session_ref(session) }?.outputs, index, "output", out))
}

fn dtype_of(code: i32, what: &str) -> Result<DType, Failure> {
    DType::from_onnx_code(code).filter(|d| *d != DType::String).ok_or_else(|| (KilnStatus::Input, format!("{what}: dtype code {code} is not a tensor dtype the C API takes (ONNX TensorProto codes: 1 float, 6 int32, 7 int64, ...)")))
}

/// Runs the model. `inputs` holds `n_inputs` tensors, one per model input (by name);
/// `outputs` holds `n_outputs` tensors: each names an output (or is NULL-named: the
/// output at its position) and gives the buffer to write it to. The session may run on
/// several threads at once.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_run(session: *const KilnSession, inputs: *const KilnTensor, n_inputs: usize, outputs: *mut KilnTensor, n_outputs: usize) -> KilnStatus {
    guard(|| {
        let s = unsafe { session_ref(session) }?;
        if (inputs.is_null() && n_inputs > 0) || (outputs.is_null() && n_outputs > 0) {
            return Err(invalid("inputs or outputs is NULL with a non-zero count"));
        }
        // SAFETY: the arrays hold the given counts of tensors (the header says so).
        let ins = if n_inputs == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(inputs, n_inputs) } };
        let outs = if n_outputs == 0 { &mut [][..] } else { unsafe { std::slice::from_raw_parts_mut(outputs, n_outputs) } };
        let mut tensors = Vec::with_capacity(ins.len());
        for (i, t) in ins.iter().enumerate() {
            let name = unsafe { string(t.name, &format!("inputs[{i}].name")) }?;
            let what = format!("input '{name}'");
            let dtype = dtype_of(t.dtype, &what)?;
            let rank = usize::try_from(t.rank).ok().filter(|&r| r <= KILN_MAX_RANK).ok_or_else(|| (KilnStatus::Input, format!("{what}: rank {} is outside 0..={KILN_MAX_RANK}", t.rank)))?;
            let dims = t.dims[..rank].iter().map(|&d| usize::try_from(d).map_err(|_| (KilnStatus::Input, format!("{what}: dim {d} is negative")))).collect::<Result<Vec<_>, _>>()?;
            let need = kiln_graph::size::bytes(dtype, &dims).map_err(|e| (KilnStatus::Input, format!("{what}: {e}")))?;
            if need != t.byte_size {
                return Err((KilnStatus::Input, format!("{what}: a {dtype} tensor of dims {dims:?} has {need} bytes, but byte_size is {}", t.byte_size)));
            }
            if t.data.is_null() && need > 0 {
                return Err(invalid(format!("{what}: data is NULL")));
            }
            // SAFETY: `data` holds `byte_size` readable bytes (the header says so).
            let bytes = if need == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(t.data as *const u8, need) } };
            tensors.push((name.to_string(), Tensor::from_bytes(dtype, &dims, bytes).map_err(|e| (KilnStatus::Input, format!("{what}: {e}")))?));
        }
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let results = s.session.run(&refs).map_err(|e| {
            let st = status_of(&e);
            (if st == KilnStatus::Model { KilnStatus::Run } else { st }, e.to_string())
        })?;
        // Match the caller's buffers to outputs, then fill in every one's type, then
        // copy (only when every buffer is large enough).
        let mut picked = Vec::with_capacity(outs.len());
        for (i, o) in outs.iter().enumerate() {
            let k = if o.name.is_null() {
                if i >= s.outputs.len() {
                    return Err(invalid(format!("outputs[{i}] has no name and the model has {} outputs", s.outputs.len())));
                }
                i
            } else {
                let name = unsafe { string(o.name, &format!("outputs[{i}].name")) }?;
                s.outputs.iter().position(|(n, _, _)| n.to_bytes() == name.as_bytes()).ok_or_else(|| {
                    let names: Vec<String> = s.outputs.iter().map(|(n, _, _)| format!("'{}'", n.to_string_lossy())).collect();
                    invalid(format!("outputs[{i}]: the model has no output '{name}' (outputs: {})", names.join(", ")))
                })?
            };
            picked.push(k);
        }
        let mut small = vec![];
        for (o, &k) in outs.iter_mut().zip(&picked) {
            let r = &results[k];
            let name = s.outputs[k].0.to_string_lossy();
            if !r.kind().is_tensor() || r.dtype() == DType::String {
                return Err((KilnStatus::Run, format!("output '{name}' is a {}, which the C API cannot return", if r.kind().is_tensor() { "string tensor".to_string() } else { r.kind().describe(&r.dtype().to_string()) })));
            }
            if r.rank() > KILN_MAX_RANK {
                return Err((KilnStatus::Run, format!("output '{name}' has rank {}; the C API handles rank {KILN_MAX_RANK} at most", r.rank())));
            }
            o.dtype = r.dtype().onnx_code();
            o.rank = r.rank() as i32;
            o.dims = [0; KILN_MAX_RANK];
            for (d, &n) in o.dims.iter_mut().zip(r.dims()) {
                *d = n as i64;
            }
            let need = r.bytes().len();
            if need > o.byte_size || (o.data.is_null() && need > 0) {
                small.push(format!("'{name}' needs {need} bytes, the buffer has {}", o.byte_size));
            }
            o.byte_size = o.byte_size.max(need);
        }
        if !small.is_empty() {
            for (o, &k) in outs.iter_mut().zip(&picked) {
                o.byte_size = results[k].bytes().len();
            }
            return Err((KilnStatus::BufferTooSmall, format!("output buffers too small: {} (byte_size now holds each output's size)", small.join("; "))));
        }
        for (o, &k) in outs.iter_mut().zip(&picked) {
            let b = results[k].bytes();
            if !b.is_empty() {
                // SAFETY: `data` holds at least `byte_size` >= b.len() writable bytes.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), o.data as *mut u8, b.len()) };
            }
            o.byte_size = b.len();
        }
        Ok(())
    })
}
