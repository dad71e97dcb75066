//! The ring all-reduce: the buffer is cut into N chunks (sizes differing by at most
//! one element). In N-1 scatter-reduce steps each rank sends one chunk to its right
//! neighbour and adds the chunk it receives from its left one, so that rank r ends with
//! the full sum of chunk r+1; in N-1 all-gather steps the summed chunks go round once
//! more. Each rank sends and receives 2(N-1) chunks: 2(N-1)/N of the buffer.
//!
//! Chunk c is summed in ring order starting at rank c+1 (each rank adds its own value
//! to the partial sum it receives), the same order on every run.
use crate::{Result, Traffic, Transport};
use half::f16;

/// How values travel between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    F32,
    /// About half the bytes: each block of 128 values scaled by a power of two that
    /// brings its largest magnitude to 2^15, rounded to f16, and sent with that
    /// exponent; summed in f32 on arrival. (Unscaled, small gradients would fall into
    /// f16's subnormals; one scale per message would drown a bias's gradient in its
    /// layer's weights'.)
    /// After the scatter-reduce each rank rounds its summed chunk the same way, so that
    /// every rank ends with the same values.
    F16,
}

impl Wire {
    /// The bytes of a message of `len` values.
    fn bytes(self, len: usize) -> u64 {
        match self {
            Wire::F32 => 4 * len as u64,
            Wire::F16 => 2 * halves_len(len) as u64,
        }
    }
}

/// Values per shared exponent in an f16 message.
const F16_BLOCK: usize = 128;

/// The exponent that scales `values`' largest finite magnitude to at most 2^15.
fn f16_exponent(values: &[f32]) -> i32 {
    let m = values.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs()));
    if m == 0.0 {
        0
    } else {
        ((32768.0 / m as f64).log2().floor() as i32).clamp(-120, 120)
    }
}

/// The length of the f16 message of `len` values: one exponent per block.
fn halves_len(len: usize) -> usize {
    len + len.div_ceil(F16_BLOCK)
}

/// `values` as a message of halves: for each block of [`F16_BLOCK`] values, the
/// block's exponent (offset by 2^15), then each value times 2^exponent in f16.
fn to_halves(values: &[f32]) -> Vec<u16> {
    let mut out = Vec::with_capacity(halves_len(values.len()));
    for block in values.chunks(F16_BLOCK) {
        let e = f16_exponent(block);
        let k = (e as f64).exp2();
        out.push((e + 32768) as u16);
        out.extend(block.iter().map(|&v| f16::from_f64(v as f64 * k).to_bits()));
    }
    out
}

/// The values of a message of [`to_halves`].
fn from_halves(message: &[u16], out: &mut [f32]) {
    for (block, m) in out.chunks_mut(F16_BLOCK).zip(message.chunks(F16_BLOCK + 1)) {
        let k = (-(m[0] as i32 - 32768) as f64).exp2();
        for (o, &h) in block.iter_mut().zip(&m[1..]) {
            *o = (f16::from_bits(h).to_f64() * k) as f32;
        }
    }
}

/// Sends `send` to rank `to` and receives `recv.len()` values from rank `from`, as
/// `wire` says.
fn exchange<T: Transport + ?Sized>(t: &T, wire: Wire, send: &[f32], to: usize, recv: &mut [f32], from: usize) -> Result<()> {
    match wire {
        Wire::F32 => t.send_receive(send, to, recv, from),
        Wire::F16 => {
            let mut got = vec![0u16; halves_len(recv.len())];
            t.send_receive_halves(&to_halves(send), to, &mut got, from)?;
            from_halves(&got, recv);
            Ok(())
        }
    }
}

/// The element range of chunk `c` of `n` over `len` elements.
pub fn chunk(len: usize, n: usize, c: usize) -> std::ops::Range<usize> {
    let (base, extra) = (len / n, len % n);
    let start = c * base + c.min(extra);
    start..start + base + usize::from(c < extra)
}

