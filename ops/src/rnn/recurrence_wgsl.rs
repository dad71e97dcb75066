//! The WGSL side shared by the recurrent ops. One program per application:
//!
//! 1. the input projection `X W^T` of every time step and direction: the linalg
//!    product kernel, writing scratch 0 (`work`) from offset 0;
//! 2. `init`: biases, sequence lengths (checked), initial states and peepholes copied
//!    into `work`, the step counters reset;
//! 3. per time step, the cell's phases ([`Phase`]): one invocation per hidden unit of
//!    every direction and batch row, each summing its gates' rows of R against the
//!    previous hidden state (ping-pong halves of `work`) and updating the state;
//! 4. `final`: Y_h (and Y_c) from the last state.
//!
//! The dispatches of every step share one source (so one pipeline): a phase learns
//! which step it runs from its counter in scratch 1, which the first invocation of
//! each workgroup advances (`atomicAdd`); every workgroup of step `s` reads a value in
//! `[s * groups, (s + 1) * groups)`, since the dispatches of a pass run in order.
//! Every loop of an invocation is at most `hidden_size` long, whatever the sequence
//! length ([`wgsl::MAX_LOOP_ITERATIONS`]).
use super::common::{Cell, Dims, Direction, Layout, Recurrent, B, INITIAL_C, INITIAL_H, P, R, SEQ_LENS, W, X};
use crate::linalg::product::{BatchedProduct, Layout as MatLayout};
use crate::linalg::product_wgsl::{self, Epilogue};
use super::quantized;
use crate::op::required;
use crate::quant::dynamic_quantize_linear::{wgsl_range, RANGE_DECL, RANGE_LANES};
use crate::wgsl::{self, Binding, Dispatch, TuneParam, WgslProgram};
use crate::{Arg, OpError, Result, TensorType, TuneValues};
use std::fmt::Write;

/// The product kernel's parameters (the projection) and the steps' workgroup size.
pub(crate) fn params() -> Vec<TuneParam> {
    let mut p = product_wgsl::params();
    p.push(wgsl::workgroup_param());
    p
}

/// Where the R rows a phase sums are multiplied from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The previous hidden state.
    Hidden,
    /// Extra region `e` of the cell ([`WgslCtx::extra`]).
    Extra(usize),
}

/// One dispatch of a time step.
#[derive(Clone, Debug)]
pub(crate) struct Phase {
    pub label: &'static str,
    /// The gates whose R rows are summed against `source`, into `acc{g}`.
    pub gates: Vec<usize>,
    pub source: Source,
    /// WGSL statements computing the unit's gates from the accumulators and the
    /// expressions of [`WgslCtx`]; the last phase defines `h_new`, the new hidden state
    /// of the unit, which the shared code stores.
    pub body: String,
}

/// The sizes, the layout of the `work` scratch and the WGSL expressions a cell's phase
/// bodies use. In a body, `d`, `b` and `j` are the direction, batch row and hidden unit
/// (u32), `t` the time of this step, and `u` the unit's index in per-unit regions.
#[derive(Clone, Debug)]
pub(crate) struct WgslCtx {
    pub dims: Dims,
    pub has_bias: bool,
    pub has_peepholes: bool,
    bias: usize,
    lens: Option<usize>,
    h: usize,
    c: usize,
    peep: usize,
    extra: usize,
    /// f32 words of `work`.
    len: usize,
}

impl WgslCtx {
    fn new(dims: Dims, has_bias: bool, has_lens: bool, has_peepholes: bool, has_c: bool, extras: usize) -> Result<WgslCtx> {
        let units = dims.dirs * dims.batch * dims.hidden;
        let mut at = 0usize;
        let mut take = |n: usize| {
            let o = at;
            at = at.saturating_add(n);
            o
        };
        let _xw = take(dims.dirs * dims.seq * dims.batch * dims.gh());
        let bias = take(if has_bias { dims.dirs * 2 * dims.gh() } else { 0 });
        let lens = take(if has_lens { dims.batch } else { 0 });
        let h = take(2 * units);
        let c = take(if has_c { units } else { 0 });
        let peep = take(if has_peepholes { dims.dirs * 3 * dims.hidden } else { 0 });
        let extra = take(extras * units);
        let len = take(0);
        if len > u32::MAX as usize / 4 {
            return Err(OpError::Unsupported(format!("recurrent op scratch of {len} floats exceeds 32-bit GPU indices")));
        }
        Ok(WgslCtx { dims, has_bias, has_peepholes, bias, lens: has_lens.then_some(lens), h, c, peep, extra, len })
    }

