//! The sample networks of `kiln_samples` (what `kiln demo --sample NAME` runs) on every
//! test device, against outputs checked in at `samples/expected.json`
//! (`KILN_UPDATE_EXPECTED=1` rewrites them from the CPU: review the diff). A sample whose
//! graph, weights or inputs change, or a kernel that changes its result, shows here.
mod common;
use common::*;
use kiln::graph::Tensor;
use kiln::runtime::{Session, SessionOptions};

const BATCH: usize = 2;
const SIZE: usize = 32;

#[test]
fn samples_match_their_expected_outputs_on_every_device() {
    gpu_env();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/expected.json");
    let update = std::env::var_os("KILN_UPDATE_EXPECTED").is_some();
    let mut expected: serde_json::Map<String, serde_json::Value> = if update {
        serde_json::Map::new()
    } else {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (KILN_UPDATE_EXPECTED=1 writes it)", path.display()));
        serde_json::from_str(&text).expect("samples/expected.json is JSON")
    };
    for name in kiln_samples::SAMPLES {
        let sample = kiln_samples::sample(name, BATCH, SIZE).unwrap().expect("a listed sample");
        let feeds: Vec<(&str, &Tensor)> = sample.inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for (backend, device) in backends() {
            let mut graph = sample.graph.clone();
            let target = if backend == "cpu" { kiln::compiler::passes::Target::Cpu } else { kiln::compiler::passes::Target::Gpu };
            kiln::compiler::passes::optimize_for(&mut graph, target);
            let session = Session::new(graph, SessionOptions::device(device)).unwrap_or_else(|e| panic!("{name} on {backend}: {e}"));
            let out = session.run(&feeds).unwrap_or_else(|e| panic!("{name} on {backend}: {e}")).remove(0);
            if update && backend == "cpu" {
                let values: Vec<serde_json::Value> = out.to_f64_vec().iter().map(|&v| serde_json::json!(format!("{v:.7e}").parse::<f64>().unwrap())).collect();
                expected.insert(name.to_string(), serde_json::json!({"dims": out.dims(), "values": values}));
                continue;
            }
            let want = &expected.get(name).unwrap_or_else(|| panic!("{name}: no expected output in {} (KILN_UPDATE_EXPECTED=1)", path.display()));
            let dims: Vec<usize> = want["dims"].as_array().expect("dims").iter().map(|d| d.as_u64().expect("a dim") as usize).collect();
            let values: Vec<f64> = want["values"].as_array().expect("values").iter().map(|v| v.as_f64().expect("a number")).collect();
            let want = Tensor::from_f64(out.dtype(), &dims, &values).expect("the expected output");
            assert_eq!(out.dims(), want.dims(), "{name} on {backend}: output shape");
            let (e, limit) = (rel_l2(&out, &want), if backend == "cpu" { 1e-4 } else { 1e-3 });
            println!("sample {name:18} {backend}: rel. L2 {e:.2e} against samples/expected.json (limit {limit:.0e})");
            assert!(e <= limit, "{name} on {backend}: rel. L2 {e:e} > {limit:e} against samples/expected.json");
        }
    }
    if update {
        // One line per sample.
        let lines: Vec<String> = expected.iter().map(|(k, v)| format!("  {}: {v}", serde_json::json!(k))).collect();
        std::fs::write(&path, format!("{{\n{}\n}}\n", lines.join(",\n"))).unwrap();
    }
}