/// Sums `data` over every rank of `t`, in place; every rank ends with the same values.
pub fn all_reduce<T: Transport + ?Sized>(t: &T, data: &mut [f32]) -> Result<Traffic> {
    all_reduce_on(t, data, Wire::F32)
}

/// [`all_reduce`] with the values travelling as `wire` says.
pub fn all_reduce_on<T: Transport + ?Sized>(t: &T, data: &mut [f32], wire: Wire) -> Result<Traffic> {
    let mut traffic = reduce_scatter(t, data, wire)?;
    let gathered = all_gather(t, data, wire)?;
    traffic.sent += gathered.sent;
    traffic.received += gathered.received;
    Ok(traffic)
}

/// The chunk of `len` elements that rank `rank` of `n` holds summed after
/// [`reduce_scatter`]: chunk `rank + 1`.
pub fn owned_chunk(len: usize, n: usize, rank: usize) -> std::ops::Range<usize> {
    chunk(len, n, (rank + 1) % n)
}

/// N-1 steps around the ring of `t`: at step s this rank sends chunk `out(s)` of `data`
/// to its right neighbour and hands the chunk `inn(s)` it receives from its left one to
/// `take` (with the chunk's place in `data`).
fn around<T: Transport + ?Sized>(t: &T, data: &mut [f32], wire: Wire, out: impl Fn(usize) -> usize, inn: impl Fn(usize) -> usize, take: impl Fn(&mut [f32], &[f32])) -> Result<Traffic> {
    let (n, r) = (t.size(), t.rank());
    let mut traffic = Traffic::default();
    if n <= 1 || data.is_empty() {
        return Ok(traffic);
    }
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let mut incoming = vec![0f32; chunk(data.len(), n, 0).len()];
    for s in 0..n - 1 {
        let (out_r, in_r) = (chunk(data.len(), n, out(s)), chunk(data.len(), n, inn(s)));
        let buf = &mut incoming[..in_r.len()];
        exchange(t, wire, &data[out_r.clone()], right, buf, left)?;
        traffic.sent += wire.bytes(out_r.len());
        traffic.received += wire.bytes(in_r.len());
        take(&mut data[in_r], buf);
    }
    Ok(traffic)
}

/// The scatter-reduce half: afterwards rank r's [`owned_chunk`] of `data` holds the sum
/// over every rank (the rest of `data` holds partial sums).
pub fn reduce_scatter<T: Transport + ?Sized>(t: &T, data: &mut [f32], wire: Wire) -> Result<Traffic> {
    let (n, r) = (t.size(), t.rank());
    // At step s, send chunk r-s, receive and add chunk r-s-1.
    let add = |d: &mut [f32], v: &[f32]| d.iter_mut().zip(v).for_each(|(d, v)| *d = *v + *d);
    let traffic = around(t, data, wire, |s| (r + n - s) % n, |s| (r + 2 * n - s - 1) % n, add)?;
    if wire == Wire::F16 && n > 1 {
        let owned = owned_chunk(data.len(), n, r);
        let message = to_halves(&data[owned.clone()]);
        from_halves(&message, &mut data[owned]);
    }
    Ok(traffic)
}

/// The all-gather half: each rank's [`owned_chunk`] goes round the ring, so that every
/// rank ends with every rank's.
pub fn all_gather<T: Transport + ?Sized>(t: &T, data: &mut [f32], wire: Wire) -> Result<Traffic> {
    let (n, r) = (t.size(), t.rank());
    // At step s, send chunk r+1-s (complete), receive chunk r-s.
    around(t, data, wire, |s| (r + 1 + n - s) % n, |s| (r + n - s) % n, |d, v| d.copy_from_slice(v))
}

