//! The engine behind most data-movement ops: an output element's source is found one
//! output dim at a time. Each output dim `d` has a [`DimMap`] from its coordinate to an
//! input coordinate (or "fill" for padding), and the source offset is
//! `base + sum_d in_index_d * stride_d`. Slice, Transpose, Expand, Tile, Pad, Split and
//! nearest Resize are all such maps; one CPU loop and one WGSL generator serve them.
//!
//! The CPU kernel works on raw elements of 1, 2, 4 or 8 bytes, so it is dtype-generic.
use crate::cpu;
use crate::wgsl::{self, Binding, Dispatch};
use crate::{OpError, Result};
use bytemuck::Pod;
use kiln_graph::Tensor;
use std::fmt::Write;

/// How a padded coordinate outside the input is mapped back in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PadMode {
    /// Outside -> the fill value.
    Constant,
    /// Outside -> the nearest edge element.
    Edge,
    /// Mirror without repeating the edge (numpy "reflect").
    Reflect,
    /// Periodic (numpy "wrap").
    Wrap,
}

/// Input coordinate of one output dim as a function of the output coordinate `o`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum DimMap {
    /// `start + step * o` (always inside the input).
    Affine { start: i64, step: i64 },
    /// `o % n` (Tile).
    Modulo { n: i64 },
    /// `o / k` (integer nearest upsampling).
    Div { k: i64 },
    /// `o - before` mapped into `0..n` by the pad mode.
    Pad { before: i64, n: i64, mode: PadMode },
    /// A lookup table; negative entries mean "fill".
    Table(Vec<i64>),
}

impl DimMap {
    /// The identity map.
    pub fn id() -> DimMap {
        DimMap::Affine { start: 0, step: 1 }
    }

    /// Input coordinate for output coordinate `o`, or None for "fill".
    pub fn index(&self, o: i64) -> Option<i64> {
        match *self {
            DimMap::Affine { start, step } => Some(start + step * o),
            DimMap::Modulo { n } => Some(o % n.max(1)),
            DimMap::Div { k } => Some(o / k.max(1)),
            DimMap::Pad { before, n, mode } => pad_index(o - before, n, mode),
            DimMap::Table(ref t) => t.get(o as usize).copied().filter(|&v| v >= 0),
        }
    }

    /// A table replaced by the simplest equivalent closed form (so GPU code needs no
    /// lookup array when the table is regular).
    pub fn simplified(self) -> DimMap {
        let DimMap::Table(t) = &self else { return self };
        if t.iter().any(|&v| v < 0) || t.is_empty() {
            return self;
        }
        let step = if t.len() > 1 { t[1] - t[0] } else { 0 };
        if t.iter().enumerate().all(|(o, &v)| v == t[0] + step * o as i64) {
            return DimMap::Affine { start: t[0], step };
        }
        // (k = 0 would be a table starting above 0, which is no division)
        if let Some(k) = t.iter().position(|&v| v != 0).filter(|&k| k > 0) {
            let k = k as i64;
            if t.iter().enumerate().all(|(o, &v)| v == o as i64 / k) {
                return DimMap::Div { k };
            }
        }
        self
    }
}

/// `t` (a coordinate relative to the input start) mapped into `0..n` by `mode`.
pub(crate) fn pad_index(t: i64, n: i64, mode: PadMode) -> Option<i64> {
    if (0..n).contains(&t) {
        return Some(t);
    }
    if n <= 0 {
        return None;
    }
    match mode {
        PadMode::Constant => None,
        PadMode::Edge => Some(t.clamp(0, n - 1)),
        PadMode::Wrap => Some(t.rem_euclid(n)),
        PadMode::Reflect => {
            if n == 1 {
                return Some(0);
            }
            let period = 2 * (n - 1);
            let m = t.abs() % period;
            Some(if m >= n { period - m } else { m })
        }
    }
}

/// A complete gather description: output dims, one map and one input stride per output
/// dim, and a base offset (all in elements).
#[derive(Clone, Debug)]
pub(crate) struct IndexMap {
    pub out_dims: Vec<usize>,
    pub maps: Vec<DimMap>,
    pub strides: Vec<usize>,
    pub base: usize,
}

const FILL: i64 = i64::MIN;

impl IndexMap {
    /// Whether any output element takes the fill value.
    pub fn may_fill(&self) -> bool {
        self.maps.iter().zip(&self.out_dims).any(|(m, &n)| match m {
            DimMap::Pad { mode: PadMode::Constant, before, n: len, .. } => {
                *before > 0 || (n as i64) > before + len
            }
            DimMap::Table(t) => t.iter().any(|&v| v < 0),
            _ => false,
        })
    }

