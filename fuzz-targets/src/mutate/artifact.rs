//! Structure-aware mutations of `.kiln` artifacts. Raw corruption is caught by the
//! checksums at once, so most edits rewrite the JSON header (numbers, strings, arrays
//! and keys anywhere in it: value ids, weight offsets and lengths, dims, dtypes,
//! attributes, op types) or the weight bytes, and then recompute the header length and
//! the CRC-32s, so that the loader's later checks and the session see the damage.

use crate::rng::Rng;
use serde_json::Value;

const PREFIX: usize = 24;
const ALIGN: usize = 64;

const STRINGS: &[&str] = &[
    "F32", "F16", "BF16", "F64", "I8", "I64", "I32", "U8", "U64", "Bool", "Complex64", "", "Gather", "Reshape", "ArgMax",
    "Resize", "Conv", "MatMul", "kiln", "FusedElementwise", "x", "Relu", "Identity", "ConstantOfShape", "Expand",
];

/// Returns a mutated copy of `data`, or `None` when it is not a parsable artifact.
pub fn mutate_artifact(data: &[u8], rng: &mut Rng) -> Option<Vec<u8>> {
    if data.len() < PREFIX {
        return None;
    }
    let header_len = usize::try_from(u64::from_le_bytes(data[12..20].try_into().ok()?)).ok()?;
    let header_end = PREFIX.checked_add(header_len).filter(|&e| e <= data.len())?;
    let mut header: Value = serde_json::from_slice(&data[PREFIX..header_end]).ok()?;
    let tail_start = header_end.next_multiple_of(ALIGN).min(data.len());
    let mut tail = data[tail_start..].to_vec();
    for _ in 0..1 + rng.below(3) {
        if rng.chance(1, 5) && !tail.is_empty() {
            // Weight bytes changed, and the weights' checksum follows.
            let weights_len = header.get("weights_len").and_then(Value::as_u64).unwrap_or(0) as usize;
            let end = weights_len.min(tail.len());
            if end > 0 {
                let at = rng.below(end);
                tail[at] = rng.next_u64() as u8;
                header["weights_crc"] = Value::from(crc32(&tail[..end]));
            }
        } else {
            mutate_value(pick(&mut header, rng), rng);
        }
    }
    let json = serde_json::to_vec(&header).ok()?;
    let mut out = data[..PREFIX].to_vec();
    out[12..20].copy_from_slice(&(json.len() as u64).to_le_bytes());
    out[20..24].copy_from_slice(&crc32(&json).to_le_bytes());
    out.extend_from_slice(&json);
    out.resize(out.len().next_multiple_of(ALIGN), 0);
    out.extend_from_slice(&tail);
    Some(out)
}

/// A random node of the JSON tree, reached by walking down from the root.
fn pick<'a>(v: &'a mut Value, rng: &mut Rng) -> &'a mut Value {
    let mut v = v;
    loop {
        let n = match &*v {
            Value::Array(a) => a.len(),
            Value::Object(o) => o.len(),
            _ => 0,
        };
        if n == 0 || rng.chance(1, 6) {
            return v;
        }
        let k = rng.below(n);
        v = match v {
            Value::Array(a) => &mut a[k],
            Value::Object(o) => o.values_mut().nth(k).expect("k < len"),
            _ => unreachable!("n > 0 only for arrays and objects"),
        };
    }
}

fn mutate_value(v: &mut Value, rng: &mut Rng) {
    match v {
        Value::Number(n) => {
            *v = match rng.below(4) {
                0 => Value::from(rng.interesting_i64()),
                1 => Value::from(rng.interesting_i64() as u64),
                2 => Value::from(n.as_i64().unwrap_or(0).wrapping_add(rng.below(3) as i64 - 1)),
                _ => Value::from(rng.interesting_f32() as f64),
            }
        }
        Value::String(_) => *v = Value::from(*rng.pick(STRINGS)),
        Value::Array(a) => match rng.below(4) {
            0 => a.clear(),
            1 if !a.is_empty() => {
                let i = rng.below(a.len());
                a.remove(i);
            }
            2 if !a.is_empty() => {
                let i = rng.below(a.len());
                let copy = a[i].clone();
                a.push(copy);
            }
            _ => a.push(Value::from(rng.interesting_i64())),
        },
        Value::Object(o) => {
            if let Some(key) = (!o.is_empty()).then(|| o.keys().nth(rng.below(o.len())).cloned()).flatten() {
                if rng.chance(1, 2) {
                    o.remove(&key);
                } else {
                    o.insert(key, Value::Null);
                }
            }
        }
        Value::Bool(b) => *b = !*b,
        Value::Null => *v = Value::from(0),
    }
}

/// CRC-32 (IEEE, reflected), as the artifact format uses.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}
