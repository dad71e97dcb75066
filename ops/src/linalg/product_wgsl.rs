//! WGSL for the batched matrix product shared by MatMul and Gemm: a barrier-free,
//! register-blocked kernel. Each invocation computes a block of `rows_per_thread` rows
//! by 4 columns (one `vec4` accumulator per row), reading operands as `vec4` where the
//! layout allows it (contiguous, 4-aligned rows) and as clamped scalars otherwise, so
//! sizes need not be multiples of the tile. Batches (with broadcasting) run on the z
//! axis of the grid. An optional epilogue computes `alpha * AB + beta * C` (Gemm).
use super::product::BatchedProduct;
use crate::wgsl::{self, Binding, Dispatch, Halves, TuneParam, WgslProgram, MAX_GROUPS};
use crate::{OpError, Result, TuneValues};
use std::fmt::Write;

/// `alpha * product + beta * C`, with C (input 2) addressed as `row * rs + col * cs`
/// (strides 0 on broadcast dims).
#[derive(Clone, Copy, Debug)]
pub struct Epilogue {
    pub alpha: f64,
    pub beta: f64,
    pub bias: Option<(usize, usize)>,
    /// A residual of the output's shape added before the activation (binding: input 3).
    pub residual: bool,
    /// A fused activation applied last (f32 only).
    pub activation: Option<crate::elementwise::UnaryKind>,
}

impl Epilogue {
    pub const NONE: Epilogue = Epilogue { alpha: 1.0, beta: 0.0, bias: None, residual: false, activation: None };
}

pub fn rows_param() -> TuneParam {
    TuneParam { name: "rows_per_thread", default: 4, candidates: vec![1, 2, 4, 8] }
}
pub fn wg_x_param() -> TuneParam {
    TuneParam { name: "wg_x", default: 8, candidates: vec![4, 8, 16, 32] }
}
pub fn wg_y_param() -> TuneParam {
    TuneParam { name: "wg_y", default: 8, candidates: vec![1, 2, 4, 8, 16] }
}

/// The tunable parameters of the product kernel.
pub fn params() -> Vec<TuneParam> {
    vec![rows_param(), wg_x_param(), wg_y_param()]
}

/// Generates the product kernel. Bindings: A = input 0, B = input 1, C = input 2 when
/// the epilogue has a bias, output 0. `ty` is the WGSL element type.
pub fn generate(label: &str, p: &BatchedProduct, ty: &str, epi: &Epilogue, tune: &TuneValues) -> Result<WgslProgram> {
    generate_halves(label, p, ty, epi, tune, &Halves::default())
}

