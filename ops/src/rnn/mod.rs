//! Recurrent ops: LSTM, GRU and RNN (one file each: the cell's gate equations on the
//! CPU and in WGSL), over shared code: attributes, activations, shapes and the op type
//! ([`common`]), the CPU recurrence ([`recurrence_cpu`]: the input projection of every
//! step as one linalg product, then per step the recurrent product and the gates) and
//! the WGSL program ([`recurrence_wgsl`]: the projection, then dispatches per step that
//! share one pipeline).
use crate::Registry;

mod common;
mod gru;
mod lstm;
mod quantized;
mod recurrence_cpu;
mod recurrence_wgsl;
#[cfg(test)]
mod reference;
mod simple_rnn;

pub(crate) fn register(r: &mut Registry) {
    lstm::register(r);
    gru::register(r);
    simple_rnn::register(r);
}
