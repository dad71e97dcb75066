//! Random generators: RandomUniform, RandomNormal, their `*Like` forms, Bernoulli and
//! Multinomial, and kiln.DropoutMask (training-mode dropout's mask), all drawing from one counter-based stream ([`generator`]) so that a
//! `seed` gives the same values on every run and on every backend.
use crate::Registry;

mod bernoulli;
mod dropout_mask;
mod fill;
mod generator;
mod multinomial;
mod random_normal;
mod random_uniform;

pub(crate) fn register(r: &mut Registry) {
    random_uniform::register(r);
    random_normal::register(r);
    bernoulli::register(r);
    dropout_mask::register(r);
    multinomial::register(r);
}
