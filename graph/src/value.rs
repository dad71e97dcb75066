//! [`Value`]: what a graph value holds at run time. Tensors, and ONNX's sequences and
//! optionals, which exist on the host only: their tensors are ordinary [`Tensor`]s.

use crate::{DType, Tensor, ValueKind};
use std::fmt;

/// A run-time value: a tensor, a sequence of tensors, or an optional tensor or sequence.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Value {
    Tensor(Tensor),
    /// Tensors of one dtype, in order (their shapes may differ).
    Sequence { dtype: DType, tensors: Vec<Tensor> },
    /// A tensor or a sequence (`element`, never an optional), or nothing; `dtype` is that
    /// of its tensors, known even when it holds nothing.
    Optional { element: ValueKind, dtype: DType, value: Option<Box<Value>> },
}

impl Value {
    /// A sequence of `tensors`; `dtype` is theirs (and the dtype of an empty one).
    pub fn sequence(dtype: DType, tensors: Vec<Tensor>) -> Value {
        Value::Sequence { dtype, tensors }
    }

    /// An optional holding `value` (a tensor or a sequence).
    pub fn some(value: Value) -> Value {
        Value::Optional { element: value.kind().element(), dtype: value.dtype(), value: Some(Box::new(value)) }
    }

    /// An empty optional of a tensor or a sequence (`element`) of `dtype`.
    pub fn none(element: ValueKind, dtype: DType) -> Value {
        Value::Optional { element: element.element(), dtype, value: None }
    }

    pub fn kind(&self) -> ValueKind {
        match self {
            Value::Tensor(_) => ValueKind::Tensor,
            Value::Sequence { .. } => ValueKind::Sequence,
            Value::Optional { element, .. } => element.optional(),
        }
    }

    /// The dtype of the tensors it is or holds.
    pub fn dtype(&self) -> DType {
        match self {
            Value::Tensor(t) => t.dtype(),
            Value::Sequence { dtype, .. } | Value::Optional { dtype, .. } => *dtype,
        }
    }

    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The tensors of a sequence.
    pub fn as_sequence(&self) -> Option<&[Tensor]> {
        match self {
            Value::Sequence { tensors, .. } => Some(tensors),
            _ => None,
        }
    }

    /// What an optional holds (`None` when empty); `None` for other kinds.
    pub fn as_optional(&self) -> Option<Option<&Value>> {
        match self {
            Value::Optional { value, .. } => Some(value.as_deref()),
            _ => None,
        }
    }

    /// Its kind and the dtype of its tensors: `seq(f32)`, `optional(i64)`, `f32[2, 3]`.
    pub fn describe(&self) -> String {
        match self {
            Value::Tensor(t) => format!("{}{:?}", t.dtype(), t.dims()),
            v => v.kind().describe(&v.dtype().to_string()),
        }
    }
}

impl From<Tensor> for Value {
    /// A tensor's value: the tensor, or the sequence or optional it carries.
    fn from(t: Tensor) -> Value {
        match t.composite() {
            Some(v) => v.clone(),
            None => Value::Tensor(t),
        }
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Tensor(t) => write!(f, "{t:?}"),
            Value::Sequence { dtype, tensors } => write!(f, "Sequence<{dtype}>{tensors:?}"),
            Value::Optional { element, dtype, value: None } => write!(f, "{}: None", element.optional().describe(&dtype.to_string())),
            Value::Optional { value: Some(v), .. } => write!(f, "Some({v:?})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_composite_reads_as_empty_elements_of_any_type() {
        let seq = Tensor::from_value(Value::sequence(DType::F32, vec![Tensor::from_slice(&[1], &[1f32]).unwrap()]));
        assert!(seq.to_f64_vec().is_empty());
        assert!(seq.as_slice::<f32>().unwrap().is_empty());
    }

    #[test]
    fn composite_tensors_carry_values_and_hold_no_bytes() {
        let a = Tensor::from_slice(&[2], &[1f32, 2.0]).unwrap();
        let seq = Tensor::from_value(Value::sequence(DType::F32, vec![a.clone(), a.clone()]));
        assert_eq!(seq.kind(), ValueKind::Sequence);
        assert_eq!((seq.dtype(), seq.dims(), seq.bytes().len()), (DType::F32, &[0][..], 0));
        assert_eq!(seq.composite().and_then(Value::as_sequence).map(|s| s.len()), Some(2));
        // Equality and hashing see the value, not only the (empty) bytes.
        let other = Tensor::from_value(Value::sequence(DType::F32, vec![a.clone()]));
        assert_ne!(seq, other);
        assert_eq!(seq, seq.clone());
        let none = Tensor::from_value(Value::none(ValueKind::Sequence, DType::F32));
        assert_eq!(none.kind(), ValueKind::OptionalSequence);
        assert_eq!(Value::from(none.clone()).as_optional(), Some(None));
        let some = Value::some(Value::Tensor(a.clone()));
        assert_eq!(some.kind(), ValueKind::OptionalTensor);
        assert_eq!(Tensor::from_value(Value::Tensor(a.clone())), a, "a tensor value is the tensor itself");
        assert!(a.composite().is_none() && a.kind().is_tensor());
        assert_eq!(Value::from(Tensor::from_value(some.clone())), some);
    }
}
