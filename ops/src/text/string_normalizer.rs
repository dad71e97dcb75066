//! StringNormalizer (opset 10): removes `stopwords` from a string tensor `[C]` or
//! `[1, C]` and changes case (`case_change_action` NONE, LOWER or UPPER; Unicode case
//! mapping). Stopwords match whole elements, exactly when `is_case_sensitive` is 1,
//! else after lowercasing both. When every element is removed the output is one empty
//! string (`[1]` or `[1, 1]`). With stopwords the output shape depends on the input's
//! values, so inference needs them; without, the shape is the input's (empty strings
//! are kept, as the spec says; the onnx reference drops them). `locale` may be empty or
//! an English one (`en_US`, `en-US`, `en_US.UTF-8`, `C`): other locales are refused
//! when the node is created, since their case rules (Turkish dotted i, ...) differ.
//! Accents are kept (the onnx reference strips them, the spec does not say so).
use super::expect_strings;
use crate::cpu::{self, CpuKernel};
use crate::op::{constant, required};
use crate::{Arg, Op, OpError, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor};
use std::collections::HashSet;

#[derive(Clone, Copy, Debug, PartialEq)]
enum CaseChange {
    None,
    Lower,
    Upper,
}

#[derive(Debug)]
pub struct StringNormalizer {
    case: CaseChange,
    case_sensitive: bool,
    /// Stopwords as compared: lowercased unless case-sensitive.
    stopwords: HashSet<String>,
}

/// Locales whose case rules are the Unicode default ones.
const LOCALES: [&str; 6] = ["", "C", "en", "en_US", "en-US", "en_US.UTF-8"];

impl StringNormalizer {
    /// Whether the element `s` is a stopword.
    fn is_stopword(&self, s: &str) -> bool {
        !self.stopwords.is_empty() && if self.case_sensitive { self.stopwords.contains(s) } else { self.stopwords.contains(&s.to_lowercase()) }
    }

    fn normalize(&self, x: &Tensor) -> Result<(Vec<usize>, Vec<String>)> {
        let rank = x.rank();
        let kept: Vec<String> = x
            .as_strings()?
            .iter()
            .filter(|s| !self.is_stopword(s))
            .map(|s| match self.case {
                CaseChange::None => s.clone(),
                CaseChange::Lower => s.to_lowercase(),
                CaseChange::Upper => s.to_uppercase(),
            })
            .collect();
        let kept = if kept.is_empty() && !x.is_empty() { vec![String::new()] } else { kept };
        let dims = if rank == 2 { vec![1, kept.len()] } else { vec![kept.len()] };
        Ok((dims, kept))
    }
}

/// Checks that `X` is `[C]` or `[1, C]`.
fn check_shape(dims: &[usize]) -> Result<()> {
    match dims {
        [_] | [1, _] => Ok(()),
        d => Err(OpError::input(0, format!("StringNormalizer takes a string tensor [C] or [1, C], found {d:?}"))),
    }
}

impl Op for StringNormalizer {
    fn name(&self) -> &str {
        "StringNormalizer"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_strings(inputs, 0)?;
        let x = required(inputs, 0)?;
        check_shape(x.dims())?;
        if self.stopwords.is_empty() {
            return Ok(vec![x.ty.clone()]);
        }
        let v = constant(inputs, 0, "the input of StringNormalizer with stopwords (its output shape depends on its values)")?;
        Ok(vec![TensorType::new(DType::String, self.normalize(v)?.0)])
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

impl CpuKernel for StringNormalizer {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        check_shape(x.dims())?;
        let (dims, y) = self.normalize(x)?;
        outputs[0] = Tensor::from_strings(&dims, y)?;
        Ok(())
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "StringNormalizer", |spec| {
        let case = match spec.string("case_change_action", "NONE")?.as_str() {
            "NONE" => CaseChange::None,
            "LOWER" => CaseChange::Lower,
            "UPPER" => CaseChange::Upper,
            other => return Err(spec.bad("case_change_action", format!("{other:?} is not NONE, LOWER or UPPER"))),
        };
        let locale = spec.string("locale", "")?;
        if !LOCALES.contains(&locale.as_str()) {
            return Err(OpError::Unsupported(format!("StringNormalizer locale {locale:?} (Kiln supports {})", LOCALES[1..].join(", "))));
        }
        let case_sensitive = spec.int("is_case_sensitive", 0)? != 0;
        let stopwords = spec.strings_opt("stopwords")?.unwrap_or_default().into_iter().map(|w| if case_sensitive { w } else { w.to_lowercase() }).collect();
        Ok(Box::new(StringNormalizer { case, case_sensitive, stopwords }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Attr;

    fn words(v: &[&str]) -> Attr {
        Attr::Strings(v.iter().map(|s| s.to_string()).collect())
    }

    fn normalize(x: kiln_graph::Tensor, attrs: &[(&str, Attr)]) -> (Vec<usize>, Vec<String>) {
        let got = Case::new("StringNormalizer").opset(10).attrs(attrs).constant(x).run_cpu().unwrap();
        (got[0].dims().to_vec(), got[0].as_strings().unwrap().to_vec())
    }

    #[test]
    fn removes_stopwords_and_changes_case() {
        let x = strs(&[1, 4], &["Monday", "tuesday", "monday", "Straße"]);
        let (dims, y) = normalize(x.clone(), &[("case_change_action", string("UPPER")), ("stopwords", words(&["monday"]))]);
        assert_eq!((dims, y), (vec![1, 2], vec!["TUESDAY".to_string(), "STRASSE".to_string()]));
        let (dims, y) = normalize(x.clone(), &[("is_case_sensitive", Attr::Int(1)), ("stopwords", words(&["monday"])), ("case_change_action", string("LOWER"))]);
        assert_eq!((dims, y), (vec![1, 3], ["monday", "tuesday", "straße"].map(String::from).to_vec()));
        let (dims, y) = normalize(x, &[]);
        assert_eq!((dims, y.len()), (vec![1, 4], 4));
        let (dims, y) = normalize(strs(&[2], &["monday", "monday"]), &[("is_case_sensitive", Attr::Int(1)), ("stopwords", words(&["monday"]))]);
        assert_eq!((dims, y), (vec![1], vec![String::new()]));
    }

    #[test]
    fn refuses_other_locales_and_shapes() {
        let e = Case::new("StringNormalizer").opset(10).attr("locale", string("tr_TR")).input(strs(&[1], &["I"])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("tr_TR"), "{e}");
        assert!(Case::new("StringNormalizer").opset(10).attr("case_change_action", string("TITLE")).input(strs(&[1], &["I"])).run_cpu().is_err());
        let e = Case::new("StringNormalizer").opset(10).input(strs(&[2, 1], &["a", "b"])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("[1, C]"), "{e}");
        assert_eq!(Case::new("StringNormalizer").opset(10).attr("locale", string("en_US")).input(strs(&[1], &["I"])).run_cpu().unwrap()[0].as_strings().unwrap(), ["I"]);
    }
}
