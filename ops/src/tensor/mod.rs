//! Data-movement and tensor-manipulation operators: views (Reshape, Flatten, Squeeze,
//! Unsqueeze, Identity, Dropout), constants and shape queries (Constant,
//! ConstantOfShape, Shape, Size, Range), Cast/CastLike, BitCast, and copies that rearrange
//! elements (Concat, Split, Slice, Pad, Transpose, Gather, GatherElements, GatherND,
//! Expand, Tile, Where, Resize, Upsample, Trilu, DepthToSpace, SpaceToDepth,
//! ReverseSequence, Compress, CenterCropPad), scatters (Scatter, ScatterElements,
//! ScatterND, TensorScatter), scans (CumSum, CumProd), selection (TopK, Hardmax, OneHot, EyeLike,
//! NonZero, Unique) and Einsum.
//! Element rearrangement is byte-level, so every op works for every dtype; ops that
//! compute widen elements through [`numeric`].
use crate::Registry;

mod common;
mod index_map;
mod numeric;
pub(crate) use numeric::{from_i64, write_i64};
pub(crate) use common::tensor_args;

pub(crate) mod cast;
mod cast_string;
mod center_crop_pad;
mod concat;
mod constant;
mod cumulative;
mod expand;
mod gather;
mod gather_elements;
mod identity;
mod pad;
mod range;
mod reshape;
mod scatter_elements;
mod scatter_nd;
mod resize;
mod shape;
mod slice;
mod split;
mod squeeze;
mod tile;
mod top_k;
mod hardmax;
mod one_hot;
mod depth_space;
mod eye_like;
mod window_fn;
mod gather_nd;
mod reverse_sequence;
mod non_zero;
mod compress;
mod einsum;
mod transpose;
mod trilu;
mod unique;
mod where_op;
mod bitcast;
mod tensor_scatter;

pub(crate) fn register(r: &mut Registry) {
    reshape::register(r);
    gather_elements::register(r);
    squeeze::register(r);
    identity::register(r);
    constant::register(r);
    shape::register(r);
    cast::register(r);
    concat::register(r);
    split::register(r);
    slice::register(r);
    pad::register(r);
    transpose::register(r);
    gather::register(r);
    expand::register(r);
    tile::register(r);
    where_op::register(r);
    range::register(r);
    resize::register(r);
    trilu::register(r);
    cumulative::register(r);
    scatter_elements::register(r);
    scatter_nd::register(r);
    top_k::register(r);
    hardmax::register(r);
    one_hot::register(r);
    depth_space::register(r);
    eye_like::register(r);
    window_fn::register(r);
    gather_nd::register(r);
    reverse_sequence::register(r);
    non_zero::register(r);
    compress::register(r);
    einsum::register(r);
    center_crop_pad::register(r);
    unique::register(r);
    bitcast::register(r);
    tensor_scatter::register(r);
}
