//! The GPU side of a manifest op: the user's WGSL with Kiln's constants appended (the
//! user's line numbers stay as they are), validated by naga, its bindings checked
//! against the manifest.
//!
//! What Kiln appends, for each input and output `v`: `v_rank`, `v_len` (u32) and
//! `v_shape` (`array<u32, 8>`, dims then 1s); for each attribute `a`: `a` (f32 or i32,
//! or an array of them); and `KILN_WORKGROUP`, `KILN_INVOCATIONS`, `KILN_ROW` with
//! `fn kiln_index(gid: vec3<u32>) -> u32`, the invocation's index on Kiln's grid.

use kiln_graph::{Attr, DType};
use std::fmt::Write;

/// Most dims a value of a custom WGSL kernel may have (`v_shape` has this length).
pub const MAX_RANK: usize = 8;

/// One bound value: its name, dtype and dims.
pub struct Value<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub dims: &'a [usize],
}

/// A WGSL f32 literal (finite values only).
fn f32_literal(v: f32) -> Result<String, String> {
    if !v.is_finite() {
        return Err(format!("{v} cannot be a WGSL constant"));
    }
    Ok(format!("{v:?}f"))
}

fn i32_literal(v: i64) -> Result<String, String> {
    let i = i32::try_from(v).map_err(|_| format!("{v} does not fit the i32 a WGSL kernel computes in"))?;
    Ok(if i == i32::MIN { "i32(-2147483648)".into() } else { format!("i32({i})") })
}

/// The WGSL Kiln appends after the user's source.
pub fn prelude(values: &[Value], attrs: &[(&str, &Attr)], workgroup: u32, invocations: u64, row: u64) -> Result<String, String> {
    let mut s = String::from("\n// ---- appended by Kiln: the shapes, attributes and grid of this application ----\n");
    let _ = writeln!(s, "const KILN_WORKGROUP: u32 = {workgroup}u;");
    let _ = writeln!(s, "const KILN_INVOCATIONS: u32 = {invocations}u;");
    let _ = writeln!(s, "const KILN_ROW: u32 = {row}u;");
    s.push_str("fn kiln_index(gid: vec3<u32>) -> u32 { return gid.x + gid.y * KILN_ROW; }\n");
    for v in values {
        if v.dims.len() > MAX_RANK {
            return Err(format!("'{}' has rank {}; a custom WGSL kernel takes values of rank up to {MAX_RANK}", v.name, v.dims.len()));
        }
        let len: usize = v.dims.iter().product();
        if len > u32::MAX as usize || v.dims.iter().any(|&d| d > u32::MAX as usize) {
            return Err(format!("'{}' has {len} elements, more than a u32 index reaches", v.name));
        }
        let dims: Vec<String> = (0..MAX_RANK).map(|i| format!("{}u", v.dims.get(i).copied().unwrap_or(1))).collect();
        let _ = writeln!(s, "const {n}_rank: u32 = {}u;\nconst {n}_len: u32 = {len}u;\nconst {n}_shape = array<u32, {MAX_RANK}>({});", v.dims.len(), dims.join(", "), n = v.name);
    }
    for (name, a) in attrs {
        let line = match a {
            Attr::Int(i) => format!("const {name}: i32 = {};", i32_literal(*i)?),
            Attr::Float(f) => format!("const {name}: f32 = {};", f32_literal(*f)?),
            Attr::Ints(v) if !v.is_empty() => {
                let items = v.iter().map(|&i| i32_literal(i)).collect::<Result<Vec<_>, _>>()?;
                format!("const {name} = array<i32, {}>({});", v.len(), items.join(", "))
            }
            Attr::Floats(v) if !v.is_empty() => {
                let items = v.iter().map(|&f| f32_literal(f)).collect::<Result<Vec<_>, _>>()?;
                format!("const {name} = array<f32, {}>({});", v.len(), items.join(", "))
            }
            // Strings and empty lists have no WGSL constant (the CPU kernel gets them).
            _ => continue,
        };
        s.push_str(&line);
        s.push('\n');
    }
    Ok(s)
}

/// Without naga (kiln-ops built without `wgsl-validation`, as the compiler alone is):
/// nothing is checked here; every build that links the runtime validates.
#[cfg(not(any(test, feature = "wgsl-validation")))]
pub fn check(_source: &str, _user_len: usize, _path: &str, _entry: &str, _values: &[Value], _inputs: usize, _workgroup: u32) -> Result<(), String> {
    Ok(())
}

