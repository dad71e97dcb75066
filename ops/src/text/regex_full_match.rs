//! RegexFullMatch (opset 20): true where the whole string matches `pattern`.
//!
//! The spec names RE2's syntax; Kiln uses the `regex` crate, whose syntax and
//! guarantees (linear time; no backreferences or look-around) are RE2's, with one
//! difference in meaning: `\d`, `\w`, `\s` and `\b` are Unicode-aware (RE2's are
//! ASCII); write `(?-u:\w)` or `[0-9]` for the ASCII classes. Patterns are compiled
//! once, when the node is created; an invalid one is an error naming the attribute.
use super::expect_strings;
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::{Arg, Op, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor};

#[derive(Debug)]
pub struct RegexFullMatch {
    /// The pattern anchored at both ends.
    regex: regex::Regex,
}

impl Op for RegexFullMatch {
    fn name(&self) -> &str {
        "RegexFullMatch"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        expect_strings(inputs, 0)?;
        Ok(vec![TensorType::new(DType::Bool, required(inputs, 0)?.dims())])
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

impl CpuKernel for RegexFullMatch {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        let matches: Vec<bool> = x.as_strings()?.iter().map(|s| self.regex.is_match(s)).collect();
        outputs[0] = Tensor::from_bools(x.dims(), &matches)?;
        Ok(())
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "RegexFullMatch", |spec| {
        let pattern = spec.string_opt("pattern")?.ok_or_else(|| spec.bad("pattern", "required"))?;
        let regex = regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| spec.bad("pattern", format!("{pattern:?} is not a valid regular expression: {e}")))?;
        Ok(Box::new(RegexFullMatch { regex }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    #[test]
    fn whole_strings_match() {
        let x = strs(&[2, 2], &["account@gmail.com", "account@hotmail.com", "not email", "a2@yahoo.com"]);
        let got = Case::new("RegexFullMatch").opset(20).attr("pattern", string(r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)")).input(x).run_cpu().unwrap();
        assert_eq!(got[0].as_slice::<u8>().unwrap(), &[1, 0, 0, 1]);
        // A match of a part is not a full match; alternation stays inside the anchors.
        let got = Case::new("RegexFullMatch").opset(20).attr("pattern", string("a|b")).input(strs(&[3], &["a", "ab", "xb"])).run_cpu().unwrap();
        assert_eq!(got[0].as_slice::<u8>().unwrap(), &[1, 0, 0]);
        let e = Case::new("RegexFullMatch").opset(20).attr("pattern", string("(")).input(strs(&[1], &["a"])).run_cpu().unwrap_err().to_string();
        assert!(e.contains("pattern"), "{e}");
        assert!(Case::new("RegexFullMatch").opset(20).input(strs(&[1], &["a"])).run_cpu().is_err());
    }
}
