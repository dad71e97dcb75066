//! Losses, as Kiln ops appended to the forward graph. Their gradients come from the
//! same rules as the model's.
use super::emit::Emit;
use super::{AutodiffError, Result};
use kiln_graph::{Attr, DType, ValueId};

#[derive(Clone, Debug, PartialEq)]
pub enum Loss {
    /// Softmax cross-entropy over the last axis of the logits, with integer class
    /// labels of the logits' other dims, averaged over the labels that count.
    CrossEntropy {
        /// Labels equal to this count for nothing (PyTorch's `ignore_index`).
        ignore_index: Option<i64>,
        /// The target puts `1 - s` on the label and `s / classes` on every class.
        label_smoothing: f32,
    },
    /// Mean squared error against a float target of the prediction's dims.
    MeanSquaredError,
    /// The model computes its own loss: the output the step reads is a scalar (an
    /// ONNX loss op such as SoftmaxCrossEntropyLoss), and `label` names the model input
    /// that takes the label.
    ModelOutput { label: String },
}

impl Loss {
    pub fn cross_entropy() -> Loss {
        Loss::CrossEntropy { ignore_index: None, label_smoothing: 0.0 }
    }

    /// The label input's dtype and dims for a prediction of `dims` (`None` for
    /// [`Loss::ModelOutput`], whose label is a model input of its own type).
    pub fn label_type(&self, pred_dtype: DType, dims: &[usize]) -> Option<(DType, Vec<usize>)> {
        match self {
            Loss::CrossEntropy { .. } => Some((DType::I64, dims[..dims.len().saturating_sub(1)].to_vec())),
            Loss::MeanSquaredError => Some((pred_dtype, dims.to_vec())),
            Loss::ModelOutput { .. } => None,
        }
    }

    /// Adds the scalar loss of `pred` against `label`.
    pub fn emit(&self, e: &mut Emit, pred: ValueId, label: ValueId) -> Result<ValueId> {
        e.set_scope("loss");
        let pd = e.dims(pred);
        let dtype = e.dtype(pred);
        if !dtype.is_float() {
            return Err(AutodiffError::Model(format!("the loss needs a float prediction, the model's output is {dtype}")));
        }
        match self {
            Loss::ModelOutput { .. } => {
                if pd.iter().product::<usize>() != 1 {
                    return Err(AutodiffError::Model(format!("the model's output is its loss, so it must be a scalar; it is {dtype}{pd:?}")));
                }
                let one = e.reshape(pred, &[])?;
                e.op("Identity", &[one], &[])
            }
            Loss::MeanSquaredError => {
                let d = e.sub(pred, label)?;
                let d2 = e.mul(d, d)?;
                let n: usize = pd.iter().product();
                let all: Vec<usize> = (0..pd.len()).collect();
                let s = e.reduce_sum(d2, &all, false)?;
                e.scale(s, 1.0 / n.max(1) as f64)
            }
            Loss::CrossEntropy { ignore_index, label_smoothing } => {
                if pd.is_empty() {
                    return Err(AutodiffError::Model("cross-entropy needs logits with a class axis".into()));
                }
                let classes = pd[pd.len() - 1];
                let rows: usize = pd[..pd.len() - 1].iter().product();
                let logits = e.reshape(pred, &[rows, classes])?;
                let labels = e.reshape(label, &[rows, 1])?;
                let logp = e.op("LogSoftmax", &[logits], &[("axis", Attr::Int(1))])?;
                let range = e.ints(&(0..classes as i64).collect::<Vec<_>>());
                let hit = e.op("Equal", &[labels, range], &[])?;
                let mut target = e.op("Cast", &[hit], &[("to", Attr::Int(dtype.onnx_code() as i64))])?;
                if *label_smoothing != 0.0 {
                    let s = *label_smoothing as f64;
                    let t = e.scale(target, 1.0 - s)?;
                    let u = e.scalar(s / classes as f64, dtype);
                    target = e.add(t, u)?;
                }
                let p = e.mul(target, logp)?;
                let row = e.reduce_sum(p, &[1], false)?;
                let row = e.neg(row)?;
                match ignore_index {
                    None => {
                        let s = e.reduce_sum(row, &[0], false)?;
                        e.scale(s, 1.0 / rows.max(1) as f64)
                    }
                    Some(ii) => {
                        // Rows whose label is ignored count for nothing, in the sum
                        // and in the mean's denominator.
                        let flat = e.reshape(label, &[rows])?;
                        let iv = e.constant(kiln_graph::Tensor::scalar(*ii));
                        let is = e.op("Equal", &[flat, iv], &[])?;
                        let keep = e.op("Not", &[is], &[])?;
                        let w = e.op("Cast", &[keep], &[("to", Attr::Int(dtype.onnx_code() as i64))])?;
                        let kept = e.mul(row, w)?;
                        let s = e.reduce_sum(kept, &[0], false)?;
                        let c = e.reduce_sum(w, &[0], false)?;
                        let one = e.scalar(1.0, dtype);
                        let c = e.op("Max", &[c, one], &[])?;
                        e.div(s, c)
                    }
                }
            }
        }
    }
}
