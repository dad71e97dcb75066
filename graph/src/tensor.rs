use crate::{DType, Element, GraphError, Result};
use std::fmt;
use std::sync::Arc;

/// A dense, row-major tensor with concrete dims: a constant of a graph, an input or
/// output of a session, or a buffer of the CPU backend.
///
/// Bytes live in 8-byte aligned storage so that they can be viewed as any element
/// type without copying. Bool tensors hold one byte (0 or 1) per element.
/// Cloning is cheap (the storage is shared, copy-on-write).
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    dims: Vec<usize>,
    data: Arc<Vec<u64>>,
    len_bytes: usize,
}

fn words(n_bytes: usize) -> usize {
    n_bytes.div_ceil(8)
}

impl Tensor {
    /// A tensor of zeros.
    pub fn zeros(dtype: DType, dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        let len_bytes = n * dtype.size();
        Tensor { dtype, dims: dims.to_vec(), data: Arc::new(vec![0u64; words(len_bytes)]), len_bytes }
    }

    /// A tensor from typed values.
    pub fn from_vec<T: Element>(dims: &[usize], values: Vec<T>) -> Result<Tensor> {
        Tensor::from_slice(dims, &values)
    }

    pub fn from_slice<T: Element>(dims: &[usize], values: &[T]) -> Result<Tensor> {
        Tensor::from_bytes(T::DTYPE, dims, bytemuck::cast_slice(values))
    }

