//! TensorProto <-> [`Tensor`]: raw_data (copied once), the typed repeated fields
//! (including the int32_data packing of the 8/16-bit types), and external data files
//! resolved relative to the model's directory. Also reads and writes the serialized
//! TensorProto files (`input_0.pb`) of the ONNX test-data layout.

use super::error::ImportError;
use super::proto::{data_type_name, OptionalProto, SequenceProto, StringStringEntryProto, TensorProto, DATA_LOCATION_EXTERNAL, ELEM_SEQUENCE, ELEM_TENSOR};
use bytes::Bytes;
use kiln_graph::{narrow, size, DType, Tensor, Value, ValueKind, ValueType};
use prost::Message;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

/// Opens external data files relative to a model's directory, keeping each open while
/// a model is imported (many tensors usually share one file).
pub(crate) struct ExternalFiles {
    base: Option<PathBuf>,
    canonical_base: Option<PathBuf>,
    open: HashMap<PathBuf, File>,
}

impl ExternalFiles {
    pub(crate) fn new(base: Option<&Path>) -> Self {
        ExternalFiles { base: base.map(Path::to_path_buf), canonical_base: None, open: HashMap::new() }
    }

    /// The file `location` names, checked to lie inside the base directory.
    fn resolve(&mut self, tensor: &str, location: &str) -> Result<PathBuf, ImportError> {
        let err = |what: String| ImportError::ExternalData { name: tensor.to_string(), what };
        let rel = Path::new(location);
        let escapes = rel.is_absolute()
            || rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
        if location.is_empty() || escapes {
            return Err(err(format!(
                "location '{location}' is not a relative path inside the model's directory"
            )));
        }
        let Some(base) = &self.base else {
            return Err(err(format!(
                "the data is in file '{location}', but the model was not loaded from a directory"
            )));
        };
        let full = base.join(rel);
        let canonical = full.canonicalize().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                err(format!("file '{}' does not exist", full.display()))
            } else {
                err(format!("cannot open '{}': {e}", full.display()))
            }
        })?;
        if self.canonical_base.is_none() {
            let cb = base
                .canonicalize()
                .map_err(|e| err(format!("cannot open the model directory '{}': {e}", base.display())))?;
            self.canonical_base = Some(cb);
        }
        if !self.canonical_base.as_ref().is_some_and(|cb| canonical.starts_with(cb)) {
            return Err(err(format!("location '{location}' resolves outside the model's directory")));
        }
        Ok(canonical)
    }

    /// Reads `length` bytes at `offset` of the file into a new tensor.
    fn read(&mut self, p: &TensorProto, dtype: DType, dims: &[usize], n_bytes: usize) -> Result<Tensor, ImportError> {
        let name = p.name.as_str();
        let err = |what: String| ImportError::ExternalData { name: name.to_string(), what };
        let (mut location, mut offset, mut length) = (None, 0u64, None);
        for StringStringEntryProto { key, value } in &p.external_data {
            let number = || value.trim().parse::<u64>().map_err(|_| err(format!("{key} '{value}' is not a number")));
            match key.as_str() {
                "location" => location = Some(value.as_str()),
                "offset" => offset = number()?,
                "length" => length = Some(number()?),
                _ => {}
            }
        }
        let location = location.ok_or_else(|| err("no 'location' entry".into()))?;
        if let Some(len) = length {
            if len != n_bytes as u64 {
                return Err(err(format!(
                    "length {len} does not match the {n_bytes} bytes of a {dtype} tensor of shape {dims:?}"
                )));
            }
        }
        let path = self.resolve(name, location)?;
        if !self.open.contains_key(&path) {
            let f = super::file::open_regular(&path).map_err(|e| err(format!("cannot open '{}': {e}", path.display())))?;
            self.open.insert(path.clone(), f);
        }
        let file = self.open.get_mut(&path).expect("inserted above");
        let file_len = file.metadata().map_err(|e| err(format!("cannot read '{}': {e}", path.display())))?.len();
        if offset.checked_add(n_bytes as u64).is_none_or(|end| end > file_len) {
            return Err(err(format!(
                "'{}' has {file_len} bytes, too short for {n_bytes} bytes at offset {offset}",
                path.display()
            )));
        }
        let mut t = Tensor::try_zeros(dtype, dims).map_err(|e| err(e.to_string()))?;
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| file.read_exact(t.bytes_mut()))
            .map_err(|e| err(format!("reading {n_bytes} bytes at offset {offset} of '{}': {e}", path.display())))?;
        if dtype == DType::Bool {
            normalize_bools(t.bytes_mut());
        }
        Ok(t)
    }
}

