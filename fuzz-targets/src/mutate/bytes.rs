//! Raw byte mutations (the stable smoke's stand-in for libFuzzer's own): bit flips,
//! interesting bytes and little-endian integers written over the data, chunks deleted,
//! duplicated or inserted, truncation. Used on every target, beside the
//! structure-aware mutations, so that decoders see malformed framing too.

use crate::rng::Rng;

/// Applies 1 to 4 random byte-level edits to `data`, keeping it at most `max_len` long.
pub fn mutate_bytes(data: &mut Vec<u8>, rng: &mut Rng, max_len: usize) {
    for _ in 0..1 + rng.below(4) {
        edit(data, rng);
    }
    data.truncate(max_len);
}

fn edit(data: &mut Vec<u8>, rng: &mut Rng) {
    if data.is_empty() {
        data.extend((0..1 + rng.below(16)).map(|_| rng.next_u64() as u8));
        return;
    }
    let at = rng.below(data.len());
    match rng.below(8) {
        0 => data[at] ^= 1 << rng.below(8),
        1 => data[at] = *rng.pick(&[0u8, 1, 0x7f, 0x80, 0xff, b'\n', b' ', b'(', b')', b',', b'\'', b'9']),
        2 => {
            let v = rng.interesting_i64();
            let width = *rng.pick(&[1usize, 2, 4, 8]);
            for (k, b) in v.to_le_bytes()[..width].iter().enumerate() {
                if let Some(slot) = data.get_mut(at + k) {
                    *slot = *b;
                }
            }
        }
        3 => {
            let len = 1 + rng.below((data.len() - at).min(64));
            data.drain(at..at + len);
        }
        4 => {
            let len = 1 + rng.below((data.len() - at).min(64));
            let chunk: Vec<u8> = data[at..at + len].to_vec();
            let to = rng.below(data.len() + 1);
            data.splice(to..to, chunk);
        }
        5 => {
            let chunk: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, chunk);
        }
        6 => data.truncate(at),
        _ => {
            let b = rng.next_u64() as u8;
            data[at] = b;
        }
    }
}
