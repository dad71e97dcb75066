//! The preview training optimizers of domain `ai.onnx.preview.training` (Adagrad,
//! Adam, Momentum), one elementwise update rule each over the shared [`optimizer`].
use crate::Registry;

mod adagrad;
mod adam;
mod momentum;
mod optimizer;

pub(crate) fn register(r: &mut Registry) {
    adagrad::register(r);
    adam::register(r);
    momentum::register(r);
}