/// [`generate`] with the f16 operands of `halves` (inputs A, B, C, residual; output 0)
/// stored as halves: they are read into f32, which the product accumulates in.
pub fn generate_halves(label: &str, p: &BatchedProduct, ty: &str, epi: &Epilogue, tune: &TuneValues, halves: &Halves) -> Result<WgslProgram> {
    if halves.any() && ty != "f32" {
        return Err(OpError::Unsupported(format!("f16 storage for a {ty} product")));
    }
    let (ha, hb, hc, hres, hout) = (halves.input(0), halves.input(1), halves.input(2), halves.input(3), halves.output(0));
    let tm = tune.get(&rows_param()).clamp(1, 16) as usize;
    let wx = tune.get(&wg_x_param()).clamp(1, 256);
    let wy = tune.get(&wg_y_param()).clamp(1, 256);
    if wx * wy > 256 {
        return Err(OpError::invalid(format!("workgroup {wx}x{wy} exceeds 256 invocations")));
    }
    let (m, n, k) = (p.m, p.n, p.k);
    let batch = p.batch_count();
    let groups = [
        (n.div_ceil(4) as u64).div_ceil(wx as u64).max(1),
        (m.div_ceil(tm) as u64).div_ceil(wy as u64).max(1),
        (batch as u64).max(1),
    ];
    if groups.iter().any(|&g| g > MAX_GROUPS as u64) {
        return Err(OpError::Unsupported(format!(
            "matrix product [{batch} x {m}x{k} by {k}x{n}] needs a grid of {groups:?} workgroups (max {MAX_GROUPS} per dim)"
        )));
    }
    let aligned = |s: &[usize]| s.iter().all(|v| v % 4 == 0);
    let a_vec = p.a.cs == 1 && k % 4 == 0 && p.a.rs % 4 == 0 && aligned(&p.a_batch_strides);
    let b_vec = p.b.cs == 1 && n % 4 == 0 && p.b.rs % 4 == 0 && aligned(&p.b_batch_strides);
    let out_vec = n % 4 == 0;
    let v4 = format!("vec4<{ty}>");
    let lit = |v: f64| wgsl::literal(ty, v);

    let a_ty = if a_vec { v4.clone() } else { ty.to_string() };
    let b_ty = if b_vec { v4.clone() } else { ty.to_string() };
    let out_ty = if out_vec { v4.clone() } else { ty.to_string() };
    let mut buffers: Vec<(&str, String, bool)> = vec![("a", wgsl::stored(&a_ty, ha), true), ("b", wgsl::stored(&b_ty, hb), true)];
    let mut bindings = vec![Binding::Input(0), Binding::Input(1)];
    if epi.bias.is_some() {
        buffers.push(("c", wgsl::stored(ty, hc), true));
        bindings.push(Binding::Input(2));
    }
    if epi.residual {
        buffers.push(("res", wgsl::stored(&out_ty, hres), true));
        bindings.push(Binding::Input(3));
    }
    buffers.push(("out", wgsl::stored(&out_ty, hout), false));
    bindings.push(Binding::Output(0));
    let decl: Vec<(&str, &str, bool)> = buffers.iter().map(|(nm, t, r)| (*nm, t.as_str(), *r)).collect();

    let mut s = wgsl::declare(&decl);
    if epi.activation.is_some() && ty == "f32" {
        s += &crate::elementwise::activation_wgsl(epi.activation);
    }
    s += &wgsl::offset_fn("a_batch", &p.batch, &p.a_batch_strides);
    s += &wgsl::offset_fn("b_batch", &p.batch, &p.b_batch_strides);
    let _ = writeln!(s, "\n@compute @workgroup_size({wx}, {wy}, 1)");
    s += "fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n";
    let _ = writeln!(s, "    let col = gid.x * 4u;\n    let row = gid.y * {tm}u;\n    let bz = gid.z;");
    let _ = writeln!(s, "    if (col >= {n}u || row >= {m}u || bz >= {batch}u) {{ return; }}");
    s += "    let oa = a_batch(bz);\n    let ob = b_batch(bz);\n";
    let (last_row, last_col) = (m.saturating_sub(1), n.saturating_sub(1));
    for r in 0..tm {
        // Rows past the end read the last row (barrier-free clamping); they are not stored.
        let base = format!("oa + min(row + {r}u, {last_row}u) * {}u", p.a.rs);
        if a_vec {
            let _ = writeln!(s, "    let ar{r} = ({base}) / 4u;");
        } else {
            let _ = writeln!(s, "    let ar{r} = {base};");
        }
        let _ = writeln!(s, "    var acc{r} = {v4}();");
    }
    if b_vec {
        let _ = writeln!(s, "    let bc = ob / 4u + gid.x;");
    } else {
        for c in 0..4 {
            let _ = writeln!(s, "    let bc{c} = ob + min(col + {c}u, {last_col}u) * {}u;", p.b.cs);
        }
    }
    let load_b = |kk: &str| -> String {
        if b_vec {
            wgsl::load(&format!("b[bc + ({kk}) * {}u]", p.b.rs / 4), &v4, hb)
        } else {
            let rs = p.b.rs;
            let lanes: Vec<String> = (0..4).map(|c| wgsl::load(&format!("b[bc{c} + ({kk}) * {rs}u]"), ty, hb)).collect();
            format!("{v4}({})", lanes.join(", "))
        }
    };
    if a_vec {
        let _ = writeln!(s, "    for (var k = 0u; k < {k}u; k = k + 4u) {{");
        for q in 0..4 {
            let _ = writeln!(s, "        let b{q} = {};", load_b(&format!("k + {q}u")));
        }
        for r in 0..tm {
            let _ = writeln!(s, "        let a{r} = {};", wgsl::load(&format!("a[ar{r} + k / 4u]"), &v4, ha));
            let _ = writeln!(s, "        acc{r} = acc{r} + a{r}.x * b0 + a{r}.y * b1 + a{r}.z * b2 + a{r}.w * b3;");
        }
    } else {
        let _ = writeln!(s, "    for (var k = 0u; k < {k}u; k = k + 1u) {{");
        let _ = writeln!(s, "        let b0 = {};", load_b("k"));
        for r in 0..tm {
            let _ = writeln!(s, "        acc{r} = acc{r} + {} * b0;", wgsl::load(&format!("a[ar{r} + k * {}u]", p.a.cs), ty, ha));
        }
    }
    s += "    }\n";
    let ob = format!("bz * {}u", m * n);
    for r in 0..tm {
        let mut v = format!("acc{r}");
        if epi.alpha != 1.0 {
            v = format!("{} * {v}", lit(epi.alpha));
        }
        if let Some((crs, ccs)) = epi.bias {
            let ci = format!("min(row + {r}u, {last_row}u) * {crs}u");
            let cols: Vec<String> = (0..4).map(|c| wgsl::load(&format!("c[{ci} + min(col + {c}u, {last_col}u) * {ccs}u]"), ty, hc)).collect();
            let cv = format!("{v4}({})", cols.join(", "));
            v = if epi.beta == 1.0 { format!("{v} + {cv}") } else { format!("{v} + {} * {cv}", lit(epi.beta)) };
        }
        if epi.residual {
            let ri = format!("{ob} + min(row + {r}u, {last_row}u) * {n}u");
            v = if out_vec {
                format!("{v} + {}", wgsl::load(&format!("res[({ri}) / 4u + gid.x]"), &v4, hres))
            } else {
                let cols: Vec<String> = (0..4).map(|c| wgsl::load(&format!("res[{ri} + min(col + {c}u, {last_col}u)]"), ty, hres)).collect();
                format!("{v} + {v4}({})", cols.join(", "))
            };
        }
        if epi.activation.is_some() && ty == "f32" {
            v = format!("kiln_act4({v})");
        }
        let _ = writeln!(s, "    let v{r} = {v};");
        if out_vec {
            let _ = writeln!(s, "    if (row + {r}u < {m}u) {{ out[({ob} + (row + {r}u) * {n}u) / 4u + gid.x] = {}; }}", wgsl::store(&format!("v{r}"), &v4, hout));
        } else {
            for (c, lane) in ["x", "y", "z", "w"].iter().enumerate() {
                let _ = writeln!(
                    s,
                    "    if (row + {r}u < {m}u && col + {c}u < {n}u) {{ out[{ob} + (row + {r}u) * {n}u + col + {c}u] = {}; }}",
                    wgsl::store(&format!("v{r}.{lane}"), ty, hout)
                );
            }
        }
    }
    s += "}\n";
    Ok(WgslProgram::single(Dispatch {
        label: label.to_string(),
        source: wgsl::with_halves(s, halves.any()),
        entry_point: "main".into(),
        workgroups: [groups[0] as u32, groups[1] as u32, groups[2] as u32],
        bindings,
    }))
}
