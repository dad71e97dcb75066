//! (family stub: ops are added here)
use crate::Registry;

pub(crate) fn register(_r: &mut Registry) {}
