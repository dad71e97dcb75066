//! [`Tensor`]: dense row-major tensors with copy-on-write storage (heap, arena or a
//! mapped file).
//!
//! Invariant: the byte size of every tensor is representable ([`crate::size`]): its
//! constructors check sizes that come from elsewhere, so `len`, `bytes` and the strides
//! of an existing tensor never overflow.

use crate::{size, DType, Element, GraphError, Result, Value, ValueKind, WordMemory};
use std::fmt;
use std::sync::Arc;

/// A dense, row-major tensor with concrete dims: a constant of a graph, an input or
/// output of a session, or a buffer of the CPU backend.
///
/// Bytes live in 8-byte aligned storage so that they can be viewed as any element
/// type without copying. Bool tensors hold one byte (0 or 1) per element.
/// String tensors ([`DType::String`]) hold `String`s instead, always on the heap:
/// they have no bytes ([`Tensor::bytes`] is empty), are read through
/// [`Tensor::as_strings`], and cannot be placed in an arena or read as numbers.
/// Cloning is cheap (the storage is shared, copy-on-write), except for tensors placed
/// in a memory plan's arena ([`WordMemory`]), whose clones copy their bytes out.
pub struct Tensor {
    dtype: DType,
    dims: Vec<usize>,
    data: Storage,
    len_bytes: usize,
}

enum Storage {
    /// Storage of its own, shared copy-on-write between clones.
    Heap(Arc<Vec<u64>>),
    /// Words `offset..` of an arena. The `owner` (made by [`Tensor::in_arena`]) may
    /// write them; views (from [`Tensor::reshaped`]) only read, and copy before a write.
    Arena { arena: Arc<dyn WordMemory>, offset: usize, owner: bool },
    /// Bytes `offset..` of read-only memory owned elsewhere (a mapped file); writes copy first.
    Shared { bytes: Arc<dyn AsRef<[u8]> + Send + Sync>, offset: usize },
    /// No bytes: a sequence or an optional ([`Tensor::from_value`]).
    Composite(Arc<Value>),
    /// The elements of a string tensor, shared copy-on-write between clones and views.
    Strings(Arc<Vec<String>>),
}

impl Clone for Tensor {
    fn clone(&self) -> Tensor {
        let data = match &self.data {
            Storage::Heap(v) => Storage::Heap(v.clone()),
            Storage::Arena { .. } => Storage::Heap(Arc::new(self.copied_words())),
            Storage::Shared { bytes, offset } => Storage::Shared { bytes: bytes.clone(), offset: *offset },
            Storage::Composite(v) => Storage::Composite(v.clone()),
            Storage::Strings(v) => Storage::Strings(v.clone()),
        };
        Tensor { dtype: self.dtype, dims: self.dims.clone(), data, len_bytes: self.len_bytes }
    }
}

fn words(n_bytes: usize) -> usize {
    n_bytes.div_ceil(8)
}

/// `bytes` in 8-byte words (the last one zero-padded).
fn words_of(bytes: &[u8]) -> Vec<u64> {
    let mut data = vec![0u64; words(bytes.len())];
    bytemuck::cast_slice_mut::<u64, u8>(&mut data)[..bytes.len()].copy_from_slice(bytes);
    data
}

impl Tensor {
    /// A tensor of zeros, for dims the caller knows to be small (constants, tests).
    ///
    /// # Panics
    /// When the byte size overflows ([`size::bytes`]). Dims that come from a model, an
    /// artifact, an input file or a flag go through [`Tensor::try_zeros`].
    pub fn zeros(dtype: DType, dims: &[usize]) -> Tensor {
        match Tensor::try_zeros(dtype, dims) {
            Ok(t) => t,
            Err(e) => panic!("Tensor::zeros: {e}"),
        }
    }

