//! The CPU side shared by the recurrent ops: the input projection `X W^T` of every time
//! step and direction as one batched matrix product (the linalg product, the `gemm`
//! crate), biases folded into it, then per step the recurrent product of every batch
//! row at once and the cell's gates ([`Cell::step`]); a bidirectional op runs its two
//! directions' steps as two tasks, in parallel where there are threads. f32 accumulates in
//! f32 as onnxruntime does; f64 runs the same code in f64 (the widened reference of the
//! cross-device tests); f16 and bf16 go through f32.
use super::common::{sequence_lengths, Activation, Cell, Dims, Recurrent, B, INITIAL_C, INITIAL_H, P, R, SEQ_LENS, W, X};
use super::quantized::{self, QuantMatrix};
use crate::cpu;
use crate::elementwise::UnaryKind;
use crate::linalg::product::{BatchedProduct, Layout};
use crate::{OpError, Result};
use kiln_graph::{DType, Element, Tensor};
use std::ops::{Add, Mul, Neg, Sub};
use std::sync::Mutex;

/// The float types the recurrence computes in.
pub(crate) trait Real: Element + Default + PartialOrd + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Neg<Output = Self> {
    fn of(v: f32) -> Self;
    /// `kind` applied to every element (f32: the vectorising approximations of the
    /// unary table, as onnxruntime's MLAS ones; f64: the exact functions).
    fn activate(kind: UnaryKind, xs: &mut [Self]);
    /// `out = A B` for the operands `p` describes (`out` overwritten).
    fn product(p: &BatchedProduct, a: &[Self], b: &[Self], out: &mut [Self]) -> Result<()>;
    /// Lends `f` a buffer of `len` elements (contents unspecified).
    fn with_scratch<Out>(len: usize, f: impl FnOnce(&mut [Self]) -> Out) -> Out;
    /// The f32 slice of an f32 buffer (None for other types).
    fn as_f32(xs: &[Self]) -> Option<&[f32]>;
    fn as_f32_mut(xs: &mut [Self]) -> Option<&mut [f32]>;
}

impl Real for f32 {
    fn of(v: f32) -> f32 {
        v
    }
    fn activate(kind: UnaryKind, xs: &mut [f32]) {
        kind.apply_slice_f32_fast(xs)
    }
    fn product(p: &BatchedProduct, a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
        p.run_f32_rows(a, b, out, 1.0, &|_, _| {})
    }
    fn with_scratch<Out>(len: usize, f: impl FnOnce(&mut [f32]) -> Out) -> Out {
        cpu::with_scratch(len, f)
    }
    fn as_f32(xs: &[f32]) -> Option<&[f32]> {
        Some(xs)
    }
    fn as_f32_mut(xs: &mut [f32]) -> Option<&mut [f32]> {
        Some(xs)
    }
}

impl Real for f64 {
    fn of(v: f32) -> f64 {
        v as f64
    }
    fn activate(kind: UnaryKind, xs: &mut [f64]) {
        xs.iter_mut().for_each(|v| *v = kind.apply_f64(*v))
    }
    fn product(p: &BatchedProduct, a: &[f64], b: &[f64], out: &mut [f64]) -> Result<()> {
        p.run_float(a, b, out, 1.0, false)
    }
    fn with_scratch<Out>(len: usize, f: impl FnOnce(&mut [f64]) -> Out) -> Out {
        f(&mut vec![0.0; len])
    }
    fn as_f32(_: &[f64]) -> Option<&[f32]> {
        None
    }
    fn as_f32_mut(_: &mut [f64]) -> Option<&mut [f32]> {
        None
    }
}

