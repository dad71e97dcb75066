//! The fast CPU product of an 8-bit matrix A (the activations, `[m, k]` row-major) and a
//! constant 8-bit matrix B (`[k, n]`, or `[n, k]` transposed), exact in int32, on the
//! micro-kernels of [`crate::linalg::int8_kernel`]: B is packed once per plan in blocks
//! of [`CH`] columns, each run packs A's rows into words (pairs of `a - za` as i16, or
//! raw quads), and tiles of [`PX`] rows by [`CH`] columns go to the caller's epilogue.
//! The quads layout (VNNI) keeps A's zero point and folds `za * sum_k b[k][n]` out
//! here, so callers always see `sum_k (a - za) * (b - zb)`.
use crate::cpu::{self, SharedPtr};
use crate::linalg::int8_kernel::{self, pack_constant, Int8Isa, Layout, CH, PX};
use crate::quant::qlinear;
use crate::{OpError, Result, TuneParam, TuneValues};
use kiln_graph::{DType, Tensor};

/// B packed for one instruction set.
pub(crate) struct PackedIntMatMul {
    isa: Int8Isa,
    layout: Layout,
    k: usize,
    n: usize,
    /// Words per row of A (k padded to the layout's word).
    tw: usize,
    /// `[n / CH blocks][tw][CH]` words.
    w: crate::cpu::Aligned<u32>,
    /// Per column: the sum of B's column (quads only: folds A's zero point out).
    col_sums: Vec<i32>,
    a_signed: bool,
}

/// Whether the quads layout fits: unsigned A, signed B with zero zero points.
pub(crate) fn quads_ok(a: DType, b: DType, zb: &[i32]) -> bool {
    a == DType::U8 && b == DType::I8 && zb.iter().all(|&z| z == 0)
}

/// The instruction-set parameter ([`int8_kernel::isa_param`]) of a product whose
/// constant operand was found (A's dtype, B, B's zero points); none otherwise.
pub(crate) fn params(found: Option<(DType, &Tensor, Vec<i32>)>) -> Vec<TuneParam> {
    match found {
        Some((a, b, zb)) => vec![int8_kernel::isa_param(quads_ok(a, b.dtype(), &zb))],
        None => vec![],
    }
}

impl PackedIntMatMul {
    /// Packs B (`[k, n]`, or `[n, k]` when `trans_b`) with zero points `zb` (one, or one
    /// per column) for the instruction set the tuning values choose.
    pub(crate) fn new(a: DType, b: &Tensor, trans_b: bool, zb: &[i32], tune: &TuneValues) -> Result<PackedIntMatMul> {
        let dims = b.dims();
        if dims.len() != 2 {
            return Err(OpError::Invalid(format!("packed B must be a matrix, got shape {dims:?}")));
        }
        let (k, n) = if trans_b { (dims[1], dims[0]) } else { (dims[0], dims[1]) };
        if zb.len() != 1 && zb.len() != n {
            return Err(OpError::Invalid(format!("{} zero points for B's {n} columns", zb.len())));
        }
        let quads = quads_ok(a, b.dtype(), zb);
        let (isa, layout) = int8_kernel::chosen(tune, quads);
        let bv = qlinear::ints(b)?;
        let at = |col: usize, i: usize| if trans_b { bv[col * k + i] } else { bv[i * n + col] };
        let w = pack_constant(layout, n, 1, k, |col, _, i| at(col, i), |col| zb[if zb.len() == 1 { 0 } else { col }]);
        let col_sums = (0..n).map(|col| (0..k).map(|i| at(col, i)).sum()).collect();
        Ok(PackedIntMatMul { isa, layout, k, n, tw: k.div_ceil(layout.per_word()), w: crate::cpu::Aligned::from_vec(w), col_sums, a_signed: a == DType::I8 })
    }

    pub(crate) fn n(&self) -> usize {
        self.n
    }