    /// A tensor of zeros; an error naming the dims and dtype when its size overflows.
    /// (Whether the memory is available is the caller's limit to check: this only
    /// guarantees that the size is computed without wrapping.)
    /// A string tensor holds empty strings.
    pub fn try_zeros(dtype: DType, dims: &[usize]) -> Result<Tensor> {
        let len_bytes = size::bytes(dtype, dims)?;
        if dtype == DType::String {
            let n = len_bytes / dtype.size();
            return Ok(Tensor { dtype, dims: dims.to_vec(), data: Storage::Strings(Arc::new(vec![String::new(); n])), len_bytes });
        }
        Ok(Tensor { dtype, dims: dims.to_vec(), data: Storage::Heap(Arc::new(vec![0u64; words(len_bytes)])), len_bytes })
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

    /// A string tensor ([`DType::String`]) from its elements in row-major order.
    pub fn from_strings(dims: &[usize], values: Vec<String>) -> Result<Tensor> {
        let len_bytes = size::bytes(DType::String, dims)?;
        if len_bytes / DType::String.size() != values.len() {
            return Err(GraphError::BadTensor {
                name: String::new(),
                what: format!("{} strings given for a string tensor of shape {dims:?}", values.len()),
            });
        }
        Ok(Tensor { dtype: DType::String, dims: dims.to_vec(), data: Storage::Strings(Arc::new(values)), len_bytes })
    }

    /// The elements of a string tensor; an error for other dtypes.
    pub fn as_strings(&self) -> Result<&[String]> {
        match &self.data {
            Storage::Strings(v) => Ok(v),
            _ => Err(GraphError::BadTensor { name: String::new(), what: format!("a {} tensor was read as strings", self.dtype) }),
        }
    }

    /// The elements of a string tensor, writable (copied first when shared).
    pub fn as_strings_mut(&mut self) -> Result<&mut [String]> {
        match &mut self.data {
            Storage::Strings(v) => Ok(Arc::make_mut(v).as_mut_slice()),
            _ => Err(GraphError::BadTensor { name: String::new(), what: format!("a {} tensor was written as strings", self.dtype) }),
        }
    }

    /// A tensor from little-endian raw bytes (not for strings, which have no bytes).
    pub fn from_bytes(dtype: DType, dims: &[usize], bytes: &[u8]) -> Result<Tensor> {
        if dtype == DType::String {
            return Err(GraphError::BadTensor { name: String::new(), what: "a string tensor cannot be made from bytes".into() });
        }
        let expected = size::bytes(dtype, dims).ok();
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
        Ok(Tensor { dtype, dims: dims.to_vec(), data: Storage::Heap(Arc::new(words_of(bytes))), len_bytes: bytes.len() })
    }

    /// The tensor that owns words `offset..` of `arena` (as many as `dtype` and `dims`
    /// need; contents are whatever the arena holds). Its views ([`Tensor::reshaped`])
    /// read the same words; its clones copy them.
    ///
    /// # Safety
    /// Until this tensor and every view made from it are dropped, no other tensor may
    /// be placed on an overlapping range of `arena`.
    pub unsafe fn in_arena<A: WordMemory + 'static>(dtype: DType, dims: &[usize], arena: &Arc<A>, offset: usize) -> Result<Tensor> {
        if dtype == DType::String {
            return Err(GraphError::BadTensor { name: String::new(), what: "string tensors live on the heap, never in an arena".into() });
        }
        let len_bytes = size::bytes(dtype, dims).ok();
        match len_bytes {
            Some(n) if offset.checked_add(words(n)).is_some_and(|end| end <= arena.words()) => {
                Ok(Tensor { dtype, dims: dims.to_vec(), data: Storage::Arena { arena: arena.clone() as Arc<dyn WordMemory>, offset, owner: true }, len_bytes: n })
            }
            _ => Err(GraphError::BadTensor {
                name: String::new(),
                what: format!("a {dtype} tensor of shape {dims:?} at word {offset} does not fit an arena of {} words", arena.words()),
            }),
        }
    }

    /// A tensor reading bytes `offset..` of `bytes` without copying (for weights in a
    /// memory-mapped file); a write copies them first. Bytes that are not 8-byte aligned
    /// in memory are copied at once.
    pub fn from_shared(dtype: DType, dims: &[usize], bytes: Arc<dyn AsRef<[u8]> + Send + Sync>, offset: usize) -> Result<Tensor> {
        if dtype == DType::String {
            return Err(GraphError::BadTensor { name: String::new(), what: "a string tensor cannot be read from shared bytes".into() });
        }
        let n = size::bytes(dtype, dims).ok();
        let all = (*bytes).as_ref();
        let Some(part) = n.and_then(|n| all.get(offset..offset.checked_add(n)?)) else {
            return Err(GraphError::BadTensor {
                name: String::new(),
                what: format!("a {dtype} tensor of shape {dims:?} at byte {offset} does not fit {} bytes", all.len()),
            });
        };
        if part.as_ptr() as usize % 8 != 0 {
            return Tensor::from_bytes(dtype, dims, part);
        }
        let len_bytes = part.len();
        Ok(Tensor { dtype, dims: dims.to_vec(), data: Storage::Shared { bytes: bytes.clone(), offset }, len_bytes })
    }