fn normalize_bools(bytes: &mut [u8]) {
    for b in bytes {
        *b = (*b != 0) as u8;
    }
}

/// The Kiln dtype of an ONNX data type code, or a message saying why there is none.
pub(crate) fn dtype_of(code: i32) -> Result<DType, String> {
    DType::from_onnx_code(code).ok_or_else(|| match code {
        0 => "has no data type (UNDEFINED)".to_string(),
        c => format!("has data type {} ({c}), which Kiln does not support", data_type_name(c)),
    })
}

/// Converts a TensorProto; external data is read relative to `base_dir`.
pub fn tensor_from_proto(p: &TensorProto, base_dir: Option<&Path>) -> Result<Tensor, ImportError> {
    convert(p, &mut ExternalFiles::new(base_dir))
}

pub(crate) fn convert(p: &TensorProto, ext: &mut ExternalFiles) -> Result<Tensor, ImportError> {
    let bad = |what: String| ImportError::Tensor { name: p.name.clone(), what };
    let dtype = dtype_of(p.data_type).map_err(|what| ImportError::UnsupportedDtype(format!("tensor '{}' {what}", p.name)))?;
    let dims = size::dims_from_i64(dtype, &p.dims).map_err(|e| bad(e.to_string()))?;
    let n_bytes = size::bytes(dtype, &dims).map_err(|e| bad(e.to_string()))?;
    let n = n_bytes / dtype.size();
    if dtype == DType::String {
        return strings(p, &dims, n).map_err(bad);
    }

    // 4- and 2-bit types are packed in files, low bits first; Kiln holds a byte each.
    let per_byte = narrow::per_byte(dtype);
    if per_byte > 1 {
        let packed_len = n.div_ceil(per_byte);
        let packed = if p.data_location == DATA_LOCATION_EXTERNAL {
            ext.read(p, DType::U8, &[packed_len], packed_len)?.bytes().to_vec()
        } else if !p.raw_data.is_empty() || n == 0 {
            if p.raw_data.len() != packed_len {
                return Err(bad(format!(
                    "raw_data has {} bytes; a {dtype} tensor of shape {dims:?} packs into {packed_len}",
                    p.raw_data.len()
                )));
            }
            p.raw_data.to_vec()
        } else {
            // int32_data holds one packed byte per entry.
            if p.int32_data.len() != packed_len {
                return Err(bad(format!("int32_data has {} values; a {dtype} tensor of shape {dims:?} packs into {packed_len}", p.int32_data.len())));
            }
            p.int32_data.iter().map(|&x| x as u8).collect()
        };
        let elements = narrow::unpack(dtype, &packed, n).ok_or_else(|| bad(format!("too few packed bytes for {n} elements")))?;
        return Tensor::from_bytes(dtype, &dims, &elements).map_err(|e| bad(e.to_string()));
    }
    if p.data_location == DATA_LOCATION_EXTERNAL {
        return ext.read(p, dtype, &dims, n_bytes);
    }
    if !p.raw_data.is_empty() || n == 0 {
        if p.raw_data.len() != n_bytes {
            return Err(bad(format!(
                "raw_data has {} bytes; a {dtype} tensor of shape {dims:?} needs {n_bytes}",
                p.raw_data.len()
            )));
        }
        let mut t = Tensor::from_bytes(dtype, &dims, &p.raw_data).map_err(|e| bad(e.to_string()))?;
        if dtype == DType::Bool {
            normalize_bools(t.bytes_mut());
        }
        return Ok(t);
    }
    let count = |have: usize, field: &str| {
        if have == n {
            Ok(())
        } else {
            Err(bad(format!("{field} has {have} values; a tensor of shape {dims:?} needs {n}")))
        }
    };
    let built = match dtype {
        DType::F32 => {
            count(p.float_data.len(), "float_data")?;
            Tensor::from_slice(&dims, &p.float_data)
        }
        DType::F64 => {
            count(p.double_data.len(), "double_data")?;
            Tensor::from_slice(&dims, &p.double_data)
        }
        DType::I32 => {
            count(p.int32_data.len(), "int32_data")?;
            Tensor::from_slice(&dims, &p.int32_data)
        }
        DType::I64 => {
            count(p.int64_data.len(), "int64_data")?;
            Tensor::from_slice(&dims, &p.int64_data)
        }
        DType::U64 => {
            count(p.uint64_data.len(), "uint64_data")?;
            Tensor::from_slice(&dims, &p.uint64_data)
        }
        DType::U32 => {
            count(p.uint64_data.len(), "uint64_data")?;
            let v: Vec<u32> = p.uint64_data.iter().map(|&x| x as u32).collect();
            Tensor::from_slice(&dims, &v)
        }
        // 16-bit types (f16 and bf16 as bit patterns) live in the low bits of int32_data.
        DType::F16 | DType::BF16 | DType::I16 | DType::U16 => {
            count(p.int32_data.len(), "int32_data")?;
            let v: Vec<u16> = p.int32_data.iter().map(|&x| x as u16).collect();
            Tensor::from_bytes(dtype, &dims, bytemuck::cast_slice(&v))
        }
        // float8 bit patterns, one per int32_data entry.
        DType::I8 | DType::U8 | DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F8E8M0 => {
            count(p.int32_data.len(), "int32_data")?;
            let v: Vec<u8> = p.int32_data.iter().map(|&x| x as u8).collect();
            Tensor::from_bytes(dtype, &dims, &v)
        }
        DType::Bool => {
            count(p.int32_data.len(), "int32_data")?;
            let v: Vec<u8> = p.int32_data.iter().map(|&x| (x != 0) as u8).collect();
            Tensor::from_bytes(dtype, &dims, &v)
        }
        DType::F4E2M1 | DType::I4 | DType::U4 | DType::I2 | DType::U2 => unreachable!("packed dtypes were read above"),
        DType::String => unreachable!("string tensors were read above"),
    };
    built.map_err(|e| bad(e.to_string()))
}