    /// Gate `g` of the unit in this step's projection row.
    pub fn xw(&self, g: usize) -> String {
        format!("work[xrow + {}u]", g * self.dims.hidden)
    }

    /// `Wb` of gate `g` (0 without B).
    pub fn wb(&self, g: usize) -> String {
        if self.has_bias { format!("work[bias + {}u]", g * self.dims.hidden) } else { "0.0".into() }
    }

    /// `Rb` of gate `g` (0 without B).
    pub fn rb(&self, g: usize) -> String {
        if self.has_bias { format!("work[bias + {}u]", (self.dims.gates + g) * self.dims.hidden) } else { "0.0".into() }
    }

    /// `Wb + Rb` of gate `g`, or nothing without B.
    pub fn biases(&self, g: usize) -> String {
        if self.has_bias { format!(" + {} + {}", self.wb(g), self.rb(g)) } else { String::new() }
    }

    /// The unit's previous hidden state.
    pub fn h_prev(&self) -> &'static str {
        "work[hp + j]"
    }

    /// The unit's cell state (LSTM), read and written in place.
    pub fn c(&self) -> String {
        format!("work[{}u + u]", self.c)
    }

    /// Peephole `k` (i, o, f) of the unit, when the op has P.
    pub fn peephole(&self, k: usize) -> Option<String> {
        let h = self.dims.hidden;
        self.has_peepholes.then(|| format!("work[{}u + d * {}u + {}u + j]", self.peep, 3 * h, k * h))
    }

    /// The unit's value in extra region `e` (a per-unit scratch of the cell).
    pub fn extra(&self, e: usize) -> String {
        format!("work[{}u + u]", self.extra + e * self.units())
    }

    /// Activation `n` (f, g, h) of this direction of `x`, after the clip.
    pub fn act(&self, n: usize, x: &str) -> String {
        format!("kiln_act{n}(d, kiln_clip({x}))")
    }

    /// Activation `n` without the clip.
    pub fn act_unclipped(&self, n: usize, x: &str) -> String {
        format!("kiln_act{n}(d, {x})")
    }

    fn units(&self) -> usize {
        self.dims.dirs * self.dims.batch * self.dims.hidden
    }

    /// The statements computing `len` (the row's sequence length) from `b`.
    fn len_code(&self) -> String {
        match self.lens {
            Some(o) => format!("let len = bitcast<u32>(work[{o}u + b]);\n"),
            None => format!("let len = {}u;\n", self.dims.seq),
        }
    }

    /// Statements computing `j`, `b` and `d` from the unit index `i`.
    fn unit_code(&self) -> String {
        let Dims { batch, hidden, .. } = self.dims;
        format!("let j = i % {hidden}u;\n    let b = (i / {hidden}u) % {batch}u;\n    let d = i / {}u;\n    let u = i;\n    ", batch * hidden)
    }

    /// The WGSL offset of `Y[t, d, b, 0]` (layout 0) for u32 expressions `t`.
    fn y_offset(&self, t: &str) -> String {
        let Dims { seq, batch, hidden, dirs, .. } = self.dims;
        match self.dims.layout {
            Layout::SeqFirst => format!("(({t} * {dirs}u + d) * {batch}u + b) * {hidden}u"),
            Layout::BatchFirst => format!("((b * {seq}u + {t}) * {dirs}u + d) * {hidden}u"),
        }
    }

    /// The offset of `Y_h[d, b, 0]` (also of initial_h and initial_c).
    fn state_offset(&self) -> String {
        let Dims { batch, hidden, dirs, .. } = self.dims;
        match self.dims.layout {
            Layout::SeqFirst => format!("(d * {batch}u + b) * {hidden}u"),
            Layout::BatchFirst => format!("(b * {dirs}u + d) * {hidden}u"),
        }
    }
}

