//! The f32 matrix-vector product `y = alpha * x B` (one row of A), which is bound by
//! reading B once: the threads split B's columns, and each streams its share.
//!
//! B is read through strides: `B[k, j]` is `b[k * rs + j * cs]`. With `cs == 1` (B
//! row-major, `[K, N]`) each step adds `x[k]` times a row segment to a block of sums
//! held in registers; with `rs == 1` (B transposed, `[N, K]`, as exported linear
//! layers store it) each output is a dot product of two contiguous rows.
use crate::cpu;

/// Columns a task sums at once when B is row-major (one block of accumulators).
const COLS: usize = 64;

/// Whether [`gemv`] handles these strides (one of them 1).
/// The most rows of A that [`gemv`] takes one at a time: beyond this a blocked GEMM
/// reuses each panel of B better.
pub(crate) const MAX_ROWS: usize = 4;

/// The most elements of B (1 MiB of f32) for which a few rows of A go through [`gemv`]
/// one after the other, B staying in the cache between them.
pub(crate) const CACHED_B: usize = 1 << 18;

pub(crate) fn applies(rs: usize, cs: usize) -> bool {
    rs == 1 || cs == 1
}

/// `y[j] = alpha * sum_k x[k] * B[k, j]` for `j < y.len()`, `k < x.len()`.
pub(crate) fn gemv(x: &[f32], b: &[f32], rs: usize, cs: usize, alpha: f32, y: &mut [f32]) {
    let (n, k) = (y.len(), x.len());
    if n == 0 {
        return;
    }
    let out = cpu::SharedOut(y.as_mut_ptr());
    let parts = n.div_ceil(COLS);
    cpu::par_ranges(parts, 2 * COLS * k, |p0, p1| {
        let (j0, j1) = (p0 * COLS, (p1 * COLS).min(n));
        // SAFETY: this range writes columns j0..j1 only.
        let y = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(j0), j1 - j0) };
        if cs == 1 {
            for (c, ys) in y.chunks_mut(COLS).enumerate() {
                dispatch_rows(x, &b[j0 + c * COLS..], rs, alpha, ys);
            }
        } else {
            dispatch_dots(x, &b[j0 * cs..], cs, alpha, y);
        }
    });
}

/// Columns a task sums for two rows at once ([`gemv2`]): two rows of four vectors of
/// sums, with room left in the registers for the two broadcasts.
const HALF: usize = COLS / 2;

/// [`gemv`] for two rows of A against a row-major B (`cs == 1`): each row of B is read
/// once for both (the steps of a recurrent layer with batch 2, and the like).
pub(crate) fn gemv2(x: [&[f32]; 2], b: &[f32], rs: usize, alpha: f32, y: [&mut [f32]; 2]) {
    let (n, k) = (y[0].len(), x[0].len());
    assert!(y[1].len() == n && x[1].len() == k);
    if n == 0 {
        return;
    }
    let out = [cpu::SharedOut(y[0].as_mut_ptr()), cpu::SharedOut(y[1].as_mut_ptr())];
    cpu::par_ranges(n.div_ceil(HALF), 4 * HALF * k, |p0, p1| {
        for c in p0..p1 {
            let (j, w) = (c * HALF, HALF.min(n - c * HALF));
            // SAFETY: this task writes columns j..j + w of both rows only.
            let (y0, y1) = unsafe { (std::slice::from_raw_parts_mut(out[0].ptr().add(j), w), std::slice::from_raw_parts_mut(out[1].ptr().add(j), w)) };
            #[cfg(target_arch = "x86_64")]
            if w == HALF && cpu::has_avx2() {
                // SAFETY: the CPU has AVX2 and FMA.
                unsafe { rows2_avx2(x, &b[j..], rs, alpha, [y0, y1]) };
                continue;
            }
            dispatch_rows(x[0], &b[j..], rs, alpha, y0);
            dispatch_rows(x[1], &b[j..], rs, alpha, y1);
        }
    });
}

/// [`HALF`] columns of two rows: eight vectors of sums in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows2_avx2(x: [&[f32]; 2], b: &[f32], rs: usize, alpha: f32, y: [&mut [f32]; 2]) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); HALF / 8]; 2];
    for (kk, (&x0, &x1)) in x[0].iter().zip(x[1]).enumerate() {
        let row = &b[kk * rs..][..HALF];
        let (v0, v1) = (_mm256_set1_ps(x0), _mm256_set1_ps(x1));
        for q in 0..HALF / 8 {
            let bv = _mm256_loadu_ps(row.as_ptr().add(8 * q));
            acc[0][q] = _mm256_fmadd_ps(v0, bv, acc[0][q]);
            acc[1][q] = _mm256_fmadd_ps(v1, bv, acc[1][q]);
        }
    }
    let al = _mm256_set1_ps(alpha);
    for (r, ys) in y.into_iter().enumerate() {
        for q in 0..HALF / 8 {
            _mm256_storeu_ps(ys.as_mut_ptr().add(8 * q), _mm256_mul_ps(al, acc[r][q]));
        }
    }
}

fn dispatch_rows(x: &[f32], b: &[f32], rs: usize, alpha: f32, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { rows_avx2(x, b, rs, alpha, y) };
    }
    rows(x, b, rs, alpha, y)
}