/// The hierarchical (two-level) all-reduce: a reduce-scatter among the ranks of one
/// machine (`local`), a ring all-reduce of each rank's summed chunk among the ranks
/// with the same local index on every machine (`cross`: as many rings as ranks per
/// machine, side by side), then an all-gather within the machine. Across machines each
/// rank moves 2(M-1)/M of its chunk (1/G of the buffer) for M machines of G ranks, and
/// a ring of M rather than M x G ranks pays the per-message latency: the 2-D idea of
/// the TPU pod's torus. The summation order depends on G and M only.
pub fn hierarchical_all_reduce<T: Transport + ?Sized>(local: &T, cross: &T, data: &mut [f32], wire: Wire) -> Result<Traffic> {
    let mut traffic = reduce_scatter(local, data, wire)?;
    let mine = owned_chunk(data.len(), local.size(), local.rank());
    let across = all_reduce_on(cross, &mut data[mine], wire)?;
    let gathered = all_gather(local, data, wire)?;
    for t in [across, gathered] {
        traffic.sent += t.sent;
        traffic.received += t.received;
    }
    Ok(traffic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local;

    /// Two levels (G ranks on each of M machines) sum what the flat ring sums: exactly
    /// on integers, within f32 rounding on random floats, the same bits on every rank.
    #[test]
    fn hierarchical_sums_equal_the_flat_ring() {
        for (machines, per) in [(2usize, 2usize), (3, 2), (2, 3), (1, 4), (4, 1)] {
            let n = machines * per;
            for len in [1usize, 7, 100, 1000] {
                let got = local::run_two_level(machines, per, move |rank, local_t, cross_t| {
                    let mut v: Vec<f32> = (0..len).map(|i| ((i * 7 + rank * 13) % 31) as f32).collect();
                    hierarchical_all_reduce(&local_t, &cross_t, &mut v, Wire::F32).unwrap();
                    v
                });
                let want: Vec<f32> = (0..len).map(|i| (0..n).map(|r| ((i * 7 + r * 13) % 31) as f32).sum()).collect();
                for (r, v) in got.iter().enumerate() {
                    assert_eq!(v, &want, "{machines} machines x {per}, len {len}, rank {r}");
                }
            }
        }
    }

    /// f16 on the wire: half the bytes, every rank the same bits, each sum within f16's
    /// rounding of the f64 sum (one rounding per hop, 2^-11 relative each, and the
    /// partial sums' magnitudes); on one level and on two.
    #[test]
    fn f16_on_the_wire_halves_the_bytes_and_rounds_like_f16() {
        let data = |rank: usize, len: usize| -> Vec<f32> {
            let mut s = 0x2545_f491_u32.wrapping_mul(rank as u32 + 1);
            (0..len).map(|_| { s ^= s << 13; s ^= s >> 17; s ^= s << 5; (s as f32 / u32::MAX as f32) - 0.5 }).collect()
        };
        for n in [2usize, 4] {
            let flat = local::run(n, move |t| {
                let mut v = data(t.rank(), 1000);
                let traffic = all_reduce_on(&t, &mut v, Wire::F16).unwrap();
                (v, traffic)
            });
            let two = local::run_two_level(2, n / 2, move |rank, l, c| {
                let mut v = data(rank, 1000);
                hierarchical_all_reduce(&l, &c, &mut v, Wire::F16).unwrap();
                v
            });
            for (got, what) in [(flat[0].0.clone(), "flat"), (two[0].clone(), "two levels")] {
                let (mut err, mut norm) = (0.0f64, 0.0f64);
                for (i, g) in got.iter().enumerate() {
                    let want: f64 = (0..n).map(|r| data(r, 1000)[i] as f64).sum();
                    err += (*g as f64 - want).powi(2);
                    norm += want * want;
                }
                let rel = (err / norm).sqrt();
                assert!(rel < 2e-3, "{n} ranks, {what}: relative L2 error {rel:.2e}");
            }
            assert!(flat.iter().all(|(v, _)| v == &flat[0].0), "{n} ranks: ranks differ");
            assert!(two.iter().all(|v| v == &two[0]), "{n} ranks, two levels: ranks differ");
            // 2 bytes a value, plus an exponent per block of 128 in every message.
            let sent = flat[0].1.sent as f64 / (2 * (n - 1) * 2 * 1000 / n) as f64;
            assert!((1.0..1.05).contains(&sent), "{n} ranks: {sent} of the f16 bytes sent");
        }
        // Tiny values (gradients of 1e-6) keep f16's relative precision: the scale.
        let tiny = local::run(2, |t| {
            let mut v: Vec<f32> = (0..100).map(|i| 1e-6 * (1.0 + i as f32 / 100.0)).collect();
            all_reduce_on(&t, &mut v, Wire::F16).unwrap();
            v
        });
        for (i, g) in tiny[0].iter().enumerate() {
            let want = 2e-6 * (1.0 + i as f64 / 100.0);
            assert!((*g as f64 - want).abs() <= 1e-3 * want, "element {i}: {g} vs {want}");
        }
    }

    #[test]
    fn chunks_cover_the_buffer_in_order() {
        for (len, n) in [(10, 3), (3, 4), (0, 2), (1024, 8), (7, 7)] {
            let mut next = 0;
            for c in 0..n {
                let r = chunk(len, n, c);
                assert_eq!(r.start, next);
                assert!(r.len() == len / n || r.len() == len / n + 1);
                next = r.end;
            }
            assert_eq!(next, len);
        }
    }

    /// Every rank gets the sum (exact on integers), identical bits on every rank, and
    /// moves 2(N-1)/N of the bytes, for rank counts 1-8 and sizes that do not divide.
    #[test]
    fn every_rank_gets_the_sum_and_moves_two_n_minus_one_over_n_of_the_bytes() {
        for n in 1..=8 {
            for len in [0usize, 1, 5, 97, 4096] {
                let results = local::run(n, move |t| {
                    let mut v: Vec<f32> = (0..len).map(|i| ((i * 7 + t.rank() * 13) % 31) as f32).collect();
                    let traffic = all_reduce(&t, &mut v).unwrap();
                    (v, traffic)
                });
                let want: Vec<f32> = (0..len).map(|i| (0..n).map(|r| ((i * 7 + r * 13) % 31) as f32).sum()).collect();
                for (r, (v, traffic)) in results.iter().enumerate() {
                    assert_eq!(v, &want, "n {n}, len {len}, rank {r}");
                    let own = |c: usize| 4 * chunk(len, n, c).len() as u64;
                    // Sent: every chunk but r+1's (scatter), every chunk but r's... in bytes
                    // exactly 2(N-1)/N of the buffer when N divides it.
                    let sent_scatter: u64 = (0..n - 1).map(|s| own((r + n - s) % n)).sum();
                    let sent_gather: u64 = (0..n - 1).map(|s| own((r + 1 + n - s) % n)).sum();
                    assert_eq!(traffic.sent, if n == 1 || len == 0 { 0 } else { sent_scatter + sent_gather });
                    if len % n == 0 {
                        assert_eq!(traffic.sent, (2 * (n as u64 - 1) * 4 * len as u64) / n as u64);
                        assert_eq!(traffic.received, traffic.sent);
                    }
                }
            }
        }
    }

    /// Random floats: the same bits on every rank and on every run (the summation order
    /// depends on the rank count only), within f32 rounding of the f64 sum.
    #[test]
    fn float_sums_are_reproducible_and_close_to_f64() {
        let data = |rank: usize, len: usize| -> Vec<f32> {
            let mut s = 0x9e37_79b9_u32.wrapping_mul(rank as u32 + 1);
            (0..len).map(|_| { s ^= s << 13; s ^= s >> 17; s ^= s << 5; (s as f32 / u32::MAX as f32) - 0.5 }).collect()
        };
        for n in [2, 3, 4, 8] {
            let go = || local::run(n, move |t| { let mut v = data(t.rank(), 1001); all_reduce(&t, &mut v).unwrap(); v });
            let (a, b) = (go(), go());
            assert_eq!(a, b, "n {n}: run to run");
            assert!(a.iter().all(|v| v == &a[0]), "n {n}: rank to rank");
            for (i, got) in a[0].iter().enumerate() {
                let want: f64 = (0..n).map(|r| data(r, 1001)[i] as f64).sum();
                assert!((*got as f64 - want).abs() <= 1e-6 * n as f64, "n {n}, element {i}: {got} vs {want}");
            }
        }
    }
}