/// What a cell's step reads: the sizes, this direction's weights and projection, and
/// which batch rows still run.
pub(crate) struct StepCtx<'a, T> {
    pub dims: Dims,
    /// Per batch row, the projection row of this step's time; None once the row's
    /// sequence has ended (its state must then stay as it is).
    pub rows: &'a [Option<usize>],
    /// This direction's input projection `[rows of X, gates * hidden]`, with `Wb` and
    /// every `Rb` not added inside the cell ([`Cell::rb_inside`]) folded in.
    pub xw: &'a [T],
    /// `R[d]`: `[gates * hidden, hidden]` (empty when quantized).
    pub r: &'a [T],
    /// `R[d]` transposed, `[hidden, gates * hidden]`, where the plan prepared it (f32).
    pub r_rows: Option<&'a [f32]>,
    /// DynamicQuantizeLSTM's `R[d]`, `[hidden, gates * hidden]` in 8 bits.
    pub rq: Option<&'a QuantMatrix>,
    /// Per batch row, whether its hidden state is quantized as it is (else as zeros):
    /// onnxruntime's recurrent operand holds zeros for rows whose sequence ended before
    /// the previous step, and the quantization range is taken over that operand.
    pub rq_rows: &'a [bool],
    /// `Rb[d]` (zeros without B).
    pub rb: &'a [T],
    /// `P[d]`: `[3 * hidden]` (LSTM's peepholes).
    pub p: Option<&'a [T]>,
    /// This direction's activations.
    pub acts: &'a [Activation],
    pub clip: Option<T>,
}

impl<T: Real> StepCtx<'_, T> {
    /// `out[b] = src[b] R[g0*hidden .. g1*hidden]^T` for every batch row `b` (`src` is
    /// `[batch, hidden]`, `out` `[batch, (g1 - g0) * hidden]`).
    pub fn recurrent(&self, src: &[T], g0: usize, g1: usize, out: &mut [T]) -> Result<()> {
        let h = self.dims.hidden;
        let n = (g1 - g0) * h;
        if let Some(q) = self.rq {
            let (Some(a), Some(out)) = (T::as_f32(src), T::as_f32_mut(out)) else {
                return Err(OpError::Unsupported("DynamicQuantizeLSTM in f64".into()));
            };
            let a = &a[..self.dims.batch * h];
            if self.rq_rows.iter().all(|&r| r) {
                q.product(a, g0 * h, n, &mut out[..self.dims.batch * n]);
            } else {
                let masked: Vec<f32> = a.chunks_exact(h).zip(self.rq_rows).flat_map(|(row, &keep)| row.iter().map(move |&v| if keep { v } else { 0.0 })).collect();
                q.product(&masked, g0 * h, n, &mut out[..self.dims.batch * n]);
            }
            return Ok(());
        }
        let gh = self.dims.gh();
        let product = |b: Layout| BatchedProduct {
            batch: vec![],
            a_batch_strides: vec![],
            b_batch_strides: vec![],
            m: self.dims.batch,
            n,
            k: h,
            a: Layout::row_major(h),
            b,
        };
        let out = &mut out[..self.dims.batch * n];
        let mut run = || match (self.r_rows, T::as_f32(src)) {
            (Some(rows), Some(src)) => {
                let out = T::as_f32_mut(out).expect("f32 like src");
                f32::product(&product(Layout { rs: gh, cs: 1 }), src, &rows[g0 * h..], out)
            }
            _ => T::product(&product(Layout { rs: 1, cs: h }), src, &self.r[g0 * h * h..g1 * h * h], out),
        };
        // A step's product is a few microseconds at the usual sizes: waking the other
        // threads for it costs as much as it saves.
        if self.dims.batch * n * h <= SERIAL_STEP {
            cpu::serial(run)
        } else {
            run()
        }
    }

    /// Gate `g` (`hidden` values) of projection row `row`.
    pub fn xw(&self, row: usize, g: usize) -> &[T] {
        let (h, gh) = (self.dims.hidden, self.dims.gh());
        &self.xw[row * gh + g * h..][..h]
    }

    /// Clips `xs` (when the op has a clip) and applies activation `n` (f, g, h...).
    pub fn activate(&self, n: usize, xs: &mut [T]) {
        if let Some(c) = self.clip {
            for v in xs.iter_mut() {
                if *v > c {
                    *v = c;
                } else if *v < -c {
                    *v = -c;
                }
            }
        }
        self.acts[n].apply(xs);
    }

    /// Activation `n` without the clip (LSTM's `h(Ct)`, as onnxruntime computes it).
    pub fn activate_unclipped(&self, n: usize, xs: &mut [T]) {
        self.acts[n].apply(xs);
    }
}

/// One step of one direction: what the cell reads ([`StepCtx`]) and the state and
/// scratch it updates. Only the rows of running batch rows may change in `h` and `c`.
pub(crate) struct Step<'a, T> {
    pub ctx: StepCtx<'a, T>,
    /// The hidden state `[batch, hidden]`, updated in place.
    pub h: &'a mut [T],
    /// LSTM's cell state `[batch, hidden]` (empty for the others).
    pub c: &'a mut [T],
    /// Scratch `[batch, gates * hidden]`.
    pub gates: &'a mut [T],
    /// Scratch `[batch, hidden]`.
    pub extra: &'a mut [T],
}

