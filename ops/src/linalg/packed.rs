//! A GEMM whose left operand is packed once (constant weights: a convolution's filters)
//! and whose right operand is packed block by block as it is consumed, straight from
//! where its values live (an image through im2col, a plain matrix), so that no whole
//! im2col buffer is ever built and no weight is repacked per run.
//!
//! `C[m x n] (+)= A[m x k] * B[k x n]`, cut into blocks of `mc` rows and `nc` columns
//! (the unit of parallel work, [`PackedGemm::run_block`]). Within a block the reduction
//! runs in slices of `kc`: a slice of B (`kc x nc`) is packed into NR-column panels in
//! per-thread scratch, then every (B panel, A panel) pair is one register tile of the
//! micro-kernel ([`Isa::tile`]); a B panel stays in L1 while the block's A panels
//! stream past it from L2. After the last slice each row of the finished block goes
//! through the caller's epilogue (bias, activation) while the block is in L2.
use super::microkernel::Isa;
use crate::cpu;

/// `A` (`m x k`, row-major) packed into panels of `isa.mr()` rows, each `k` columns of
/// MR values (zero rows pad the last panel).
#[derive(Clone, Debug)]
pub struct PackedA {
    pub isa: Isa,
    pub m: usize,
    pub k: usize,
    /// On cache lines.
    data: cpu::AlignedF32,
}

impl PackedA {
    pub fn pack(isa: Isa, a: &[f32], m: usize, k: usize) -> PackedA {
        let mr = isa.mr();
        let panels = m.div_ceil(mr);
        let mut data = vec![0f32; panels * k * mr];
        for p in 0..panels {
            let panel = &mut data[p * k * mr..][..k * mr];
            for i in 0..mr.min(m - p * mr) {
                let row = &a[(p * mr + i) * k..][..k];
                for (kk, &v) in row.iter().enumerate() {
                    panel[kk * mr + i] = v;
                }
            }
        }
        PackedA { isa, m, k, data: cpu::AlignedF32::from_vec(data) }
    }
}

/// Where the rows of B come from.
pub trait BRows: Sync {
    /// Writes `B[k][n0 .. n0 + dst.len()]` into `dst`.
    fn row(&self, k: usize, n0: usize, dst: &mut [f32]);
}

/// A row-major matrix with row stride `ld` as B.
pub struct MatrixRows<'a> {
    pub data: &'a [f32],
    pub ld: usize,
}

impl BRows for MatrixRows<'_> {
    fn row(&self, k: usize, n0: usize, dst: &mut [f32]) {
        dst.copy_from_slice(&self.data[k * self.ld + n0..][..dst.len()]);
    }
}

/// Block sizes of a [`PackedGemm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Reduction slice.
    pub kc: usize,
    /// Rows per block (a multiple of MR).
    pub mc: usize,
    /// Columns per block (a multiple of NR unless it is all of n).
    pub nc: usize,
}

/// One product `C = A * B` with A packed: how it is cut into blocks.
pub struct PackedGemm<'a> {
    a: &'a PackedA,
    n: usize,
    blocking: Blocking,
}

