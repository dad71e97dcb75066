//! `kiln._kiln`, the native half of Kiln's Python package (`kiln/__init__.py` is the
//! other): sessions over ONNX models or `.kiln` artifacts, numpy arrays in and out
//! through the buffer protocol, runs with the GIL released, Kiln's errors as
//! `kiln.KilnError`.

use kiln_graph::{DType, Dim, Tensor, Value};
use kiln_runtime::{DeviceChoice, Session as Inner, SessionOptions};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use pyo3::{create_exception, ffi};
use std::ffi::{c_int, CString};
use std::path::PathBuf;
use std::sync::Arc;

create_exception!(kiln, KilnError, PyException, "An error from Kiln: a model, an input or a device that is not what was expected.");

fn kiln_err(e: impl std::fmt::Display) -> PyErr {
    KilnError::new_err(e.to_string())
}

/// numpy's name of a dtype.
fn numpy_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F64 => "float64",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        DType::String => "str",
        other => other.name(),
    }
}

/// An input or output of a model: its name, numpy dtype name and shape (ints, and
/// strings for symbolic dims; `None` when not even the rank is known).
#[pyclass(frozen, module = "kiln", name = "ValueInfo")]
struct ValueInfo {
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    dtype: String,
    dims: Option<Vec<Dim>>,
}

#[pymethods]
impl ValueInfo {
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(dims) = &self.dims else { return Ok(py.None().into_bound(py)) };
        let items: Vec<Bound<'py, PyAny>> = dims
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => Ok(n.into_pyobject(py)?.into_any()),
                Dim::Sym(s) => Ok(s.into_pyobject(py)?.into_any()),
            })
            .collect::<PyResult<_>>()?;
        Ok(PyList::new(py, items)?.into_any())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("ValueInfo(name={:?}, dtype={:?}, shape={})", self.name, self.dtype, self.shape(py)?.repr()?))
    }
}

/// A model opened on a device. `Session(model, device="auto", threads=None,
/// custom_ops=None)`: `model` is a path (`.onnx` or `.kiln`) or the bytes of either.
#[pyclass(frozen, module = "kiln", name = "Session")]
struct Session {
    inner: Inner,
    inputs: Vec<Py<ValueInfo>>,
    outputs: Vec<Py<ValueInfo>>,
    output_names: Vec<String>,
}

#[pymethods]
impl Session {
    #[new]
    #[pyo3(signature = (model, device = "auto", threads = None, custom_ops = None))]
    fn new(py: Python<'_>, model: &Bound<'_, PyAny>, device: &str, threads: Option<usize>, custom_ops: Option<Vec<PathBuf>>) -> PyResult<Session> {
        let device: DeviceChoice = device.parse().map_err(kiln_err)?;
        let custom = custom_ops.unwrap_or_default().iter().map(|p| kiln_ops::custom::CustomOp::load(p).map_err(kiln_err)).collect::<PyResult<Vec<_>>>()?;
        let bytes: Option<Vec<u8>> = model.cast::<PyBytes>().ok().map(|b| b.as_bytes().to_vec());
        let path: Option<PathBuf> = if bytes.is_none() { Some(model.extract().map_err(|_| pyo3::exceptions::PyTypeError::new_err("model must be a path (str or os.PathLike) or bytes"))?) } else { None };
        if threads == Some(0) {
            return Err(pyo3::exceptions::PyValueError::new_err("threads must be at least 1 (None: one per core)"));
        }
        let inner = py
            .detach(|| -> Result<Inner, String> {
                let target = match kiln_runtime::device_kind(&device).map_err(|e| e.to_string())? {
                    kiln_runtime::DeviceKind::Cpu => kiln_compiler::passes::Target::Cpu,
                    kiln_runtime::DeviceKind::Gpu => kiln_compiler::passes::Target::Gpu,
                };
                let source = match (&path, &bytes) {
                    (Some(p), _) => kiln::load::Source::File(p),
                    (None, Some(b)) => kiln::load::Source::Bytes(b),
                    (None, None) => unreachable!("a path or bytes"),
                };
                let loaded = kiln::load::load(source, target, true, &custom).map_err(|e| e.to_string())?;
                Inner::new(loaded.graph, SessionOptions { device, threads, registry: loaded.registry, ..Default::default() }).map_err(|e| e.to_string())
            })
            .map_err(KilnError::new_err)?;
        let inputs = inner
            .inputs()
            .into_iter()
            .map(|(name, t)| Py::new(py, ValueInfo { name, dtype: numpy_name(t.dtype).into(), dims: Some(t.shape.0) }))
            .collect::<PyResult<_>>()?;
        let g = inner.graph();
        let outputs = inner
            .output_shapes()
            .into_iter()
            .zip(&g.outputs)
            .map(|((name, shape), &v)| Py::new(py, ValueInfo { name, dtype: g.values[v].ty.as_ref().map_or("unknown", |t| numpy_name(t.dtype)).into(), dims: shape.map(|s| s.0) }))
            .collect::<PyResult<_>>()?;
        let output_names = inner.output_names();
        Ok(Session { inner, inputs, outputs, output_names })
    }