    /// A 0-d tensor.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor::from_slice(&[], &[v]).expect("one element fits a scalar")
    }

    /// Bool tensor from booleans.
    pub fn from_bools(dims: &[usize], values: &[bool]) -> Result<Tensor> {
        let bytes: Vec<u8> = values.iter().map(|&b| b as u8).collect();
        Tensor::from_bytes(DType::Bool, dims, &bytes)
    }

    /// A tensor from little-endian raw bytes.
    pub fn from_bytes(dtype: DType, dims: &[usize], bytes: &[u8]) -> Result<Tensor> {
        let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let expected = n.and_then(|n| n.checked_mul(dtype.size()));
        if expected != Some(bytes.len()) {
            return Err(GraphError::BadTensor {
                name: String::new(),
                what: format!(
                    "{} bytes given for a {dtype} tensor of shape {dims:?} ({} bytes expected)",
                    bytes.len(),
                    expected.map(|e| e.to_string()).unwrap_or_else(|| "overflowing".into())
                ),
            });
        }
        let mut data = vec![0u64; words(bytes.len())];
        bytemuck::cast_slice_mut::<u64, u8>(&mut data)[..bytes.len()].copy_from_slice(bytes);
        Ok(Tensor { dtype, dims: dims.to_vec(), data: Arc::new(data), len_bytes: bytes.len() })
    }

    /// A tensor of `dtype` and `dims` on recycled storage (at least as many 8-byte words
    /// as it needs; contents unspecified). With [`Tensor::into_storage`], a memory plan
    /// hands one buffer from tensor to tensor without allocating or copying.
    pub fn on_storage(dtype: DType, dims: &[usize], storage: Arc<Vec<u64>>) -> Result<Tensor> {
        let n: usize = dims.iter().product();
        let len_bytes = n * dtype.size();
        if storage.len() < words(len_bytes) {
            return Err(GraphError::BadTensor {
                name: String::new(),
                what: format!("storage of {} bytes is too small for a {dtype} tensor of shape {dims:?}", storage.len() * 8),
            });
        }
        Ok(Tensor { dtype, dims: dims.to_vec(), data: storage, len_bytes })
    }

    /// The tensor's storage (shared with its clones).
    pub fn into_storage(self) -> Arc<Vec<u64>> {
        self.data
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.data)[..self.len_bytes]
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.len_bytes;
        &mut bytemuck::cast_slice_mut::<u64, u8>(Arc::make_mut(&mut self.data).as_mut_slice())[..n]
    }

    /// Same bytes, other dims (the element count must match).
    pub fn reshaped(&self, dims: &[usize]) -> Result<Tensor> {
        if dims.iter().product::<usize>() != self.len() {
            return Err(GraphError::BadTensor {
                name: String::new(),
                what: format!("cannot reshape {:?} to {:?}", self.dims, dims),
            });
        }
        Ok(Tensor { dims: dims.to_vec(), ..self.clone() })
    }

    /// Typed view of the elements. Bool tensors can be viewed as `u8`.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check::<T>()?;
        Ok(bytemuck::cast_slice(self.bytes()))
    }

    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check::<T>()?;
        Ok(bytemuck::cast_slice_mut(self.bytes_mut()))
    }

    fn check<T: Element>(&self) -> Result<()> {
        let ok = T::DTYPE == self.dtype || (self.dtype == DType::Bool && T::DTYPE == DType::U8);
        if ok {
            Ok(())
        } else {
            Err(GraphError::BadTensor {
                name: String::new(),
                what: format!("a {} tensor was read as {}", self.dtype, T::DTYPE),
            })
        }
    }

    /// Elements converted to f64 (any dtype); for references and comparisons.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let b = self.bytes();
        match self.dtype {
            DType::F32 => bytemuck::cast_slice::<u8, f32>(b).iter().map(|&v| v as f64).collect(),
            DType::F64 => bytemuck::cast_slice::<u8, f64>(b).to_vec(),
            DType::F16 => bytemuck::cast_slice::<u8, half::f16>(b).iter().map(|v| v.to_f64()).collect(),
            DType::BF16 => bytemuck::cast_slice::<u8, half::bf16>(b).iter().map(|v| v.to_f64()).collect(),
            DType::I8 => bytemuck::cast_slice::<u8, i8>(b).iter().map(|&v| v as f64).collect(),
            DType::I16 => bytemuck::cast_slice::<u8, i16>(b).iter().map(|&v| v as f64).collect(),
            DType::I32 => bytemuck::cast_slice::<u8, i32>(b).iter().map(|&v| v as f64).collect(),
            DType::I64 => bytemuck::cast_slice::<u8, i64>(b).iter().map(|&v| v as f64).collect(),
            DType::U8 | DType::Bool => b.iter().map(|&v| v as f64).collect(),
            DType::U16 => bytemuck::cast_slice::<u8, u16>(b).iter().map(|&v| v as f64).collect(),
            DType::U32 => bytemuck::cast_slice::<u8, u32>(b).iter().map(|&v| v as f64).collect(),
            DType::U64 => bytemuck::cast_slice::<u8, u64>(b).iter().map(|&v| v as f64).collect(),
        }
    }

    /// Integer elements as i64 (integer and bool dtypes only); for shapes, axes, indices.
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        let b = self.bytes();
        Ok(match self.dtype {
            DType::I8 => bytemuck::cast_slice::<u8, i8>(b).iter().map(|&v| v as i64).collect(),
            DType::I16 => bytemuck::cast_slice::<u8, i16>(b).iter().map(|&v| v as i64).collect(),
            DType::I32 => bytemuck::cast_slice::<u8, i32>(b).iter().map(|&v| v as i64).collect(),
            DType::I64 => bytemuck::cast_slice::<u8, i64>(b).to_vec(),
            DType::U8 | DType::Bool => b.iter().map(|&v| v as i64).collect(),
            DType::U16 => bytemuck::cast_slice::<u8, u16>(b).iter().map(|&v| v as i64).collect(),
            DType::U32 => bytemuck::cast_slice::<u8, u32>(b).iter().map(|&v| v as i64).collect(),
            DType::U64 => bytemuck::cast_slice::<u8, u64>(b).iter().map(|&v| v as i64).collect(),
            d => {
                return Err(GraphError::BadTensor {
                    name: String::new(),
                    what: format!("expected an integer tensor, found {d}"),
                })
            }
        })
    }

    /// A tensor of `dtype` from f64 values (rounding/casting like a C cast; bool is v != 0).
    pub fn from_f64(dtype: DType, dims: &[usize], values: &[f64]) -> Result<Tensor> {
        macro_rules! conv {
            ($t:ty, $f:expr) => {{
                let v: Vec<$t> = values.iter().map($f).collect();
                Tensor::from_bytes(dtype, dims, bytemuck::cast_slice(&v))
            }};
        }
        match dtype {
            DType::F32 => conv!(f32, |&v| v as f32),
            DType::F64 => conv!(f64, |&v| v),
            DType::F16 => conv!(half::f16, |&v| half::f16::from_f64(v)),
            DType::BF16 => conv!(half::bf16, |&v| half::bf16::from_f64(v)),
            DType::I8 => conv!(i8, |&v| v as i8),
            DType::I16 => conv!(i16, |&v| v as i16),
            DType::I32 => conv!(i32, |&v| v as i32),
            DType::I64 => conv!(i64, |&v| v as i64),
            DType::U8 => conv!(u8, |&v| v as u8),
            DType::U16 => conv!(u16, |&v| v as u16),
            DType::U32 => conv!(u32, |&v| v as u32),
            DType::U64 => conv!(u64, |&v| v as u64),
            DType::Bool => conv!(u8, |&v| (v != 0.0) as u8),
        }
    }
}

