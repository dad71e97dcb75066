//! Host <-> GPU element conversion. GPU buffers hold 4-byte elements (see
//! `kiln_ops::wgsl`): floats as f32, signed integers as i32, unsigned and bool as u32.
//! Integers that do not fit 32 bits are reported, never wrapped. Narrow dtypes travel
//! as their values (float8/float4 as f32, 4- and 2-bit integers as i32/u32).
use crate::{Result, RuntimeError};
use kiln_graph::{narrow, DType, Tensor};

/// The bytes to upload for `t` (4 bytes per element). `what` names the tensor in errors.
pub(crate) fn to_gpu(t: &Tensor, what: &str) -> Result<Vec<u8>> {
    let b = t.bytes();
    Ok(match t.dtype() {
        DType::F32 | DType::I32 | DType::U32 => b.to_vec(),
        DType::F64 | DType::F16 | DType::BF16 => {
            let v: Vec<f32> = t.to_f64_vec().into_iter().map(|x| x as f32).collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        DType::I64 => {
            let src: &[i64] = bytemuck::cast_slice(b);
            let mut v = Vec::with_capacity(src.len());
            for (i, &x) in src.iter().enumerate() {
                let y = i32::try_from(x).map_err(|_| {
                    RuntimeError::OutOfRange(format!(
                        "{what}: element {i} is {x}, which does not fit the GPU's 32-bit integers"
                    ))
                })?;
                v.push(y);
            }
            bytemuck::cast_slice(&v).to_vec()
        }
        DType::U64 => {
            let src: &[u64] = bytemuck::cast_slice(b);
            let mut v = Vec::with_capacity(src.len());
            for (i, &x) in src.iter().enumerate() {
                v.push(u32::try_from(x).map_err(|_| {
                    RuntimeError::OutOfRange(format!("{what}: element {i} is {x}, which does not fit 32 bits"))
                })?);
            }
            bytemuck::cast_slice(&v).to_vec()
        }
        DType::I8 | DType::I16 => {
            let v: Vec<i32> = t.to_i64_vec()?.into_iter().map(|x| x as i32).collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        DType::U8 | DType::U16 | DType::Bool | DType::U4 | DType::U2 => {
            let v: Vec<u32> = t.to_i64_vec()?.into_iter().map(|x| x as u32).collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        DType::I4 | DType::I2 => {
            let v: Vec<i32> = t.to_i64_vec()?.into_iter().map(|x| x as i32).collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F8E8M0 | DType::F4E2M1 => {
            let v: Vec<f32> = t.to_f64_vec().into_iter().map(|x| x as f32).collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        DType::String => return Err(not_on_gpu(what)),
    })
}

/// The error for a string tensor sent to a GPU (placement keeps them on the host).
fn not_on_gpu(what: &str) -> RuntimeError {
    RuntimeError::Gpu(format!("{what} is a string tensor, which a GPU buffer cannot hold; string tensors stay on the host"))
}

/// A tensor of `dtype` and `dims` from downloaded 4-byte elements.
pub(crate) fn from_gpu(bytes: &[u8], dtype: DType, dims: &[usize]) -> Result<Tensor> {
    if dtype.is_string() {
        return Err(not_on_gpu("a downloaded buffer"));
    }
    let n: usize = dims.iter().product();
    let b = &bytes[..n * 4];
    Ok(match dtype {
        DType::F32 | DType::I32 | DType::U32 => Tensor::from_bytes(dtype, dims, b)?,
        DType::F64 | DType::F16 | DType::BF16 => {
            let v: Vec<f64> = bytemuck::cast_slice::<u8, f32>(b).iter().map(|&x| x as f64).collect();
            Tensor::from_f64(dtype, dims, &v)?
        }
        DType::I64 => {
            let v: Vec<i64> = bytemuck::cast_slice::<u8, i32>(b).iter().map(|&x| x as i64).collect();
            Tensor::from_slice(dims, &v)?
        }
        DType::I8 | DType::I16 | DType::I4 | DType::I2 => {
            let v: Vec<f64> = bytemuck::cast_slice::<u8, i32>(b).iter().map(|&x| x as f64).collect();
            Tensor::from_f64(dtype, dims, &v)?
        }
        // The values are the format's own (kernels round into it), so encoding is exact:
        // without saturation, so that E5M2's infinities stay infinities.
        DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F4E2M1 => {
            let f = narrow::MiniFloat::of(dtype).expect("a minifloat dtype");
            let v: Vec<u8> = bytemuck::cast_slice::<u8, f32>(b).iter().map(|&x| f.encode(x as f64, false)).collect();
            Tensor::from_bytes(dtype, dims, &v)?
        }
        // Powers of two (2^-127 as an f32 subnormal): their exponent, rounding down.
        DType::F8E8M0 => {
            let v: Vec<u8> = bytemuck::cast_slice::<u8, f32>(b).iter().map(|&x| narrow::e8m0_encode(x, true, narrow::E8M0Round::Down)).collect();
            Tensor::from_bytes(dtype, dims, &v)?
        }
        DType::U8 | DType::U16 | DType::U64 | DType::Bool | DType::U4 | DType::U2 => {
            let v: Vec<f64> = bytemuck::cast_slice::<u8, u32>(b).iter().map(|&x| x as f64).collect();
            Tensor::from_f64(dtype, dims, &v)?
        }
        DType::String => unreachable!("refused above"),
    })
}