    /// The model's inputs, in order.
    #[getter]
    fn inputs(&self, py: Python<'_>) -> Vec<Py<ValueInfo>> {
        self.inputs.iter().map(|v| v.clone_ref(py)).collect()
    }

    /// The model's outputs, in order.
    #[getter]
    fn outputs(&self, py: Python<'_>) -> Vec<Py<ValueInfo>> {
        self.outputs.iter().map(|v| v.clone_ref(py)).collect()
    }

    /// The device the session runs on.
    #[getter]
    fn device(&self) -> String {
        self.inner.device_name()
    }

    /// Runs the model: `feeds` maps input names to arrays (anything numpy.asarray
    /// takes); returns the outputs named in `output_names` (`None`: all), in that order,
    /// as numpy arrays. The GIL is released while the model runs.
    #[pyo3(signature = (output_names, feeds))]
    fn run<'py>(&self, py: Python<'py>, output_names: Option<Vec<String>>, feeds: &Bound<'py, PyDict>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let mut inputs: Vec<(String, Tensor)> = Vec::with_capacity(feeds.len());
        for (k, v) in feeds.iter() {
            let name: String = k.extract().map_err(|_| pyo3::exceptions::PyTypeError::new_err("feed names must be strings"))?;
            let t = tensor_from(py, &v).map_err(|e| KilnError::new_err(format!("input '{name}': {}", e.value(py))))?;
            inputs.push((name, t));
        }
        let picked: Vec<usize> = match &output_names {
            None => (0..self.output_names.len()).collect(),
            Some(names) => names
                .iter()
                .map(|n| self.output_names.iter().position(|o| o == n).ok_or_else(|| KilnError::new_err(format!("the model has no output '{n}' (outputs: {})", self.output_names.join(", ")))))
                .collect::<PyResult<_>>()?,
        };
        let results = py.detach(|| {
            let refs: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
            self.inner.run(&refs)
        });
        drop(inputs);
        let mut results: Vec<Option<Tensor>> = results.map_err(kiln_err)?.into_iter().map(Some).collect();
        // Each output moves to numpy without a copy; a name asked for twice is copied
        // for its earlier uses.
        (0..picked.len())
            .map(|k| {
                let i = picked[k];
                let last = !picked[k + 1..].contains(&i);
                let t = if last { results[i].take() } else { results[i].clone() };
                to_python(py, t.expect("taken at its last use only"))
            })
            .collect()
    }

    fn __repr__(&self) -> String {
        format!("kiln.Session(device={:?}, inputs={:?}, outputs={:?})", self.inner.device_name(), self.inner.inputs().iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(), self.output_names)
    }
}

/// Holds a Python buffer view open (and its object alive) while a tensor reads it in
/// place.
struct HeldBuffer {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the view's memory stays valid while the view is held; it is only read, and
// released under the GIL.
unsafe impl Send for HeldBuffer {}
unsafe impl Sync for HeldBuffer {}

impl AsRef<[u8]> for HeldBuffer {
    fn as_ref(&self) -> &[u8] {
        if self.view.len == 0 {
            return &[];
        }
        // SAFETY: an open C-contiguous view of `len` bytes at `buf`.
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, self.view.len as usize) }
    }
}

