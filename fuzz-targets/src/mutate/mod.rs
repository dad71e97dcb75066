//! Mutators: structure-aware ones per input format ([`model`], [`artifact`], [`npy`])
//! and raw byte edits ([`bytes`]). [`crate::Target::mutate`] picks between them; the
//! libFuzzer targets call it from their custom mutator, the stable smoke with seeded
//! generators.

pub mod artifact;
pub mod bytes;
pub mod model;
pub mod npy;
