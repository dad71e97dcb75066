//! Neural-network ops: convolutions (Conv, ConvTranspose), pooling (MaxPool,
//! AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool) and normalization
//! (BatchNormalization, InstanceNormalization). Sliding-window geometry (pads,
//! auto_pad, strides, dilations, ceil_mode) is shared in [`window`].
use crate::Registry;

mod conv;
mod conv_cpu;
#[cfg(test)]
mod testutil;
mod window;

pub(crate) fn register(r: &mut Registry) {
    conv::register(r);
}
