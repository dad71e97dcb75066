//! StringSplit (opset 20): splits each string of `X` at `delimiter` into at most
//! `maxsplit + 1` parts (every part when `maxsplit` is absent or negative), as Python's
//! `str.split` does: with a delimiter, consecutive delimiters give empty parts and an
//! empty string gives one empty part; without one (absent or empty), runs of whitespace
//! separate, leading whitespace is dropped and an all-whitespace string has no parts
//! (after `maxsplit` splits, the rest is one part, its trailing whitespace kept).
//! Outputs: `Y` of shape `X.shape + [the most parts of any string]`, padded with empty
//! strings, and `Z` (int64, `X.shape`), each string's number of parts. `Y`'s shape
//! depends on the values of `X`: its inference needs them.
use super::expect_strings;
use crate::cpu::{self, CpuKernel};
use crate::op::{constant, required};
use crate::{Arg, Op, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct StringSplit {
    delimiter: Option<String>,
    maxsplit: Option<usize>,
}

impl StringSplit {
    fn split(&self, s: &str) -> Vec<String> {
        match (&self.delimiter, self.maxsplit) {
            (Some(d), None) => s.split(d.as_str()).map(str::to_string).collect(),
            (Some(d), Some(m)) => s.splitn(m.saturating_add(1), d.as_str()).map(str::to_string).collect(),
            (None, m) => split_whitespace(s, m),
        }
    }

    /// Every string's parts, and the most parts of any.
    fn parts(&self, x: &Tensor) -> Result<(Vec<Vec<String>>, usize)> {
        let parts: Vec<Vec<String>> = x.as_strings()?.iter().map(|s| self.split(s)).collect();
        let most = parts.iter().map(Vec::len).max().unwrap_or(0);
        Ok((parts, most))
    }
}

/// Python's `str.split(None, maxsplit)`.
fn split_whitespace(s: &str, maxsplit: Option<usize>) -> Vec<String> {
    let mut out = vec![];
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        if maxsplit == Some(out.len()) {
            out.push(rest.to_string());
            break;
        }
        match rest.find(char::is_whitespace) {
            None => {
                out.push(rest.to_string());
                break;
            }
            Some(i) => {
                out.push(rest[..i].to_string());
                rest = rest[i..].trim_start();
            }
        }
    }
    out
}

impl Op for StringSplit {
    fn name(&self) -> &str {
        "StringSplit"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_strings(inputs, 0)?;
        let dims = required(inputs, 0)?.dims().to_vec();
        let x = constant(inputs, 0, "the input of StringSplit (its output shape depends on its values)")?;
        let (_, most) = self.parts(x)?;
        let padded: Vec<usize> = dims.iter().copied().chain([most]).collect();
        Ok(vec![TensorType::new(DType::String, padded), TensorType::new(DType::I64, dims)])
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

impl CpuKernel for StringSplit {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let (parts, most) = self.parts(x)?;
        let counts: Vec<i64> = parts.iter().map(|p| p.len() as i64).collect();
        let mut padded = Vec::with_capacity(parts.len() * most);
        for p in parts {
            let n = p.len();
            padded.extend(p);
            padded.extend(std::iter::repeat_with(String::new).take(most - n));
        }
        let dims: Vec<usize> = x.dims().iter().copied().chain([most]).collect();
        outputs[0] = Tensor::from_strings(&dims, padded)?;
        if let Some(z) = outputs.get_mut(1) {
            *z = Tensor::from_slice(x.dims(), &counts)?;
        }
        Ok(())
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "StringSplit", |spec| {
        let delimiter = spec.string_opt("delimiter")?.filter(|d| !d.is_empty());
        let maxsplit = spec.int_opt("maxsplit")?.and_then(|m| usize::try_from(m).ok());
        Ok(Box::new(StringSplit { delimiter, maxsplit }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Attr;

    fn split(x: kiln_graph::Tensor, attrs: &[(&str, Attr)]) -> (Vec<usize>, Vec<String>, Vec<i64>) {
        let got = Case::new("StringSplit").opset(20).attrs(attrs).constant(x).outputs(2).run_cpu().unwrap();
        (got[0].dims().to_vec(), got[0].as_strings().unwrap().to_vec(), got[1].to_i64_vec().unwrap())
    }

    #[test]
    fn splits_like_python() {
        let x = strs(&[2], &["abc-d-e", "f--g"]);
        let (dims, y, z) = split(x.clone(), &[("delimiter", string("-"))]);
        assert_eq!((dims, z), (vec![2, 3], vec![3, 3]));
        assert_eq!(y, ["abc", "d", "e", "f", "", "g"].map(String::from));
        let (dims, y, z) = split(x, &[("delimiter", string("-")), ("maxsplit", Attr::Int(1))]);
        assert_eq!((dims, z), (vec![2, 2], vec![2, 2]));
        assert_eq!(y, ["abc", "d-e", "f", "-g"].map(String::from));
        // No delimiter: whitespace runs; the rest after maxsplit keeps its tail.
        let (dims, y, z) = split(strs(&[3], &["  a b\t c ", "", "x  y  "]), &[("maxsplit", Attr::Int(1))]);
        assert_eq!((dims, z), (vec![3, 2], vec![2, 0, 2]));
        assert_eq!(y, ["a", "b\t c ", "", "", "x", "y  "].map(String::from));
        let (dims, _, z) = split(strs(&[0], &[]), &[]);
        assert_eq!((dims, z), (vec![0, 0], vec![]));
        let (_, y, _) = split(strs(&[1], &[""]), &[("delimiter", string(","))]);
        assert_eq!(y, [""]);
    }

    #[test]
    fn its_shape_needs_the_values() {
        let e = Case::new("StringSplit").opset(20).input(strs(&[1], &["a b"])).outputs(2).op().unwrap();
        let t = crate::TensorType::new(kiln_graph::DType::String, vec![1]);
        let err = e.infer(&[Some(crate::Arg { ty: &t, value: None })]).unwrap_err();
        assert!(matches!(err, crate::OpError::NeedsValue { .. }), "{err}");
    }
}
