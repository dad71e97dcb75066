//! wip
pub(crate) fn register(_r: &mut crate::Registry) {}
