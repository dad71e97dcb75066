//! Writing trained weights back into the ONNX model they came from: each trained
//! initializer replaced, BatchNormalization switched to inference mode (its running
//! statistics as trained), Dropout to the identity, everything else as it was.
use super::{Result, TrainError, Trainer};
use kiln_compiler::autodiff::StateKind;
use kiln_compiler::onnx::{proto, tensor_to_proto};
use prost::Message;
use std::path::Path;

/// Reads the ONNX model at `source`, writes it with the trainer's weights to `dest`.
pub fn export_onnx(trainer: &Trainer, source: &Path, dest: &Path) -> Result<()> {
    let fail = |what: String| TrainError::Export(what);
    let bytes = std::fs::read(source).map_err(|e| fail(format!("cannot read '{}': {e}", source.display())))?;
    let mut model = proto::ModelProto::decode(bytes.as_slice()).map_err(|e| fail(format!("'{}' is not an ONNX model: {e}", source.display())))?;
    let graph = model.graph.as_mut().ok_or_else(|| fail(format!("'{}' has no graph", source.display())))?;
    for (s, t) in trainer.state()? {
        if matches!(s.kind, StateKind::Slot { .. } | StateKind::LossScale) {
            continue;
        }
        let init = graph.initializer.iter_mut().find(|i| i.name == s.name).ok_or_else(|| fail(format!("the model has no initializer '{}'", s.name)))?;
        *init = tensor_to_proto(&s.name, &t);
    }
    for n in &mut graph.node {
        if n.domain.is_empty() || n.domain == "ai.onnx" {
            match n.op_type.as_str() {
                "BatchNormalization" => {
                    n.attribute.retain(|a| a.name != "training_mode");
                    n.output.truncate(1);
                }
                // Without its training_mode input, Dropout is the identity.
                "Dropout" => n.input.truncate(2),
                _ => {}
            }
        }
    }
    std::fs::write(dest, model.encode_to_vec()).map_err(|e| fail(format!("cannot write '{}': {e}", dest.display())))
}