/// The most multiply-adds of a recurrent step's product that run on one thread.
const SERIAL_STEP: usize = 1 << 17;

/// `dst[i] += src[i]`.
pub(crate) fn add_into<T: Real>(dst: &mut [T], src: &[T]) {
    dst.iter_mut().zip(src).for_each(|(d, s)| *d = *d + *s);
}

/// What one direction's steps write: its state, its scratch, its outputs `[seq][batch][hidden]`
/// (by time, not by step) and how its steps ended.
struct DirState<'a, T> {
    h: &'a mut [T],
    c: &'a mut [T],
    gates: &'a mut [T],
    extra: &'a mut [T],
    y: &'a mut [T],
    result: Result<()>,
}

/// `xs` in `n` chunks of `len`, or `n` empty slices when `xs` is empty (a cell without a
/// cell state).
fn chunks_or_empty<T>(xs: &mut [T], len: usize, n: usize) -> impl Iterator<Item = &mut [T]> {
    let empty = xs.is_empty();
    let mut chunks = xs.chunks_mut(len.max(1));
    (0..n).map(move |_| if empty { &mut [][..] } else { chunks.next().unwrap_or(&mut []) })
}

/// Runs a recurrent op on tensors of any of its dtypes.
pub(crate) fn run<C: Cell>(op: &Recurrent<C>, inputs: &[Option<&Tensor>], outputs: &mut [Tensor], prepared: Prepared) -> Result<()> {
    match cpu::input(inputs, X)?.dtype() {
        DType::F32 => run_typed::<C, f32>(op, inputs, outputs, prepared),
        DType::F64 => run_typed::<C, f64>(op, inputs, outputs, prepared),
        DType::F16 | DType::BF16 => {
            let widen = |t: &Tensor| if t.dtype().is_float() { Tensor::from_f64(DType::F32, t.dims(), &t.to_f64_vec()) } else { Ok(t.clone()) };
            let wide: Vec<Option<Tensor>> = inputs.iter().map(|t| t.map(widen).transpose()).collect::<std::result::Result<_, _>>()?;
            let refs: Vec<Option<&Tensor>> = wide.iter().map(Option::as_ref).collect();
            let mut outs: Vec<Tensor> = outputs.iter().map(|o| Tensor::try_zeros(DType::F32, o.dims())).collect::<std::result::Result<_, _>>()?;
            run_typed::<C, f32>(op, &refs, &mut outs, prepared)?;
            for (o, w) in outputs.iter_mut().zip(&outs) {
                *o = Tensor::from_f64(o.dtype(), o.dims(), &w.to_f64_vec())?;
            }
            Ok(())
        }
        d => Err(OpError::Unsupported(format!("{} of {d} tensors", C::SPEC.name))),
    }
}

/// What a plan builds once for a recurrent op ([`super::common::Recurrent::prepare`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct Prepared<'a> {
    /// The quantized op's W and R per direction.
    pub quantized: Option<(&'a [QuantMatrix], &'a [QuantMatrix])>,
    /// An f32 R transposed: `[dirs][hidden][gates * hidden]`, so that a step's product
    /// streams rows of it with its sums in registers.
    pub r_rows: Option<&'a [f32]>,
}

/// `R` (`[dirs, gates * hidden, hidden]`) transposed per direction into
/// `[dirs][hidden][gates * hidden]`.
pub(crate) fn transpose_r(r: &[f32], dirs: usize, gh: usize, hidden: usize) -> Vec<f32> {
    let mut out = vec![0f32; dirs * gh * hidden];
    for d in 0..dirs {
        let (src, dst) = (&r[d * gh * hidden..][..gh * hidden], &mut out[d * gh * hidden..][..gh * hidden]);
        for (j, row) in src.chunks_exact(hidden).enumerate() {
            for (k, &v) in row.iter().enumerate() {
                dst[k * gh + j] = v;
            }
        }
    }
    out
}

