//! The reference training runs of ../shared/training (PyTorch's trajectories): their
//! optimizers and batches, for the training and data-parallel tests.
use super::training_dir;
use kiln::compiler::autodiff::{Optimizer, OptimizerKind};
use kiln::graph::{DType, Tensor};
use kiln::ops::TensorType;
use kiln::runtime::npy;
use serde_json::Value;

pub fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("reference.json has no number '{k}'"))
}

/// The optimizer a reference run used.
pub fn optimizer(r: &Value) -> Optimizer {
    let kind = match r["optimizer"].as_str().unwrap() {
        "sgd" => OptimizerKind::Sgd { momentum: f(r, "momentum") as f32, nesterov: r["nesterov"].as_bool().unwrap_or(false) },
        "adam" => OptimizerKind::Adam { beta1: f(r, "beta1") as f32, beta2: f(r, "beta2") as f32, eps: f(r, "epsilon") as f32 },
        "adamw" => OptimizerKind::AdamW { beta1: f(r, "beta1") as f32, beta2: f(r, "beta2") as f32, eps: f(r, "epsilon") as f32 },
        o => panic!("optimizer {o}"),
    };
    Optimizer { kind, weight_decay: r["weight_decay"].as_f64().unwrap_or(0.0) as f32, clip_norm: None }
}

/// A run's data: batch `k` as (input name, input, label).
pub struct Run {
    pub name: &'static str,
    pub reference: Value,
    pub input: String,
    pub batch: Box<dyn Fn(usize) -> (Tensor, Tensor) + Send + Sync>,
    pub input_type: TensorType,
}

pub fn gather_rows(x: &Tensor, rows: &[usize]) -> Tensor {
    let row: usize = x.dims()[1..].iter().product();
    let size = x.dtype().size();
    let mut bytes = Vec::with_capacity(rows.len() * row * size);
    for &r in rows {
        bytes.extend_from_slice(&x.bytes()[r * row * size..(r + 1) * row * size]);
    }
    let mut dims = x.dims().to_vec();
    dims[0] = rows.len();
    Tensor::from_bytes(x.dtype(), &dims, &bytes).unwrap()
}

pub fn run(name: &'static str) -> Run {
    let dir = training_dir().join(name);
    let reference: Value = serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    let batches: Vec<Vec<usize>> = reference["batches"].as_array().unwrap().iter().map(|b| b.as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as usize).collect()).collect();
    let bsize = batches[0].len();
    if name.starts_with("lenet") {
        let x = npy::read_file(training_dir().join("digits/train_x.npy")).unwrap();
        let y = npy::read_file(training_dir().join("digits/train_y.npy")).unwrap();
        let mut dims = x.dims().to_vec();
        dims[0] = bsize;
        Run { name, reference, input: "x".into(), input_type: TensorType::new(DType::F32, dims), batch: Box::new(move |k| (gather_rows(&x, &batches[k]), gather_rows(&y, &batches[k]))) }
    } else {
        let corpus = std::fs::read(training_dir().join("corpus.txt")).unwrap();
        let ctx = reference["context"].as_u64().unwrap() as usize;
        let stride = reference["sample_stride"].as_u64().unwrap() as usize;
        Run {
            name,
            reference,
            input: "ids".into(),
            input_type: TensorType::new(DType::I64, vec![bsize, ctx]),
            batch: Box::new(move |k| {
                let take = |off: usize| -> Tensor {
                    let v: Vec<i64> = batches[k].iter().flat_map(|&i| corpus[stride * i + off..stride * i + off + ctx].iter().map(|&b| b as i64)).collect();
                    Tensor::from_vec(&[bsize, ctx], v).unwrap()
                };
                (take(0), take(1))
            }),
        }
    }
}


/// The elements of a run's parameter whose gradient is zero in exact arithmetic, so
/// that every trainer's value is rounding noise there (relative errors mean nothing;
/// Adam turns the noise into steps of up to lr): a convolution's bias followed by
/// BatchNormalization in training mode (the batch mean removes it), and the key third
/// of an attention's fused query-key-value bias (a query's scores move together).
pub fn zero_gradient(run: &str, param: &str, len: usize) -> Option<std::ops::Range<usize>> {
    if run.starts_with("lenet") && param == "features.3.bias" {
        return Some(0..len);
    }
    if run.starts_with("tiny_gpt") && param.ends_with("qkv.bias") {
        return Some(len / 3..2 * len / 3);
    }
    None
}
