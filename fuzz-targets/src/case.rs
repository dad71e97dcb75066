//! The input of the `session_run` target: a model, the tensors to feed it, and a seed
//! for the inputs the case does not give (dims bound to small values, data drawn from
//! a mix of ordinary and hostile numbers). Encoded as a protobuf message so that the
//! structure-aware mutator can decode, edit and re-encode it; the model field has the
//! wire format of a `.onnx` file's bytes.

use crate::rng::Rng;
use kiln_compiler::onnx::proto::{ModelProto, TensorProto};
use kiln_graph::{DType, Dim, Tensor, ValueType};
use std::collections::HashMap;

#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionCase {
    #[prost(message, optional, tag = "1")]
    pub model: Option<ModelProto>,
    /// Inputs by name (`TensorProto.name`); graph inputs not listed are synthesised.
    #[prost(message, repeated, tag = "2")]
    pub inputs: Vec<TensorProto>,
    /// Seeds the synthesised inputs.
    #[prost(uint64, tag = "3")]
    pub seed: u64,
    /// Runs the graph as imported, without `kiln_compiler::passes::optimize`.
    #[prost(bool, tag = "4")]
    pub skip_passes: bool,
}

/// Largest synthesised input, in elements: the harness's own limit, not the model's.
pub const MAX_SYNTH_ELEMENTS: usize = 1 << 22;

/// The tensors to run a session with: the case's own where it names an input, the
/// rest made up from the declared types with symbols bound to 1..=4.
pub fn inputs_for(declared: &[(String, ValueType)], given: &[(String, Tensor)], seed: u64) -> Result<Vec<(String, Tensor)>, String> {
    let mut rng = Rng::new(seed);
    let mut symbols: HashMap<String, usize> = HashMap::new();
    let mut out = vec![];
    for (name, ty) in declared {
        if let Some((_, t)) = given.iter().find(|(n, _)| n == name) {
            out.push((name.clone(), t.clone()));
            continue;
        }
        let dims: Vec<usize> = ty
            .shape
            .0
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => *n,
                Dim::Sym(s) => *symbols.entry(s.clone()).or_insert_with(|| 1 + rng.below(4)),
            })
            .collect();
        let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).filter(|&n| n <= MAX_SYNTH_ELEMENTS);
        let n = n.ok_or_else(|| format!("harness: input '{name}' of shape {dims:?} is too large to synthesise"))?;
        out.push((name.clone(), synthesise(ty.dtype, &dims, n, &mut rng)?));
    }
    Ok(out)
}

fn synthesise(dtype: DType, dims: &[usize], n: usize, rng: &mut Rng) -> Result<Tensor, String> {
    let hostile = rng.chance(1, 8);
    let values: Vec<f64> = (0..n)
        .map(|_| {
            if dtype.is_float() {
                if hostile && rng.chance(1, 4) {
                    rng.interesting_f32() as f64
                } else {
                    (rng.below(2001) as f64 - 1000.0) / 250.0
                }
            } else if hostile && rng.chance(1, 4) {
                rng.interesting_i64() as f64
            } else {
                rng.below(5) as f64 - 1.0
            }
        })
        .collect();
    Tensor::from_f64(dtype, dims, &values).map_err(|e| format!("harness: {e}"))
}
