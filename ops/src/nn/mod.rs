//! Neural-network ops: convolutions (Conv, ConvTranspose, DeformConv), pooling (MaxPool,
//! AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool) and normalization
//! (BatchNormalization, InstanceNormalization, LayerNormalization, GroupNormalization,
//! RMSNormalization, LpNormalization, MeanVarianceNormalization, LRN), Attention,
//! LinearAttention,
//! RotaryEmbedding, CausalConvWithState, GridSample, AffineGrid, Col2Im, MaxUnpool, the detection ops
//! (RoiAlign, NonMaxSuppression) and the losses (NegativeLogLikelihoodLoss,
//! SoftmaxCrossEntropyLoss).
//! Sliding-window geometry (pads, auto_pad, strides, dilations, ceil_mode) is shared
//! in [`window`].
use crate::Registry;

pub use conv_nchwc::INPUT_BLOCKED_ATTR;

mod affine_grid;
mod attention;
mod attention_cpu;
mod attention_msft;
#[cfg(test)]
mod attention_tests;
mod attention_wgsl;
mod batch_norm;
mod causal_conv_with_state;
mod col2im;
mod blocked8;
mod conv;
mod conv_integer;
mod qlinear_conv;
mod qconv_depthwise;
mod qconv_depthwise_nhwc;
mod qconv_packed;
#[cfg(test)]
mod qconv_packed_tests;
mod conv_cpu;
mod conv_depthwise8;
mod conv_flipped;
mod conv_nchwc;
mod conv_nchwc_winograd;
mod conv_packed;
mod conv_winograd;
mod embed_layer_norm;
mod conv_small_k;
mod conv_transpose;
mod deform_conv;
mod global_pool;
mod instance_norm;
mod grid_sample;
mod group_norm;
mod group_query_attention;
mod layer_norm;
mod linear_attention;
mod lp_norm;
mod lrn;
mod conv_weight_grad;
mod max_pool_grad;
mod max_unpool;
mod non_max_suppression;
mod losses;
mod multi_head_attention;
mod mvn;
mod nchwc_reorder;
mod plane_lanes;
mod rms_norm;
mod roi_align;
mod skip_layer_norm;
mod rotary_embedding;
mod pool;
mod pool_blocked8;
mod pool_nchwc;
pub(crate) mod window;

pub(crate) fn register(r: &mut Registry) {
    conv::register(r);
    causal_conv_with_state::register(r);
    deform_conv::register(r);
    linear_attention::register(r);
    conv_integer::register(r);
    qlinear_conv::register(r);
    conv_nchwc::register(r);
    nchwc_reorder::register(r);
    pool_nchwc::register(r);
    conv_transpose::register(r);
    pool::register(r);
    global_pool::register(r);
    batch_norm::register(r);
    instance_norm::register(r);
    layer_norm::register(r);
    attention::register(r);
    attention_msft::register(r);
    multi_head_attention::register(r);
    group_query_attention::register(r);
    losses::register(r);
    group_norm::register(r);
    rms_norm::register(r);
    skip_layer_norm::register(r);
    embed_layer_norm::register(r);
    lp_norm::register(r);
    mvn::register(r);
    lrn::register(r);
    rotary_embedding::register(r);
    grid_sample::register(r);
    non_max_suppression::register(r);
    roi_align::register(r);
    max_unpool::register(r);
    max_pool_grad::register(r);
    conv_weight_grad::register(r);
    col2im::register(r);
    affine_grid::register(r);
}
