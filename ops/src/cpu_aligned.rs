//! Packed operands on cache-line boundaries: a kernel that reads a packed panel in
//! 64-byte vector loads then never has one load span two lines (an allocator's large
//! blocks start 16 bytes past a page: every 512-bit load of them would split).
use std::ops::{Deref, DerefMut};

/// Bytes of a cache line, the alignment of an [`Aligned`] buffer's first element.
pub const LINE: usize = 64;

/// A buffer of plain values (floats, packed integer words) whose first element sits at
/// a multiple of [`LINE`] bytes. Its elements never move (the heap block does not move
/// with the value).
pub struct Aligned<T> {
    buf: Vec<T>,
    start: usize,
    len: usize,
}

/// Packed f32 filters and panels.
pub type AlignedF32 = Aligned<f32>;

impl<T: Copy + Default> Aligned<T> {
    /// The values of `v` (moved where `v` is aligned already, else copied once).
    pub fn from_vec(v: Vec<T>) -> Aligned<T> {
        let len = v.len();
        if v.as_ptr().align_offset(LINE) == 0 {
            return Aligned { buf: v, start: 0, len };
        }
        let slack = LINE.div_ceil(std::mem::size_of::<T>().max(1));
        let mut buf = vec![T::default(); len + slack];
        // (`align_offset` may answer "cannot": then the values start unaligned.)
        let start = buf.as_ptr().align_offset(LINE).min(slack);
        buf[start..start + len].copy_from_slice(&v);
        Aligned { buf, start, len }
    }
}

impl<T: Copy + Default> Clone for Aligned<T> {
    fn clone(&self) -> Aligned<T> {
        Aligned::from_vec(self.to_vec())
    }
}

impl<T> Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl<T> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

impl<T> std::fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Aligned({} values of {} bytes)", self.len, std::mem::size_of::<T>())
    }
}

#[cfg(test)]
mod tests {
    use super::{Aligned, AlignedF32, LINE};

    #[test]
    fn starts_on_a_line_and_keeps_the_values() {
        for n in [0usize, 1, 15, 16, 1000, 100_003] {
            let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
            // Misaligned on purpose: the tail of a larger block.
            let mut shifted = vec![0f32; n + 1];
            shifted[1..].copy_from_slice(&v);
            let tail = shifted[1..].to_vec();
            for a in [AlignedF32::from_vec(v.clone()), AlignedF32::from_vec(tail)] {
                assert_eq!(a.as_ptr().align_offset(LINE), 0, "{n}");
                assert_eq!(&a[..], &v[..]);
            }
        }
        let words = Aligned::from_vec(vec![7u32; 33]);
        assert_eq!((words.as_ptr().align_offset(LINE), words.len(), words[32]), (0, 33, 7));
    }
}
