//! Random generators: RandomUniform, RandomNormal, their `*Like` forms, Bernoulli and
//! Multinomial, all drawing from one counter-based stream ([`generator`]) so that a
//! `seed` gives the same values on every run and on every backend.
use crate::Registry;

mod bernoulli;
mod fill;
mod generator;
mod multinomial;
mod random_normal;
mod random_uniform;

pub(crate) fn register(r: &mut Registry) {
    random_uniform::register(r);
    random_normal::register(r);
    bernoulli::register(r);
    multinomial::register(r);
}