/// A STRING tensor from `string_data` (the only place ONNX keeps strings), each
/// element valid UTF-8.
fn strings(p: &TensorProto, dims: &[usize], n: usize) -> Result<Tensor, String> {
    if p.data_location == DATA_LOCATION_EXTERNAL || !p.raw_data.is_empty() {
        return Err("a STRING tensor keeps its elements in string_data, not in raw or external data".into());
    }
    if p.string_data.len() != n {
        return Err(format!("string_data has {} values; a tensor of shape {dims:?} needs {n}", p.string_data.len()));
    }
    let values = p
        .string_data
        .iter()
        .enumerate()
        .map(|(i, s)| String::from_utf8(s.clone()).map_err(|_| format!("string_data[{i}] is not valid UTF-8")))
        .collect::<Result<Vec<String>, String>>()?;
    Tensor::from_strings(dims, values).map_err(|e| e.to_string())
}

/// A TensorProto holding `t` as raw_data (4- and 2-bit types packed; strings in string_data).
pub fn tensor_to_proto(name: &str, t: &Tensor) -> TensorProto {
    if let Ok(s) = t.as_strings() {
        return TensorProto {
            dims: t.dims().iter().map(|&d| d as i64).collect(),
            data_type: t.dtype().onnx_code(),
            name: name.to_string(),
            string_data: s.iter().map(|s| s.as_bytes().to_vec()).collect(),
            ..Default::default()
        };
    }
    let raw = if narrow::per_byte(t.dtype()) > 1 { Bytes::from(narrow::pack(t.dtype(), t.bytes())) } else { Bytes::copy_from_slice(t.bytes()) };
    TensorProto {
        dims: t.dims().iter().map(|&d| d as i64).collect(),
        data_type: t.dtype().onnx_code(),
        name: name.to_string(),
        raw_data: raw,
        ..Default::default()
    }
}

