//! numpy's .npz format: a zip archive of .npy files, one per named array (`np.savez`).
//!
//! Kiln reads and writes the stored (uncompressed) form that `np.savez` writes; an
//! archive made by `np.savez_compressed` is refused with an error that says so. Each
//! entry's CRC-32 is checked on reading. Kiln's training checkpoints are .npz files,
//! so numpy opens them as they are.
use crate::npy::{self, NpyError};
use kiln_graph::Tensor;
use std::path::Path;

const LOCAL: u32 = 0x0403_4b50;
const CENTRAL: u32 = 0x0201_4b50;
const END: u32 = 0x0605_4b50;

fn invalid(what: impl Into<String>) -> NpyError {
    NpyError::Invalid(format!("npz: {}", what.into()))
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, NpyError> {
    b.get(at..at + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or_else(|| invalid("truncated archive"))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, NpyError> {
    b.get(at..at + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]])).ok_or_else(|| invalid("truncated archive"))
}

/// Decodes an archive held in memory: its arrays by name (the `.npy` suffix removed),
/// in archive order.
pub fn decode(bytes: &[u8]) -> Result<Vec<(String, Tensor)>, NpyError> {
    let mut out = vec![];
    let mut at = 0;
    while at + 4 <= bytes.len() {
        match u32_at(bytes, at)? {
            LOCAL => {}
            CENTRAL | END => break,
            sig => return Err(invalid(format!("unexpected record {sig:#x} at byte {at}"))),
        }
        let flags = u16_at(bytes, at + 6)?;
        let method = u16_at(bytes, at + 8)?;
        let crc = u32_at(bytes, at + 14)?;
        let mut size = u32_at(bytes, at + 18)? as u64;
        let name_len = u16_at(bytes, at + 26)? as usize;
        let extra_len = u16_at(bytes, at + 28)? as usize;
        let name_at = at + 30;
        let name = std::str::from_utf8(bytes.get(name_at..name_at + name_len).ok_or_else(|| invalid("truncated entry name"))?).map_err(|_| invalid("an entry name is not UTF-8"))?.to_string();
        if method != 0 {
            return Err(NpyError::Unsupported(format!("npz entry '{name}' is compressed (method {method}); Kiln reads archives written by np.savez, not np.savez_compressed")));
        }
        if flags & 0x8 != 0 {
            return Err(NpyError::Unsupported(format!("npz entry '{name}' has its size after the data (streamed zip)")));
        }
        // Zip64: sizes in the extra field (numpy writes them for large arrays).
        let extra = bytes.get(name_at + name_len..name_at + name_len + extra_len).ok_or_else(|| invalid("truncated extra field"))?;
        if size == u32::MAX as u64 {
            let mut e = 0;
            while e + 4 <= extra.len() {
                let (id, len) = (u16_at(extra, e)?, u16_at(extra, e + 2)? as usize);
                if e + 4 + len > extra.len() {
                    return Err(invalid(format!("entry '{name}': its extra field runs past its end")));
                }
                if id == 1 && len >= 16 {
                    size = u64::from_le_bytes(extra[e + 12..e + 20].try_into().expect("8 bytes"));
                }
                e += 4 + len;
            }
        }
        let data_at = name_at + name_len + extra_len;
        let end = usize::try_from(size).ok().and_then(|s| data_at.checked_add(s)).filter(|&e| e <= bytes.len()).ok_or_else(|| invalid(format!("entry '{name}' runs past the end of the archive")))?;
        let data = &bytes[data_at..end];
        if crc32fast::hash(data) != crc {
            return Err(invalid(format!("entry '{name}' fails its CRC-32 check")));
        }
        let t = npy::decode(data).map_err(|e| invalid(format!("entry '{name}': {e}")))?;
        out.push((name.strip_suffix(".npy").unwrap_or(&name).to_string(), t));
        at = end;
    }
    Ok(out)
}

/// Reads a .npz file (a regular file).
pub fn read_file(path: impl AsRef<Path>) -> Result<Vec<(String, Tensor)>, NpyError> {
    let path = path.as_ref();
    let io = |error| NpyError::Io { path: path.to_path_buf(), error };
    let mut file = crate::file::open_regular(path).map_err(io)?;
    let mut bytes = vec![];
    std::io::Read::read_to_end(&mut file, &mut bytes).map_err(io)?;
    decode(&bytes).map_err(|e| NpyError::InFile { path: path.to_path_buf(), error: Box::new(e) })
}

