//! The cross-device runner: a [`Suite`] runs each [`Case`] as a one-node session on
//! every device ([`devices`]), compares every output with a reference (the CPU in f64
//! where the case has float inputs) at per-dtype tolerances, and reports all failures
//! at once; expected failures ([`EXPECTED_FAILURES`], [`Suite::expect_failure`]) must
//! fail, and one that passes fails the suite so that the list shrinks.
use super::devices::{devices, TestDevice};
use super::expected::{Expected, EXPECTED_FAILURES, NO_F64_REFERENCE};
use kiln_graph::{DType, Tensor};
use kiln_ops::testing::{compare, Case, Tolerance};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs one case on every device and panics on any failure.
pub fn check(case: Case, tol: Tolerance) {
    let mut s = Suite::new(&case.op_type.clone());
    s.check(case, tol);
    s.finish();
}

/// Cases run on every device, failures collected; [`Suite::finish`] reports them
/// (a suite dropped without `finish` panics, so none is forgotten).
pub struct Suite {
    name: String,
    expected: Vec<Expected>,
    failures: Vec<String>,
    unexpected_passes: Vec<String>,
    notes: Vec<String>,
    runs: usize,
    expected_failed: usize,
    finished: bool,
}

/// The outputs a case is checked against, and how they were computed.
struct Reference {
    outputs: Vec<Tensor>,
    /// Computed on the CPU from float inputs widened to f64 (else at the case's dtypes,
    /// in which case the CPU row is the reference itself).
    widened: bool,
}

impl Suite {
    pub fn new(name: &str) -> Suite {
        Suite { name: name.into(), expected: vec![], failures: vec![], unexpected_passes: vec![], notes: vec![], runs: 0, expected_failed: 0, finished: false }
    }

    /// States that cases whose label contains `case` fail on devices whose label
    /// contains `device` (in addition to [`EXPECTED_FAILURES`]).
    pub fn expect_failure(mut self, device: &'static str, case: &'static str, why: &'static str) -> Suite {
        self.expected.push(Expected { device, case, why });
        self
    }

    /// Runs `case` on every device and compares its outputs with the reference within
    /// `tol` (per output dtype; GPUs compute f64 in f32, so f64 is held to f32's).
    pub fn check(&mut self, case: Case, tol: Tolerance) {
        let label = case.to_string();
        let reference = match self.reference(&case, &label) {
            Ok(r) => r,
            Err(e) => {
                self.failures.push(format!("{label}\n    reference: {e}"));
                return;
            }
        };
        let mut cpu_dtypes: Option<Vec<DType>> = None;
        for dev in devices() {
            let expected = self.expected_for(&dev.label, &label);
            let verdict = if dev.is_cpu() && !reference.widened {
                // The reference is this device's own run.
                cpu_dtypes = Some(reference.outputs.iter().map(Tensor::dtype).collect());
                Ok(())
            } else {
                let tol = if dev.computes_in_f32 { tol.computed_in_f32() } else { tol };
                run_caught(dev, &case).and_then(|outs| {
                    if dev.is_cpu() {
                        cpu_dtypes = Some(outs.iter().map(Tensor::dtype).collect());
                    }
                    verify(&outs, &reference, cpu_dtypes.as_deref(), &case, tol)
                })
            };
            self.runs += 1;
            match (verdict, expected) {
                (Ok(()), None) => {}
                (Err(e), None) => self.failures.push(format!("{label}\n    on {}: {e}", dev.label)),
                (Err(_), Some(_)) => self.expected_failed += 1,
                (Ok(()), Some(x)) => self.unexpected_passes.push(format!(
                    "{label}\n    on {} passes but is listed as failing (device \"{}\", case \"{}\": {}): remove it from the list",
                    dev.label, x.device, x.case, x.why
                )),
            }
        }
    }

    fn expected_for(&self, device: &str, case: &str) -> Option<Expected> {
        self.expected.iter().chain(EXPECTED_FAILURES).find(|x| x.matches(device, case)).copied()
    }

