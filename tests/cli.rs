//! The `kiln` command line: JSON output, output files, and clear errors (never a
//! panic) for bad models, bad inputs and missing devices.
mod common;
use common::*;
use std::path::PathBuf;
use std::process::{Command, Output};

fn kiln(args: &[&str]) -> Output {
    gpu_env();
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("kiln runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn model(name: &str) -> PathBuf {
    zoo().join(name).join("model.onnx")
}

/// Fails with a message (exit code 1, "error:"), and did not panic.
fn assert_clean_error(o: &Output, needle: &str) {
    let e = stderr(o);
    assert!(!o.status.success(), "expected failure, got success; stderr: {e}");
    assert_eq!(o.status.code(), Some(1), "exit code; stderr: {e}");
    assert!(!e.contains("panicked"), "kiln panicked: {e}");
    assert!(e.contains(needle), "expected '{needle}' in: {e}");
}

#[test]
fn run_writes_npy_outputs_and_json() {
    let dir = tmp("run");
    let mlp = model("mlp");
    let input = zoo().join("mlp/test_data_set_0/input_0.pb");
    let name = kiln::compiler::onnx::read_tensor_pb(&input).unwrap().0;
    let spec = format!("{name}={}", input.display());
    let o = kiln(&["run", mlp.to_str().unwrap(), "--device", "cpu", "-i", &spec, "--output-dir", dir.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    let out_name = j["outputs"][0]["name"].as_str().unwrap().to_string();
    let file: String = out_name.chars().map(|c| if c.is_ascii_alphanumeric() || ".-_".contains(c) { c } else { '_' }).collect();
    let got = kiln::runtime::npy::read_file(dir.join(format!("{file}.npy"))).unwrap();
    let want = kiln::compiler::onnx::read_tensor_pb(zoo().join("mlp/test_data_set_0/output_0.pb")).unwrap().1;
    assert!(rel_l2(&got, &want) < 1e-4);
}

#[test]
fn bench_json_has_the_promised_fields() {
    let o = kiln(&["bench", model("mlp").to_str().unwrap(), "--device", "cpu", "--iters", "5", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in ["median_ms", "p90_ms", "min_ms", "iters", "device"] {
        assert!(!j[k].is_null(), "missing {k} in {j}");
    }
    assert_eq!(j["iters"], 5);
}

#[test]
fn gpu_run_is_one_submit() {
    let o = kiln(&["bench", model("mlp").to_str().unwrap(), "--device", "gpu", "--iters", "3", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["submits_per_run"], 1, "{j}");
}

#[test]
fn truncated_and_garbage_models_are_clean_errors() {
    let dir = tmp("bad");
    let bytes = std::fs::read(model("lenet")).unwrap();
    let cut = dir.join("cut.onnx");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    assert_clean_error(&kiln(&["run", cut.to_str().unwrap(), "--device", "cpu"]), "cut.onnx");
    let junk = dir.join("junk.onnx");
    std::fs::write(&junk, (0..5000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect::<Vec<_>>()).unwrap();
    assert_clean_error(&kiln(&["run", junk.to_str().unwrap(), "--device", "cpu"]), "junk.onnx");
    assert_clean_error(&kiln(&["run", dir.join("absent.onnx").to_str().unwrap()]), "absent.onnx");
}

#[test]
fn wrong_inputs_are_clean_errors() {
    let dir = tmp("inputs");
    let mlp = model("mlp");
    let m = mlp.to_str().unwrap();
    let x = kiln::graph::Tensor::zeros(kiln::graph::DType::F32, &[1, 783]);
    let bad_shape = dir.join("x.npy");
    kiln::runtime::npy::write_file(&bad_shape, &x).unwrap();
    let real_name = kiln::compiler::onnx::read_tensor_pb(zoo().join("mlp/test_data_set_0/input_0.pb")).unwrap().0;
    assert_clean_error(&kiln(&["run", m, "--device", "cpu", "-i", &format!("{real_name}={}", bad_shape.display())]), "784");
    assert_clean_error(&kiln(&["run", m, "--device", "cpu", "-i", &format!("nope={}", bad_shape.display())]), "unknown input 'nope'");
    let ints = dir.join("i.npy");
    kiln::runtime::npy::write_file(&ints, &kiln::graph::Tensor::zeros(kiln::graph::DType::I64, &[1, 784])).unwrap();
    assert_clean_error(&kiln(&["run", m, "--device", "cpu", "-i", &format!("{real_name}={}", ints.display())]), "dtype i64");
    assert_clean_error(&kiln(&["run", m, "--device", "cpu", "-i", "x"]), "NAME=FILE");
}

#[test]
fn missing_gpu_is_a_clean_error() {
    gpu_env();
    // No adapter exists for a backend this machine lacks.
    let backend = if cfg!(target_os = "macos") { "dx12" } else { "metal" };
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .env("WGPU_BACKEND", backend)
        .args(["run", model("mlp").to_str().unwrap(), "--device", "gpu"])
        .output()
        .unwrap();
    assert_clean_error(&o, "no GPU");
}

#[test]
fn unsupported_ops_are_listed_together() {
    let dir = tmp("unsupported");
    // Rename two op types of lenet so that they are unknown.
    let bytes = std::fs::read(model("lenet")).unwrap();
    let mut m = kiln::compiler::onnx::decode_model(bytes.as_slice(), "lenet").unwrap();
    let g = m.graph.as_mut().unwrap();
    let mut k = 0;
    for n in g.node.iter_mut() {
        if n.op_type == "Relu" {
            n.op_type = if k % 2 == 0 { "FancyRelu".into() } else { "OtherRelu".into() };
            k += 1;
        }
    }
    let path = dir.join("weird.onnx");
    std::fs::write(&path, prost::Message::encode_to_vec(&m)).unwrap();
    let o = kiln(&["run", path.to_str().unwrap(), "--device", "cpu"]);
    assert_clean_error(&o, "FancyRelu");
    assert!(stderr(&o).contains("OtherRelu"), "{}", stderr(&o));
}

#[test]
fn devices_json_lists_cpu_and_adapters() {
    let o = kiln(&["devices", "--json"]);
    assert!(o.status.success());
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(j["cpu"]["threads"].as_u64().unwrap() >= 1);
    assert!(!j["adapters"].as_array().unwrap().is_empty(), "no GPU adapter: install mesa-vulkan-drivers");
}


#[test]
fn inspect_shows_nodes_passes_memory_and_writes_dot() {
    let dir = tmp("inspect");
    let dot = dir.join("g.dot");
    let o = kiln(&["inspect", model("resnet18").to_str().unwrap(), "--passes", "--json", "--dot", dot.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let nodes = v["nodes"].as_array().unwrap();
    // A Conv (in the blocked layout on the CPU) with its Relu fused.
    assert!(nodes.iter().any(|n| n["op"].as_str().unwrap().starts_with("Conv") && n["fused"].as_str().unwrap().contains("Relu")), "{v}");
    assert!(nodes.iter().all(|n| n["shape"].as_str().unwrap().starts_with("f32[")), "{v}");
    let passes = v["passes"].as_array().unwrap();
    assert!(passes.iter().any(|p| p["pass"] == "fuse-activation" && p["changes"].as_u64().unwrap() > 0), "{v}");
    let m = &v["memory"];
    assert!(m["planned_bytes"].as_u64().unwrap() >= m["lower_bound_bytes"].as_u64().unwrap());
    let d = std::fs::read_to_string(&dot).unwrap();
    assert!(d.starts_with("digraph") && d.contains("cluster_device") && d.matches("->").count() >= nodes.len());
    // A model that does not exist is a clean error.
    assert_clean_error(&kiln(&["inspect", "/nonexistent.onnx"]), "nonexistent");
}

#[test]
fn compile_writes_an_artifact_that_run_accepts() {
    let dir = tmp("compile");
    let art = dir.join("mlp.kiln");
    let o = kiln(&["compile", model("mlp").to_str().unwrap(), "-o", art.to_str().unwrap(), "--device", "cpu", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["bytes"].as_u64().unwrap() > 0 && v["compile_ms"].as_f64().is_some(), "{v}");
    let o = kiln(&["run", art.to_str().unwrap(), "--device", "cpu", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Compiling an artifact again, or fixing a symbol the model lacks, are clean errors.
    assert_clean_error(&kiln(&["compile", art.to_str().unwrap()]), "already a compiled artifact");
    assert_clean_error(&kiln(&["compile", model("mlp").to_str().unwrap(), "--fix", "nope=2", "-o", art.to_str().unwrap()]), "no symbolic dim 'nope'");
    // Tuning a model whose dims --fix fixed: its random inputs take the fixed shapes.
    let bert = dir.join("bert.kiln");
    let db = dir.join("tune.db");
    let o = kiln(&["compile", model("bert_tiny").to_str().unwrap(), "-o", bert.to_str().unwrap(), "--device", "cpu", "--fix", "batch=1", "--fix", "sequence=8", "--tune", "--budget", "1", "--tuning-db", db.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_huge_dim_for_random_inputs_is_a_named_error_not_an_abort() {
    // 2^40 x 1 i64 elements: 8 TiB, which used to be built as a Vec<f64> and abort.
    let o = kiln(&["run", model("bert_tiny").to_str().unwrap(), "--device", "cpu", "--dim", "batch=1099511627776"]);
    assert_clean_error(&o, "random input 'input_ids'");
    assert!(stderr(&o).contains("memory limit"), "{}", stderr(&o));
    // A size that wraps usize is an overflow, also named.
    let o = kiln(&["bench", model("bert_tiny").to_str().unwrap(), "--device", "cpu", "--dim", "batch=4294967296", "--dim", "sequence=4294967296"]);
    assert_clean_error(&o, "overflows");
    // --memory-limit is honoured, and checked as a size.
    let o = kiln(&["run", model("mlp").to_str().unwrap(), "--device", "cpu", "--memory-limit", "1K"]);
    assert_clean_error(&o, "over the memory limit of 1024 bytes");
    let o = kiln(&["run", model("mlp").to_str().unwrap(), "--device", "cpu", "--memory-limit", "lots"]);
    assert!(!o.status.success() && stderr(&o).contains("not a size"), "{}", stderr(&o));
}

#[test]
fn colliding_output_names_get_a_suffix_and_a_warning() {
    let dir = tmp("collide");
    // The MLP with its logits also given out as 'a/b' and 'a_b' (both "a_b.npy" as files).
    let bytes = std::fs::read(model("mlp")).unwrap();
    let mut m = kiln::compiler::onnx::decode_model(bytes.as_slice(), "mlp").unwrap();
    let g = m.graph.as_mut().unwrap();
    let logits = g.output[0].clone();
    for name in ["a/b", "a_b"] {
        g.node.push(kiln::compiler::onnx::proto::NodeProto {
            op_type: "Identity".into(),
            name: format!("copy {name}"),
            input: vec![logits.name.clone()],
            output: vec![name.into()],
            ..Default::default()
        });
        let mut out = logits.clone();
        out.name = name.into();
        g.output.push(out);
    }
    let path = dir.join("two_names.onnx");
    std::fs::write(&path, prost::Message::encode_to_vec(&m)).unwrap();
    let out_dir = dir.join("out");
    let o = kiln(&["run", path.to_str().unwrap(), "--device", "cpu", "--output-dir", out_dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("'a_b' goes to a_b_2.npy"), "{}", stderr(&o));
    let a = kiln::runtime::npy::read_file(out_dir.join("a_b.npy")).unwrap();
    let b = kiln::runtime::npy::read_file(out_dir.join("a_b_2.npy")).unwrap();
    assert_eq!(a, b);
}

#[cfg(unix)]
#[test]
fn a_fifo_input_is_refused_not_read() {
    let dir = tmp("fifo");
    let fifo = dir.join("x.npy");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let spec = format!("x={}", fifo.display());
    let o = kiln(&["run", model("mlp").to_str().unwrap(), "--device", "cpu", "-i", &spec]);
    assert_clean_error(&o, "FIFO");
    assert!(stderr(&o).contains("x.npy"), "{}", stderr(&o));
}

#[test]
fn tune_measures_stores_reuses_embeds_lists_and_clears() {
    let dir = tmp("tune");
    let db = dir.join("tuning.json");
    let (mlp, db_s) = (model("mlp"), db.to_str().unwrap().to_string());
    let tune = |extra: &[&str]| {
        let mut args = vec!["tune", mlp.to_str().unwrap(), "--device", "gpu", "--budget", "30", "--json", "--tuning-db", &db_s];
        args.extend_from_slice(extra);
        let o = kiln(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let first = tune(&[]);
    for field in ["device", "keys", "tuned", "before_ms", "after_ms", "db"] {
        assert!(!first[field].is_null(), "missing '{field}': {first}");
    }
    let keys = first["keys"].as_array().unwrap();
    assert!(!keys.is_empty(), "mlp's GPU kernels have choices: {first}");
    assert_eq!(first["tuned"].as_u64().unwrap() as usize, keys.len(), "{first}");
    assert!(first["before_ms"].as_f64().unwrap() > 0.0 && first["after_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(first["db"][0].as_str(), Some(db_s.as_str()));
    for k in keys {
        assert!(k["default_ms"].as_f64().unwrap() > 0.0 && k["speedup"].as_f64().is_some() && k["config"].is_object(), "{k}");
    }
    // A second run finds every key tuned and measures nothing.
    let second = tune(&[]);
    assert!(second["keys"].as_array().unwrap().iter().all(|k| k["status"] == "already tuned"), "{second}");
    assert!(second["tune_s"].as_f64().unwrap() < 1.0, "{second}");
    // --list shows the entries.
    let o = kiln(&["tune", "--list", "--json", "--tuning-db", &db_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The kernels' entries and the model's pass choice (mlp has no attention: its one
    // candidate on a GPU, fuse-attention, makes the same graph, so only the defaults
    // were timed).
    assert_eq!(listed["databases"][0]["entries"].as_array().unwrap().len(), keys.len() + 1, "{listed}");
    assert_eq!((&first["passes"]["status"], &first["passes"]["tried"]), (&serde_json::json!("tuned"), &serde_json::json!(1)), "{first}");
    assert_eq!(second["passes"]["status"], "already tuned", "{second}");
    // compile --tune embeds the choices (found in the database); the artifact runs with
    // and without them.
    let art = dir.join("mlp.kiln");
    let o = kiln(&["compile", mlp.to_str().unwrap(), "-o", art.to_str().unwrap(), "--device", "gpu", "--tune", "--budget", "5", "--tuning-db", &db_s, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["tuned_keys"].as_u64().unwrap() as usize, keys.len(), "{v}");
    for extra in [&[][..], &["--no-tuning"][..]] {
        let mut args = vec!["run", art.to_str().unwrap(), "--device", "gpu", "--json"];
        args.extend_from_slice(extra);
        let o = kiln(&args);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    // bench uses the database; a damaged database is ignored with a warning.
    let o = kiln(&["bench", mlp.to_str().unwrap(), "--device", "gpu", "--iters", "3", "--tuning-db", &db_s, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let b: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(b["untuned_keys"], 0, "every key is tuned: {b}");
    let o = kiln(&["bench", mlp.to_str().unwrap(), "--device", "gpu", "--iters", "3", "--no-tuning", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let b: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(b["untuned_keys"].as_u64().unwrap() as usize >= keys.len(), "--no-tuning: every key untuned: {b}");
    std::fs::write(&db, b"KILNTUNE 1 0123456789abcdef 2\n{}").unwrap();
    let o = kiln(&["run", mlp.to_str().unwrap(), "--device", "gpu", "--tuning-db", &db_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("ignored"), "a warning names the ignored database: {}", stderr(&o));
    // --clear deletes it.
    let o = kiln(&["tune", "--clear", "--tuning-db", &db_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!db.exists());
    // On the CPU the command works the same (keys: the CPU kernels that declare choices).
    let o = kiln(&["tune", mlp.to_str().unwrap(), "--device", "cpu", "--budget", "30", "--json", "--tuning-db", &db_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    let cpu: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(cpu["device"].as_str().unwrap().starts_with("cpu") && cpu["keys"].is_array(), "{cpu}");
    // A model is required unless listing or clearing.
    let o = kiln(&["tune"]);
    assert!(!o.status.success());
}

#[test]
fn ops_lists_operators_and_dtypes() {
    let o = kiln(&["ops"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.lines().any(|l| l == "QuantizeLinear") && out.lines().any(|l| l == "com.microsoft.QLinearAdd"), "{out}");
    let o = kiln(&["ops", "--dtypes", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f8 = list.as_array().unwrap().iter().find(|d| d["dtype"] == "f8e4m3fn").expect("float8 listed");
    assert_eq!(f8["onnx"], 17);
    assert!(f8["ops"].as_str().unwrap().contains("QuantizeLinear"));
    let st = list.as_array().unwrap().iter().find(|d| d["dtype"] == "string").expect("string listed");
    assert_eq!(st["onnx"], 8);
}

/// A sequence output prints its tensors and refuses a .npy file by name, without a panic.
#[test]
fn run_prints_a_sequence_output_and_refuses_to_write_it_as_npy() {
    let dir = onnx_tests().join("test_split_to_sequence_1");
    let (m, set) = (dir.join("model.onnx"), dir.join("test_data_set_0"));
    let (data, split) = (format!("data={}", set.join("input_0.pb").display()), format!("split={}", set.join("input_1.pb").display()));
    let base = ["run", m.to_str().unwrap(), "--device", "cpu", "-i", &data, "-i", &split];
    let o = kiln(&base);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("Sequence<f32>[Tensor<f32[3, 2]>"), "{}", String::from_utf8_lossy(&o.stdout));
    let out = tmp("seq-out");
    let o = kiln(&[&base[..], &["--output-dir", out.to_str().unwrap()]].concat());
    assert_clean_error(&o, "the output is a Sequence, not a tensor");
}

/// Random inputs take the symbols that given inputs bind (only input_ids given to
/// bert_tiny: attention_mask follows its [1, 17]), come from `--seed`, and are written
/// with the given ones by `--save-inputs`.
#[test]
fn random_inputs_follow_given_inputs_seed_and_are_saved() {
    let dir = tmp("seed");
    let ids = dir.join("ids.npy");
    kiln::runtime::npy::write_file(&ids, &kiln::graph::Tensor::from_vec(&[1, 17], (0..17).map(|i| i as i64 * 7 % 50).collect::<Vec<i64>>()).unwrap()).unwrap();
    let bert = model("bert_tiny");
    let saved = |seed: &str, sub: &str| {
        let out = dir.join(sub);
        let o = kiln(&["run", bert.to_str().unwrap(), "--device", "cpu", "-i", &format!("input_ids={}", ids.display()), "--seed", seed, "--save-inputs", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        let read = |n: &str| kiln::runtime::npy::read_file(out.join(format!("{n}.npy"))).unwrap();
        (read("input_ids"), read("attention_mask"))
    };
    let (given, mask) = saved("5", "a");
    assert_eq!(given, kiln::runtime::npy::read_file(&ids).unwrap());
    assert_eq!(mask.dims(), [1, 17], "attention_mask follows input_ids' batch and sequence");
    assert_eq!(saved("5", "b").1, mask, "the same seed gives the same values");
    assert_ne!(saved("6", "c").1, mask, "another seed gives other values");
    // A --dim that contradicts a given input names both.
    let o = kiln(&["run", bert.to_str().unwrap(), "--device", "cpu", "-i", &format!("input_ids={}", ids.display()), "--dim", "sequence=9"]);
    assert_clean_error(&o, "binds 'sequence' to 17, but --dim sets it to 9");
}

/// Options that would be ignored are errors or warnings, and an error's causes are
/// said once.
#[test]
fn unknown_dims_are_errors_and_causes_are_said_once() {
    let bert = model("bert_tiny");
    assert_clean_error(&kiln(&["run", bert.to_str().unwrap(), "--device", "cpu", "--dim", "bogus=3"]), "no input of the model has a symbolic dim 'bogus' (its symbols: batch, sequence)");
    let o = kiln(&["run", "/nonexistent.onnx"]);
    assert_clean_error(&o, "No such file or directory");
    assert_eq!(stderr(&o).matches("No such file or directory").count(), 1, "{}", stderr(&o));
    let o = kiln(&["run", model("mlp").to_str().unwrap(), "--device", "cpu", "-i", "x=/nonexistent.npy"]);
    assert_eq!(stderr(&o).matches("No such file or directory").count(), 1, "{}", stderr(&o));
    // --profile on a GPU session says so before any timed run.
    let o = kiln(&["bench", model("mlp").to_str().unwrap(), "--device", "gpu", "--profile", "--json"]);
    assert_clean_error(&o, "--profile times the nodes of CPU sessions; for ");
    assert!(stderr(&o).contains("kiln profile MODEL"), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "no JSON before the error");
    // Progress is drawn on terminals only: a piped text bench leaves stderr empty.
    let o = kiln(&["bench", model("mlp").to_str().unwrap(), "--device", "cpu", "--iters", "5"]);
    assert!(o.status.success() && o.stderr.is_empty(), "{}", stderr(&o));
    // --threads on every command that runs a model.
    for cmd in [&["inspect"][..], &["tune", "--budget", "1", "--tuning-db", "/dev/null/none"][..]] {
        let mut a: Vec<&str> = cmd.to_vec();
        let m = model("mlp");
        a.extend([m.to_str().unwrap(), "--device", "cpu", "--threads", "1", "--json"]);
        let o = kiln(&a);
        assert!(!stderr(&o).contains("unexpected argument"), "{cmd:?}: {}", stderr(&o));
    }
    // -v logs each pass once.
    let o = kiln(&["-v", "run", model("mlp").to_str().unwrap(), "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o).matches("pass fuse-bias:").count(), 1, "{}", stderr(&o));
}

/// `inspect` starts with the model's inputs and outputs, symbolic dims and all.
#[test]
fn inspect_shows_the_signature() {
    let bert = model("bert_tiny");
    let o = kiln(&["inspect", bert.to_str().unwrap(), "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("inputs:\n  input_ids: i64[batch,sequence]\n  attention_mask: i64[batch,sequence]\noutputs:\n  last_hidden_state: f32[batch,sequence,128]\n"), "{text}");
    let o = kiln(&["inspect", bert.to_str().unwrap(), "--device", "cpu", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["inputs"][1], serde_json::json!({"name": "attention_mask", "type": "i64[batch,sequence]"}));
    assert_eq!(v["outputs"][1], serde_json::json!({"name": "pooler_output", "type": "f32[batch,128]"}));
}

/// `run --data-set` runs ONNX backend-test data sets and compares each output with its
/// reference: exit code 0 within the tolerance, 1 naming the output outside it;
/// `--dump-intermediates` writes every value of the graph that runs.
#[test]
fn data_sets_are_checked_and_intermediates_dumped() {
    let mlp = model("mlp");
    let m = mlp.to_str().unwrap();
    let sets = zoo().join("mlp");
    let o = kiln(&["run", m, "--device", "cpu", "--data-set", sets.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert!(v["outputs"].as_array().unwrap().iter().all(|c| c["ok"] == true && c["rel_l2"].as_f64().unwrap() < 1e-5), "{v}");
    // No tolerance at all: float rounding differs from onnxruntime's somewhere.
    let one = sets.join("test_data_set_0");
    let o = kiln(&["run", m, "--device", "cpu", "--data-set", one.to_str().unwrap(), "--rtol", "0", "--atol", "0"]);
    assert_clean_error(&o, "outputs differ from their data sets");
    assert!(String::from_utf8_lossy(&o.stdout).contains("MISMATCH"));
    assert_clean_error(&kiln(&["run", m, "--data-set", one.to_str().unwrap(), "-i", "x=y.npy"]), "leave out --input");
    assert_clean_error(&kiln(&["run", m, "--data-set", "/nonexistent"]), "/nonexistent");
    // Every value of the model without its passes: the Gemm, the Relu, the logits.
    let dir = tmp("dump");
    let o = kiln(&["run", m, "--device", "cpu", "--no-passes", "--dump-intermediates", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let files: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    let g = kiln::compiler::onnx::import_file(&mlp).unwrap();
    assert_eq!(files.len(), g.nodes.iter().map(|n| n.outputs.len()).sum::<usize>(), "{files:?}");
    // The model's own output line is still the only one printed.
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.starts_with("  ")).count(), g.outputs.len());
}

/// `kiln demo --sample all` runs every sample network on the CPU and every adapter that
/// opens (lavapipe in CI) and they agree; an unknown sample is a clear error.
#[test]
fn demo_runs_every_sample_on_every_device() {
    let o = kiln(&["demo", "--sample", "all", "--size", "32", "--iters", "1", "--json"]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["ok"], true, "{v}");
    let samples = v["samples"].as_array().expect("samples");
    assert_eq!(samples.len(), kiln_samples::SAMPLES.len());
    for s in samples {
        let devices = s["devices"].as_array().expect("devices");
        // The CPU and at least one GPU adapter ran it (CI has lavapipe).
        let ran: Vec<&serde_json::Value> = devices.iter().filter(|d| d.get("median_ms").is_some()).collect();
        assert!(ran.len() >= 2 && ran[0]["device"] == "cpu", "{s}");
        assert!(ran[1..].iter().all(|d| d["rel_l2_vs_cpu"].as_f64().is_some_and(|e| e <= 1e-3)), "{s}");
    }
    assert_clean_error(&kiln(&["demo", "--sample", "resnet99"]), "no sample named 'resnet99'");
}

/// Checks a Chrome trace's structure: every complete slice has name, ph, ts, dur, pid
/// and tid; slices on one track nest or do not overlap. Returns the slices.
fn trace_slices(path: &std::path::Path) -> (Vec<serde_json::Value>, serde_json::Value) {
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).expect("the trace is JSON");
    let events = j["traceEvents"].as_array().expect("traceEvents").clone();
    let slices: Vec<serde_json::Value> = events.into_iter().filter(|e| e["ph"] == "X").collect();
    assert!(!slices.is_empty());
    for s in &slices {
        for key in ["name", "ph", "ts", "dur", "pid", "tid"] {
            assert!(!s[key].is_null(), "slice without {key}: {s}");
        }
        assert!(s["ts"].as_f64().unwrap() >= 0.0 && s["dur"].as_f64().unwrap() >= 0.0, "{s}");
    }
    let mut tids: Vec<i64> = slices.iter().map(|s| s["tid"].as_i64().unwrap()).collect();
    tids.sort();
    tids.dedup();
    for tid in tids {
        let mut on: Vec<(f64, f64, String)> = slices.iter().filter(|s| s["tid"].as_i64() == Some(tid)).map(|s| {
            let ts = s["ts"].as_f64().unwrap();
            (ts, ts + s["dur"].as_f64().unwrap(), s["name"].as_str().unwrap().to_string())
        }).collect();
        on.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<(f64, f64, String)> = vec![];
        for s in on {
            while open.last().is_some_and(|o| s.0 >= o.1 - 1e-3) {
                open.pop();
            }
            if let Some(o) = open.last() {
                assert!(s.1 <= o.1 + 1e-3, "track {tid}: '{}' [{}, {}] overlaps '{}' [{}, {}] without nesting", s.2, s.0, s.1, o.2, o.0, o.1);
            }
            open.push(s);
        }
    }
    (slices, j["otherData"].clone())
}

#[test]
fn profile_writes_a_chrome_trace_with_a_slice_per_kernel() {
    let dir = tmp("profile");
    // On the GPU: one slice per kernel from timestamp queries, inside the submit's span.
    let out = dir.join("gpu.json");
    let o = kiln(&["profile", model("resnet18").to_str().unwrap(), "--device", "gpu", "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (slices, info) = trace_slices(&out);
    assert_eq!(info["gpu_timestamps"], true, "lavapipe has TIMESTAMP_QUERY: {info}");
    let gpu: Vec<&serde_json::Value> = slices.iter().filter(|s| s["cat"] == "gpu").collect();
    assert_eq!(gpu.len() as u64, info["kernels"].as_u64().unwrap(), "one slice per kernel");
    assert!(gpu.len() >= 20, "resnet18 runs its convolutions as kernels: {}", gpu.len());
    let submit = slices.iter().find(|s| s["name"] == "submit and wait").expect("the submit's host span");
    let (s0, s1) = (submit["ts"].as_f64().unwrap(), submit["ts"].as_f64().unwrap() + submit["dur"].as_f64().unwrap());
    for k in &gpu {
        let (k0, k1) = (k["ts"].as_f64().unwrap(), k["ts"].as_f64().unwrap() + k["dur"].as_f64().unwrap());
        assert!(k0 >= s0 - 1e-3 && k1 <= s1 + 1e-3, "GPU slice {k} outside the submit [{s0}, {s1}]");
    }
    assert!(gpu.iter().filter(|k| k["name"].as_str().unwrap().contains("(Conv)")).count() >= 16, "kernels are named by their nodes: {gpu:?}");
    for phase in ["import", "graph passes", "open session (devices, op checks)", "first run (specialise, place, compile kernels)", "specialise (types, folding)", "place and build the plan (kernels generated and compiled)", "upload inputs", "read outputs back"] {
        assert!(slices.iter().any(|s| s["name"] == phase), "no '{phase}' slice");
    }
    // On the CPU: one slice per step, from CPU timers.
    let out = dir.join("cpu.json");
    let o = kiln(&["profile", model("mlp").to_str().unwrap(), "--device", "cpu", "-o", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (slices, info) = trace_slices(&out);
    let kernels = slices.iter().filter(|s| s["cat"] == "kernel").count();
    assert_eq!(kernels as u64, info["kernels"].as_u64().unwrap());
    assert!(kernels >= 2 && slices.iter().any(|s| s["name"].as_str().unwrap().contains("Gemm")));
}

fn training(path: &str) -> String {
    training_dir().join(path).to_str().unwrap().to_string()
}

/// `kiln train` learns: lenet on the digits reaches 97% test accuracy in 200 steps,
/// prints one JSON object per step and a final one, and writes a model that Kiln runs
/// with the same accuracy (python/tests/test_training.py runs it in onnxruntime).
#[test]
fn train_learns_the_digits_and_exports_the_model() {
    let d = tmp("train");
    let out = d.join("trained.onnx");
    let ck = d.join("state.npz");
    let (m, data) = (training("lenet_digits_sgd/model.onnx"), training("digits"));
    let o = kiln(&[
        "train", &m, "--data", &data, "--eval", &data, "--loss", "cross_entropy", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
        "--weight-decay", "1e-4", "--batch", "64", "--steps", "200", "--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "-o", out.to_str().unwrap(), "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 201, "one object per step and a final one");
    for (k, l) in lines[..200].iter().enumerate() {
        assert_eq!(l["step"], k + 1);
        assert!(l["loss"].as_f64().unwrap().is_finite() && l["samples_per_s"].as_f64().unwrap() > 0.0, "{l}");
    }
    let fin = &lines[200];
    let acc = fin["eval"]["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.97, "test accuracy {acc}");
    assert_eq!(fin["eval"]["samples"], 360);
    // Training memory against the forward pass alone.
    let (step, fwd) = (fin["memory"]["step_bytes"].as_u64().unwrap(), fin["memory"]["forward_bytes"].as_u64().unwrap());
    assert!(step > fwd && fwd > 0 && fin["memory"]["state_bytes"].as_u64().unwrap() == (2 * 13_770 + 64) * 4, "{}", fin["memory"]);
    // The exported model runs as an ordinary inference model.
    let o = kiln(&["run", out.to_str().unwrap(), "--device", "cpu", "-i", &format!("x={}", training("digits/test_x.npy")), "--output-dir", d.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let logits = kiln::runtime::npy::read_file(d.join("logits.npy")).unwrap().to_f64_vec();
    let labels = kiln::runtime::npy::read_file(training("digits/test_y.npy")).unwrap().to_i64_vec().unwrap();
    let correct = labels.iter().enumerate().filter(|(i, &l)| {
        let row = &logits[i * 10..(i + 1) * 10];
        row.iter().enumerate().fold(0, |b, (j, v)| if *v > row[b] { j } else { b }) == l as usize
    });
    assert_eq!(correct.count() as f64 / 360.0, acc, "the exported model's accuracy");
    // Resuming at the end has nothing left to do and keeps the step count.
    let o = kiln(&["train", &m, "--data", &data, "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "1e-4", "--batch", "64", "--steps", "200", "--resume", ck.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"steps\":200"), "{}", String::from_utf8_lossy(&o.stdout));
    let _ = std::fs::remove_dir_all(&d);
}

/// On a GPU the state stays in device memory between steps; the checkpoint and the
/// exported model read it back, and a CPU run resumes from it.
#[test]
fn train_on_the_gpu_keeps_the_state_on_the_device() {
    let d = tmp("train-gpu");
    let (out, ck) = (d.join("trained.onnx"), d.join("state.npz"));
    let (m, data) = (training("lenet_digits_sgd/model.onnx"), training("digits"));
    let common = ["--lr", "0.05", "--momentum", "0.9", "--batch", "64", "--json"];
    let mut args = vec!["train", &m, "--data", &data, "--steps", "5", "--device", "gpu", "--checkpoint", ck.to_str().unwrap(), "-o", out.to_str().unwrap()];
    args.extend(common);
    let o = kiln(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let fin: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(fin["state_on_device"], true, "{fin}");
    let mut args = vec!["train", &m, "--data", &data, "--steps", "7", "--device", "cpu", "--resume", ck.to_str().unwrap()];
    args.extend(common);
    let o = kiln(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let steps: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(steps[0]["step"], 6, "resumed after step 5: {stdout}");
    assert_eq!(steps.last().unwrap()["state_on_device"], false);
    let o = kiln(&["run", out.to_str().unwrap(), "--device", "cpu", "-i", &format!("x={}", training("digits/test_x.npy")), "--output-dir", d.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&d);
}

/// `--mixed-precision` on the GPU logs the loss scale and skipped steps, resumes (also
/// in f32 on the CPU) from its checkpoint, and is refused on the CPU.
#[test]
fn train_with_mixed_precision() {
    let d = tmp("train-mixed");
    let ck = d.join("state.npz");
    let (m, data) = (training("lenet_digits_sgd/model.onnx"), training("digits"));
    let common = ["--lr", "0.05", "--momentum", "0.9", "--batch", "64", "--json"];
    // 2^30: the first steps overflow f16 and are skipped at halving scales.
    let mut args = vec!["train", &m, "--data", &data, "--steps", "4", "--device", "gpu", "--mixed-precision", "--loss-scale", "1073741824", "--checkpoint", ck.to_str().unwrap()];
    args.extend(common);
    let o = kiln(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let steps: Vec<&serde_json::Value> = lines.iter().filter(|l| l.get("final").is_none()).collect();
    assert_eq!(steps[0]["loss_scale"], 1073741824.0, "{stdout}");
    assert_eq!(steps[0]["skipped"], true, "{stdout}");
    assert_eq!(steps.iter().filter(|s| s["skipped"] == false).count(), 4, "{stdout}");
    assert_eq!(lines.last().unwrap()["steps"], 4);
    let mut args = vec!["train", &m, "--data", &data, "--steps", "6", "--device", "cpu", "--resume", ck.to_str().unwrap()];
    args.extend(common);
    let o = kiln(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = kiln(&["train", &m, "--data", &data, "--steps", "1", "--mixed-precision", "--lr", "0.1", "--batch", "8"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("mixed precision") && stderr(&o).contains("CPU"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&d);
}

/// Bad training input gets a clear error, and nothing is lost.
#[test]
fn train_errors_are_clear_and_keep_the_last_good_state() {
    let d = tmp("train-errors");
    let (m, data) = (training("lenet_digits_sgd/model.onnx"), training("digits"));
    let base = |extra: &[&str]| -> Output {
        let mut a = vec!["train", m.as_str(), "--lr", "0.05", "--batch", "64", "--steps", "3"];
        a.extend(extra);
        kiln(&a)
    };
    // x and y of different lengths.
    let x = kiln::runtime::npy::read_file(training("digits/train_x.npy")).unwrap();
    let y = kiln::runtime::npy::read_file(training("digits/train_y.npy")).unwrap();
    let short = d.join("short");
    std::fs::create_dir_all(&short).unwrap();
    kiln::runtime::npy::write_file(short.join("x.npy"), &x).unwrap();
    kiln::runtime::npy::write_file(short.join("y.npy"), &y.reshaped(&[1437]).unwrap()).unwrap();
    let y9 = kiln::graph::Tensor::from_vec(&[100], y.to_i64_vec().unwrap()[..100].to_vec()).unwrap();
    kiln::runtime::npy::write_file(short.join("y.npy"), &y9).unwrap();
    assert_clean_error(&base(&["--data", short.to_str().unwrap()]), "has 1437 samples but");
    // Labels that are not classes of the model, and float labels for cross-entropy.
    let bad = d.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    kiln::runtime::npy::write_file(bad.join("x.npy"), &x).unwrap();
    let mut yl = y.to_i64_vec().unwrap();
    yl[7] = 10;
    kiln::runtime::npy::write_file(bad.join("y.npy"), &kiln::graph::Tensor::from_vec(&[1437], yl).unwrap()).unwrap();
    assert_clean_error(&base(&["--data", bad.to_str().unwrap()]), "label 10 of sample 7 is not a class of the model's 10");
    let yf = kiln::graph::Tensor::from_f64(kiln::graph::DType::F32, &[1437], &y.to_f64_vec()).unwrap();
    kiln::runtime::npy::write_file(bad.join("y.npy"), &yf).unwrap();
    assert_clean_error(&base(&["--data", bad.to_str().unwrap()]), "cross-entropy needs integer class labels in y, found f32");
    assert_clean_error(&base(&["--data", bad.to_str().unwrap(), "--loss", "mse"]), "y.npy is [1437]; this model and loss need one label of [10] per sample");
    // A loss that diverges stops at its step; the checkpoint holds the last good state.
    let ck = d.join("state.npz");
    let o = kiln(&["train", &m, "--data", &data, "--lr", "1e30", "--batch", "64", "--steps", "20", "--checkpoint", ck.to_str().unwrap()]);
    assert_clean_error(&o, "the loss is");
    let e = stderr(&o);
    let step: u64 = e.split("error: step ").nth(1).and_then(|s| s.split(':').next()).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{e}"));
    let saved = kiln::runtime::npz::read_file(&ck).unwrap();
    let at = saved.iter().find(|(n, _)| n == "kiln.step").unwrap().1.to_i64_vec().unwrap()[0];
    assert_eq!(at as u64, step - 1, "{e}");
    assert!(saved.iter().all(|(_, t)| t.to_f64_vec().iter().all(|v| v.is_finite())), "the kept state is finite");
    // A checkpoint of another model.
    let o = kiln(&["train", &training("tiny_gpt_adamw/model.onnx"), "--data", &data, "--lr", "0.05", "--batch", "4", "--steps", "1", "--resume", ck.to_str().unwrap()]);
    assert!(!o.status.success() && !stderr(&o).contains("panicked"), "{}", stderr(&o));
    let gpt = d.join("gpt");
    std::fs::create_dir_all(&gpt).unwrap();
    let ids = kiln::graph::Tensor::from_vec(&[8, 64], (0..512).map(|i| (i % 256) as i64).collect()).unwrap();
    kiln::runtime::npy::write_file(gpt.join("x.npy"), &ids).unwrap();
    kiln::runtime::npy::write_file(gpt.join("y.npy"), &ids).unwrap();
    let o = kiln(&["train", &training("tiny_gpt_adamw/model.onnx"), "--data", gpt.to_str().unwrap(), "--lr", "0.05", "--batch", "4", "--steps", "1", "--resume", ck.to_str().unwrap()]);
    assert_clean_error(&o, "a checkpoint of another model");
    // Unknown optimizer, schedule.
    assert_clean_error(&base(&["--data", &data, "--optimizer", "rmsprop"]), "unknown optimizer 'rmsprop'");
    assert_clean_error(&base(&["--data", &data, "--schedule", "linear"]), "unknown schedule 'linear'");
    let _ = std::fs::remove_dir_all(&d);
}

/// Every optimizer, schedule and clipping option trains (the loss falls).
#[test]
fn train_options_all_train() {
    let (m, data) = (training("lenet_digits_sgd/model.onnx"), training("digits"));
    for opts in [
        &["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--nesterov"][..],
        &["--optimizer", "lars", "--lr", "0.5", "--trust", "0.02", "--weight-decay", "1e-4"],
        &["--optimizer", "adam", "--lr", "3e-3"],
        &["--optimizer", "adamw", "--lr", "3e-3", "--weight-decay", "0.01", "--schedule", "cosine", "--warmup", "5", "--clip-norm", "1"],
        &["--optimizer", "sgd", "--lr", "0.1", "--schedule", "step:10:0.5", "--label-smoothing", "0.1"],
    ] {
        let mut a = vec!["train", m.as_str(), "--data", data.as_str(), "--batch", "32", "--steps", "40", "--json"];
        a.extend(opts);
        let o = kiln(&a);
        assert!(o.status.success(), "{opts:?}: {}", stderr(&o));
        let losses: Vec<f64> = String::from_utf8_lossy(&o.stdout).lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter(|v| v["final"].is_null()).map(|v| v["loss"].as_f64().unwrap()).collect();
        let (first, last) = (losses[..5].iter().sum::<f64>() / 5.0, losses[35..].iter().sum::<f64>() / 5.0);
        assert!(last < 0.75 * first, "{opts:?}: loss {first} -> {last}");
    }
}
