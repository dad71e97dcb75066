//! f16 across the bus. When the adapter has SHADER_F16, f16 graph inputs are uploaded
//! as 2-byte halves and widened to the f32 the kernels compute in by a GPU kernel, and
//! f16 outputs are narrowed on the GPU and read back as halves: half the bytes each way
//! and no host conversion. Without the feature the host converts (`convert.rs`).
use kiln_ops::wgsl::grid_1d;

const WORKGROUP: u32 = 256;

/// Bytes of a buffer holding `n` halves (bindings are whole 4-byte words).
pub(crate) fn packed_bytes(n: usize) -> u64 {
    ((n as u64 * 2).div_ceil(4) * 4).max(4)
}

/// f16[n] (binding 0) -> f32[n] (binding 1).
pub(crate) fn widen(n: usize) -> (String, [u32; 3]) {
    let (grid, index) = grid_1d(n, WORKGROUP);
    let source = format!(
        "enable f16;\n\
         @group(0) @binding(0) var<storage, read> src: array<f16>;\n\
         @group(0) @binding(1) var<storage, read_write> dst: array<f32>;\n\
         @compute @workgroup_size({WORKGROUP})\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n    {index}    dst[i] = f32(src[i]);\n}}\n"
    );
    (source, grid)
}

/// f32[n] (binding 0) -> f16[n] (binding 1, as words of two halves), rounding like the
/// CPU's Cast: values beyond the f16 range become infinities, NaN stays NaN (handled
/// explicitly: WGSL leaves out-of-range conversions undefined).
pub(crate) fn narrow(n: usize) -> (String, [u32; 3]) {
    let words = n.div_ceil(2);
    let (grid, index) = grid_1d(words, WORKGROUP);
    let source = format!(
        "@group(0) @binding(0) var<storage, read> src: array<f32>;\n\
         @group(0) @binding(1) var<storage, read_write> dst: array<u32>;\n\
         fn half_bits(x: f32) -> u32 {{\n    \
         if (x != x) {{ return 0x7e00u; }}\n    \
         if (x >= 65520.0) {{ return 0x7c00u; }}\n    \
         if (x <= -65520.0) {{ return 0xfc00u; }}\n    \
         return pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;\n}}\n\
         @compute @workgroup_size({WORKGROUP})\n\
         fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n    {index}    \
         let lo = half_bits(src[2u * i]);\n    \
         var hi = 0u;\n    \
         if (2u * i + 1u < {n}u) {{ hi = half_bits(src[2u * i + 1u]); }}\n    \
         dst[i] = lo | (hi << 16u);\n}}\n"
    );
    (source, grid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(src: &str) {
        let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{}\n{src}", e.emit_to_string(src)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{e:?}\n{src}"));
    }

    #[test]
    fn conversion_kernels_are_valid_wgsl() {
        for n in [1, 3, 1000, 70_000_000] {
            validate(&widen(n).0);
            validate(&narrow(n).0);
        }
        assert_eq!(packed_bytes(1), 4);
        assert_eq!(packed_bytes(3), 8);
        assert_eq!(packed_bytes(4), 8);
    }
}
