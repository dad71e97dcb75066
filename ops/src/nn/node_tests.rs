//! Runs the CPU kernels on the ONNX backend node tests of the nn ops, dumped to text by
//! `dump_node_tests.py` (a development aid: ops has no ONNX importer). Ignored by
//! default; run with `KILN_NN_CASES=<dir> cargo test -p kiln-ops --release
//! onnx_node_tests -- --ignored --nocapture`.
use super::testutil::run;
use crate::{NodeSpec, Registry};
use kiln_graph::{Attr, DType, Node, Tensor};

fn parse_tensor(parts: &[&str]) -> Tensor {
    let dtype = match parts[0] {
        "f32" => DType::F32,
        "f64" => DType::F64,
        "u8" => DType::U8,
        "i8" => DType::I8,
        "i64" => DType::I64,
        d => panic!("dtype {d}"),
    };
    let dims: Vec<usize> = if parts[1] == "-" { vec![] } else { parts[1].split(',').map(|d| d.parse().unwrap()).collect() };
    let vals: Vec<f64> = parts[2..].iter().map(|v| v.parse().unwrap()).collect();
    Tensor::from_f64(dtype, &dims, &vals).unwrap()
}

/// Runs one dumped case; returns a failure description.
fn run_case(text: &str) -> Result<(), String> {
    let (mut op, mut opset, mut n_out) = (String::new(), 17, 1);
    let mut attrs = std::collections::BTreeMap::new();
    let (mut ins, mut outs) = (vec![], vec![]);
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.first().copied() {
            Some("op") => op = parts[1].to_string(),
            Some("opset") => opset = parts[1].parse().unwrap(),
            Some("outputs") => n_out = parts[1].parse().unwrap(),
            Some("attr") => {
                let v = &parts[3..];
                let a = match parts[2] {
                    "int" => Attr::Int(v[0].parse().unwrap()),
                    "float" => Attr::Float(v[0].parse().unwrap()),
                    "string" => Attr::String(v.first().unwrap_or(&"").to_string()),
                    "ints" => Attr::Ints(v.iter().map(|x| x.parse().unwrap()).collect()),
                    _ => Attr::Floats(v.iter().map(|x| x.parse().unwrap()).collect()),
                };
                attrs.insert(parts[1].to_string(), a);
            }
            Some("in") => ins.push(parse_tensor(&parts[1..])),
            Some("out") => outs.push(parse_tensor(&parts[1..])),
            _ => {}
        }
    }
    let node = Node {
        name: "n".into(),
        op_type: op,
        domain: String::new(),
        attrs: attrs.into_iter().collect(),
        inputs: (0..ins.len()).map(Some).collect(),
        outputs: (ins.len()..ins.len() + n_out).collect(),
    };
    let op = Registry::builtin().create(&NodeSpec::new(&node, opset)).map_err(|e| format!("create: {e}"))?;
    let inputs: Vec<Option<&Tensor>> = ins.iter().map(Some).collect();
    let got = run(op.as_ref(), &inputs, &[]).map_err(|e| format!("run: {e}"))?;
    for (i, (g, w)) in got.iter().zip(&outs).enumerate() {
        if g.dims() != w.dims() {
            return Err(format!("output {i}: dims {:?}, want {:?}", g.dims(), w.dims()));
        }
        for (j, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            if (a - b).abs() > 1e-4 * b.abs().max(1.0) && !(a.is_nan() && b.is_nan()) {
                return Err(format!("output {i} element {j}: got {a}, want {b}"));
            }
        }
    }
    Ok(())
}

#[test]
#[ignore]
fn onnx_node_tests() {
    let Ok(dir) = std::env::var("KILN_NN_CASES") else {
        eprintln!("KILN_NN_CASES is not set; nothing to run");
        return;
    };
    let mut paths: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    let mut failed = 0;
    for p in &paths {
        let name = p.file_stem().unwrap().to_string_lossy();
        match run_case(&std::fs::read_to_string(p).unwrap()) {
            Ok(()) => println!("ok   {name}"),
            Err(e) => {
                failed += 1;
                println!("FAIL {name}: {e}");
            }
        }
    }
    println!("{} of {} node tests pass", paths.len() - failed, paths.len());
}
