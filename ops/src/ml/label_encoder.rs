//! LabelEncoder (ai.onnx.ml 2 to 4): maps each element of `X` through a table of keys
//! to values, and elements that are no key to a default. Keys and values are string,
//! integer or float tensors, given as `keys_strings`/`keys_int64s`/`keys_floats`/
//! `keys_tensor` and `values_strings`/`values_int64s`/`values_floats`/`values_tensor`;
//! `X` has the keys' dtype, `Y` the values' dtype and `X`'s shape. The default is
//! `default_tensor` (one element), else `default_string` ("_Unused"), `default_int64`
//! (-1) or `default_float` (-0.0) by the values' dtype. Float keys match by value
//! (`-0.0` is `0.0`, every NaN matches a NaN key). The opset 1 form
//! (`classes_strings`) is not supported.
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor};
use std::collections::HashMap;

/// The keys, each with its index in the values.
#[derive(Debug)]
enum Table {
    Strings(HashMap<String, usize>),
    /// Integer keys by their i64 bits, float keys by `float_key`.
    Numbers(HashMap<u64, usize>),
}

#[derive(Debug)]
pub struct LabelEncoder {
    key_dtype: DType,
    table: Table,
    values: Tensor,
    /// One element of the values' dtype.
    default: Tensor,
}

/// A float's key: its f64 bits with `-0.0` as `0.0` and one NaN.
fn float_key(v: f64) -> u64 {
    if v.is_nan() {
        f64::NAN.to_bits()
    } else if v == 0.0 {
        0
    } else {
        v.to_bits()
    }
}

/// Every element's key (numbers only).
fn number_keys(t: &Tensor) -> Result<Vec<u64>> {
    if t.dtype().is_float() || t.dtype().is_narrow_float() {
        Ok(t.to_f64_vec().into_iter().map(float_key).collect())
    } else {
        Ok(t.to_i64_vec()?.into_iter().map(|v| v as u64).collect())
    }
}

impl LabelEncoder {
    /// Each element's index in the values, `None` for no key.
    fn lookup(&self, x: &Tensor) -> Result<Vec<Option<usize>>> {
        Ok(match &self.table {
            Table::Strings(m) => x.as_strings()?.iter().map(|s| m.get(s).copied()).collect(),
            Table::Numbers(m) => number_keys(x)?.iter().map(|k| m.get(k).copied()).collect(),
        })
    }
}

impl Op for LabelEncoder {
    fn name(&self) -> &str {
        "LabelEncoder"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let x = required(inputs, 0)?;
        if x.dtype() != self.key_dtype {
            return Err(OpError::input(0, format!("dtype {} is not the keys' dtype {}", x.dtype(), self.key_dtype)));
        }
        Ok(vec![TensorType::new(self.values.dtype(), x.dims())])
    }

    fn handles_strings(&self) -> bool {
        true
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn crate::WgslKernel> {
        None
    }
}

impl CpuKernel for LabelEncoder {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let found = self.lookup(x)?;
        outputs[0] = if let Ok(v) = self.values.as_strings() {
            let d = &self.default.as_strings()?[0];
            Tensor::from_strings(x.dims(), found.iter().map(|i| i.map_or(d, |i| &v[i]).clone()).collect())?
        } else {
            let size = self.values.dtype().size();
            let (v, d) = (self.values.bytes(), self.default.bytes());
            let mut bytes = Vec::with_capacity(found.len() * size);
            for i in found {
                bytes.extend_from_slice(i.map_or(d, |i| &v[i * size..(i + 1) * size]));
            }
            Tensor::from_bytes(self.values.dtype(), x.dims(), &bytes)?
        };
        Ok(())
    }
}

/// The tensor of `{prefix}_strings`, `{prefix}_int64s`, `{prefix}_floats` or
/// `{prefix}_tensor`, whichever the node has (exactly one).
fn table_attr(spec: &NodeSpec, prefix: &str) -> Result<Tensor> {
    let mut found = vec![];
    let (s, i, f, t) = (format!("{prefix}_strings"), format!("{prefix}_int64s"), format!("{prefix}_floats"), format!("{prefix}_tensor"));
    if let Some(v) = spec.strings_opt(&s)? {
        found.push(Tensor::from_strings(&[v.len()], v)?);
    }
    if let Some(v) = spec.ints_opt(&i)? {
        found.push(Tensor::from_slice(&[v.len()], &v)?);
    }
    if let Some(v) = spec.floats_opt(&f)? {
        found.push(Tensor::from_slice(&[v.len()], &v)?);
    }
    if let Some(v) = spec.tensor_opt(&t)? {
        found.push(v.reshaped(&[v.len()])?);
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(spec.bad(&t, format!("one of {s}, {i}, {f} or {t} is required"))),
        _ => Err(spec.bad(&t, format!("only one of {s}, {i}, {f} and {t} may be given"))),
    }
}