/// The activation and clip functions of a recurrent op's kernels.
fn functions<C: Cell>(op: &Recurrent<C>) -> String {
    let dirs = op.attrs.direction.count();
    let per_dir = op.attrs.activations.len() / dirs;
    let mut s = String::new();
    let mut helpers: Vec<&str> = vec![];
    for n in 0..per_dir {
        for d in 0..dirs {
            let (body, h) = op.attrs.activation(d, n).wgsl();
            if !h.is_empty() && !helpers.contains(&h) {
                helpers.push(h);
            }
            let _ = writeln!(s, "fn kiln_act{n}_{d}(x: f32) -> f32 {{\n    {body}\n}}");
        }
        if dirs == 2 {
            let _ = writeln!(s, "fn kiln_act{n}(d: u32, x: f32) -> f32 {{\n    if (d == 0u) {{ return kiln_act{n}_0(x); }}\n    return kiln_act{n}_1(x);\n}}");
        } else {
            let _ = writeln!(s, "fn kiln_act{n}(d: u32, x: f32) -> f32 {{\n    return kiln_act{n}_0(x);\n}}");
        }
    }
    match op.attrs.clip {
        Some(c) => {
            let (lo, hi) = (wgsl::literal("f32", -c as f64), wgsl::literal("f32", c as f64));
            let _ = writeln!(s, "fn kiln_clip(x: f32) -> f32 {{\n    return select(select(x, {lo}, x < {lo}), {hi}, x > {hi});\n}}");
        }
        None => s += "fn kiln_clip(x: f32) -> f32 {\n    return x;\n}\n",
    }
    helpers.concat() + &s
}

