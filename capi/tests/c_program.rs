//! A C program (tests/c/run_model.c) compiled with the system compiler against
//! include/kiln.h, linked once to the shared library and once to the static one, runs a
//! zoo model (mlp) on the CPU and the GPU; its output matches onnxruntime's.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder cargo put this crate's libraries in: `deps/` beside the test binary under
/// `cargo test`, the profile's folder after `cargo build`.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let found = [deps, deps.parent().unwrap()].into_iter().find(|d| d.join("libkiln_c.so").exists());
    found.expect("libkiln_c.so is built beside the test (cargo builds the crate's cdylib)").to_path_buf()
}

fn zoo() -> PathBuf {
    std::env::var_os("KILN_ZOO").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/zoo"))
}

fn compile(out: &Path, static_link: bool) {
    compile_source(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/run_model.c"), out, static_link);
}

fn compile_source(source: &Path, out: &Path, static_link: bool) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    let mut cc = Command::new("cc");
    cc.arg("-O1").arg("-Wall").arg("-Werror").arg("-I").arg(dir.join("include")).arg(source).arg("-o").arg(out);
    if static_link {
        cc.arg(lib.join("libkiln_c.a")).args(["-lpthread", "-ldl", "-lm"]);
    } else {
        cc.arg(format!("-L{}", lib.display())).arg("-lkiln_c").arg(format!("-Wl,-rpath,{}", lib.display()));
    }
    let o = cc.output().expect("the system C compiler (cc) runs; scripts/test.sh installs it");
    assert!(o.status.success(), "cc failed:\n{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_c_program_runs_a_zoo_model_through_the_shared_and_the_static_library() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let d = std::env::temp_dir().join("kiln-xdg");
        let _ = std::fs::create_dir_all(&d);
        std::env::set_var("XDG_RUNTIME_DIR", d);
    }
    let tmp = std::env::temp_dir().join(format!("kiln-capi-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let model = zoo().join("mlp/model.onnx");
    let data = zoo().join("mlp/test_data_set_0");
    let input = kiln_compiler::onnx::read_tensor_pb(data.join("input_0.pb")).unwrap().1;
    let want = kiln_compiler::onnx::read_tensor_pb(data.join("output_0.pb")).unwrap().1;
    let input_bin = tmp.join("input.bin");
    std::fs::write(&input_bin, input.bytes()).unwrap();
    for static_link in [false, true] {
        let exe = tmp.join(if static_link { "run_model_static" } else { "run_model_shared" });
        compile(&exe, static_link);
        for device in ["cpu", "gpu"] {
            let out_bin = tmp.join(format!("out-{device}-{static_link}.bin"));
            let o = Command::new(&exe).arg(&model).arg(&input_bin).arg(&out_bin).arg(device).output().unwrap();
            let stdout = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "{} on {device} failed:\n{stdout}\n{}", exe.display(), String::from_utf8_lossy(&o.stderr));
            assert!(stdout.contains("input 0: x dtype 1 rank 2") && stdout.contains("ok"), "{stdout}");
            let bytes = std::fs::read(&out_bin).unwrap();
            let got: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            let want = want.to_f64_vec();
            assert_eq!(got.len(), want.len());
            let err = got.iter().zip(&want).map(|(&a, &b)| (a as f64 - b).abs()).fold(0.0, f64::max);
            assert!(err < 1e-4, "{device}: max |error| {err:.3e} against onnxruntime");
        }
    }
    let _ = std::fs::remove_dir_all(tmp);
}

/// The C blocks of docs/guide.md compile and run on the zoo's mlp.
#[test]
fn the_c_blocks_of_the_guide_compile_and_run() {
    let guide = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/guide.md")).unwrap();
    let blocks: Vec<&str> = guide.split("```c\n").skip(1).map(|b| b.split("```").next().unwrap()).collect();
    assert!(!blocks.is_empty(), "the guide has C blocks");
    let tmp = std::env::temp_dir().join(format!("kiln-capi-guide-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for (k, code) in blocks.iter().enumerate() {
        let src = tmp.join(format!("guide{k}.c"));
        std::fs::write(&src, code).unwrap();
        let exe = tmp.join(format!("guide{k}"));
        compile_source(&src, &exe, false);
        let o = Command::new(&exe).arg(zoo().join("mlp/model.onnx")).output().unwrap();
        assert!(o.status.success(), "guide C block {k}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).contains("logits[0]"));
    }
    let _ = std::fs::remove_dir_all(tmp);
}
