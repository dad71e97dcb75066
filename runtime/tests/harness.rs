//! Tests of the cross-device runner itself: a wrong result fails, an expected failure
//! that fails is accepted, one that passes fails the suite, and a suite whose results
//! are never checked fails.
mod common;
use common::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

fn relu() -> Case {
    Case::new("Relu").opset(14).input(rand_f32(&[3, 67], 1))
}

/// A tolerance no float result can meet (every device but the reference fails).
fn impossible() -> Tolerance {
    Tolerance::f32(-1.0)
}

fn finish_message(s: Suite) -> Option<String> {
    catch_unwind(AssertUnwindSafe(|| s.finish())).err().map(|p| p.downcast_ref::<String>().cloned().unwrap_or_default())
}

#[test]
fn every_device_is_checked_and_a_wrong_result_fails() {
    let mut s = Suite::new("self-test: passes");
    s.check(relu(), Tolerance::DEFAULT);
    s.finish();
    let mut s = Suite::new("self-test: fails");
    s.check(relu(), impossible());
    let msg = finish_message(s).expect("an impossible tolerance must fail");
    for d in devices() {
        assert!(msg.contains(&format!("on {}:", d.label)), "{} not reported in {msg}", d.label);
    }
}

#[test]
fn expected_failures_must_fail() {
    let mut s = Suite::new("self-test: expected").expect_failure("", "Relu [", "forced by an impossible tolerance");
    s.check(relu(), impossible());
    s.finish();
    let mut s = Suite::new("self-test: unexpected pass").expect_failure("gpu", "Relu [", "listed, but passes");
    s.check(relu(), Tolerance::DEFAULT);
    let msg = finish_message(s).expect("an expected failure that passes must fail the suite");
    assert!(msg.contains("remove it from the list"), "{msg}");
}

#[test]
fn an_unfinished_suite_fails() {
    let r = catch_unwind(|| {
        let mut s = Suite::new("self-test: unfinished");
        s.check(relu(), Tolerance::DEFAULT);
    });
    assert!(r.is_err(), "dropping a suite without finish() must panic");
}

#[test]
fn expectation_patterns() {
    let x = Expected { device: "GL", case: "Attention [", why: "" };
    assert!(x.matches("gpu:1 llvmpipe (Gl)", "Attention [data f32[1]] opset 23"));
    assert!(!x.matches("gpu:0 llvmpipe (Vulkan)", "Attention [data f32[1]] opset 23"));
    assert!(!x.matches("gpu:1 llvmpipe (Gl)", "RotaryEmbedding [data f32[1]] opset 23"));
}
