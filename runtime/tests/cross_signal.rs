//! The signal ops on every device against the f64 CPU reference: DFT (forward,
//! inverse, one-sided, real inverse, padded and truncated lengths, inner axes, opsets
//! 17 and 20), STFT (windowed, two-sided, complex input) and MelWeightMatrix.
mod common;
use common::*;
use kiln_graph::{Attr, Tensor};

#[test]
fn dft_agrees() {
    let mut s = Suite::new("DFT");
    let tol = Tolerance::f32(2e-5);
    let real = rand_f32(&[2, 13, 3, 1], 1);
    let complex = rand_f32(&[3, 9, 2], 2);
    for (inverse, onesided) in [(0, 0), (0, 1), (1, 0)] {
        let attrs = [("inverse", Attr::Int(inverse)), ("onesided", Attr::Int(onesided))];
        s.check(Case::new("DFT").opset(20).input(real.clone()).omitted().constant(Tensor::scalar(1i64)).attrs(&attrs), tol);
        s.check(Case::new("DFT").opset(20).input(complex.clone()).constant(Tensor::scalar(12i64)).attrs(&attrs), tol);
        s.check(Case::new("DFT").opset(17).input(complex.clone()).constant(Tensor::scalar(5i32)).attrs(&attrs).attr("axis", Attr::Int(1)), tol);
    }
    // The real inverse of one-sided spectra (irfft), default and odd lengths.
    let spectrum = rand_f32(&[2, 6, 2], 3);
    let irfft = [("inverse", Attr::Int(1)), ("onesided", Attr::Int(1))];
    s.check(Case::new("DFT").opset(20).input(spectrum.clone()).attrs(&irfft), tol);
    s.check(Case::new("DFT").opset(20).input(spectrum).constant(Tensor::scalar(9i64)).attrs(&irfft), tol);
    s.finish();
}

#[test]
fn stft_and_mel_agree() {
    let mut s = Suite::new("STFT and MelWeightMatrix");
    let tol = Tolerance::f32(2e-5);
    let signal = rand_f32(&[2, 67, 1], 4);
    let window = rand_f32_map(&[16], 5, |v| v.abs());
    s.check(Case::new("STFT").opset(17).input(signal.clone()).constant(Tensor::scalar(5i64)).input(window), tol);
    let two_sided = Case::new("STFT").opset(17).input(signal).constant(Tensor::scalar(7i64)).omitted().constant(Tensor::scalar(10i64));
    s.check(two_sided.attr("onesided", Attr::Int(0)), tol);
    s.check(Case::new("STFT").opset(17).input(rand_f32(&[1, 40, 2], 6)).constant(Tensor::scalar(8i64)).omitted().constant(Tensor::scalar(8i64)), tol);
    for (mels, len, rate, low, high) in [(8, 16, 8192, 0.0f32, 4096.0f32), (10, 64, 16000, 100.0, 7000.0), (5, 33, 22050, 30.0, 9000.0)] {
        let case = Case::new("MelWeightMatrix")
            .opset(17)
            .constant(Tensor::scalar(mels as i32))
            .constant(Tensor::scalar(len as i64))
            .input(Tensor::scalar(rate as i32))
            .input(Tensor::scalar(low))
            .input(Tensor::scalar(high));
        s.check(case, Tolerance::f32(1e-6));
    }
    s.finish();
}