fn run_typed<C: Cell, T: Real>(op: &Recurrent<C>, inputs: &[Option<&Tensor>], outputs: &mut [Tensor], prepared: Prepared) -> Result<()> {
    let name = C::SPEC.name;
    let shapes: Vec<Option<(&[usize], DType)>> = inputs.iter().map(|t| t.map(|t| (t.dims(), t.dtype()))).collect();
    let dims = op.check(&shapes)?;
    let get = |i: usize| inputs.get(i).copied().flatten();
    let lens = sequence_lengths(name, get(SEQ_LENS), &dims)?;
    let slice = |i: usize| get(i).map(|t| t.as_slice::<T>()).transpose();
    let x = cpu::input(inputs, X)?.as_slice::<T>()?;
    let (w, r) = if op.quantized { (&[][..], &[][..]) } else { (cpu::input(inputs, W)?.as_slice::<T>()?, cpu::input(inputs, R)?.as_slice::<T>()?) };
    let built;
    let quantized: Option<(&[QuantMatrix], &[QuantMatrix])> = match (op.quantized, prepared.quantized) {
        (false, _) => None,
        (true, Some(p)) => Some(p),
        (true, None) => {
            built = (quantized::matrices(inputs, W, &dims)?, quantized::matrices(inputs, R, &dims)?);
            Some((&built.0[..], &built.1[..]))
        }
    };
    let (bias, h0, c0, peep) = (slice(B)?, slice(INITIAL_H)?, slice(INITIAL_C)?, slice(P)?);
    let Dims { seq, batch, input, hidden, dirs, .. } = dims;
    let gh = dims.gh();
    let rows = seq * batch;
    let state = batch * hidden;
    let has_c = C::SPEC.has_cell_state;
    // Scratch: the projection, per direction h (and c), gates, extra rows and outputs
    // of every step, and Rb (zeros without B).
    let sizes = [dirs * rows * gh, dirs * state, if has_c { dirs * state } else { 0 }, dirs * batch * gh, dirs * state, dirs * rows * hidden, dirs * gh];
    let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s)).ok_or_else(|| OpError::invalid(format!("{name}: scratch size overflows")))?;
    T::with_scratch(total, |buf| -> Result<()> {
        let (xw, rest) = buf.split_at_mut(sizes[0]);
        let (hs, rest) = rest.split_at_mut(sizes[1]);
        let (cs, rest) = rest.split_at_mut(sizes[2]);
        let (gates, rest) = rest.split_at_mut(sizes[3]);
        let (extra, rest) = rest.split_at_mut(sizes[4]);
        let (ys, rb) = rest.split_at_mut(sizes[5]);
        // X W^T for every direction: W[d] is read transposed through strides.
        let p = BatchedProduct {
            batch: vec![dirs],
            a_batch_strides: vec![0],
            b_batch_strides: vec![gh * input],
            m: rows,
            n: gh,
            k: input,
            a: Layout::row_major(input),
            b: Layout { rs: 1, cs: input },
        };
        match (quantized, T::as_f32(x), T::as_f32_mut(xw)) {
            (None, ..) => T::product(&p, x, w, xw)?,
            (Some((wq, _)), Some(x), Some(xw)) => {
                for (d, wd) in wq.iter().enumerate() {
                    wd.product(x, 0, gh, &mut xw[d * rows * gh..(d + 1) * rows * gh]);
                }
            }
            _ => return Err(OpError::Unsupported(format!("{name} in f64"))),
        }
        rb.fill(T::default());
        if let Some(bias) = bias {
            for d in 0..dirs {
                let (wb, rbd) = bias[d * 2 * gh..(d + 1) * 2 * gh].split_at(gh);
                rb[d * gh..(d + 1) * gh].copy_from_slice(rbd);
                let mut folded = wb.to_vec();
                for g in 0..dims.gates {
                    if !op.cell.rb_inside(g) {
                        add_into(&mut folded[g * hidden..(g + 1) * hidden], &rbd[g * hidden..(g + 1) * hidden]);
                    }
                }
                xw[d * rows * gh..(d + 1) * rows * gh].chunks_mut(gh).for_each(|row| add_into(row, &folded));
            }
        }
        // Initial states, stored per direction as [batch, hidden].
        for (src, dst) in [(h0, &mut *hs), (c0, &mut *cs)] {
            match src {
                Some(v) if !dst.is_empty() => {
                    for d in 0..dirs {
                        for b in 0..batch {
                            dst[(d * batch + b) * hidden..][..hidden].copy_from_slice(&v[dims.state_offset(d, b)..][..hidden]);
                        }
                    }
                }
                _ => dst.fill(T::default()),
            }
        }
        // The directions are independent: each runs its steps as one task, on its own
        // state, scratch and outputs ([`DirState`]), in parallel where there are threads.
        let per_dir = op.attrs.activations.len() / dirs;
        let parts = hs
            .chunks_mut(state)
            .zip(chunks_or_empty(cs, state, dirs))
            .zip(gates.chunks_mut(batch * gh).zip(extra.chunks_mut(state)))
            .zip(ys.chunks_mut(rows * hidden))
            .map(|(((h, c), (gates, extra)), y)| Mutex::new(DirState { h, c, gates, extra, y, result: Ok(()) }))
            .collect::<Vec<_>>();
        let run_dir = |d: usize| {
            let mut guard = parts[d].lock().unwrap_or_else(|e| e.into_inner());
            let part = &mut *guard;
            let mut step_rows: Vec<Option<usize>> = vec![None; batch];
            let mut times = vec![0usize; batch];
            let mut rq_rows = vec![true; batch];
            let forward = op.attrs.direction.is_forward(d);
            for s in 0..seq {
                for (b, keep) in rq_rows.iter_mut().enumerate() {
                    *keep = s <= lens[b];
                }
                for b in 0..batch {
                    step_rows[b] = (s < lens[b]).then(|| {
                        times[b] = if forward { s } else { lens[b] - 1 - s };
                        dims.x_row(times[b], b)
                    });
                }
                let mut st = Step {
                    ctx: StepCtx {
                        dims,
                        rows: &step_rows,
                        xw: &xw[d * rows * gh..(d + 1) * rows * gh],
                        r: if op.quantized { r } else { &r[d * gh * hidden..(d + 1) * gh * hidden] },
                        r_rows: prepared.r_rows.map(|rows| &rows[d * gh * hidden..(d + 1) * gh * hidden]),
                        rq: quantized.map(|(_, rq)| &rq[d]),
                        rq_rows: &rq_rows,
                        rb: &rb[d * gh..(d + 1) * gh],
                        p: peep.map(|p| &p[d * 3 * hidden..(d + 1) * 3 * hidden]),
                        acts: &op.attrs.activations[d * per_dir..(d + 1) * per_dir],
                        clip: op.attrs.clip.map(T::of),
                    },
                    h: &mut *part.h,
                    c: &mut *part.c,
                    gates: &mut *part.gates,
                    extra: &mut *part.extra,
                };
                if let Err(e) = op.cell.step(&mut st) {
                    part.result = Err(e);
                    return;
                }
                for b in (0..batch).filter(|&b| step_rows[b].is_some()) {
                    part.y[(times[b] * batch + b) * hidden..][..hidden].copy_from_slice(&part.h[b * hidden..(b + 1) * hidden]);
                }
            }
        };
        // A step's work, in multiply-adds: its recurrent product.
        cpu::par_ranges(dirs, seq * batch * gh * hidden, |d0, d1| (d0..d1).for_each(run_dir));
        for part in parts {
            let part = part.into_inner().unwrap_or_else(|e| e.into_inner());
            part.result?;
        }
        if let Some(y) = outputs.first_mut() {
            let y = y.as_mut_slice::<T>()?;
            y.fill(T::default());
            for d in 0..dirs {
                for b in 0..batch {
                    for t in 0..lens[b] {
                        y[dims.y_offset(t, d, b)..][..hidden].copy_from_slice(&ys[((d * seq + t) * batch + b) * hidden..][..hidden]);
                    }
                }
            }
        }
        // Y_h and Y_c: the state after each row's last step (zeros for empty sequences).
        for (k, src) in [(1, &*hs), (2, &*cs)] {
            let Some(out) = outputs.get_mut(k) else { continue };
            let out = out.as_mut_slice::<T>()?;
            for d in 0..dirs {
                for b in 0..batch {
                    let dst = &mut out[dims.state_offset(d, b)..][..hidden];
                    if lens[b] == 0 {
                        dst.fill(T::default());
                    } else {
                        dst.copy_from_slice(&src[(d * batch + b) * hidden..][..hidden]);
                    }
                }
            }
        }
        Ok(())
    })
}