impl Drop for HeldBuffer {
    fn drop(&mut self) {
        // SAFETY: the view was filled by PyObject_GetBuffer and is released once.
        Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
}

/// The dtype of a buffer-protocol format and item size (native byte order only).
fn dtype_of_format(format: &str, itemsize: usize) -> Option<DType> {
    let f = format.trim_start_matches(['@', '=', '<', '|']);
    Some(match (f, itemsize) {
        ("f", 4) => DType::F32,
        ("d", 8) => DType::F64,
        ("e", 2) => DType::F16,
        ("b", 1) => DType::I8,
        ("B", 1) => DType::U8,
        ("h", 2) => DType::I16,
        ("H", 2) => DType::U16,
        ("i" | "l", 4) => DType::I32,
        ("I" | "L", 4) => DType::U32,
        ("l" | "q", 8) => DType::I64,
        ("L" | "Q", 8) => DType::U64,
        ("?", 1) => DType::Bool,
        _ => return None,
    })
}

/// A tensor over a Python object's values: read in place through the buffer protocol
/// when the values are large (a plan may keep small inputs as part of its key, so those
/// are copied); other objects go through `numpy.ascontiguousarray` first.
fn tensor_from(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: `view` is a zeroed Py_buffer for the call to fill.
    let got = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_FORMAT) };
    if got != 0 {
        let _ = PyErr::take(py);
        // Not a C-contiguous buffer: numpy makes one (lists, strided views, scalars).
        let np = py.import("numpy")?;
        let arr = np.call_method1("ascontiguousarray", (obj,))?;
        if arr.getattr("dtype")?.getattr("kind")?.extract::<String>()? == "U" {
            return string_tensor(&arr);
        }
        if arr.is(obj) {
            return Err(KilnError::new_err("does not expose its values as a buffer"));
        }
        return tensor_from(py, &arr);
    }
    let held = HeldBuffer { view };
    let v = &held.view;
    // SAFETY: an open view with a format (PyBUF_FORMAT) and ndim dims in `shape`.
    let format = if v.format.is_null() { "B".to_string() } else { unsafe { std::ffi::CStr::from_ptr(v.format) }.to_string_lossy().into_owned() };
    let dims: Vec<usize> = if v.ndim == 0 || v.shape.is_null() { vec![] } else { unsafe { std::slice::from_raw_parts(v.shape, v.ndim as usize) }.iter().map(|&d| d as usize).collect() };
    let dtype = dtype_of_format(&format, v.itemsize as usize).ok_or_else(|| KilnError::new_err(format!("buffer format '{format}' (item size {}) is not a dtype Kiln takes (native byte order: float16/32/64, int8..64, uint8..64, bool)", v.itemsize)))?;
    let len = dims.iter().product::<usize>();
    let small = if dtype.is_float() { len <= kiln_runtime::MAX_FLOAT_VALUE_INPUT } else { len <= kiln_runtime::MAX_VALUE_INPUT };
    if small {
        return Tensor::from_bytes(dtype, &dims, held.as_ref()).map_err(kiln_err);
    }
    Tensor::from_shared(dtype, &dims, Arc::new(held), 0).map_err(kiln_err)
}

fn string_tensor(arr: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let dims: Vec<usize> = arr.getattr("shape")?.extract()?;
    let items: Vec<String> = arr.call_method0("ravel")?.call_method0("tolist")?.extract()?;
    Tensor::from_strings(&dims, items).map_err(kiln_err)
}

/// An output's values, exposed to numpy through the buffer protocol without a copy.
#[pyclass(frozen, module = "kiln")]
struct OutputBuffer {
    /// Owns the memory `ptr` points into.
    _owner: Tensor,
    ptr: usize,
    shape: Vec<ffi::Py_ssize_t>,
    strides: Vec<ffi::Py_ssize_t>,
    format: CString,
    itemsize: usize,
}