    /// Per-dim offset contributions (`index * stride`, or FILL).
    fn tables(&self) -> Vec<Vec<i64>> {
        self.maps
            .iter()
            .zip(&self.out_dims)
            .zip(&self.strides)
            .map(|((m, &n), &s)| (0..n as i64).map(|o| m.index(o).map_or(FILL, |i| i * s as i64)).collect())
            .collect()
    }

    /// Checks every source offset lies inside an input of `in_len` elements (so a bad
    /// map is an error, not a panic).
    pub fn check_bounds(&self, in_len: usize) -> Result<()> {
        if self.out_dims.contains(&0) {
            return Ok(());
        }
        let (mut lo, mut hi) = (self.base as i64, self.base as i64);
        for t in self.tables() {
            let valid = t.iter().filter(|&&v| v != FILL);
            lo += valid.clone().min().copied().unwrap_or(0);
            hi += valid.max().copied().unwrap_or(0);
        }
        if lo < 0 || hi >= in_len as i64 {
            return Err(OpError::invalid(format!(
                "internal index map reads offsets {lo}..={hi} of an input of {in_len} elements"
            )));
        }
        Ok(())
    }

    /// Runs the gather on the CPU: `dst` (output bytes) from `src` (input bytes),
    /// elements of `elem` bytes; `fill` is one element's bytes for padding.
    pub fn run(&self, src: &Tensor, dst: &mut Tensor, fill: &[u8]) -> Result<()> {
        let elem = src.dtype().size();
        if dst.dtype().size() != elem || fill.len() != elem {
            return Err(OpError::invalid("index map: element sizes of input, output and fill differ"));
        }
        self.check_bounds(src.len())?;
        match elem {
            1 => self.run_typed::<u8>(src.bytes(), dst.bytes_mut(), fill),
            2 => self.run_typed::<u16>(src.bytes(), dst.bytes_mut(), fill),
            4 => self.run_typed::<u32>(src.bytes(), dst.bytes_mut(), fill),
            8 => self.run_typed::<u64>(src.bytes(), dst.bytes_mut(), fill),
            n => return Err(OpError::invalid(format!("unsupported element size {n}"))),
        }
        Ok(())
    }

    fn run_typed<T: Pod + Send + Sync>(&self, src: &[u8], dst: &mut [u8], fill: &[u8]) {
        let src: &[T] = bytemuck::cast_slice(src);
        let dst: &mut [T] = bytemuck::cast_slice_mut(dst);
        let fill: T = bytemuck::pod_read_unaligned(fill);
        if dst.is_empty() {
            return;
        }
        if let Some((rows, cols)) = self.batched_transpose() {
            return transpose_rows(src, dst, rows, cols);
        }
        let mut tables = self.tables();
        let mut dims = self.out_dims.clone();
        if dims.is_empty() {
            dims.push(1);
            tables.push(vec![0]);
        }
        let rank = dims.len();
        let inner = dims[rank - 1];
        let inner_t = &tables[rank - 1];
        // The inner dim as `t[o] = t[0] + o / k`: a contiguous run (k = 1), or each
        // element repeated k times (integer nearest upsampling).
        let repeat = inner_t.iter().take_while(|&&v| v == inner_t[0]).count().max(1);
        let runs = inner_t.iter().enumerate().all(|(o, &v)| v != FILL && v == inner_t[0] + (o / repeat) as i64);
        let base = self.base as i64;
        let (dims, tables) = (&dims, &tables);
        cpu::par_chunks_mut(dst, inner, 1, |row0, part| {
            // The source offset of the row written last, when it was copied from the
            // input: a row with the same source (upsampling, Expand, Tile) copies it.
            let mut last: Option<(i64, usize)> = None;
            for r in 0..part.len() / inner {
                let mut rem = row0 + r;
                let mut off = base;
                let mut valid = true;
                for d in (0..rank - 1).rev() {
                    let t = tables[d][rem % dims[d]];
                    rem /= dims[d];
                    if t == FILL {
                        valid = false;
                    } else {
                        off += t;
                    }
                }
                if let Some((_, prev)) = last.filter(|&(o, _)| valid && o == off) {
                    part.copy_within(prev * inner..(prev + 1) * inner, r * inner);
                    continue;
                }
                let row = &mut part[r * inner..(r + 1) * inner];
                last = valid.then_some((off, r));
                if !valid {
                    row.fill(fill);
                } else if runs && repeat == 1 {
                    let s = (off + inner_t[0]) as usize;
                    row.copy_from_slice(&src[s..s + inner]);
                } else if runs && repeat == 2 && inner % 2 == 0 {
                    // Twice each (2x nearest upsampling), in pairs the compiler vectorises.
                    let s = (off + inner_t[0]) as usize;
                    for (pair, &v) in row.chunks_exact_mut(2).zip(&src[s..s + inner / 2]) {
                        pair[0] = v;
                        pair[1] = v;
                    }
                } else if runs {
                    let s = (off + inner_t[0]) as usize;
                    for (group, &v) in row.chunks_mut(repeat).zip(&src[s..]) {
                        group.fill(v);
                    }
                } else {
                    for (o, &t) in row.iter_mut().zip(inner_t) {
                        *o = if t == FILL { fill } else { src[(off + t) as usize] };
                    }
                }
            }
        });
    }