    /// The CPU's outputs, from float inputs widened to f64 when there are any (and the
    /// op is not in [`NO_F64_REFERENCE`]), else at the case's dtypes.
    fn reference(&mut self, case: &Case, label: &str) -> Result<Reference, String> {
        let cpu = &devices_cpu();
        let widen = case.has_float_inputs() && case.inputs.iter().filter_map(|x| x.tensor()).any(|t| t.dtype().is_float() && t.dtype() != DType::F64);
        let no_f64 = NO_F64_REFERENCE.contains(&case.op_type.as_str());
        if widen && no_f64 {
            if run_caught(cpu, &case.with_floats_as(DType::F64)).is_ok() {
                self.unexpected_passes.push(format!("{label}\n    runs in f64 on the CPU: remove {} from NO_F64_REFERENCE", case.op_type));
            }
        } else if widen {
            let outputs = run_caught(cpu, &case.with_floats_as(DType::F64)).map_err(|e| format!("the CPU in f64: {e}"))?;
            return Ok(Reference { outputs, widened: true });
        }
        let outputs = run_caught(cpu, case).map_err(|e| format!("the CPU: {e}"))?;
        Ok(Reference { outputs, widened: false })
    }

    /// Notes printed with the summary.
    pub fn note(&mut self, text: String) {
        self.notes.push(text);
    }

    /// Prints the summary; panics with every failure and unexpected pass.
    pub fn finish(mut self) {
        self.finished = true;
        let devs: Vec<&str> = devices().iter().map(|d| d.label.as_str()).collect();
        eprintln!(
            "suite {}: {} runs on {devs:?}, {} failed, {} failed as expected, {} expected failures passed",
            self.name,
            self.runs,
            self.failures.len(),
            self.expected_failed,
            self.unexpected_passes.len()
        );
        for n in &self.notes {
            eprintln!("  note: {n}");
        }
        let mut report = String::new();
        if !self.failures.is_empty() {
            report += &format!("{} failures:\n{}\n", self.failures.len(), self.failures.join("\n"));
        }
        if !self.unexpected_passes.is_empty() {
            report += &format!("{} expected failures passed:\n{}\n", self.unexpected_passes.len(), self.unexpected_passes.join("\n"));
        }
        assert!(report.is_empty(), "suite {}: {report}", self.name);
    }
}

impl Drop for Suite {
    fn drop(&mut self) {
        if !self.finished && !std::thread::panicking() {
            panic!("suite {} was dropped without finish(): its results were never checked", self.name);
        }
    }
}

fn devices_cpu() -> TestDevice {
    devices().iter().find(|d| d.is_cpu()).cloned().unwrap_or(TestDevice {
        label: "cpu".into(),
        choice: kiln_runtime::DeviceChoice::Cpu,
        computes_in_f32: false,
    })
}

/// Runs `case` on `dev` in a new session; an error or a panic is a failure message.
fn run_caught(dev: &TestDevice, case: &Case) -> Result<Vec<Tensor>, String> {
    let (graph, feeds) = case.graph();
    match catch_unwind(AssertUnwindSafe(|| dev.run(graph, &feeds))) {
        Ok(Ok(outs)) => Ok(outs),
        Ok(Err(e)) => Err(format!("error: {e}")),
        Err(p) => Err(format!(
            "panic: {}",
            p.downcast_ref::<String>().map(String::as_str).or_else(|| p.downcast_ref::<&str>().copied()).unwrap_or("?")
        )),
    }
}

/// Checks a device's outputs: count, dtypes (those of the CPU's native run when known,
/// else the reference's with widened floats narrowed back), dims and values.
fn verify(outs: &[Tensor], r: &Reference, cpu_dtypes: Option<&[DType]>, case: &Case, tol: Tolerance) -> Result<(), String> {
    if outs.len() != r.outputs.len() {
        return Err(format!("{} outputs, want {}", outs.len(), r.outputs.len()));
    }
    let float_in = case.inputs.iter().filter_map(|x| x.tensor()).map(Tensor::dtype).find(|d| d.is_float());
    for (k, (o, want)) in outs.iter().zip(&r.outputs).enumerate() {
        let dtype = match cpu_dtypes {
            Some(d) => d[k],
            None if r.widened && want.dtype() == DType::F64 => float_in.unwrap_or(DType::F64),
            None => want.dtype(),
        };
        if o.dtype() != dtype {
            return Err(format!("output {k}: dtype {}, want {dtype}", o.dtype()));
        }
        compare(o, want, tol.of(o.dtype())).map_err(|e| format!("output {k}: {e}"))?;
    }
    Ok(())
}
