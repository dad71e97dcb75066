//! Architecture invariant: the modules of kiln-runtime import each other one way only.
//! Reads the sources: every `crate::NAME` path (names re-exported by lib.rs resolved to
//! the module they come from) is an edge between top-level modules (a file or folder
//! of src/); the graph must have no cycle.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Identifiers following `crate::` in a source text, including each name inside a
/// `crate::{a, b::c}` group.
fn crate_paths(src: &str) -> Vec<String> {
    let code: String = src.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut out = vec![];
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            out.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    out
}

#[test]
fn runtime_modules_form_no_cycle() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    // Modules, and the names lib.rs re-exports from each.
    let mut modules = BTreeSet::new();
    let mut reexport: BTreeMap<String, String> = BTreeMap::new();
    for line in lib.lines().map(str::trim) {
        let line = line.trim_start_matches("pub ").trim_start_matches("pub(crate) ");
        if let Some(m) = line.strip_prefix("mod ") {
            modules.insert(m.trim_end_matches(';').to_string());
        } else if let Some(u) = line.strip_prefix("use ") {
            let (m, names) = u.split_once("::").unwrap_or((u, ""));
            for n in names.trim_end_matches(';').trim_matches(|c| c == '{' || c == '}').split(',') {
                let n = n.trim().rsplit("::").next().unwrap_or("").split(" as ").last().unwrap_or("").trim().to_string();
                if !n.is_empty() {
                    reexport.insert(n, m.to_string());
                }
            }
        }
    }
    let mut files = vec![];
    rust_files(&src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if first == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for name in crate_paths(&text) {
            let target = if modules.contains(&name) { Some(name) } else { reexport.get(&name).cloned() };
            if let Some(t) = target.filter(|t| *t != first && modules.contains(t)) {
                edges.entry(first.clone()).or_default().insert(t);
            }
        }
    }
    // Depth-first search for a back edge.
    fn visit(m: &str, edges: &BTreeMap<String, BTreeSet<String>>, state: &mut BTreeMap<String, u8>, path: &mut Vec<String>) -> Option<Vec<String>> {
        match state.get(m) {
            Some(1) => {
                let start = path.iter().position(|p| p == m).unwrap();
                let mut cycle = path[start..].to_vec();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            Some(_) => return None,
            None => {}
        }
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for t in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(t, edges, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in &modules {
        if let Some(cycle) = visit(m, &edges, &mut state, &mut vec![]) {
            panic!("runtime modules import each other: {}\nall edges: {edges:?}", cycle.join(" -> "));
        }
    }
    assert!(edges.values().map(|e| e.len()).sum::<usize>() > 3, "the scan found too few imports: {edges:?}");
}