    /// A pure permutation that is a batch of 2-D transposes, once the dims that move
    /// together are merged (NCHW to NHWC and back): `Some((rows, cols))` where output
    /// `[b][r][c]` is input `[b][c][r]` (one row: a plain copy).
    fn batched_transpose(&self) -> Option<(usize, usize)> {
        if self.base != 0 || self.maps.iter().any(|m| !matches!(m, DimMap::Affine { start: 0, step: 1 })) {
            return None;
        }
        // (size, input stride) of the output dims, size-1 dims dropped, neighbours that
        // step through the input as one dim merged.
        let mut ds: Vec<(usize, usize)> = vec![];
        for (&d, &st) in self.out_dims.iter().zip(&self.strides) {
            if d == 1 {
                continue;
            }
            match ds.last_mut() {
                Some(last) if last.1 == st * d => *last = (last.0 * d, st),
                _ => ds.push((d, st)),
            }
        }
        match ds[..] {
            // Only size-1 dims move ([N, 1, 1, C] to [N, C, 1, 1]): a copy.
            [] => Some((1, 1)),
            [(n, 1)] => Some((1, n)),
            [(r, 1), (c, sc)] if sc == r => Some((r, c)),
            [(_, sb), (r, 1), (c, sc)] if sc == r && sb == r * c => Some((r, c)),
            _ => None,
        }
    }

    /// WGSL statements computing `var src_ok: bool` and `var src_off: i32` (the source
    /// offset) from the output index `i`, plus module-scope helpers (lookup tables).
    pub fn wgsl_offset(&self, prefix: &str) -> (String, String) {
        let mut helpers = String::new();
        let mut code = format!("var {prefix}_r = i;\n    var {prefix}_off = {}i;\n    var {prefix}_ok = true;\n", self.base);
        let rank = self.out_dims.len();
        for d in (0..rank).rev() {
            let n = self.out_dims[d];
            let c = format!("{prefix}_c{d}");
            if d == 0 {
                let _ = writeln!(code, "    let {c} = i32({prefix}_r);");
            } else {
                let n = n.max(1);
                let _ = writeln!(code, "    let {c} = i32({prefix}_r % {n}u);\n    {prefix}_r = {prefix}_r / {n}u;");
            }
            let x = format!("{prefix}_x{d}");
            let (expr, check) = match &self.maps[d] {
                DimMap::Affine { start, step } => (format!("{start}i + {step}i * {c}"), None),
                DimMap::Modulo { n } => (format!("{c} % {}i", n.max(&1)), None),
                DimMap::Div { k } => (format!("{c} / {}i", k.max(&1)), None),
                DimMap::Pad { before, n, mode } => {
                    let t = format!("({c} - {before}i)");
                    match mode {
                        PadMode::Constant => (t, Some(format!("{x} >= 0i && {x} < {n}i"))),
                        PadMode::Edge => (format!("clamp({t}, 0i, {}i)", (n - 1).max(0)), None),
                        PadMode::Wrap => (format!("((({t}) % {n}i) + {n}i) % {n}i", n = n.max(&1)), None),
                        PadMode::Reflect => {
                            if *n <= 1 {
                                ("0i".to_string(), None)
                            } else {
                                let p = 2 * (n - 1);
                                let _ = writeln!(code, "    let {x}_m = abs{t} % {p}i;");
                                (format!("select({x}_m, {p}i - {x}_m, {x}_m >= {n}i)"), None)
                            }
                        }
                    }
                }
                DimMap::Table(t) => {
                    let name = format!("{}_T{d}", prefix.to_uppercase());
                    let vals: Vec<String> = t.iter().map(|v| format!("{}i", (*v).max(-1))).collect();
                    let _ = writeln!(helpers, "const {name} = array<i32, {}>({});", t.len().max(1), if vals.is_empty() { "0i".to_string() } else { vals.join(", ") });
                    (format!("{name}[{c}]"), Some(format!("{x} >= 0i")))
                }
            };
            let _ = writeln!(code, "    let {x} = {expr};");
            if let Some(check) = check {
                let _ = writeln!(code, "    {prefix}_ok = {prefix}_ok && ({check});");
            }
            if self.strides[d] != 0 {
                let _ = writeln!(code, "    {prefix}_off += {x} * {}i;", self.strides[d]);
            }
        }
        (helpers, code)
    }