#[pymethods]
impl OutputBuffer {
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, _flags: c_int) -> PyResult<()> {
        let me = slf.get();
        let len: usize = me.shape.iter().product::<ffi::Py_ssize_t>() as usize * me.itemsize;
        // SAFETY: `view` is the caller's Py_buffer to fill; the pointers stay valid while
        // the view holds a reference to `slf` (set in `obj`).
        unsafe {
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).buf = me.ptr as *mut std::ffi::c_void;
            (*view).len = len as ffi::Py_ssize_t;
            (*view).readonly = 0;
            (*view).itemsize = me.itemsize as ffi::Py_ssize_t;
            (*view).format = me.format.as_ptr() as *mut _;
            (*view).ndim = me.shape.len() as c_int;
            (*view).shape = me.shape.as_ptr() as *mut _;
            (*view).strides = me.strides.as_ptr() as *mut _;
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// A numpy array (or a list, or None, for sequences and optionals) over an output.
fn to_python<'py>(py: Python<'py>, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    let np = py.import("numpy")?;
    if let Some(v) = t.composite() {
        return match v {
            Value::Tensor(t) => to_python(py, t.clone()),
            Value::Sequence { tensors, .. } => Ok(PyList::new(py, tensors.iter().map(|t| to_python(py, t.clone())).collect::<PyResult<Vec<_>>>()?)?.into_any()),
            Value::Optional { value: None, .. } => Ok(py.None().into_bound(py)),
            Value::Optional { value: Some(v), .. } => to_python(py, Tensor::from_value((**v).clone())),
        };
    }
    if t.dtype() == DType::String {
        let items = t.as_strings().map_err(kiln_err)?.to_vec();
        let arr = np.call_method("array", (items,), Some(&[("dtype", np.getattr("object")?)].into_py_dict(py)?))?;
        return arr.call_method1("reshape", (t.dims().to_vec(),));
    }
    // numpy has no bfloat16: widened to float32.
    let mut t = if t.dtype() == DType::BF16 { Tensor::from_vec(t.dims(), t.to_f64_vec().iter().map(|&v| v as f32).collect()).map_err(kiln_err)? } else { t };
    let format = match t.dtype() {
        DType::F32 => "f",
        DType::F64 => "d",
        DType::F16 => "e",
        DType::I8 => "b",
        DType::U8 => "B",
        DType::I16 => "h",
        DType::U16 => "H",
        DType::I32 => "i",
        DType::U32 => "I",
        DType::I64 => "q",
        DType::U64 => "Q",
        DType::Bool => "?",
        other => return Err(KilnError::new_err(format!("an output of dtype {other} has no numpy equivalent"))),
    };
    let itemsize = t.dtype().size();
    let dims = t.dims().to_vec();
    let shape: Vec<ffi::Py_ssize_t> = dims.iter().map(|&d| d as ffi::Py_ssize_t).collect();
    let mut strides = vec![itemsize as ffi::Py_ssize_t; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1].max(1) as ffi::Py_ssize_t;
    }
    // Owned by this tensor alone from here (a shared one, such as a weight, is copied).
    let ptr = t.bytes_mut().as_mut_ptr() as usize;
    let buffer = Bound::new(py, OutputBuffer { _owner: t, ptr, shape, strides, format: CString::new(format).expect("no NUL"), itemsize })?;
    np.call_method1("asarray", (buffer,))
}

use pyo3::types::IntoPyDict;

/// The CPU and every GPU adapter Kiln finds, as JSON (`kiln.devices()` parses it).
#[pyfunction]
fn _devices_json() -> PyResult<String> {
    serde_json::to_string(&kiln_runtime::list_devices()).map_err(kiln_err)
}

/// Compiles an ONNX model into a `.kiln` artifact (see `kiln.compile`).
#[pyfunction]
#[pyo3(signature = (model, output, device = "auto", fix = None, custom_ops = None))]
fn _compile(py: Python<'_>, model: PathBuf, output: PathBuf, device: &str, fix: Option<std::collections::HashMap<String, usize>>, custom_ops: Option<Vec<PathBuf>>) -> PyResult<usize> {
    let device: DeviceChoice = device.parse().map_err(kiln_err)?;
    let custom = custom_ops.unwrap_or_default().iter().map(|p| kiln_ops::custom::CustomOp::load(p).map_err(kiln_err)).collect::<PyResult<Vec<_>>>()?;
    let fix = fix.unwrap_or_default();
    py.detach(|| -> Result<usize, String> {
        let target = match kiln_runtime::device_kind(&device).map_err(|e| e.to_string())? {
            kiln_runtime::DeviceKind::Cpu => kiln_compiler::passes::Target::Cpu,
            kiln_runtime::DeviceKind::Gpu => kiln_compiler::passes::Target::Gpu,
        };
        let compiled = kiln::load::compile(&model, target, &fix, &custom, &Default::default()).map_err(|e| e.to_string())?;
        // Checked on the device before anything is written.
        Inner::new(compiled.graph.clone(), SessionOptions { device: device.clone(), registry: compiled.registry.clone(), ..Default::default() }).map_err(|e| e.to_string())?;
        let info = kiln_runtime::artifact::ArtifactInfo { device: device.to_string(), ..compiled.info };
        kiln_runtime::artifact::save(&output, &compiled.graph, &info).map_err(|e| e.to_string())?;
        Ok(compiled.graph.nodes.len())
    })
    .map_err(KilnError::new_err)
}

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("KilnError", m.py().get_type::<KilnError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Session>()?;
    m.add_class::<ValueInfo>()?;
    m.add_class::<OutputBuffer>()?;
    m.add_function(wrap_pyfunction!(_devices_json, m)?)?;
    m.add_function(wrap_pyfunction!(_compile, m)?)?;
    Ok(())
}
