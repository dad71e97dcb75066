//! WGSL for per-plane statistics (GlobalAveragePool/GlobalMaxPool,
//! InstanceNormalization) that keeps every invocation within the GPU loop budget
//! ([`wgsl::MAX_LOOP_ITERATIONS`]): a plane too big for one invocation, or big enough
//! that spreading it is faster, gets a workgroup of lanes that fold strided partials
//! and combine them in workgroup memory.
use crate::wgsl::{self, Binding, Dispatch};
use crate::{OpError, Result};

/// Planes at least this big always use a workgroup of lanes (faster than one
/// invocation walking the whole plane).
const SPREAD_FROM: usize = 2048;
/// Lanes used for planes of at least [`SPREAD_FROM`] elements (more when the budget
/// needs them).
const SPREAD_LANES: usize = 64;

/// Lanes (invocations, a power of two up to 256) per plane for a kernel making `passes`
/// strided loops over `size` elements and `trees` tree combines (log2(lanes) loop
/// iterations each); an `OpError::Unsupported` naming `op` when 256 lanes are not
/// enough.
pub(crate) fn plane_lanes(op: &str, size: usize, passes: usize, trees: usize) -> Result<usize> {
    let iterations = |lanes: usize| passes * size.div_ceil(lanes) + trees * lanes.trailing_zeros() as usize;
    let least = if size >= SPREAD_FROM { SPREAD_LANES } else { 1 };
    (0..=8).map(|p| 1usize << p).filter(|&l| l >= least).find(|&l| iterations(l) <= wgsl::MAX_LOOP_ITERATIONS).ok_or_else(|| {
        OpError::Unsupported(format!(
            "{op} over planes of {size} elements exceeds the GPU loop budget ({} iterations per invocation, even with 256 lanes)",
            wgsl::MAX_LOOP_ITERATIONS
        ))
    })
}

/// A strided loop of lane `lid.x` over the plane's elements `j`; `body` uses `j`.
pub(crate) fn lane_loop(size: usize, lanes: usize, body: &str) -> String {
    wgsl::for_loop("j", "lid.x", &format!("{size}u"), &format!("{lanes}u"), body)
}

/// Stores the lane's partial `t` and combines all partials into `red[0]` (`combine` of
/// `red[lid.x]` and `red[lid.x + w]`); ends with a barrier, so every lane may read
/// `red[0]`, but must pass another barrier before the next tree writes `red`.
pub(crate) fn tree(lanes: usize, combine: &str) -> String {
    format!(
        "red[lid.x] = t;\n    workgroupBarrier();\n    for (var w = {}u; w > 0u; w = w >> 1u) {{\n        if (lid.x < w) {{ red[lid.x] = {combine}; }}\n        workgroupBarrier();\n    }}\n",
        lanes / 2
    )
}

/// One workgroup of `lanes` invocations per plane `i` (`planes` of them, over a 2-D
/// grid when there are many); `body` sees `i` and `lid`, and may use `red`.
pub(crate) fn lanes_dispatch(label: &str, planes: usize, lanes: usize, buffers: &[(&str, &str, bool)], bindings: Vec<Binding>, body: &str) -> Dispatch {
    let gx = planes.clamp(1, wgsl::MAX_GROUPS as usize);
    let gy = planes.div_ceil(gx).max(1);
    let source = format!(
        "{}\nvar<workgroup> red: array<f32, {lanes}>;\n\n@compute @workgroup_size({lanes})\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{\n    \
         let i = wid.x + wid.y * {gx}u;\n    if (i >= {planes}u) {{ return; }}\n    {body}\n}}\n",
        wgsl::declare(buffers)
    );
    Dispatch { label: format!("{label}[{lanes} lanes]"), source, entry_point: "main".into(), workgroups: [gx as u32, gy as u32, 1], bindings }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_grow_with_the_work_and_fail_past_256() {
        assert_eq!(plane_lanes("t", 49, 1, 1).unwrap(), 1);
        assert_eq!(plane_lanes("t", 2047, 3, 2).unwrap(), 1);
        assert_eq!(plane_lanes("t", 90_000, 1, 1).unwrap(), 64);
        assert_eq!(plane_lanes("t", 64 * 65_535, 1, 1).unwrap(), 128);
        assert_eq!(plane_lanes("t", 64 * 65_535, 3, 2).unwrap(), 256);
        // 256 lanes: 65535 iterations minus the 8 of the tree.
        assert_eq!(plane_lanes("t", 256 * 65_527, 1, 1).unwrap(), 256);
        let err = plane_lanes("GlobalAveragePool", 256 * 65_527 + 1, 1, 1).unwrap_err();
        assert!(matches!(&err, OpError::Unsupported(m) if m.contains("GlobalAveragePool") && m.contains("loop budget")), "{err}");
    }
}