/// Reads a serialized TensorProto file (as in `test_data_set_0/input_0.pb`): its name
/// field and its tensor. External data is read relative to the file's directory.
pub fn read_tensor_pb(path: impl AsRef<Path>) -> Result<(String, Tensor), ImportError> {
    let path = path.as_ref();
    let bytes = super::file::read_regular(path).map_err(|source| ImportError::Io { path: path.to_path_buf(), error: source })?;
    let p = TensorProto::decode(Bytes::from(bytes)).map_err(|error| ImportError::Decode {
        source_name: path.display().to_string(),
        what: "tensor",
        error,
    })?;
    let t = tensor_from_proto(&p, path.parent())?;
    Ok((p.name, t))
}

/// Reads a serialized value file of the declared type `ty`: a TensorProto for a tensor,
/// a SequenceProto or an OptionalProto (of tensors) for a sequence or an optional,
/// whose value comes back as a composite tensor ([`Tensor::from_value`]). Its name
/// field and its value.
pub fn read_value_pb(path: impl AsRef<Path>, ty: &ValueType) -> Result<(String, Tensor), ImportError> {
    let path = path.as_ref();
    if ty.kind.is_tensor() {
        return read_tensor_pb(path);
    }
    let bytes = super::file::read_regular(path).map_err(|source| ImportError::Io { path: path.to_path_buf(), error: source })?;
    let decode = |what: &'static str, error| ImportError::Decode { source_name: path.display().to_string(), what, error };
    let mut ext = ExternalFiles::new(path.parent());
    if ty.kind == ValueKind::Sequence {
        let p = SequenceProto::decode(Bytes::from(bytes)).map_err(|e| decode("sequence", e))?;
        return Ok((p.name.clone(), Tensor::from_value(sequence_from_proto(&p, ty.dtype, &mut ext)?)));
    }
    let p = OptionalProto::decode(Bytes::from(bytes)).map_err(|e| decode("optional", e))?;
    let bad = |what: String| ImportError::Tensor { name: p.name.clone(), what };
    let element = ty.kind.element();
    let value = match (&p.tensor_value, &p.sequence_value) {
        (Some(t), None) if element.is_tensor() && p.elem_type == ELEM_TENSOR => Value::some(Value::Tensor(convert(t, &mut ext)?)),
        (None, Some(s)) if !element.is_tensor() && p.elem_type == ELEM_SEQUENCE => Value::some(sequence_from_proto(s, ty.dtype, &mut ext)?),
        (None, None) => Value::none(element, ty.dtype),
        _ => return Err(bad(format!("an optional of elem_type {} does not hold the declared {ty}", p.elem_type))),
    };
    Ok((p.name.clone(), Tensor::from_value(value)))
}

/// A SequenceProto of tensors of `dtype` (the declared one: an empty sequence has none).
fn sequence_from_proto(p: &SequenceProto, dtype: DType, ext: &mut ExternalFiles) -> Result<Value, ImportError> {
    let bad = |what: String| ImportError::Tensor { name: p.name.clone(), what };
    if !p.sequence_values.is_empty() || (p.elem_type != ELEM_TENSOR && !p.tensor_values.is_empty()) {
        return Err(bad(format!("a sequence of elem_type {}: only sequences of tensors are supported", p.elem_type)));
    }
    let tensors: Vec<Tensor> = p.tensor_values.iter().map(|t| convert(t, ext)).collect::<Result<_, _>>()?;
    if let Some(t) = tensors.iter().find(|t| t.dtype() != dtype) {
        return Err(bad(format!("holds a tensor of {}, declared a sequence of {dtype}", t.dtype())));
    }
    Ok(Value::sequence(dtype, tensors))
}

/// Writes `t` as a serialized TensorProto named `name` (raw_data encoding).
pub fn write_tensor_pb(path: impl AsRef<Path>, name: &str, t: &Tensor) -> Result<(), ImportError> {
    let path = path.as_ref();
    std::fs::write(path, tensor_to_proto(name, t).encode_to_vec())
        .map_err(|source| ImportError::Io { path: path.to_path_buf(), error: source })
}