impl Tensor {
    /// Relative L2 error of `self` against `reference`: ||self - ref|| / ||ref||
    /// (the absolute L2 norm of the difference when the reference is all zeros).
    /// Compares elements in order; callers check dims first.
    pub fn rel_l2_error(&self, reference: &Tensor) -> f64 {
        let (a, b) = (self.to_f64_vec(), reference.to_f64_vec());
        let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
        let den: f64 = b.iter().map(|y| y * y).sum();
        if den == 0.0 {
            num.sqrt()
        } else {
            (num / den).sqrt()
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor<{}{:?}>", self.dtype, self.dims)?;
        if self.len() <= 8 {
            write!(f, "{:?}", self.to_f64_vec())?;
        }
        Ok(())
    }
}

impl Eq for Tensor {}

impl std::hash::Hash for Tensor {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.dtype.hash(state);
        self.dims.hash(state);
        self.bytes().hash(state);
    }
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        self.dtype == other.dtype && self.dims == other.dims && self.bytes() == other.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_views_bytes_and_errors() {
        let t = Tensor::from_slice(&[2, 2], &[1f32, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(t.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        assert!(t.as_slice::<i32>().is_err());
        assert!(Tensor::from_bytes(DType::F32, &[3], &[0u8; 8]).is_err());
        assert!(Tensor::from_bytes(DType::F32, &[usize::MAX, 2], &[]).is_err());
        assert!(t.reshaped(&[3]).is_err());
        let b = Tensor::from_bools(&[3], &[true, false, true]).unwrap();
        assert_eq!(b.to_i64_vec().unwrap(), vec![1, 0, 1]);
        let mut c = t.clone();
        c.as_mut_slice::<f32>().unwrap()[0] = 9.0;
        assert_eq!(t.as_slice::<f32>().unwrap()[0], 1.0, "clones are copy-on-write");
    }

    #[test]
    fn relative_l2_error() {
        let a = Tensor::from_slice(&[2], &[3f32, 4.0]).unwrap();
        let b = Tensor::from_slice(&[2], &[3f32, 4.5]).unwrap();
        assert!((b.rel_l2_error(&a) - 0.1).abs() < 1e-12);
        assert_eq!(a.rel_l2_error(&a), 0.0);
        let z = Tensor::zeros(DType::F32, &[2]);
        assert_eq!(a.rel_l2_error(&z), 5.0);
    }
}
