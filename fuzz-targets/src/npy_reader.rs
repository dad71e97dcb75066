//! The one place the fuzz targets reach Kiln's `.npy` reader. The reader is moving
//! from kiln-compiler into kiln-runtime (issue 10): when it moves, only the path in
//! [`read_npy`] changes.

use kiln_graph::Tensor;

/// Decodes a `.npy` file held in memory.
pub fn read_npy(bytes: &[u8]) -> Result<Tensor, String> {
    kiln_runtime::npy::decode(bytes).map_err(|e| e.to_string())
}

/// Encodes a tensor as a `.npy` file (for seeds).
pub fn write_npy(t: &Tensor) -> Vec<u8> {
    kiln_runtime::npy::encode(t)
}
