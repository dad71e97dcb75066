//! numpy's .npy format: read and write [`Tensor`]s.
//!
//! A file is the magic `\x93NUMPY`, a version (1.0: u16 header length; 2.0 and 3.0:
//! u32), then a header that is a Python dict literal such as
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }` padded with spaces to a
//! multiple of 64 bytes and ended by `\n`, then the elements in C order. Kiln reads and
//! writes little-endian, C-order arrays of the dtypes of [`DType::numpy_descr`] (bf16 as
//! `<V2`, which numpy itself cannot name).
//!
//! It lives in the runtime so that applications that only run models (and the CLI) read
//! and write tensors without the compiler. A header's shape is checked against the data
//! that follows it before anything is allocated: a header claiming terabytes costs
//! nothing. Files must be regular files ([`crate::file::open_regular`]).

use kiln_graph::{size, DType, Tensor};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

#[derive(Debug, Error)]
pub enum NpyError {
    #[error("cannot access '{}': {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("'{}': {error}", path.display())]
    InFile { path: PathBuf, error: Box<NpyError> },
    #[error("I/O error: {0}")]
    Stream(#[from] std::io::Error),
    #[error("not a valid .npy file: {0}")]
    Invalid(String),
    #[error("unsupported .npy array: {0}")]
    Unsupported(String),
}

type Result<T> = std::result::Result<T, NpyError>;

/// Reads a .npy file (a regular file: FIFOs and devices are refused).
pub fn read_file(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let file = crate::file::open_regular(path).map_err(|source| NpyError::Io { path: path.to_path_buf(), error: source })?;
    let len = file.metadata().map_err(|source| NpyError::Io { path: path.to_path_buf(), error: source })?.len();
    read_sized(std::io::BufReader::new(file), Some(len)).map_err(|e| NpyError::InFile { path: path.to_path_buf(), error: Box::new(e) })
}

/// Writes a .npy file.
pub fn write_file(path: impl AsRef<Path>, t: &Tensor) -> Result<()> {
    let path = path.as_ref();
    if let Some(v) = t.composite() {
        return Err(NpyError::Unsupported(format!("{}: the output is a {:?}, not a tensor (a .npy file holds one array)", path.display(), v.kind())));
    }
    std::fs::write(path, encode(t)).map_err(|source| NpyError::Io { path: path.to_path_buf(), error: source })
}

/// Decodes a .npy file held in memory.
pub fn decode(bytes: &[u8]) -> Result<Tensor> {
    read_sized(bytes, Some(bytes.len() as u64))
}

/// Reads one array from a stream (which must end after it). Memory grows with the data
/// actually read, never with what the header claims.
pub fn read(r: impl Read) -> Result<Tensor> {
    read_sized(r, None)
}

/// [`read`], knowing the stream's total length when it is a file or a buffer: then the
/// data length is checked before the tensor is allocated.
fn read_sized(mut r: impl Read, total: Option<u64>) -> Result<Tensor> {
    let mut head = [0u8; 8];
    let got = read_full(&mut r, &mut head)?;
    if got < 8 || &head[..6] != MAGIC {
        return Err(NpyError::Invalid("it does not start with the magic string \\x93NUMPY".into()));
    }
    let (major, minor) = (head[6], head[7]);
    let (header_len, len_size) = match major {
        1 => {
            let mut b = [0u8; 2];
            read_exactly(&mut r, &mut b, "the header length")?;
            (u16::from_le_bytes(b) as usize, 2)
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            read_exactly(&mut r, &mut b, "the header length")?;
            (u32::from_le_bytes(b) as usize, 4)
        }
        _ => return Err(NpyError::Unsupported(format!("format version {major}.{minor} (1.0, 2.0 and 3.0 are supported)"))),
    };
    if header_len > 1 << 24 {
        return Err(NpyError::Invalid(format!("header length {header_len} is implausible")));
    }
    let mut header = vec![0u8; header_len];
    read_exactly(&mut r, &mut header, "the header")?;
    let header = std::str::from_utf8(&header).map_err(|_| NpyError::Invalid("the header is not text".into()))?;
    let (dtype, dims) = parse_header(header)?;

    let n_bytes = size::bytes(dtype, &dims).map_err(|e| NpyError::Invalid(e.to_string()))?;
    let ends_after = |got: u64| {
        NpyError::Invalid(format!("the data ends after {got} bytes; a {dtype} array of shape {dims:?} needs {n_bytes}"))
    };
    let extra_data = || NpyError::Invalid(format!("there is data after the {n_bytes} bytes of a {dtype} array of shape {dims:?}"));
    let mut t = match total {
        Some(total) => {
            // The data length is known: check it before allocating.
            let data_len = total.saturating_sub((MAGIC.len() + 2 + len_size + header_len) as u64);
            match data_len.cmp(&(n_bytes as u64)) {
                std::cmp::Ordering::Less => return Err(ends_after(data_len)),
                std::cmp::Ordering::Greater => return Err(extra_data()),
                std::cmp::Ordering::Equal => {}
            }
            let mut t = Tensor::try_zeros(dtype, &dims).map_err(|e| NpyError::Invalid(e.to_string()))?;
            let got = read_full(&mut r, t.bytes_mut())?;
            if got < n_bytes {
                return Err(ends_after(got as u64));
            }
            t
        }
        None => {
            // Unknown length: buffer what arrives, at most one byte more than needed.
            let mut data = Vec::new();
            r.by_ref().take(n_bytes as u64 + 1).read_to_end(&mut data)?;
            if data.len() < n_bytes {
                return Err(ends_after(data.len() as u64));
            }
            if data.len() > n_bytes {
                return Err(extra_data());
            }
            Tensor::from_bytes(dtype, &dims, &data).map_err(|e| NpyError::Invalid(e.to_string()))?
        }
    };
    let mut extra = [0u8; 1];
    if read_full(&mut r, &mut extra)? > 0 {
        return Err(extra_data());
    }
    if dtype == DType::Bool {
        for b in t.bytes_mut() {
            *b = (*b != 0) as u8;
        }
    }
    Ok(t)
}

/// Reads until `buf` is full or the stream ends; returns the number of bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn read_exactly(r: &mut impl Read, buf: &mut [u8], what: &str) -> Result<()> {
    if read_full(r, buf)? < buf.len() {
        return Err(NpyError::Invalid(format!("the file ends inside {what}")));
    }
    Ok(())
}

/// Encodes a tensor as a .npy file (version 1.0, or 2.0 for very long headers).
/// numpy has no narrow dtypes: float8/float4 tensors are written as f32, 4- and 2-bit
/// integers as i8/u8, which hold their values exactly. String tensors are written as
/// numpy's fixed-width unicode arrays (`<U` + the longest string's length in code
/// points, UTF-32, padded with zeros); reading them back is not supported.
pub fn encode(t: &Tensor) -> Vec<u8> {
    let widened;
    let t = match t.dtype() {
        d if d.is_narrow() => {
            let wide = if d.is_narrow_float() { DType::F32 } else if d.is_signed() { DType::I8 } else { DType::U8 };
            widened = Tensor::from_f64(wide, t.dims(), &t.to_f64_vec()).expect("the same dims in a dtype of the same size or wider");
            &widened
        }
        _ => t,
    };
    let shape = match t.dims() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        ds => format!("({})", ds.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let (descr, data) = match t.as_strings() {
        Ok(s) => {
            let width = s.iter().map(|s| s.chars().count()).max().unwrap_or(0).max(1);
            let mut utf32 = Vec::with_capacity(s.len() * width * 4);
            for s in s {
                let n = s.chars().count();
                s.chars().for_each(|c| utf32.extend_from_slice(&(c as u32).to_le_bytes()));
                utf32.resize(utf32.len() + (width - n) * 4, 0);
            }
            (format!("<U{width}"), std::borrow::Cow::Owned(utf32))
        }
        Err(_) => (t.dtype().numpy_descr().expect("compute dtypes have a numpy name").to_string(), std::borrow::Cow::Borrowed(t.bytes())),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let (version, len_size) = if dict.len() + 1 + 10 < 65536 { (1u8, 2) } else { (2u8, 4) };
    let prefix = MAGIC.len() + 2 + len_size;
    let total = (prefix + dict.len() + 1).div_ceil(64) * 64;
    let header_len = total - prefix;
    let mut out = Vec::with_capacity(total + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(header_len as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header_len as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    out.write_all(&data).expect("writing to a Vec cannot fail");
    out
}

/// A Python literal of the kinds a .npy header holds.
#[derive(Debug, PartialEq)]
enum Lit {
    Str(String),
    Bool(bool),
    Int(u64),
    /// A tuple or a list.
    Seq(Vec<Lit>),
    Dict(Vec<(Lit, Lit)>),
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> NpyError {
        NpyError::Invalid(format!("bad header at byte {}: {what}", self.pos))
    }

    fn skip_ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.pos).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<Lit> {
        match self.peek() {
            Some(q @ (b'\'' | b'"')) => {
                self.pos += 1;
                let start = self.pos;
                while self.pos < self.s.len() && self.s[self.pos] != q {
                    self.pos += 1;
                }
                if self.pos >= self.s.len() {
                    return Err(self.err("unterminated string"));
                }
                let text = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
                self.pos += 1;
                Ok(Lit::Str(text))
            }
            Some(open @ (b'(' | b'[')) => {
                self.pos += 1;
                let close = if open == b'(' { b')' } else { b']' };
                let mut items = Vec::new();
                while !self.eat(close) {
                    items.push(self.value()?);
                    if !self.eat(b',') && self.peek() != Some(close) {
                        return Err(self.err("expected ',' or the end of a sequence"));
                    }
                }
                Ok(Lit::Seq(items))
            }
            Some(b'{') => {
                self.pos += 1;
                let mut items = Vec::new();
                while !self.eat(b'}') {
                    let k = self.value()?;
                    if !self.eat(b':') {
                        return Err(self.err("expected ':'"));
                    }
                    items.push((k, self.value()?));
                    if !self.eat(b',') && self.peek() != Some(b'}') {
                        return Err(self.err("expected ',' or '}'"));
                    }
                }
                Ok(Lit::Dict(items))
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.pos;
                while self.pos < self.s.len() && self.s[self.pos].is_ascii_digit() {
                    self.pos += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.pos]).expect("ascii digits");
                let v = text.parse().map_err(|_| self.err("integer too large"))?;
                if self.s.get(self.pos) == Some(&b'L') {
                    self.pos += 1; // Python 2 long
                }
                Ok(Lit::Int(v))
            }
            Some(_) => {
                let rest = &self.s[self.pos..];
                for (word, v) in [(&b"True"[..], true), (&b"False"[..], false)] {
                    if rest.starts_with(word) {
                        self.pos += word.len();
                        return Ok(Lit::Bool(v));
                    }
                }
                Err(self.err("unexpected character"))
            }
            None => Err(self.err("unexpected end")),
        }
    }
}

/// The dtype and dims of a header dict.
fn parse_header(header: &str) -> Result<(DType, Vec<usize>)> {
    let mut p = Parser { s: header.as_bytes(), pos: 0 };
    let Lit::Dict(items) = p.value()? else {
        return Err(NpyError::Invalid(format!("the header is not a dict: {}", header.trim())));
    };
    if p.peek().is_some() {
        return Err(p.err("text after the header dict"));
    }
    let get = |key: &str| {
        items
            .iter()
            .find(|(k, _)| *k == Lit::Str(key.into()))
            .map(|(_, v)| v)
            .ok_or_else(|| NpyError::Invalid(format!("the header has no '{key}': {}", header.trim())))
    };
    let dtype = match get("descr")? {
        Lit::Str(d) => dtype_of_descr(d)?,
        _ => return Err(NpyError::Unsupported("structured dtypes (a 'descr' that is not a string)".into())),
    };
    match get("fortran_order")? {
        Lit::Bool(false) => {}
        Lit::Bool(true) => {
            return Err(NpyError::Unsupported(
                "the array is in Fortran (column-major) order; save it with np.ascontiguousarray".into(),
            ))
        }
        other => return Err(NpyError::Invalid(format!("'fortran_order' is {other:?}, not a bool"))),
    }
    let dims = match get("shape")? {
        Lit::Seq(ds) => ds
            .iter()
            .map(|d| match d {
                Lit::Int(n) => usize::try_from(*n).map_err(|_| NpyError::Invalid(format!("dimension {n} is too large"))),
                other => Err(NpyError::Invalid(format!("shape entry {other:?} is not an integer"))),
            })
            .collect::<Result<Vec<_>>>()?,
        other => return Err(NpyError::Invalid(format!("'shape' is {other:?}, not a tuple"))),
    };
    Ok((dtype, dims))
}

fn dtype_of_descr(descr: &str) -> Result<DType> {
    if let Some(d) = DType::from_numpy_descr(descr) {
        return Ok(d);
    }
    if let Some(rest) = descr.strip_prefix('>') {
        // One-byte types have no byte order.
        if let Some(d) = DType::from_numpy_descr(&format!("|{rest}")).filter(|d| d.size() == 1) {
            return Ok(d);
        }
        return Err(NpyError::Unsupported(format!(
            "big-endian data ('{descr}'); convert it with arr.astype(arr.dtype.newbyteorder('<'))"
        )));
    }
    if descr.trim_start_matches(['<', '|', '=']).starts_with(['U', 'S', 'O']) {
        return Err(NpyError::Unsupported(format!("string arrays ('{descr}'); give string inputs as ONNX TensorProto .pb files")));
    }
    let supported: Vec<&str> = DType::ALL.iter().filter_map(|d| d.numpy_descr()).collect();
    Err(NpyError::Unsupported(format!("dtype '{descr}' (supported: {})", supported.join(" "))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as numpy writes it: magic, version, length, dict, padding, '\n'.
    fn numpy_file(version: u8, dict: &str, data: &[u8]) -> Vec<u8> {
        let len_size = if version == 1 { 2 } else { 4 };
        let prefix = 8 + len_size;
        let total = (prefix + dict.len() + 1).div_ceil(64) * 64;
        let hl = total - prefix;
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[version, 0]);
        if version == 1 {
            out.extend_from_slice(&(hl as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(hl as u32).to_le_bytes());
        }
        out.extend_from_slice(dict.as_bytes());
        out.resize(total - 1, b' ');
        out.push(b'\n');
        out.extend_from_slice(data);
        out
    }

    fn sample(dtype: DType, dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        let vals: Vec<f64> = (0..n).map(|i| if dtype == DType::Bool { (i % 3 == 0) as u8 as f64 } else { i as f64 * 1.5 - 3.0 }).collect();
        let vals: Vec<f64> = if dtype.is_signed() { vals } else { vals.iter().map(|v| v.abs()).collect() };
        Tensor::from_f64(dtype, dims, &vals).unwrap()
    }

    #[test]
    fn strings_are_written_as_unicode_arrays() {
        let t = Tensor::from_strings(&[2], vec!["ab".into(), "é".into()]).unwrap();
        let bytes = encode(&t);
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("'descr': '<U2'") && text.contains("'shape': (2,)"), "{text}");
        let data = &bytes[bytes.len() - 16..];
        assert_eq!(data, [b'a', 0, 0, 0, b'b', 0, 0, 0, 0xe9, 0, 0, 0, 0, 0, 0, 0]);
        let e = decode(&bytes).unwrap_err().to_string();
        assert!(e.contains("string arrays") && e.contains(".pb"), "{e}");
    }

    #[test]
    fn round_trip_every_dtype() {
        // Narrow dtypes come back widened (numpy has none), with their values.
        for dtype in DType::ALL.into_iter().filter(|d| d.is_narrow()) {
            let t = Tensor::from_f64(dtype, &[3], &[1.0, -1.0, 0.0]).unwrap();
            let back = decode(&encode(&t)).unwrap();
            assert_eq!((back.dims(), back.to_f64_vec()), (t.dims(), t.to_f64_vec()), "{dtype}");
            assert_eq!(back.dtype().size(), if dtype.is_narrow_float() { 4 } else { 1 });
        }
        for dtype in DType::COMPUTE {
            for dims in [&[][..], &[1][..], &[7][..], &[2, 3, 5][..], &[0, 4][..]] {
                let t = sample(dtype, dims);
                let bytes = encode(&t);
                assert_eq!((bytes.len() - t.bytes().len()) % 64, 0, "header is 64-byte aligned");
                let back = decode(&bytes).unwrap();
                assert_eq!(back, t, "{dtype} {dims:?}");
            }
        }
    }

    #[test]
    fn header_matches_numpy() {
        let t = Tensor::from_vec(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let expected = numpy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", t.bytes());
        assert_eq!(encode(&t), expected);
        let s = Tensor::scalar(7i64);
        assert!(String::from_utf8_lossy(&encode(&s)).contains("'shape': (), }"));
        let v = Tensor::from_vec(&[4], vec![1u8, 2, 3, 4]).unwrap();
        assert!(String::from_utf8_lossy(&encode(&v)).contains("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }"));
    }

    #[test]
    fn reads_numpy_written_files() {
        // float64 (3,), version 1.0
        let data: Vec<u8> = [1.0f64, -2.5, 3.25].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = decode(&numpy_file(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", &data)).unwrap();
        assert_eq!(t.dtype(), DType::F64);
        assert_eq!(t.to_f64_vec(), vec![1.0, -2.5, 3.25]);
        // bool (2, 2), version 2.0, nonzero bytes normalised
        let t = decode(&numpy_file(2, "{'descr': '|b1', 'fortran_order': False, 'shape': (2, 2), }", &[1, 0, 0, 1])).unwrap();
        assert_eq!(t.dtype(), DType::Bool);
        assert_eq!(t.bytes(), &[1, 0, 0, 1]);
        // int64 scalar, version 3.0, key order and quoting as other writers produce
        let t = decode(&numpy_file(3, "{\"shape\": (), \"fortran_order\": False, \"descr\": \"<i8\"}", &42i64.to_le_bytes())).unwrap();
        assert_eq!(t.dims(), &[] as &[usize]);
        assert_eq!(t.to_i64_vec().unwrap(), vec![42]);
        // Python 2 longs, f16
        let data: Vec<u8> = [half::f16::from_f32(0.5), half::f16::from_f32(-1.0)].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = decode(&numpy_file(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (1L, 2L), }", &data)).unwrap();
        assert_eq!(t.dtype(), DType::F16);
        assert_eq!(t.to_f64_vec(), vec![0.5, -1.0]);
        // int8 / uint16 / uint32 / uint64 / int16 / int32
        for (descr, dtype) in [("|i1", DType::I8), ("<u2", DType::U16), ("<u4", DType::U32), ("<u8", DType::U64), ("<i2", DType::I16), ("<i4", DType::I32), ("<f4", DType::F32)] {
            let data = vec![0u8; dtype.size() * 3];
            let t = decode(&numpy_file(1, &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (3,), }}"), &data)).unwrap();
            assert_eq!((t.dtype(), t.dims()), (dtype, &[3usize][..]));
        }
    }

    fn err(bytes: &[u8]) -> String {
        decode(bytes).unwrap_err().to_string()
    }

    #[test]
    fn clear_errors() {
        let e = err(&numpy_file(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", &[0; 16]));
        assert!(e.contains("Fortran"), "{e}");
        let e = err(&numpy_file(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", &[0; 8]));
        assert!(e.contains("big-endian"), "{e}");
        let e = err(&numpy_file(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", &[0; 16]));
        assert!(e.contains("dtype '<c8'"), "{e}");
        let e = err(&numpy_file(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", &[0; 8]));
        assert!(e.contains("structured"), "{e}");
        let e = err(&numpy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", &[0; 20]));
        assert!(e.contains("ends after 20 bytes") && e.contains("needs 24"), "{e}");
        let e = err(&numpy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", &[0; 8]));
        assert!(e.contains("data after"), "{e}");
        let e = err(&numpy_file(1, "{'descr': '<f4', 'shape': (1,), }", &[0; 4]));
        assert!(e.contains("no 'fortran_order'"), "{e}");
        let e = err(&numpy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,  }", &[0; 4]));
        assert!(e.contains("bad header"), "{e}");
        let e = err(b"PK\x03\x04 not numpy");
        assert!(e.contains("magic"), "{e}");
        let e = err(&numpy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", &[0; 4])[..9]);
        assert!(e.contains("ends inside"), "{e}");
        let mut v4 = numpy_file(1, "{}", &[]);
        v4[6] = 4;
        assert!(err(&v4).contains("version 4.0"));
        // '>' on a one-byte type is harmless
        let t = decode(&numpy_file(1, "{'descr': '>u1', 'fortran_order': False, 'shape': (1,), }", &[9])).unwrap();
        assert_eq!(t.to_i64_vec().unwrap(), vec![9]);
    }

    #[test]
    fn a_huge_header_shape_is_refused_before_allocating() {
        // 2^40 f32 elements claimed, 8 bytes given: an error, not a 4 TiB allocation
        // (which aborts the process).
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }";
        let e = err(&numpy_file(1, header, &[0; 8]));
        assert!(e.contains("ends after 8 bytes") && e.contains("1099511627776"), "{e}");
        let e = read(&numpy_file(1, header, &[0; 8])[..]).unwrap_err().to_string();
        assert!(e.contains("ends after 8 bytes"), "{e}");
        // A shape whose byte size wraps (2^32 * 2^32 * 4 = 0 mod 2^64) is an overflow.
        let e = err(&numpy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", &[]));
        assert!(e.contains("overflows"), "{e}");
        // Streams: trailing data is still found.
        let e = read(&numpy_file(1, "{'descr': '<u1', 'fortran_order': False, 'shape': (2,), }", &[1, 2, 3])[..]).unwrap_err().to_string();
        assert!(e.contains("data after"), "{e}");
        assert_eq!(read(&numpy_file(1, "{'descr': '<u1', 'fortran_order': False, 'shape': (2,), }", &[1, 2])[..]).unwrap().bytes(), &[1, 2]);
    }

    #[test]
    fn files() {
        let dir = std::env::temp_dir().join(format!("kiln-npy-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.npy");
        let t = sample(DType::I32, &[3, 4]);
        write_file(&path, &t).unwrap();
        assert_eq!(read_file(&path).unwrap(), t);
        let e = read_file(dir.join("missing.npy")).unwrap_err().to_string();
        assert!(e.contains("missing.npy"), "{e}");
        std::fs::write(&path, b"garbage").unwrap();
        let e = read_file(&path).unwrap_err().to_string();
        assert!(e.contains("a.npy") && e.contains("magic"), "{e}");
        // A FIFO would block forever: refused by type, naming the path.
        let fifo = dir.join("in.npy");
        if std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
            let e = read_file(&fifo).unwrap_err().to_string();
            assert!(e.contains("in.npy") && e.contains("FIFO"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
