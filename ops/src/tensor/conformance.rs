//! A runner for ONNX backend node tests converted to a plain-text case file by
//! `testdata/onnx_cases.py`: each case names the op, opset, attributes,
//! inputs and expected outputs. Ignored by default; run with
//! `KILN_NODE_CASES=/path/cases.txt cargo test -p kiln-ops --release node_cases -- --ignored`.
use super::common::testing::{make, run};
use kiln_graph::{Attr, DType, Tensor};

fn dtype(name: &str) -> DType {
    DType::ALL.into_iter().find(|d| d.name() == name).unwrap_or_else(|| panic!("dtype {name}"))
}

/// Parses `dtype ndims dims... values...`.
fn tensor(words: &[&str]) -> Tensor {
    let d = dtype(words[0]);
    let nd: usize = words[1].parse().unwrap();
    let dims: Vec<usize> = words[2..2 + nd].iter().map(|w| w.parse().unwrap()).collect();
    let vals = &words[2 + nd..];
    if matches!(d, DType::I64) {
        let v: Vec<i64> = vals.iter().map(|w| w.parse().unwrap()).collect();
        return Tensor::from_slice(&dims, &v).unwrap();
    }
    if matches!(d, DType::U64) {
        let v: Vec<u64> = vals.iter().map(|w| w.parse().unwrap()).collect();
        return Tensor::from_slice(&dims, &v).unwrap();
    }
    let v: Vec<f64> = vals.iter().map(|w| w.parse().unwrap()).collect();
    Tensor::from_f64(d, &dims, &v).unwrap()
}

fn close(a: &Tensor, b: &Tensor) -> bool {
    if a.dtype() != b.dtype() || a.dims() != b.dims() {
        return false;
    }
    if !a.dtype().is_float() {
        return a.bytes() == b.bytes();
    }
    let tol = if matches!(a.dtype(), DType::F16 | DType::BF16) { 1e-2 } else { 1e-5 };
    a.to_f64_vec().iter().zip(b.to_f64_vec()).all(|(x, y)| (x.is_nan() && y.is_nan()) || x == &y || (x - y).abs() <= tol * (1.0 + y.abs()))
}

#[test]
#[ignore]
fn node_cases() {
    let Ok(path) = std::env::var("KILN_NODE_CASES") else { return };
    let text = std::fs::read_to_string(path).unwrap();
    let mut failures = vec![];
    let mut passed = 0;
    for case in text.split("\nend").filter(|c| c.trim().starts_with("case")) {
        let mut name = "";
        let (mut op, mut opset, mut n_in, mut n_out) = ("", 0i64, 0usize, 0usize);
        let mut attrs: Vec<(String, Attr)> = vec![];
        let mut inputs: Vec<Option<Tensor>> = vec![];
        let mut outputs: Vec<(usize, Tensor)> = vec![];
        for line in case.trim().lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w[0] {
                "case" => name = w[1],
                "op" => {
                    op = w[1];
                    opset = w[2].parse().unwrap();
                    n_in = w[3].parse().unwrap();
                    n_out = w[4].parse().unwrap();
                    inputs = vec![None; n_in];
                }
                "attr" => {
                    let a = match w[2] {
                        "int" => Attr::Int(w[3].parse().unwrap()),
                        "float" => Attr::Float(w[3].parse().unwrap()),
                        "ints" => Attr::Ints(w[3..].iter().map(|v| v.parse().unwrap()).collect()),
                        "floats" => Attr::Floats(w[3..].iter().map(|v| v.parse().unwrap()).collect()),
                        "string" => Attr::String(w.get(3).unwrap_or(&"").to_string()),
                        "tensor" => Attr::Tensor(tensor(&w[3..])),
                        k => panic!("attr kind {k}"),
                    };
                    attrs.push((w[1].to_string(), a));
                }
                "input" => inputs[w[1].parse::<usize>().unwrap()] = Some(tensor(&w[2..])),
                "output" => outputs.push((w[1].parse().unwrap(), tensor(&w[2..]))),
                _ => {}
            }
        }
        let attr_refs: Vec<(&str, Attr)> = attrs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let result = make(op, opset, &attr_refs, n_in, n_out).and_then(|o| {
            let ins: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
            let consts: Vec<usize> = (0..n_in).collect();
            run(o.as_ref(), &ins, &consts)
        });
        match result {
            Err(e) => failures.push(format!("{name}: error: {e}")),
            Ok(got) => {
                let bad: Vec<String> = outputs
                    .iter()
                    .filter(|(k, want)| !got.get(*k).is_some_and(|g| close(g, want)))
                    .map(|(k, want)| format!("output {k}: got {:?} want {:?}", got.get(*k), want))
                    .collect();
                if bad.is_empty() {
                    passed += 1;
                } else {
                    failures.push(format!("{name}: {}", bad.join("; ")));
                }
            }
        }
    }
    for f in &failures {
        eprintln!("FAIL {f}");
    }
    eprintln!("{passed} passed, {} failed", failures.len());
}