/// Encodes arrays as a stored .npz archive (zip64 records where an entry needs them).
pub fn encode(arrays: &[(&str, &Tensor)]) -> Vec<u8> {
    let mut out: Vec<u8> = vec![];
    let mut central: Vec<u8> = vec![];
    for (name, t) in arrays {
        let data = npy::encode(t);
        let name = format!("{name}.npy");
        let crc = crc32fast::hash(&data);
        let offset = out.len() as u64;
        let big = data.len() as u64 >= u32::MAX as u64 || offset >= u32::MAX as u64;
        let size32 = if big { u32::MAX } else { data.len() as u32 };
        let mut zip64 = vec![];
        if big {
            zip64.extend(1u16.to_le_bytes());
            zip64.extend(24u16.to_le_bytes());
            zip64.extend((data.len() as u64).to_le_bytes());
            zip64.extend((data.len() as u64).to_le_bytes());
            zip64.extend(offset.to_le_bytes());
        }
        let version: u16 = if big { 45 } else { 20 };
        // Local header.
        out.extend(LOCAL.to_le_bytes());
        out.extend(version.to_le_bytes());
        out.extend(0u16.to_le_bytes()); // flags
        out.extend(0u16.to_le_bytes()); // stored
        out.extend(0u32.to_le_bytes()); // time, date
        out.extend(crc.to_le_bytes());
        out.extend(size32.to_le_bytes());
        out.extend(size32.to_le_bytes());
        out.extend((name.len() as u16).to_le_bytes());
        out.extend((if big { 20u16 } else { 0 }).to_le_bytes());
        out.extend(name.as_bytes());
        if big {
            out.extend(1u16.to_le_bytes());
            out.extend(16u16.to_le_bytes());
            out.extend((data.len() as u64).to_le_bytes());
            out.extend((data.len() as u64).to_le_bytes());
        }
        out.extend(&data);
        // Central directory record.
        central.extend(CENTRAL.to_le_bytes());
        central.extend(version.to_le_bytes());
        central.extend(version.to_le_bytes());
        central.extend([0u8; 4]); // flags, method
        central.extend(0u32.to_le_bytes());
        central.extend(crc.to_le_bytes());
        central.extend(size32.to_le_bytes());
        central.extend(size32.to_le_bytes());
        central.extend((name.len() as u16).to_le_bytes());
        central.extend((zip64.len() as u16).to_le_bytes());
        central.extend([0u8; 6]); // comment length, disk, internal attributes
        central.extend(0u32.to_le_bytes()); // external attributes
        central.extend((if big { u32::MAX } else { offset as u32 }).to_le_bytes());
        central.extend(name.as_bytes());
        central.extend(&zip64);
    }
    let cd_at = out.len() as u64;
    out.extend(&central);
    let n = arrays.len().min(u16::MAX as usize) as u16;
    out.extend(END.to_le_bytes());
    out.extend([0u8; 4]);
    out.extend(n.to_le_bytes());
    out.extend(n.to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend((cd_at.min(u32::MAX as u64) as u32).to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

/// Writes a .npz file, through a temporary file renamed into place (a crash never
/// leaves half a checkpoint under the final name).
pub fn write_file(path: impl AsRef<Path>, arrays: &[(&str, &Tensor)]) -> Result<(), NpyError> {
    let path = path.as_ref();
    let tmp = path.with_extension("npz.tmp");
    let io = |error| NpyError::Io { path: path.to_path_buf(), error };
    std::fs::write(&tmp, encode(arrays)).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let a = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
        let b = Tensor::from_vec(&[1], vec![7i64]).unwrap();
        let bytes = encode(&[("a.w", &a), ("step", &b)]);
        let back = decode(&bytes).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!((back[0].0.as_str(), back[0].1.as_slice::<f32>().unwrap()), ("a.w", a.as_slice::<f32>().unwrap()));
        assert_eq!(back[1].1.as_slice::<i64>().unwrap(), &[7]);
        let mut bad = bytes.clone();
        bad[100] ^= 1;
        assert!(decode(&bad).unwrap_err().to_string().contains("CRC-32"));
        assert!(decode(&bytes[..90]).is_err());
    }

    /// What Python's zipfile (numpy's reader) checks: the central directory's records
    /// at the offsets the end record gives, each pointing at its local header.
    #[test]
    fn central_directory_is_well_formed() {
        let a = Tensor::from_vec(&[3], vec![1f32, 2., 3.]).unwrap();
        let bytes = encode(&[("a", &a), ("bb", &a)]);
        let end = bytes.len() - 22;
        assert_eq!(u32_at(&bytes, end).unwrap(), END);
        let (count, size, at) = (u16_at(&bytes, end + 10).unwrap(), u32_at(&bytes, end + 12).unwrap() as usize, u32_at(&bytes, end + 16).unwrap() as usize);
        assert_eq!((count, at + size), (2, end));
        let mut p = at;
        for name in ["a.npy", "bb.npy"] {
            assert_eq!(u32_at(&bytes, p).unwrap(), CENTRAL);
            let (n, x, c) = (u16_at(&bytes, p + 28).unwrap() as usize, u16_at(&bytes, p + 30).unwrap() as usize, u16_at(&bytes, p + 32).unwrap() as usize);
            assert_eq!(&bytes[p + 46..p + 46 + n], name.as_bytes());
            let local = u32_at(&bytes, p + 42).unwrap() as usize;
            assert_eq!(u32_at(&bytes, local).unwrap(), LOCAL);
            p += 46 + n + x + c;
        }
        assert_eq!(p, end);
    }
}