/// The program of a recurrent op (see the module docs).
pub(crate) fn generate<C: Cell>(op: &Recurrent<C>, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
    let dims = op.dims(inputs)?;
    let has = |i: usize| inputs.get(i).copied().flatten().is_some();
    let name = C::SPEC.name;
    let Dims { seq, batch, input, hidden, dirs, .. } = dims;
    if hidden > wgsl::MAX_LOOP_ITERATIONS {
        return Err(OpError::Unsupported(format!("{name} with hidden_size {hidden} on the GPU (at most {})", wgsl::MAX_LOOP_ITERATIONS)));
    }
    let w = WgslCtx::new(dims, has(B), has(SEQ_LENS), has(P), C::SPEC.has_cell_state, op.cell.extra_regions())?;
    let gh = dims.gh();
    let wg = tune.get(&wgsl::workgroup_param()).clamp(1, 256);
    let units = w.units();
    let mut dispatches = vec![];

    // 1. X W^T for every direction into work[0..].
    let mut extra_scratch = vec![];
    if op.quantized {
        let (projection, sizes) = quantized::wgsl_projection(&dims, inputs, wg)?;
        dispatches.extend(projection);
        extra_scratch.push(quantized::qp_bytes(dirs));
        extra_scratch.extend(sizes);
    } else {
        let p = BatchedProduct {
            batch: vec![dirs],
            a_batch_strides: vec![0],
            b_batch_strides: vec![gh * input],
            m: seq * batch,
            n: gh,
            k: input,
            a: MatLayout::row_major(input),
            b: MatLayout { rs: 1, cs: input },
        };
        let mut proj = product_wgsl::generate(&format!("{name} input projection"), &p, "f32", &Epilogue::NONE, tune)?.dispatches.remove(0);
        proj.bindings = vec![Binding::Input(X), Binding::Input(W), Binding::Scratch(0)];
        dispatches.push(proj);
    }

    // 2. init.
    let optional = [(B, "bias_in", "f32"), (SEQ_LENS, "lens_in", "i32"), (INITIAL_H, "h0", "f32"), (INITIAL_C, "c0", "f32"), (P, "p_in", "f32")];
    let mut buffers: Vec<(&str, &str, bool)> = vec![];
    let mut bindings = vec![];
    for (i, nm, ty) in optional {
        if has(i) {
            buffers.push((nm, ty, true));
            bindings.push(Binding::Input(i));
        }
    }
    buffers.push(("work", "f32", false));
    bindings.push(Binding::Scratch(0));
    let n_init = [units, if has(B) { dirs * 2 * gh } else { 0 }, if has(SEQ_LENS) { batch } else { 0 }, if has(P) { dirs * 3 * hidden } else { 0 }, 1].into_iter().max().unwrap_or(1);
    let mut body = String::from("if (i == 0u) { atomicStore(&ctr[0], 0u); atomicStore(&ctr[1], 0u); }\n");
    if has(B) {
        let _ = writeln!(body, "    if (i < {}u) {{ work[{}u + i] = bias_in[i]; }}", dirs * 2 * gh, w.bias);
    }
    if let Some(o) = w.lens {
        let report = wgsl::report_index_error("l", &format!("i32({})", seq + 1));
        let _ = writeln!(
            body,
            "    if (i < {batch}u) {{\n        let l = lens_in[i];\n        if (l < 0 || l > {seq}) {{ {report} }}\n        work[{o}u + i] = bitcast<f32>(u32(clamp(l, 0, {seq})));\n    }}"
        );
    }
    let mut state = format!("if (i < {units}u) {{\n        {}let o = {};\n", w.unit_code(), w.state_offset());
    let _ = writeln!(state, "        work[{}u + i] = {};", w.h, if has(INITIAL_H) { "h0[o + j]" } else { "0.0" });
    if C::SPEC.has_cell_state {
        let _ = writeln!(state, "        work[{}u + i] = {};", w.c, if has(INITIAL_C) { "c0[o + j]" } else { "0.0" });
    }
    body += &format!("    {state}    }}\n");
    if has(P) {
        let _ = writeln!(body, "    if (i < {}u) {{ work[{}u + i] = p_in[i]; }}", dirs * 3 * hidden, w.peep);
    }
    let mut init = wgsl::simple_kernel(&format!("{name} init"), n_init, wg, &buffers, bindings, "", &body);
    let extra_decl = format!(
        "@group(0) @binding({}) var<storage, read_write> ctr: array<atomic<u32>>;\n{}",
        buffers.len(),
        if has(SEQ_LENS) { wgsl::status_decl(buffers.len() + 1) } else { String::new() }
    );
    init.source = extra_decl + &init.source;
    init.bindings.push(Binding::Scratch(1));
    if has(SEQ_LENS) {
        init.bindings.push(Binding::Status);
    }
    dispatches.push(init);

    // 3. The steps.
    let has_y = !outputs.is_empty();
    let phases = op.cell.phases(&w);
    let fns = functions(op);
    let quant = if op.quantized { Some(QuantizedR::new(inputs, &dims)?) } else { None };
    let mut steps: Vec<Dispatch> = phases.iter().enumerate().map(|(k, ph)| phase_dispatch(op, &w, ph, k, k + 1 == phases.len(), has_y, wg, &fns, quant.as_ref())).collect::<Result<_>>()?;
    if quant.is_some() {
        steps.insert(0, hidden_range(&w, phases.len())?);
    }
    for _ in 0..seq {
        dispatches.extend(steps.iter().cloned());
    }

    // 4. Y_h and Y_c.
    if outputs.len() >= 2 {
        let mut buffers = vec![("work", "f32", false), ("yh", "f32", false)];
        let mut bindings = vec![Binding::Scratch(0), Binding::Output(1)];
        let last = w.h + (seq % 2) * units;
        let mut body = format!("{}{}    let o = {} + j;\n", w.unit_code(), w.len_code(), w.state_offset());
        let _ = writeln!(body, "    yh[o] = select(work[{last}u + i], 0.0, len == 0u);");
        if outputs.len() >= 3 {
            buffers.push(("yc", "f32", false));
            bindings.push(Binding::Output(2));
            let _ = writeln!(body, "    yc[o] = select(work[{}u + i], 0.0, len == 0u);", w.c);
        }
        dispatches.push(wgsl::simple_kernel(&format!("{name} final state"), units, wg, &buffers, bindings, "", &body));
    }
    let work_bytes = (w.len.max(1) as u64 * 4).next_multiple_of(16);
    let mut scratch_bytes = vec![work_bytes, 16];
    scratch_bytes.extend(extra_scratch);
    Ok(WgslProgram { dispatches, scratch_bytes })
}

/// How the quantized op's R is read: per direction or per column scale and zero point
/// (`d` the direction, `col` the gate column `g * hidden + j`).
pub(crate) struct QuantizedR {
    scale: String,
    zero: String,
    zero_type: &'static str,
    r_type: &'static str,
}

impl QuantizedR {
    fn new(inputs: &[Option<Arg>], dims: &Dims) -> Result<QuantizedR> {
        let at = |i: usize| -> Result<String> {
            Ok(if required(inputs, i)?.ty.len() != dims.dirs { format!("d * {}u + col", dims.gh()) } else { "d".into() })
        };
        Ok(QuantizedR { scale: at(quantized::R_SCALE)?, zero: at(quantized::R_ZERO)?, zero_type: wgsl::elem(required(inputs, quantized::R_ZERO)?.dtype()), r_type: wgsl::elem(required(inputs, R)?.dtype()) })
    }
}

