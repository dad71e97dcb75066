//! One block of memory that a memory plan carves into tensors at fixed offsets.
//!
//! A CPU plan assigns every intermediate a word range in an [`Arena`]; ranges of
//! tensors alive at the same time never overlap. [`crate::Tensor::in_arena`] makes the
//! tensor that owns a range (it may be written), and views of it
//! ([`crate::Tensor::reshaped`]) read the same range without copying. The rules that
//! keep this sound live with the plan: only one owner per range at a time, owners are
//! written only by the step that defines them, and views are dropped before their
//! range gets a new owner. Everything else about a range-backed tensor stays safe:
//! cloning copies its bytes out, and writing through a view copies first.
use std::cell::UnsafeCell;

/// A zeroed block of 8-byte words, shared by the tensors a memory plan places in it.
pub struct Arena {
    words: Box<[UnsafeCell<u64>]>,
}

// SAFETY: the words are only reached through tensors placed by a memory plan, which
// never gives two live tensors overlapping ranges where one of them is written.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl Arena {
    /// An arena of `words` zeroed 8-byte words.
    pub fn new(words: usize) -> Arena {
        Arena { words: (0..words).map(|_| UnsafeCell::new(0)).collect() }
    }

    /// Size in 8-byte words.
    pub fn words(&self) -> usize {
        self.words.len()
    }

    /// The address of word `offset` (`offset <= words()`).
    pub(crate) fn word_ptr(&self, offset: usize) -> *mut u64 {
        debug_assert!(offset <= self.words.len());
        // UnsafeCell<u64> has the layout of u64, and gives mutable access through `&self`.
        UnsafeCell::raw_get(self.words.as_ptr()).wrapping_add(offset)
    }
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Arena({} words)", self.words.len())
    }
}