fn dispatch_dots(x: &[f32], b: &[f32], cs: usize, alpha: f32, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { dots_avx2(x, b, cs, alpha, y) };
    }
    dots(x, b, cs, alpha, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2(x: &[f32], b: &[f32], rs: usize, alpha: f32, y: &mut [f32]) {
    use std::arch::x86_64::*;
    if y.len() < COLS {
        return rows(x, b, rs, alpha, y);
    }
    let mut acc = [_mm256_setzero_ps(); COLS / 8];
    for (kk, &xk) in x.iter().enumerate() {
        let row = &b[kk * rs..][..COLS];
        let v = _mm256_set1_ps(xk);
        for (q, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(v, _mm256_loadu_ps(row.as_ptr().add(8 * q)), *a);
        }
    }
    let al = _mm256_set1_ps(alpha);
    for (q, a) in acc.into_iter().enumerate() {
        _mm256_storeu_ps(y.as_mut_ptr().add(8 * q), _mm256_mul_ps(al, a));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2(x: &[f32], b: &[f32], cs: usize, alpha: f32, y: &mut [f32]) {
    use std::arch::x86_64::*;
    // Four rows at a time, two vectors each: eight independent sums.
    const R: usize = 4;
    let k = x.len();
    let body = k - k % 16;
    let groups = y.len() / R;
    for g in 0..groups {
        let rows: [&[f32]; R] = std::array::from_fn(|i| &b[(g * R + i) * cs..][..k]);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for c in (0..body).step_by(16) {
            let x0 = _mm256_loadu_ps(x.as_ptr().add(c));
            let x1 = _mm256_loadu_ps(x.as_ptr().add(c + 8));
            for (a, row) in acc.iter_mut().zip(&rows) {
                a[0] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(row.as_ptr().add(c)), a[0]);
                a[1] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(row.as_ptr().add(c + 8)), a[1]);
            }
        }
        // The four sums' lanes, reduced together: after two rounds of pairwise adds,
        // lane i of each 128-bit half holds half of row i's sum.
        let s: [__m256; R] = std::array::from_fn(|i| _mm256_add_ps(acc[i][0], acc[i][1]));
        let h = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
        let mut sums = [0f32; R];
        _mm_storeu_ps(sums.as_mut_ptr(), _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h)));
        for (i, (sum, row)) in sums.iter().zip(&rows).enumerate() {
            let tail: f32 = x[body..].iter().zip(&row[body..]).map(|(p, q)| p * q).sum();
            y[g * R + i] = alpha * (sum + tail);
        }
    }
    dots(x, &b[groups * R * cs..], cs, alpha, &mut y[groups * R..]);
}

/// Up to COLS columns of a row-major B (`b[k * rs + j]`): the sums stay in registers
/// while the rows stream by.
#[inline(always)]
fn rows(x: &[f32], b: &[f32], rs: usize, alpha: f32, y: &mut [f32]) {
    let w = y.len();
    let mut acc = [0f32; COLS];
    if w == COLS {
        for (kk, &xk) in x.iter().enumerate() {
            let row: &[f32; COLS] = b[kk * rs..][..COLS].try_into().expect("COLS columns");
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += xk * v;
            }
        }
    } else {
        for (kk, &xk) in x.iter().enumerate() {
            for (a, &v) in acc.iter_mut().zip(&b[kk * rs..][..w]) {
                *a += xk * v;
            }
        }
    }
    for (o, a) in y.iter_mut().zip(acc) {
        *o = alpha * a;
    }
}

/// Dot products of `x` with rows of a transposed B (`b[j * cs + k]`), each over 16
/// partial sums.
#[inline(always)]
fn dots(x: &[f32], b: &[f32], cs: usize, alpha: f32, y: &mut [f32]) {
    const L: usize = 16;
    let k = x.len();
    let body = k - k % L;
    for (j, o) in y.iter_mut().enumerate() {
        let row = &b[j * cs..][..k];
        let mut acc = [0f32; L];
        for (xs, ws) in x[..body].chunks_exact(L).zip(row[..body].chunks_exact(L)) {
            for l in 0..L {
                acc[l] += xs[l] * ws[l];
            }
        }
        let tail: f32 = x[body..].iter().zip(&row[body..]).map(|(a, b)| a * b).sum();
        *o = alpha * (acc.iter().sum::<f32>() + tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_match_the_f64_reference() {
        for &(k, n) in &[(1usize, 1usize), (7, 3), (33, 65), (1280, 1000), (100, 200), (64, 256), (5, 96)] {
            let x: Vec<f32> = (0..k).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 13) as f32 - 6.0) * 0.1).collect();
            // b as [K, N] row-major, and the same values as [N, K] (transposed).
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let want: Vec<f64> = (0..n).map(|j| 0.5 * (0..k).map(|kk| x[kk] as f64 * b[kk * n + j] as f64).sum::<f64>()).collect();
            for (data, rs, cs) in [(&b, n, 1), (&bt, 1, k)] {
                let mut y = vec![f32::NAN; n];
                gemv(&x, data, rs, cs, 0.5, &mut y);
                for (j, (&g, &w)) in y.iter().zip(&want).enumerate() {
                    assert!((g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()), "k {k} n {n} rs {rs} column {j}: {g} vs {w}");
                }
                if cs == 1 {
                    // Two rows at once: the second row the first negated.
                    let neg: Vec<f32> = x.iter().map(|v| -v).collect();
                    let (mut y0, mut y1) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                    gemv2([&x, &neg], data, rs, 0.5, [&mut y0, &mut y1]);
                    for (j, ((&a, &b), &w)) in y0.iter().zip(&y1).zip(&want).enumerate() {
                        assert!((a as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()), "gemv2 k {k} n {n} column {j}: {a} vs {w}");
                        assert_eq!(a, -b, "gemv2 k {k} n {n} column {j}: the negated row");
                    }
                }
            }
        }
    }
}