    /// The exact sums `sum_k (a[r][k] - za) * (b[k][c] - zb[c])` of A's `m` rows (`a`:
    /// m * k bytes), handed a tile at a time to `store(r0, rows, c0, cols, c)` (`c`: row
    /// j, column l at `j * CH + l`) from parallel tasks, each tile once.
    pub(crate) fn run(&self, a: &[u8], m: usize, za: i32, store: impl Fn(usize, usize, usize, usize, &[i32; PX * CH]) + Sync) -> Result<()> {
        if a.len() != m * self.k {
            return Err(OpError::input(0, format!("A has {} elements, expected {m} x {}", a.len(), self.k)));
        }
        if m == 0 || self.n == 0 {
            return Ok(());
        }
        let (tw, layout, signed) = (self.tw, self.layout, self.a_signed);
        if m * tw > u32::MAX as usize {
            return Err(OpError::Unsupported(format!("an 8-bit product with {m} rows of {} values (at most 2^32 words packed)", self.k)));
        }
        let mut words = vec![0u32; m * tw];
        let dst = SharedPtr(words.as_mut_ptr());
        cpu::par_ranges(m, self.k, |r0, r1| {
            for r in r0..r1 {
                let row = &a[r * self.k..(r + 1) * self.k];
                // SAFETY: row r's words belong to this task alone.
                let out = unsafe { std::slice::from_raw_parts_mut(dst.get().add(r * tw), tw) };
                if layout == Layout::Pairs {
                    // Pairs are A's values less za as consecutive i16 (a word's low
                    // half first), an odd k's last half 0: a loop that vectorises.
                    let halves: &mut [i16] = bytemuck::cast_slice_mut(out);
                    let zero = za as i16;
                    if signed {
                        halves.iter_mut().zip(row).for_each(|(h, &v)| *h = v as i8 as i16 - zero);
                    } else {
                        halves.iter_mut().zip(row).for_each(|(h, &v)| *h = v as i16 - zero);
                    }
                    halves[self.k..].fill(0);
                    continue;
                }
                // Quads are A's bytes as stored, padded with za's byte.
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
                bytes[..self.k].copy_from_slice(row);
                bytes[self.k..].fill(za as u8);
            }
        });
        // A unit of work: `span` tiles of rows (two where the ISA runs a pair in one
        // pass) against one block of columns.
        let span = if self.isa.pairs_tiles() { 2 } else { 1 };
        let (units, blocks) = (m.div_ceil(span * PX), self.n.div_ceil(CH));
        let fold = layout == Layout::Quads;
        let x = SharedPtr(words.as_mut_ptr());
        cpu::par_ranges(units * blocks, span * PX * tw * CH, |start, end| {
            let mut c = [0i32; 2 * PX * CH];
            for u in start..end {
                let (unit, blk) = (u / blocks, u % blocks);
                let r0 = unit * span * PX;
                // Rows past m repeat the last one (their sums are dropped).
                let offs: [u32; 2 * PX] = std::array::from_fn(|j| ((r0 + j).min(m - 1) * tw) as u32);
                let wblk = self.w[blk * tw * CH..].as_ptr();
                let tiles = if r0 + PX < m { span } else { 1 };
                if r0 + 1 == m {
                    // A last (or only) row alone: a matrix-vector product.
                    let row: &mut [i32; CH] = (&mut c[..CH]).try_into().expect("CH sums");
                    // SAFETY: row r0 has tw words of A, the block tw * CH words of B, and
                    // the isa is available.
                    unsafe { self.isa.row(layout, tw, x.get().add(r0 * tw), wblk, row) };
                } else if tiles == 2 {
                    // SAFETY: offs are 2 * PX rows of tw words of A, the block has tw * CH
                    // words of B, and the isa is available.
                    unsafe { self.isa.tile_pair(layout, 1, tw, x.get(), offs.as_ptr(), offs[PX..].as_ptr(), wblk, &mut c) };
                } else {
                    // SAFETY: offs are PX rows of tw words of A, the block has tw * CH
                    // words of B, and the isa is available.
                    unsafe { self.isa.tile(layout, 1, tw, x.get(), offs.as_ptr(), wblk, int8_kernel::first_tile(&mut c)) };
                }
                let (c0, cols) = (blk * CH, CH.min(self.n - blk * CH));
                // Quads keep A's zero point: `za * sum_k b[k][col]` comes off each sum.
                let mut zfold = [0i32; CH];
                if fold {
                    for (f, &s) in zfold.iter_mut().zip(&self.col_sums[c0..c0 + cols]) {
                        *f = za.wrapping_mul(s);
                    }
                }
                for (i, sums) in c.chunks_exact_mut(PX * CH).take(tiles).enumerate() {
                    for row in sums.chunks_exact_mut(CH) {
                        row.iter_mut().zip(&zfold).for_each(|(v, &f)| *v = v.wrapping_sub(f));
                    }
                    let r = r0 + i * PX;
                    store(r, PX.min(m - r), c0, cols, (&*sums).try_into().expect("a tile"));
                }
            }
        });
        Ok(())
    }
}
