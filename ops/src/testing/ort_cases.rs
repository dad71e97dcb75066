//! Cases recorded from onnxruntime ([`super::msft_cases`], written by
//! scripts/gen_msft_op_cases.py): one node, its inputs, and the outputs onnxruntime
//! computed. [`OrtCase::case`] turns one into a [`Case`] (every output present), so the
//! same recordings check the CPU kernels here and every device in kiln-runtime's tests.
use super::{compare, Case, Input};
use kiln_graph::{Attr, Tensor};

/// An attribute value.
pub enum A {
    I(i64),
    F(f32),
    Ints(&'static [i64]),
}

/// A tensor: dims and values.
pub enum V {
    F32(&'static [usize], &'static [f32]),
    I32(&'static [usize], &'static [i32]),
    I64(&'static [usize], &'static [i64]),
}

impl V {
    pub fn tensor(&self) -> Tensor {
        match self {
            V::F32(d, v) => Tensor::from_slice(d, v),
            V::I32(d, v) => Tensor::from_slice(d, v),
            V::I64(d, v) => Tensor::from_slice(d, v),
        }
        .expect("a recorded tensor's values match its dims")
    }
}

pub struct OrtCase {
    pub name: &'static str,
    pub op: &'static str,
    pub domain: &'static str,
    pub attrs: &'static [(&'static str, A)],
    /// `None`: an omitted optional input.
    pub inputs: &'static [Option<V>],
    /// onnxruntime's outputs; `None`: an output the recorded node did not ask for.
    pub outputs: &'static [Option<V>],
}

impl OrtCase {
    /// The case with every input a run-time input and all recorded outputs.
    pub fn case(&self) -> Case {
        let attrs: Vec<(&str, Attr)> = self
            .attrs
            .iter()
            .map(|(k, a)| {
                let v = match a {
                    A::I(i) => Attr::Int(*i),
                    A::F(f) => Attr::Float(*f),
                    A::Ints(v) => Attr::Ints(v.to_vec()),
                };
                (*k, v)
            })
            .collect();
        let inputs = self.inputs.iter().map(|v| v.as_ref().map_or(Input::Omitted, |v| Input::Data(v.tensor())));
        Case::new(self.op).domain(self.domain).attrs(&attrs).inputs(inputs).outputs(self.outputs.len())
    }

    /// Compares `got` (one tensor per recorded output) with onnxruntime's outputs
    /// (relative L2 error at most `tol`); an error names the case and the output.
    pub fn check(&self, got: &[Tensor], tol: f64) -> Result<(), String> {
        for (k, want) in self.outputs.iter().enumerate() {
            let Some(want) = want else { continue };
            let g = got.get(k).ok_or_else(|| format!("{}: output {k} missing", self.name))?;
            let want = want.tensor();
            if g.dims() != want.dims() {
                return Err(format!("{}: output {k} has shape {:?}, onnxruntime's {:?}", self.name, g.dims(), want.dims()));
            }
            compare(g, &want, if want.dtype().is_float() { tol } else { 0.0 }).map_err(|e| format!("{}: output {k}: {e}", self.name))?;
        }
        Ok(())
    }
}

/// The recorded cases of `op`.
pub fn ort_cases(op: &str) -> impl Iterator<Item = &'static OrtCase> + '_ {
    super::msft_cases::CASES.iter().filter(move |c| c.op == op)
}

/// Every recorded case.
pub fn all_ort_cases() -> &'static [OrtCase] {
    super::msft_cases::CASES
}

/// Runs every recorded case of `op` on the CPU (validating its WGSL on the way) and
/// checks it against onnxruntime's outputs (relative L2 error at most `tol`); panics
/// naming the first case that differs. Returns the number of cases run.
pub fn check_ort_cases(op: &str, tol: f64) -> usize {
    let mut n = 0;
    for c in ort_cases(op) {
        let got = c.case().run_cpu().unwrap_or_else(|e| panic!("{}: {e}", c.name));
        c.check(&got, tol).unwrap_or_else(|e| panic!("{e}"));
        n += 1;
    }
    assert!(n > 0, "no recorded onnxruntime cases of {op}");
    n
}

/// The error creating `case`'s op gives (its attributes refused); panics if it is
/// accepted.
pub fn creation_error(case: &Case) -> String {
    match case.op() {
        Ok(_) => panic!("{} with {:?} was accepted", case.op_type, case.attrs),
        Err(e) => e.to_string(),
    }
}
