//! Structure-aware mutations of `.npy` files: the header dict's shape, descr and
//! fortran_order rewritten, the format version and header length field changed, the
//! data cut short or extended; the header length is kept consistent unless the edit
//! is about it.

use crate::rng::Rng;

const DESCRS: &[&str] = &["<f4", "<f8", "<f2", "<i8", "<i4", "<i2", "|i1", "|u1", "<u2", "<u4", "<u8", "|b1", "<V2", ">f4", "<U3", "|O", "<c8", "f4", "", "<f4x"];

/// Returns a mutated copy of `data` (which need not be a valid .npy file).
pub fn mutate_npy(data: &[u8], rng: &mut Rng) -> Option<Vec<u8>> {
    let (version, header, body) = split(data)?;
    let mut header = header.to_string();
    let mut version = version;
    let mut body = body.to_vec();
    let mut len_override = None;
    for _ in 0..1 + rng.below(2) {
        match rng.below(8) {
            0..=2 => header = with_key(&header, "shape", &random_shape(rng)),
            3 => header = with_key(&header, "descr", &format!("'{}'", rng.pick(DESCRS))),
            4 => header = with_key(&header, "fortran_order", *rng.pick(&["True", "False", "1", "'x'", "None"])),
            5 => version = *rng.pick(&[0u8, 1, 2, 3, 4, 255]),
            6 => {
                let cut = rng.below(body.len() + 1);
                if rng.chance(1, 2) {
                    body.truncate(cut);
                } else {
                    body.extend(std::iter::repeat_n(0x3f, 1 + rng.below(64)));
                }
            }
            _ => len_override = Some(rng.interesting_i64() as u64),
        }
    }
    Some(join(version, &header, &body, len_override))
}

fn random_shape(rng: &mut Rng) -> String {
    let rank = rng.below(5);
    let dims: Vec<String> = (0..rank)
        .map(|_| match rng.below(6) {
            0 => rng.interesting_i64().unsigned_abs().to_string(),
            1 => "99999999999999999999999".to_string(),
            2 => "-1".to_string(),
            _ => rng.below(5).to_string(),
        })
        .collect();
    match rank {
        0 => "()".into(),
        1 if rng.chance(1, 2) => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    }
}

/// Replaces `'key': VALUE` in a header dict (VALUE up to the next top-level comma).
fn with_key(header: &str, key: &str, value: &str) -> String {
    let pat = format!("'{key}':");
    let Some(at) = header.find(&pat) else {
        return header.replacen('{', &format!("{{{pat} {value}, "), 1);
    };
    let start = at + pat.len();
    let mut depth = 0i32;
    let mut end = header.len();
    for (i, c) in header[start..].char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' | '}' if depth <= 0 => {
                end = start + i;
                break;
            }
            _ => {}
        }
    }
    format!("{} {value}{}", &header[..start], &header[end..])
}

fn split(data: &[u8]) -> Option<(u8, &str, &[u8])> {
    if data.len() < 10 || &data[..6] != b"\x93NUMPY" {
        return None;
    }
    let (len, at): (usize, usize) = if data[6] == 1 { (u16::from_le_bytes([data[8], data[9]]) as usize, 10) } else { (u32::from_le_bytes(data.get(8..12)?.try_into().ok()?) as usize, 12) };
    let header = std::str::from_utf8(data.get(at..at.checked_add(len)?)?).ok()?;
    Some((data[6], header, &data[at + len..]))
}

fn join(version: u8, header: &str, body: &[u8], len_override: Option<u64>) -> Vec<u8> {
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[version, 0]);
    let len = len_override.unwrap_or(header.len() as u64);
    if version == 1 {
        out.extend_from_slice(&(len as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(len as u32).to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(body);
    out
}