    /// A full kernel `out[i] = src[offset(i)]` (or `fill` where the map says so).
    /// `fill` is a WGSL expression of the element type (a literal or a buffer read);
    /// `extra` are further buffers (e.g. a run-time pad value), bound after `src`.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch(
        &self,
        label: &str,
        ty: &str,
        wg: u32,
        src: Binding,
        dst: Binding,
        fill: &str,
        extra: &[(&str, Binding)],
    ) -> Dispatch {
        let n: usize = self.out_dims.iter().product();
        let mut buffers = vec![("src", ty, true)];
        let mut bindings = vec![src];
        for (name, b) in extra {
            buffers.push((name, ty, true));
            bindings.push(*b);
        }
        buffers.push(("dst", ty, false));
        bindings.push(dst);
        if n == 0 {
            // nothing to write (the grid bounds check returns at once)
            return wgsl::simple_kernel(label, 0, wg, &buffers, bindings, "", "");
        }
        let contiguous = self.base == 0
            && self.strides == crate::broadcast::strides(&self.out_dims)
            && self.maps.iter().all(|m| *m == DimMap::id());
        let body = if contiguous {
            "dst[i] = src[i];".to_string()
        } else {
            let (helpers, code) = self.wgsl_offset("m");
            let body = format!(
                "{code}    if (m_ok) {{ dst[i] = src[u32(m_off)]; }} else {{ dst[i] = {fill}; }}"
            );
            return wgsl::simple_kernel(label, n, wg, &buffers, bindings, &helpers, &body);
        };
        wgsl::simple_kernel(label, n, wg, &buffers, bindings, "", &body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_graph::DType;

    #[test]
    fn pad_modes_match_numpy() {
        // numpy.pad(np.arange(3), 4, mode) for each mode
        let idx = |mode| (-4..7).map(|t| pad_index(t, 3, mode).unwrap_or(-1)).collect::<Vec<_>>();
        assert_eq!(idx(PadMode::Reflect), vec![0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2]);
        assert_eq!(idx(PadMode::Edge), vec![0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2]);
        assert_eq!(idx(PadMode::Wrap), vec![2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(idx(PadMode::Constant), vec![-1, -1, -1, -1, 0, 1, 2, -1, -1, -1, -1]);
    }

    #[test]
    fn simplify_tables() {
        assert_eq!(DimMap::Table(vec![3, 5, 7]).simplified(), DimMap::Affine { start: 3, step: 2 });
        assert_eq!(DimMap::Table(vec![0, 0, 0, 1, 1, 1, 2]).simplified(), DimMap::Div { k: 3 });
        assert!(matches!(DimMap::Table(vec![0, 0, 1, 2]).simplified(), DimMap::Table(_)));
        assert!(matches!(DimMap::Table(vec![1, 2, 5, 6]).simplified(), DimMap::Table(_)));
    }

    #[test]
    fn transpose_like_gather_and_wgsl() {
        // out[j][i] = in[i][j] for in 2x3
        let t = Tensor::from_slice(&[2, 3], &[1i64, 2, 3, 4, 5, 6]).unwrap();
        let m = IndexMap { out_dims: vec![3, 2], maps: vec![DimMap::id(), DimMap::id()], strides: vec![1, 3], base: 0 };
        let mut out = Tensor::zeros(DType::I64, &[3, 2]);
        m.run(&t, &mut out, &[0; 8]).unwrap();
        assert_eq!(out.as_slice::<i64>().unwrap(), &[1, 4, 2, 5, 3, 6]);
        let mut maps = m.clone();
        maps.maps[0] = DimMap::Table(vec![2, -1, 0]);
        maps.maps[1] = DimMap::Pad { before: 1, n: 2, mode: PadMode::Reflect };
        let d = maps.dispatch("t", "i32", 64, Binding::Input(0), Binding::Output(0), "0i", &[]);
        crate::wgsl::testing::validate(&d.source);
        let bad = IndexMap { base: 1, ..m };
        assert!(bad.run(&t, &mut out, &[0; 8]).is_err());
    }
}

/// A data-movement op whose output reads input 0 through an [`IndexMap`] (Expand, Tile,
/// Transpose, Slice): it only says how to plan the map; [`MappedOp`] turns that into
/// the op's inference, CPU kernel and WGSL kernel.
pub(crate) trait PlansIndexMap: Send + Sync + std::fmt::Debug {
    const NAME: &'static str;
    fn plan(&self, inputs: &[Option<crate::Arg>]) -> Result<IndexMap>;
}

/// The op of a [`PlansIndexMap`].
#[derive(Debug)]
pub(crate) struct MappedOp<T>(pub T);

impl<T: PlansIndexMap> crate::Op for MappedOp<T> {
    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        T::NAME
    }

    fn infer(&self, inputs: &[Option<crate::Arg>]) -> Result<Vec<crate::TensorType>> {
        Ok(vec![crate::TensorType::new(crate::required(inputs, 0)?.dtype(), self.0.plan(inputs)?.out_dims)])
    }

    fn cpu(&self) -> Option<&dyn crate::CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn crate::WgslKernel> {
        Some(self)
    }
}

impl<T: PlansIndexMap> crate::CpuKernel for MappedOp<T> {
    fn run(&self, inputs: &[Option<&kiln_graph::Tensor>], outputs: &mut [kiln_graph::Tensor]) -> Result<()> {
        let map = super::common::tensor_args(inputs, |a| self.0.plan(a))?;
        let x = crate::cpu::input(inputs, 0)?;
        map.run(x, &mut outputs[0], &vec![0; x.dtype().size()])
    }
}

impl<T: PlansIndexMap> crate::WgslKernel for MappedOp<T> {
    fn generate(&self, inputs: &[Option<crate::Arg>], outputs: &[crate::TensorType], tune: &crate::TuneValues) -> Result<crate::WgslProgram> {
        self.generate_halves(inputs, outputs, tune, &crate::wgsl::Halves::default())
    }

    fn half_storage(&self) -> crate::wgsl::HalfStorage {
        crate::wgsl::HalfStorage::Together
    }

    /// Moves halves as they are when both sides are stored as halves.
    fn generate_halves(&self, inputs: &[Option<crate::Arg>], outputs: &[crate::TensorType], tune: &crate::TuneValues, halves: &crate::wgsl::Halves) -> Result<crate::WgslProgram> {
        let map = self.0.plan(inputs)?;
        let half = halves.input(0) && halves.output(0) && outputs[0].dtype == kiln_graph::DType::F16;
        if halves.any() && !half {
            return Err(OpError::Unsupported(format!("{}: halves on one side only", T::NAME)));
        }
        let (ty, fill) = if half { ("f16", "f16(0.0)".to_string()) } else {
            let ty = crate::wgsl::elem(outputs[0].dtype);
            (ty, crate::wgsl::literal(ty, 0.0))
        };
        let wg = tune.get(&crate::wgsl::workgroup_param());
        let mut d = map.dispatch(T::NAME, ty, wg, crate::Binding::Input(0), crate::Binding::Output(0), &fill, &[]);
        if half {
            d.source = format!("{}{}", crate::wgsl::HALF_HEADER, d.source);
        }
        Ok(crate::WgslProgram::single(d))
    }
}

/// `dst[b][r][c] = src[b][c][r]` for every batch `b` of `rows x cols` elements, in
/// square tiles so that both sides stay in cache lines.
fn transpose_rows<T: Pod + Send + Sync>(src: &[T], dst: &mut [T], rows: usize, cols: usize) {
    const TILE: usize = 32;
    cpu::par_chunks_mut(dst, cols, cols, |row0, part| {
        let n = part.len() / cols;
        let mut r = 0;
        while r < n {
            // A tile never crosses a batch.
            let (b, r_in) = ((row0 + r) / rows, (row0 + r) % rows);
            let h = TILE.min(n - r).min(rows - r_in);
            let plane = &src[b * rows * cols..(b + 1) * rows * cols];
            for c0 in (0..cols).step_by(TILE) {
                let w = TILE.min(cols - c0);
                for i in 0..h {
                    let out = &mut part[(r + i) * cols + c0..][..w];
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = plane[(c0 + j) * rows + r_in + i];
                    }
                }
            }
            r += h;
        }
    });
}