/// The quantized op's first dispatch of every step: one workgroup per direction finds
/// the range of its hidden state (rows that ended before the previous step as zeros,
/// as the CPU's) and stores its scale and zero point in `qp[2 + 2d..]`. Its step
/// counter is `ctr[counter]`.
fn hidden_range(w: &WgslCtx, counter: usize) -> Result<Dispatch> {
    let Dims { batch, hidden, dirs, .. } = w.dims;
    let count = batch * hidden;
    if count.div_ceil(RANGE_LANES) > wgsl::MAX_LOOP_ITERATIONS || counter >= 4 {
        return Err(OpError::Unsupported(format!("DynamicQuantizeLSTM with a hidden state of {count} values per direction on the GPU (at most {})", RANGE_LANES * wgsl::MAX_LOOP_ITERATIONS)));
    }
    let value = format!("select(0.0, work[hp + e], s <= row_len(e / {hidden}u))");
    let source = format!(
        "@group(0) @binding(0) var<storage, read_write> work: array<f32>;\n\
         @group(0) @binding(1) var<storage, read_write> ctr: array<atomic<u32>>;\n\
         @group(0) @binding(2) var<storage, read_write> qp: array<f32>;\n{RANGE_DECL}var<workgroup> kiln_step: u32;\n{}\
         fn row_len(b: u32) -> u32 {{\n    {}    return len;\n}}\n\
         @compute @workgroup_size({RANGE_LANES})\n\
         fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{\n\
         \x20   if (lid.x == 0u) {{ kiln_step = atomicAdd(&ctr[{counter}], 1u) / {dirs}u; }}\n\
         \x20   let s = workgroupUniformLoad(&kiln_step);\n    let d = wid.x;\n\
         \x20   let hp = {}u + (s % 2u) * {}u + d * {count}u;\n{}{}}}\n",
        crate::quant::qlinear::WGSL_REQUANTIZE,
        w.len_code(),
        w.h,
        w.units(),
        wgsl_range(&value, &format!("{count}u")),
        quantized::wgsl_store_params("2u + 2u * d")
    );
    Ok(Dispatch {
        label: "DynamicQuantizeLSTM step: hidden state range".into(),
        source,
        entry_point: "main".into(),
        workgroups: [dirs as u32, 1, 1],
        bindings: vec![Binding::Scratch(0), Binding::Scratch(1), Binding::Scratch(quantized::QP_SCRATCH)],
    })
}