    /// Whether this is the tensor that owns words `offset..` of `arena`.
    pub fn owns_arena_range<A: WordMemory>(&self, arena: &Arc<A>, offset: usize) -> bool {
        matches!(&self.data, Storage::Arena { arena: a, offset: o, owner: true } if std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(arena)) && *o == offset)
    }

    /// Whether the bytes live in an arena (an owner or a view of one).
    pub fn in_an_arena(&self) -> bool {
        matches!(self.data, Storage::Arena { .. })
    }

    /// `value` as a tensor: a tensor is itself; a sequence or an optional becomes a
    /// composite tensor, which holds no bytes (dims `[0]`, the dtype of its elements)
    /// and carries the value through interfaces that pass tensors (kernel arguments,
    /// folded constants, session inputs and outputs). Only ops that declare they take
    /// such values see them ([`Tensor::composite`]).
    pub fn from_value(value: Value) -> Tensor {
        match value {
            Value::Tensor(t) => t,
            v => Tensor { dtype: v.dtype(), dims: vec![0], data: Storage::Composite(Arc::new(v)), len_bytes: 0 },
        }
    }

    /// The sequence or optional this tensor carries; `None` for a tensor.
    pub fn composite(&self) -> Option<&Value> {
        match &self.data {
            Storage::Composite(v) => Some(v),
            _ => None,
        }
    }

    /// The kind of value this is.
    pub fn kind(&self) -> ValueKind {
        self.composite().map_or(ValueKind::Tensor, Value::kind)
    }

    /// The value this tensor is (itself, or the sequence or optional it carries).
    pub fn to_value(&self) -> Value {
        match self.composite() {
            Some(v) => v.clone(),
            None => Value::Tensor(self.clone()),
        }
    }

    fn copied_words(&self) -> Vec<u64> {
        words_of(self.bytes())
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

    /// Number of elements (never overflows: the constructors checked the size).
    pub fn len(&self) -> usize {
        self.len_bytes / self.dtype.size()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements' bytes; empty for a string tensor (see [`Tensor::as_strings`]).
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            Storage::Heap(v) => &bytemuck::cast_slice::<u64, u8>(v)[..self.len_bytes],
            // SAFETY: `in_arena` checked that the range lies in the arena, and its
            // contract keeps writers of overlapping ranges away while `self` lives.
            Storage::Arena { arena, offset, .. } => unsafe { std::slice::from_raw_parts(arena.word_ptr(*offset) as *const u8, self.len_bytes) },
            Storage::Shared { bytes, offset } => &(**bytes).as_ref()[*offset..*offset + self.len_bytes],
            // An empty view aligned for every element type, so typed casts of it succeed.
            Storage::Composite(_) | Storage::Strings(_) => bytemuck::cast_slice::<u64, u8>(&[]),
        }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if let Storage::Arena { owner: false, .. } | Storage::Shared { .. } = self.data {
            self.data = Storage::Heap(Arc::new(self.copied_words()));
        }
        let n = self.len_bytes;
        match &mut self.data {
            Storage::Strings(_) | Storage::Composite(_) => bytemuck::cast_slice_mut::<u64, u8>(&mut []),
            Storage::Heap(v) => &mut bytemuck::cast_slice_mut::<u64, u8>(Arc::make_mut(v).as_mut_slice())[..n],
            // SAFETY: as in `bytes`; only the range's owner gets here, through `&mut self`.
            Storage::Arena { arena, offset, .. } => unsafe { std::slice::from_raw_parts_mut(arena.word_ptr(*offset) as *mut u8, n) },
            Storage::Shared { .. } => unreachable!("shared bytes were copied above"),
        }
    }

    /// Same bytes, other dims (the element count must match).
    pub fn reshaped(&self, dims: &[usize]) -> Result<Tensor> {
        if size::elements(dims).ok() != Some(self.len()) || size::check(self.dtype, dims).is_err() {
            return Err(GraphError::BadTensor { name: String::new(), what: format!("cannot reshape {:?} to {:?}", self.dims, dims) });
        }
        let data = match &self.data {
            Storage::Heap(v) => Storage::Heap(v.clone()),
            Storage::Arena { arena, offset, .. } => Storage::Arena { arena: arena.clone(), offset: *offset, owner: false },
            Storage::Shared { bytes, offset } => Storage::Shared { bytes: bytes.clone(), offset: *offset },
            Storage::Composite(v) => Storage::Composite(v.clone()),
            Storage::Strings(v) => Storage::Strings(v.clone()),
        };
        Ok(Tensor { dtype: self.dtype, dims: dims.to_vec(), data, len_bytes: self.len_bytes })
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
            Err(GraphError::BadTensor { name: String::new(), what: format!("a {} tensor was read as {}", self.dtype, T::DTYPE) })
        }
    }

    /// Elements converted to f64 (any dtype; strings parse as numbers, else NaN); for
    /// references and comparisons.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let b = self.bytes();
        match self.dtype {
            DType::String => self.as_strings().unwrap_or(&[]).iter().map(|s| s.trim().parse().unwrap_or(f64::NAN)).collect(),
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
            d => b.iter().map(|&v| crate::narrow::decode(d, v)).collect(),
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
            DType::I4 | DType::I2 => b.iter().map(|&v| v as i8 as i64).collect(),
            DType::U4 | DType::U2 => b.iter().map(|&v| v as i64).collect(),
            d => return Err(GraphError::BadTensor { name: String::new(), what: format!("expected an integer tensor, found {d}") }),
        })
    }

    /// A tensor of `dtype` from f64 values (rounding/casting like a C cast; bool is v != 0;
    /// narrow floats round to nearest even and saturate, narrow integers wrap).
    /// Not for strings (an error: formatting numbers is Cast's business).
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
            DType::String => Err(GraphError::BadTensor { name: String::new(), what: "a string tensor cannot be made from numbers".into() }),
            DType::F8E8M0 => conv!(u8, |&v| crate::narrow::e8m0_encode(v as f32, true, crate::narrow::E8M0Round::Nearest)),
            d => match (crate::narrow::MiniFloat::of(d), crate::narrow::narrow_int(d)) {
                (Some(f), _) => conv!(u8, |&v| f.encode(v, true)),
                (_, Some((bits, signed))) => conv!(u8, |&v| crate::narrow::wrap_int(v as i128, bits, signed)),
                _ => unreachable!("every narrow dtype is a minifloat or a narrow integer"),
            },
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
        if let Some(v) = self.composite() {
            return write!(f, "Tensor<{v:?}>");
        }
        write!(f, "Tensor<{}{:?}>", self.dtype, self.dims)?;
        if let Ok(s) = self.as_strings() {
            if s.len() <= 8 {
                write!(f, "{s:?}")?;
            }
        } else if self.len() <= 8 {
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
        self.composite().hash(state);
        if let Ok(s) = self.as_strings() {
            s.hash(state);
        }
    }
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        self.dtype == other.dtype && self.dims == other.dims && self.bytes() == other.bytes() && self.composite() == other.composite() && self.as_strings().ok() == other.as_strings().ok()
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

    /// Words for the arena tests (the runtime's arena is the real one).
    struct TestArena(Box<[std::cell::UnsafeCell<u64>]>);
    // SAFETY: the test places non-overlapping tensors only.
    unsafe impl Sync for TestArena {}
    unsafe impl WordMemory for TestArena {
        fn words(&self) -> usize {
            self.0.len()
        }
        fn word_ptr(&self, offset: usize) -> *mut u64 {
            std::cell::UnsafeCell::raw_get(self.0.as_ptr()).wrapping_add(offset)
        }
    }

    #[test]
    fn arena_owners_views_and_clones() {
        let arena = Arc::new(TestArena((0..8).map(|_| std::cell::UnsafeCell::new(0)).collect()));
        // SAFETY: the two ranges (words 0..2 and 2..4) do not overlap.
        let (mut a, mut b) = unsafe { (Tensor::in_arena(DType::F32, &[4], &arena, 0).unwrap(), Tensor::in_arena(DType::F32, &[2], &arena, 2).unwrap()) };
        a.as_mut_slice::<f32>().unwrap().copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        b.as_mut_slice::<f32>().unwrap().copy_from_slice(&[5.0, 6.0]);
        assert!(a.owns_arena_range(&arena, 0) && !a.owns_arena_range(&arena, 2));
        let view = a.reshaped(&[2, 2]).unwrap();
        assert!(view.in_an_arena() && !view.owns_arena_range(&arena, 0));
        assert_eq!(view.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        // Writing through a view copies first; clones are copies.
        let mut written = view.reshaped(&[4]).unwrap();
        written.as_mut_slice::<f32>().unwrap()[0] = 9.0;
        let clone = b.clone();
        b.as_mut_slice::<f32>().unwrap()[0] = 7.0;
        assert!(!clone.in_an_arena() && !written.in_an_arena());
        assert_eq!(clone.as_slice::<f32>().unwrap(), &[5.0, 6.0]);
        assert_eq!(a.as_slice::<f32>().unwrap()[0], 1.0);
        assert_eq!(written.as_slice::<f32>().unwrap()[0], 9.0);
        // A range past the end is an error.
        assert!(unsafe { Tensor::in_arena(DType::F32, &[4], &arena, 7) }.is_err());
        assert!(unsafe { Tensor::in_arena(DType::F32, &[usize::MAX, 4], &arena, 0) }.is_err());
    }

    #[test]
    fn shared_bytes_are_read_in_place_and_copied_on_write() {
        let words: Vec<u64> = vec![0; 3];
        let mut backing = bytemuck::cast_slice::<u64, u8>(&words).to_vec();
        backing[8..16].copy_from_slice(bytemuck::cast_slice(&[1.5f32, -2.0]));
        let shared: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(backing);
        let t = Tensor::from_shared(DType::F32, &[2], shared.clone(), 8).unwrap();
        assert_eq!(t.as_slice::<f32>().unwrap(), &[1.5, -2.0]);
        let mut c = t.reshaped(&[1, 2]).unwrap();
        c.as_mut_slice::<f32>().unwrap()[0] = 7.0;
        assert_eq!(t.as_slice::<f32>().unwrap()[0], 1.5);
        assert_eq!(&(*shared).as_ref()[8..12], &1.5f32.to_le_bytes());
        // Out of range is an error; a misaligned start is copied (and still right).
        assert!(Tensor::from_shared(DType::F32, &[5], shared.clone(), 8).is_err());
        assert!(Tensor::from_shared(DType::F32, &[1], shared.clone(), usize::MAX).is_err());
        let odd = Tensor::from_shared(DType::U8, &[3], shared, 9).unwrap();
        assert_eq!(odd.bytes(), &1.5f32.to_le_bytes()[1..4]);
    }

    #[test]
    fn sizes_that_wrap_are_errors_not_tensors() {
        // 2^32 * 2^32 * 4 bytes wraps to 0 in release builds: a tensor "of 0 bytes" that
        // kernels would then index out of range.
        let huge = [1usize << 32, 1 << 32];
        let e = Tensor::try_zeros(DType::F32, &huge).unwrap_err().to_string();
        assert!(e.contains("[4294967296, 4294967296]") && e.contains("f32"), "{e}");
        assert!(Tensor::try_zeros(DType::F32, &[usize::MAX, 2, 0]).is_err());
        assert!(Tensor::from_bytes(DType::F32, &huge, &[]).is_err());
        let empty = Tensor::zeros(DType::F32, &[0]);
        assert!(empty.reshaped(&huge).is_err(), "the wrapped product 0 must not pass for an empty tensor");
        assert!(empty.reshaped(&[0, usize::MAX]).is_err());
        assert_eq!(empty.reshaped(&[0, 7]).unwrap().len(), 0);
        let t = Tensor::try_zeros(DType::I64, &[3, 5]).unwrap();
        assert_eq!((t.len(), t.bytes().len()), (15, 120));
        assert_eq!(Tensor::scalar(1u8).len(), 1);
    }

    #[test]
    #[should_panic(expected = "overflows")]
    fn zeros_panics_instead_of_wrapping() {
        Tensor::zeros(DType::F32, &[1 << 32, 1 << 32]);
    }

    #[test]
    fn string_tensors_hold_strings_not_bytes() {
        let t = Tensor::from_strings(&[2], vec!["a".into(), "b".into()]).unwrap();
        assert_eq!((t.dtype(), t.len(), t.bytes().len()), (DType::String, 2, 0));
        assert_eq!(t.as_strings().unwrap(), ["a", "b"]);
        assert!(Tensor::from_strings(&[3], vec!["a".into()]).is_err());
        let mut c = t.reshaped(&[1, 2]).unwrap();
        c.as_strings_mut().unwrap()[0] = "z".into();
        assert_eq!(t.as_strings().unwrap()[0], "a", "views are copy-on-write");
        assert_ne!(t, c);
        assert_eq!(t, t.clone());
        assert_eq!(Tensor::zeros(DType::String, &[3]).as_strings().unwrap(), ["", "", ""]);
        assert!(t.as_slice::<u8>().is_err() && t.to_i64_vec().is_err());
        assert!(Tensor::from_bytes(DType::String, &[0], &[]).is_err() && Tensor::from_f64(DType::String, &[1], &[1.0]).is_err());
        assert!(Tensor::from_f64(DType::F32, &[1], &[1.0]).unwrap().as_strings().is_err());
        let arena = Arc::new(TestArena((0..8).map(|_| std::cell::UnsafeCell::new(0)).collect()));
        // SAFETY: refused before anything is placed.
        assert!(unsafe { Tensor::in_arena(DType::String, &[1], &arena, 0) }.is_err());
        assert_eq!(DType::from_onnx_code(8), Some(DType::String));
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