/// The default for values of `dtype`: `default_tensor`, else the attribute of its kind.
fn default_value(spec: &NodeSpec, dtype: DType) -> Result<Tensor> {
    if let Some(t) = spec.tensor_opt("default_tensor")? {
        if t.dtype() != dtype || t.len() != 1 {
            return Err(spec.bad("default_tensor", format!("expected one {dtype} element, found {}{:?}", t.dtype(), t.dims())));
        }
        return Ok(t.reshaped(&[1])?);
    }
    Ok(match dtype {
        DType::String => Tensor::from_strings(&[1], vec![spec.string("default_string", "_Unused")?])?,
        DType::I64 => Tensor::from_slice(&[1], &[spec.int("default_int64", -1)?])?,
        d if d.is_float() => Tensor::from_f64(d, &[1], &[spec.float("default_float", -0.0)? as f64])?,
        d => Tensor::from_f64(d, &[1], &[spec.int("default_int64", -1)? as f64])?,
    })
}

fn create(spec: &NodeSpec) -> Result<Box<dyn Op>> {
    if spec.has("classes_strings") {
        return Err(OpError::Unsupported("LabelEncoder of opset 1 (classes_strings); use keys_* and values_* (opset 2)".into()));
    }
    let keys = table_attr(spec, "keys")?;
    let values = table_attr(spec, "values")?;
    if keys.len() != values.len() {
        return Err(spec.bad("values", format!("{} values for {} keys", values.len(), keys.len())));
    }
    let table = match keys.as_strings() {
        Ok(k) => Table::Strings(k.iter().enumerate().rev().map(|(i, s)| (s.clone(), i)).collect()),
        Err(_) => Table::Numbers(number_keys(&keys)?.into_iter().enumerate().rev().map(|(i, k)| (k, i)).collect()),
    };
    let default = default_value(spec, values.dtype())?;
    Ok(Box::new(LabelEncoder { key_dtype: keys.dtype(), table, values, default }))
}

pub(crate) fn register(r: &mut Registry) {
    r.register("ai.onnx.ml", "LabelEncoder", create);
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType, Tensor};

    fn strings(v: &[&str]) -> Attr {
        Attr::Strings(v.iter().map(|s| s.to_string()).collect())
    }

    fn encoder(attrs: &[(&str, Attr)]) -> Case {
        Case::new("LabelEncoder").domain("ai.onnx.ml").opset(4).attrs(attrs)
    }

    #[test]
    fn strings_to_numbers_and_back() {
        let x = strs(&[5], &["a", "b", "d", "c", "g"]);
        let abc = ("keys_strings", strings(&["a", "b", "c"]));
        let got = encoder(&[abc.clone(), ("values_int64s", Attr::Ints(vec![0, 1, 2])), ("default_int64", Attr::Int(42))]).input(x.clone()).run_cpu().unwrap();
        assert_eq!(got[0].to_i64_vec().unwrap(), vec![0, 1, 42, 2, 42]);
        let got = encoder(&[abc.clone(), ("values_int64s", Attr::Ints(vec![0, 1, 2]))]).input(x.clone()).run_cpu().unwrap();
        assert_eq!(got[0].to_i64_vec().unwrap(), vec![0, 1, -1, 2, -1]);
        let v16 = Tensor::from_slice(&[3], &[0i16, 1, 2]).unwrap();
        let d16 = Tensor::from_slice(&[1], &[42i16]).unwrap();
        let got = encoder(&[abc, ("values_tensor", Attr::Tensor(v16)), ("default_tensor", Attr::Tensor(d16))]).input(x).run_cpu().unwrap();
        assert_eq!((got[0].dtype(), got[0].to_i64_vec().unwrap()), (DType::I16, vec![0, 1, 42, 2, 42]));
        let got = encoder(&[("keys_floats", Attr::Floats(vec![0.0, f32::NAN])), ("values_strings", strings(&["zero", "nan"]))])
            .input(f32s(&[3], &[-0.0, f32::NAN, 1.0]))
            .run_cpu()
            .unwrap();
        assert_eq!(got[0].as_strings().unwrap(), ["zero", "nan", "_Unused"]);
        let got = encoder(&[("keys_int64s", Attr::Ints(vec![7])), ("values_floats", Attr::Floats(vec![0.5]))]).input(i64_vec(&[7, 8])).run_cpu().unwrap();
        assert_eq!(got[0].as_slice::<f32>().unwrap()[0], 0.5);
        assert!(got[0].as_slice::<f32>().unwrap()[1].is_sign_negative());
    }

    #[test]
    fn malformed_tables_are_errors() {
        let x = strs(&[1], &["a"]);
        assert!(encoder(&[("keys_strings", strings(&["a"]))]).input(x.clone()).run_cpu().is_err());
        assert!(encoder(&[("keys_strings", strings(&["a"])), ("values_int64s", Attr::Ints(vec![1, 2]))]).input(x.clone()).run_cpu().is_err());
        let e = encoder(&[("keys_int64s", Attr::Ints(vec![1])), ("values_int64s", Attr::Ints(vec![1]))]).input(x).run_cpu().unwrap_err().to_string();
        assert!(e.contains("keys' dtype"), "{e}");
    }
}