/// The dispatch of phase `k` of every step.
#[allow(clippy::too_many_arguments)]
fn phase_dispatch<C: Cell>(op: &Recurrent<C>, w: &WgslCtx, ph: &Phase, k: usize, last: bool, has_y: bool, wg: u32, fns: &str, quant: Option<&QuantizedR>) -> Result<Dispatch> {
    let Dims { seq, batch, hidden, .. } = w.dims;
    let gh = w.dims.gh();
    let units = w.units();
    let (grid, index) = wgsl::grid_1d(units, wg);
    let groups = grid[0] as u64 * grid[1] as u64;
    if groups * seq as u64 > u32::MAX as u64 {
        return Err(OpError::Unsupported(format!("{}: {seq} steps of {groups} workgroups overflow the step counter", C::SPEC.name)));
    }
    // R is f32, or 8-bit integers (their WGSL type) in the quantized op.
    let r_type = quant.map_or("f32", |q| q.r_type);
    let mut s = format!("@group(0) @binding(0) var<storage, read_write> work: array<f32>;\n@group(0) @binding(1) var<storage, read> r: array<{r_type}>;\n");
    s += "@group(0) @binding(2) var<storage, read_write> ctr: array<atomic<u32>>;\n";
    let mut bindings = vec![Binding::Scratch(0), Binding::Input(R), Binding::Scratch(1)];
    if let Some(q) = quant {
        let _ = writeln!(
            s,
            "@group(0) @binding(3) var<storage, read_write> qp: array<f32>;\n@group(0) @binding(4) var<storage, read> rs: array<f32>;\n@group(0) @binding(5) var<storage, read> rz: array<{}>;",
            q.zero_type
        );
        bindings.extend([Binding::Scratch(quantized::QP_SCRATCH), Binding::Input(quantized::R_SCALE), Binding::Input(quantized::R_ZERO)]);
        s += quantized::WGSL_Q_VALUE;
        s += crate::quant::qlinear::WGSL_REQUANTIZE;
    }
    if has_y && last {
        let _ = writeln!(s, "@group(0) @binding({}) var<storage, read_write> y: array<f32>;", bindings.len());
        bindings.push(Binding::Output(0));
    }
    s += "var<workgroup> kiln_step: u32;\n\n";
    s += fns;
    let _ = writeln!(
        s,
        "\n@compute @workgroup_size({wg})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{"
    );
    let _ = writeln!(s, "    if (lid == 0u) {{ kiln_step = atomicAdd(&ctr[{k}], 1u) / {groups}u; }}\n    let s = workgroupUniformLoad(&kiln_step);");
    s += &format!("    {index}");
    s += &format!("    {}{}", w.unit_code(), w.len_code());
    let h = w.h;
    let _ = writeln!(s, "    let cur = s % 2u;\n    let row = (d * {batch}u + b) * {hidden}u;\n    let hp = {h}u + cur * {units}u + row;\n    let hn = {h}u + (1u - cur) * {units}u + row;");
    let mut ended = String::new();
    if last {
        ended += "work[hn + j] = work[hp + j]; ";
        if has_y {
            let _ = write!(ended, "y[{} + j] = 0.0; ", w.y_offset("s"));
        }
    }
    let _ = writeln!(s, "    if (s >= len) {{ {ended}return; }}");
    let fwd = match op.attrs.direction {
        Direction::Forward => "true",
        Direction::Reverse => "false",
        Direction::Bidirectional => "d == 0u",
    };
    let x_row = match w.dims.layout {
        Layout::SeqFirst => format!("t * {batch}u + b"),
        Layout::BatchFirst => format!("b * {seq}u + t"),
    };
    let _ = writeln!(s, "    let t = select(len - 1u - s, s, {fwd});\n    let xrow = (d * {}u + {x_row}) * {gh}u + j;", seq * batch);
    if w.has_bias {
        let _ = writeln!(s, "    let bias = {}u + d * {}u + j;", w.bias, 2 * gh);
    }
    if let Some(q) = quant {
        // acc{g}: the exact sum of (quantized h - its zero point) times (R - its zero
        // point) over the unit's column of R (stored [hidden, 4*hidden] per direction),
        // scaled by the two scales, as the CPU's.
        let hq = quantized::wgsl_quantized("work[hp + k]", "2u + 2u * d");
        for g in &ph.gates {
            let col = format!("({}u + j)", g * hidden);
            let _ = writeln!(s, "    var iacc{g} = 0i;\n    let rz{g} = i32(rz[{}]);", q.zero.replace("col", &col));
        }
        let _ = writeln!(s, "    let rbase = d * {}u + j;\n    for (var k = 0u; k < {hidden}u; k = k + 1u) {{\n        let hk = {hq};", gh * hidden);
        for g in &ph.gates {
            let _ = writeln!(s, "        iacc{g} += hk * (i32(r[rbase + k * {gh}u + {}u]) - rz{g});", g * hidden);
        }
        s += "    }\n";
        for g in &ph.gates {
            let col = format!("({}u + j)", g * hidden);
            let _ = writeln!(s, "    let acc{g} = f32(iacc{g}) * (qp[2u + 2u * d] * rs[{}]);", q.scale.replace("col", &col));
        }
    }
    for g in ph.gates.iter().filter(|_| quant.is_none()) {
        let _ = writeln!(s, "    var acc{g} = 0.0;");
    }
    if !ph.gates.is_empty() && quant.is_none() {
        let src = match ph.source {
            Source::Hidden => "hp".to_string(),
            Source::Extra(e) => format!("{}u + row", w.extra + e * units),
        };
        let _ = writeln!(s, "    let src = {src};\n    let rbase = d * {}u + j * {hidden}u;", gh * hidden);
        let _ = writeln!(s, "    for (var k = 0u; k < {hidden}u; k = k + 1u) {{\n        let hk = work[src + k];");
        for g in &ph.gates {
            let _ = writeln!(s, "        acc{g} = acc{g} + hk * r[rbase + {}u + k];", g * hidden * hidden);
        }
        s += "    }\n";
    }
    s += &format!("    {}\n", ph.body.trim_end());
    if last {
        s += "    work[hn + j] = h_new;\n";
        if has_y {
            let _ = writeln!(s, "    y[{} + j] = h_new;", w.y_offset("t"));
        }
    }
    s += "}\n";
    Ok(Dispatch { label: format!("{} step: {}", C::SPEC.name, ph.label), source: s, entry_point: "main".into(), workgroups: grid, bindings })
}