/// Validates the kernel source (the user's text followed by a prelude) with naga and
/// checks the entry point and the bindings: `values[..inputs]` read-only, the rest
/// read-write, at `@group(0) @binding(0..)` in order, with the elements of their dtypes.
/// Errors point into the user's file, `path`.
#[cfg(any(test, feature = "wgsl-validation"))]
pub fn check(source: &str, user_len: usize, path: &str, entry: &str, values: &[Value], inputs: usize, workgroup: u32) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| located(path, source, user_len, e.location(source), e.message(), &e.emit_to_string_with_path(source, path)))?;
    let span_at = |span: naga::Span, what: String| {
        let l = span.location(source);
        format!("{path}:{}:{}: {what}", l.line_number, l.line_position)
    };
    let expected = || {
        let list: Vec<String> = values.iter().enumerate().map(|(i, v)| format!("@binding({i}) {} ({}, array<{}>)", v.name, if i < inputs { "read" } else { "read_write" }, crate::wgsl::elem(v.dtype))).collect();
        list.join(", ")
    };
    // The entry point.
    let Some(ep) = module.entry_points.iter().find(|e| e.name == entry) else {
        let found: Vec<&str> = module.entry_points.iter().map(|e| e.name.as_str()).collect();
        return Err(format!("{path}: no entry point '{entry}' (found: {})", if found.is_empty() { "none".into() } else { found.join(", ") }));
    };
    if ep.stage != naga::ShaderStage::Compute {
        return Err(format!("{path}: entry point '{entry}' is not a @compute function"));
    }
    let line_of_entry = || {
        let off = source[..user_len].find(&format!("fn {entry}")).unwrap_or(0);
        source[..off].matches('\n').count() + 1
    };
    if ep.workgroup_size != [workgroup, 1, 1] {
        return Err(format!(
            "{path}:{}: entry point '{entry}' has @workgroup_size{:?}; expected ({workgroup}, 1, 1): write @workgroup_size(KILN_WORKGROUP), which Kiln sets from the manifest",
            line_of_entry(),
            ep.workgroup_size
        ));
    }
    // The bindings.
    let mut bound = vec![false; values.len()];
    for (h, var) in module.global_variables.iter() {
        let Some(rb) = &var.binding else { continue };
        let name = var.name.as_deref().unwrap_or("?");
        let span = module.global_variables.get_span(h);
        if rb.group != 0 {
            return Err(span_at(span, format!("'{name}' is in @group({}); Kiln binds every value in @group(0): {}", rb.group, expected())));
        }
        let b = rb.binding as usize;
        let Some(v) = values.get(b) else {
            return Err(span_at(span, format!("@binding({b}) '{name}': the manifest declares {} values, so bindings 0..{} are bound: {}", values.len(), values.len() - 1, expected())));
        };
        let want_rw = b >= inputs;
        let access_ok = match var.space {
            naga::AddressSpace::Storage { access } => access.contains(naga::StorageAccess::STORE) == want_rw,
            _ => false,
        };
        let want_elem = crate::wgsl::elem(v.dtype);
        let elem_ok = match &module.types[var.ty].inner {
            naga::TypeInner::Array { base, size: naga::ArraySize::Dynamic, .. } => match &module.types[*base].inner {
                naga::TypeInner::Scalar(s) => s.width == 4 && scalar_name(s.kind) == Some(want_elem),
                _ => false,
            },
            _ => false,
        };
        if !access_ok || !elem_ok {
            return Err(span_at(
                span,
                format!(
                    "@binding({b}) '{name}' holds {} '{}': expected var<storage, {}> {}: array<{want_elem}> ({} {}, dtype {})",
                    if b < inputs { "input" } else { "output" },
                    v.name,
                    if want_rw { "read_write" } else { "read" },
                    name,
                    if b < inputs { "input" } else { "output" },
                    v.name,
                    v.dtype
                ),
            ));
        }
        if std::mem::replace(&mut bound[b], true) {
            return Err(span_at(span, format!("@binding({b}) is declared twice")));
        }
    }
    if let Some(missing) = bound.iter().position(|b| !b) {
        return Err(format!(
            "{path}: the kernel declares {} of the {} bindings: @binding({missing}) for '{}' is missing (expected {})",
            bound.iter().filter(|b| **b).count(),
            values.len(),
            values[missing].name,
            expected()
        ));
    }
    // Bindings and entry point first (their errors say more), then naga's validation.
    let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty());
    if let Err(e) = validator.validate(&module) {
        let mut msg = e.as_inner().to_string();
        let mut cause = std::error::Error::source(e.as_inner());
        while let Some(c) = cause {
            msg = format!("{msg}: {c}");
            cause = c.source();
        }
        return Err(located(path, source, user_len, e.location(source), &msg, &e.emit_to_string_with_path(source, path)));
    }
    Ok(())
}

#[cfg(any(test, feature = "wgsl-validation"))]
fn scalar_name(kind: naga::ScalarKind) -> Option<&'static str> {
    match kind {
        naga::ScalarKind::Float => Some("f32"),
        naga::ScalarKind::Sint => Some("i32"),
        naga::ScalarKind::Uint => Some("u32"),
        _ => None,
    }
}

/// An error at `loc`: in the user's file when it lies there, else in Kiln's appended
/// constants (quoted, since the user cannot see them).
#[cfg(any(test, feature = "wgsl-validation"))]
fn located(path: &str, source: &str, user_len: usize, loc: Option<naga::SourceLocation>, message: &str, report: &str) -> String {
    // naga's report repeats the message on its first line: keep its excerpt only.
    let report = report.split_once('\n').map_or(report, |(first, rest)| if first.starts_with("error") { rest } else { report }).trim_end();
    match loc {
        Some(l) if (l.offset as usize) < user_len => format!("{path}:{}:{}: {message}\n{report}", l.line_number, l.line_position),
        Some(_) => format!("{path}: {message}, in the constants Kiln appends (a name of the manifest that WGSL does not accept?):\n{}", &source[user_len..]),
        None => format!("{path}: {message}\n{report}"),
    }
}
