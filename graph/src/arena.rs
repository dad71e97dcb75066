//! Memory that a memory plan carves into tensors at fixed offsets.
//!
//! A runtime's plan assigns every intermediate a word range of a block of memory (its
//! arena, which implements [`WordMemory`]); ranges of tensors alive at the same time
//! never overlap. [`crate::Tensor::in_arena`] makes the tensor that owns a range (it may
//! be written), and views of it ([`crate::Tensor::reshaped`]) read the same range
//! without copying. The rules that keep this sound live with the plan: only one owner
//! per range at a time, owners are written only by the step that defines them, and
//! views are dropped before their range gets a new owner. Everything else about a
//! range-backed tensor stays safe: cloning copies its bytes out, and writing through a
//! view copies first. The IR defines only this contract; the memory itself (and its
//! `unsafe` interior mutability) belongs to the runtime.

/// A block of 8-byte words that tensors placed by a memory plan read and write through
/// shared references.
///
/// # Safety
/// `word_ptr(o)` for `o <= words()` must point at word `o` of one allocation of
/// `words()` 8-byte aligned words, valid for reads and writes (through that pointer,
/// from any thread) for as long as the memory lives, and never moved.
pub unsafe trait WordMemory: Send + Sync {
    /// Size in 8-byte words.
    fn words(&self) -> usize;
    /// The address of word `offset` (`offset <= words()`).
    fn word_ptr(&self, offset: usize) -> *mut u64;
}