impl<'a> PackedGemm<'a> {
    /// The product of `a` by an `n`-column B with these block sizes (rounded so that
    /// blocks start on whole panels).
    pub fn new(a: &'a PackedA, n: usize, blocking: Blocking) -> PackedGemm<'a> {
        let mr = a.isa.mr();
        let blocking = Blocking { kc: blocking.kc.max(1), mc: blocking.mc.max(1).next_multiple_of(mr), nc: blocking.nc.max(1) };
        PackedGemm { a, n, blocking }
    }

    /// Blocks along m and along n.
    pub fn blocks(&self) -> (usize, usize) {
        (self.a.m.div_ceil(self.blocking.mc.max(1)), self.n.div_ceil(self.blocking.nc.max(1)))
    }

    /// Computes block (`mi`, `ni`) of C: `C = (accumulate ? C : 0) + A * B`, then
    /// `epilogue(row, values)` on each finished row segment of the block.
    ///
    /// # Safety
    /// `c` points at C (row stride `ldc >= n`, `m` rows) and no other thread touches
    /// this block's elements meanwhile; `b` yields rows `0..k` over columns `0..n`.
    pub unsafe fn run_block(
        &self,
        mi: usize,
        ni: usize,
        b: &dyn BRows,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        epilogue: &(dyn Fn(usize, &mut [f32]) + Sync),
    ) {
        let PackedA { isa, m, k, ref data } = *self.a;
        let (mr, nr) = (isa.mr(), isa.nr());
        let Blocking { kc, mc, nc } = self.blocking;
        let kc = kc.clamp(1, k.max(1));
        let (m0, n0) = (mi * mc, ni * nc);
        let (m1, n1) = ((m0 + mc).min(m), (n0 + nc).min(self.n));
        if m0 >= m1 || n0 >= n1 {
            return;
        }
        let cols = n1 - n0;
        let panels = cols.div_ceil(nr);
        cpu::with_scratch(kc * panels * nr + cols + mr * nr, |scratch| {
            let (bp, rest) = scratch.split_at_mut(kc * panels * nr);
            let (row, edge) = rest.split_at_mut(cols);
            if k == 0 {
                for i in m0..m1 {
                    let out = std::slice::from_raw_parts_mut(c.add(i * ldc + n0), cols);
                    if !accumulate {
                        out.fill(0.0);
                    }
                    epilogue(i, out);
                }
                return;
            }
            let mut kb = 0;
            while kb < k {
                let kcur = kc.min(k - kb);
                let last = kb + kcur == k;
                // Pack B[kb .. kb + kcur][n0 .. n1] into NR-column panels.
                for kk in 0..kcur {
                    b.row(kb + kk, n0, row);
                    for p in 0..panels {
                        let dst = &mut bp[(p * kcur + kk) * nr..][..nr];
                        let src = &row[p * nr..(p * nr + nr).min(cols)];
                        dst[..src.len()].copy_from_slice(src);
                        dst[src.len()..].fill(0.0);
                    }
                }
                for p in 0..panels {
                    let j0 = n0 + p * nr;
                    let ncur = nr.min(n1 - j0);
                    let bpanel = bp.as_ptr().add(p * kcur * nr);
                    let mut i0 = m0;
                    while i0 < m1 {
                        let mcur = mr.min(m1 - i0);
                        let apanel = data.as_ptr().add((i0 / mr) * k * mr + kb * mr);
                        let acc = accumulate || kb > 0;
                        let dst = c.add(i0 * ldc + j0);
                        if mcur == mr && ncur == nr {
                            isa.tile(kcur, apanel, bpanel, dst, ldc, acc);
                        } else {
                            // A partial tile: through a full one in scratch.
                            if acc {
                                for r in 0..mcur {
                                    std::ptr::copy_nonoverlapping(dst.add(r * ldc), edge.as_mut_ptr().add(r * nr), ncur);
                                }
                            }
                            isa.tile(kcur, apanel, bpanel, edge.as_mut_ptr(), nr, acc);
                            for r in 0..mcur {
                                std::ptr::copy_nonoverlapping(edge.as_ptr().add(r * nr), dst.add(r * ldc), ncur);
                            }
                        }
                        i0 += mcur;
                    }
                }
                kb += kcur;
                if last {
                    // The finished block (still in L2), one call per row.
                    for i in m0..m1 {
                        epilogue(i, std::slice::from_raw_parts_mut(c.add(i * ldc + n0), cols));
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_match_the_reference_on_odd_shapes() {
        for isa in Isa::available() {
            for &(m, n, k) in &[(1, 1, 1), (13, 37, 29), (25, 70, 300), (7, 3, 0), (40, 33, 5)] {
                let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
                let bm: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 * 0.5 - 2.0).collect();
                let packed = PackedA::pack(isa, &a, m, k);
                let whole = Blocking { kc: 256, mc: m.max(1), nc: n.max(1) };
                for blocking in [whole, Blocking { kc: 7, mc: isa.mr(), nc: isa.nr() }, Blocking { kc: 64, mc: 2 * isa.mr(), nc: 3 * isa.nr() + 1 }] {
                    let g = PackedGemm::new(&packed, n, blocking);
                    let ldc = n + 3;
                    for accumulate in [false, true] {
                        let mut c = vec![1.5f32; m * ldc];
                        let (mb, nb) = g.blocks();
                        for mi in 0..mb {
                            for ni in 0..nb {
                                unsafe {
                                    g.run_block(mi, ni, &MatrixRows { data: &bm, ld: n }, c.as_mut_ptr(), ldc, accumulate, &|_, r| r.iter_mut().for_each(|v| *v *= 2.0))
                                };
                            }
                        }
                        for i in 0..m {
                            for j in 0..ldc {
                                let got = c[i * ldc + j];
                                if j >= n {
                                    assert_eq!(got, 1.5);
                                    continue;
                                }
                                let mut want: f64 = if accumulate { 1.5 } else { 0.0 };
                                for p in 0..k {
                                    want += a[i * k + p] as f64 * bm[p * n + j] as f64;
                                }
                                assert_eq!(got as f64, want * 2.0, "{isa:?} {m}x{n}x{k} {blocking:?} at ({i}, {j})");
                            }
                        }
                    }
                }
            }
        }
    }
}
