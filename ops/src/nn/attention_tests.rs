//! Attention tests: the CPU kernel against a naive f64 reference (3-D and 4-D inputs,
//! grouped-query heads, past keys, masks, causal and window masking, nonpad lengths,
//! softcap, every qk_matmul_output mode), WGSL validation and shape errors.
use crate::testing::{assert_close, as_inputs, make, rand_f32, run, tune};
use kiln_graph::{Attr, Tensor};

#[derive(Clone, Default)]
struct Case {
    q: Vec<usize>,
    k: Vec<usize>,
    v: Vec<usize>,
    heads: Option<(i64, i64)>,
    mask: Option<Tensor>,
    past: Option<usize>,
    nonpad: Option<Vec<i64>>,
    causal: bool,
    scale: Option<f32>,
    softcap: f32,
    mode: i64,
    window: (i64, i64),
}

/// Naive attention in f64: returns (Y, present_key, present_value, qk_matmul_output).
fn reference(c: &Case, q: &Tensor, k: &Tensor, v: &Tensor, pk: Option<&Tensor>, pv: Option<&Tensor>) -> [Vec<f64>; 4] {
    let three = c.q.len() == 3;
    let (hq, hkv) = if three { (c.heads.unwrap().0 as usize, c.heads.unwrap().1 as usize) } else { (c.q[1], c.k[1]) };
    let b_n = c.q[0];
    let (sq, skv) = if three { (c.q[1], c.k[1]) } else { (c.q[2], c.k[2]) };
    let (d, dv) = if three { (c.q[2] / hq, c.v[2] / hkv) } else { (c.q[3], c.v[3]) };
    let p = c.past.unwrap_or(0);
    let t = p + skv;
    let (qv, kv, vv) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let at = |x: &[f64], dims: &[usize], b: usize, h: usize, s: usize, e: usize, hs: usize| {
        if three {
            x[(b * dims[1] + s) * dims[2] + h * hs + e]
        } else {
            x[((b * dims[1] + h) * dims[2] + s) * dims[3] + e]
        }
    };
    let key = |b: usize, h: usize, j: usize, e: usize| {
        if j < p {
            pk.unwrap().to_f64_vec()[((b * hkv + h) * p + j) * d + e]
        } else {
            at(&kv, &c.k, b, h, j - p, e, d)
        }
    };
    let val = |b: usize, h: usize, j: usize, e: usize| {
        if j < p {
            pv.unwrap().to_f64_vec()[((b * hkv + h) * p + j) * dv + e]
        } else {
            at(&vv, &c.v, b, h, j - p, e, dv)
        }
    };
    let scale = c.scale.map(|s| s as f64).unwrap_or(1.0 / (d as f64).sqrt());
    let mask = c.mask.as_ref().map(|m| (m.dims().to_vec(), m.to_f64_vec(), m.dtype() == kiln_graph::DType::Bool));
    let mut y = vec![0.0; b_n * hq * sq * dv];
    let mut qk = vec![0.0; b_n * hq * sq * t];
    for b in 0..b_n {
        for h in 0..hq {
            let hk = h / (hq / hkv);
            for i in 0..sq {
                let mut s = vec![0.0; t];
                let mut allowed = vec![true; t];
                for j in 0..t {
                    let raw = (0..d).map(|e| at(&qv, &c.q, b, h, i, e, d) * key(b, hk, j, e)).sum::<f64>() * scale;
                    let capped = if c.softcap > 0.0 { c.softcap as f64 * (raw / c.softcap as f64).tanh() } else { raw };
                    let mut bias = 0.0;
                    if let Some((md, mv, is_bool)) = &mask {
                        let mut full = vec![1usize; 4 - md.len()];
                        full.extend_from_slice(md);
                        if j >= full[3] {
                            allowed[j] = false;
                        } else {
                            let idx = [b, h, i, j].iter().zip(&full).fold(0, |acc, (&ix, &n)| acc * n + if n == 1 { 0 } else { ix });
                            if *is_bool {
                                allowed[j] &= mv[idx] != 0.0;
                            } else if mv[idx] == f64::NEG_INFINITY {
                                allowed[j] = false;
                            } else {
                                bias = mv[idx];
                            }
                        }
                    }
                    let offset = match &c.nonpad {
                        Some(np) => np[b] - sq as i64,
                        None => p as i64,
                    };
                    let pos = i as i64 + offset;
                    let jj = j as i64;
                    if (c.causal && jj > pos) || (c.window.0 >= 0 && pos - jj > c.window.0) || (c.window.1 >= 0 && jj - pos > c.window.1) {
                        allowed[j] = false;
                    }
                    if c.nonpad.as_ref().is_some_and(|np| jj >= np[b]) {
                        allowed[j] = false;
                    }
                    s[j] = capped + bias;
                    let row = ((b * hq + h) * sq + i) * t;
                    qk[row + j] = match c.mode {
                        0 => raw,
                        1 => capped,
                        _ => if allowed[j] { capped + bias } else { f64::NEG_INFINITY },
                    };
                }
                let m = (0..t).filter(|&j| allowed[j]).map(|j| s[j]).fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = (0..t).filter(|&j| allowed[j]).map(|j| (s[j] - m).exp()).sum();
                let probs: Vec<f64> = (0..t).map(|j| if allowed[j] { (s[j] - m).exp() / sum } else { 0.0 }).collect();
                let row = ((b * hq + h) * sq + i) * t;
                if c.mode == 3 {
                    qk[row..row + t].copy_from_slice(&probs);
                }
                for e in 0..dv {
                    let o = (0..t).map(|j| probs[j] * val(b, hk, j, e)).sum::<f64>();
                    let yi = if three { (b * sq + i) * hq * dv + h * dv + e } else { ((b * hq + h) * sq + i) * dv + e };
                    y[yi] = o;
                }
            }
        }
    }
    let mut pres_k = vec![];
    let mut pres_v = vec![];
    for b in 0..b_n {
        for h in 0..hkv {
            for j in 0..t {
                pres_k.extend((0..d).map(|e| key(b, h, j, e)));
                pres_v.extend((0..dv).map(|e| val(b, h, j, e)));
            }
        }
    }
    [y, pres_k, pres_v, qk]
}

fn check(c: &Case) {
    let q = rand_f32(&c.q, 1);
    let k = rand_f32(&c.k, 2);
    let v = rand_f32(&c.v, 3);
    let (hkv, d, dv, b) = if c.q.len() == 3 {
        let (_, hkv) = c.heads.unwrap();
        (hkv as usize, c.k[2] / hkv as usize, c.v[2] / hkv as usize, c.q[0])
    } else {
        (c.k[1], c.k[3], c.v[3], c.q[0])
    };
    let pk = c.past.map(|p| rand_f32(&[b, hkv, p, d], 4));
    let pv = c.past.map(|p| rand_f32(&[b, hkv, p, dv], 5));
    let nonpad = c.nonpad.as_ref().map(|n| Tensor::from_slice(&[n.len()], n).unwrap());
    let mut attrs = vec![("is_causal", Attr::Int(c.causal as i64)), ("softcap", Attr::Float(c.softcap)), ("qk_matmul_output_mode", Attr::Int(c.mode))];
    if let Some((hq, hkv)) = c.heads {
        attrs.push(("q_num_heads", Attr::Int(hq)));
        attrs.push(("kv_num_heads", Attr::Int(hkv)));
    }
    if let Some(s) = c.scale {
        attrs.push(("scale", Attr::Float(s)));
    }
    if c.window.0 >= 0 || c.window.1 >= 0 {
        attrs.push(("left_window_size", Attr::Int(c.window.0)));
        attrs.push(("right_window_size", Attr::Int(c.window.1)));
    }
    let op = make("Attention", 19, &attrs, 7, 4).unwrap();
    let inputs = [Some(&q), Some(&k), Some(&v), c.mask.as_ref(), pk.as_ref(), pv.as_ref(), nonpad.as_ref()];
    let got = run(op.as_ref(), &as_inputs(&inputs, &[]), &[tune(&[("workgroup", 32)])]).unwrap();
    let want = reference(c, &q, &k, &v, pk.as_ref(), pv.as_ref());
    for (o, name) in ["Y", "present_key", "present_value", "qk_matmul_output"].iter().enumerate() {
        assert_close(&got[o], &want[o], 1e-5, name);
    }
}

fn case4(q: [usize; 4], k: [usize; 4], dv: usize) -> Case {
    Case { q: q.to_vec(), k: k.to_vec(), v: vec![k[0], k[1], k[2], dv], window: (-1, -1), ..Default::default() }
}

#[test]
fn four_d_variants_match_the_reference() {
    check(&case4([2, 3, 4, 8], [2, 3, 6, 8], 8));
    check(&Case { causal: true, scale: Some(0.3), ..case4([1, 6, 5, 7], [1, 2, 9, 7], 5) });
    check(&Case { softcap: 0.7, mode: 1, ..case4([2, 2, 3, 4], [2, 1, 5, 4], 3) });
    check(&Case { softcap: 0.7, mode: 0, ..case4([2, 2, 3, 4], [2, 1, 5, 4], 3) });
    // Past keys, a float mask shorter than the total length, causal: mode 2 and 3.
    let mask = rand_f32(&[2, 1, 3, 7], 9);
    for mode in [2, 3] {
        check(&Case { past: Some(4), mask: Some(mask.clone()), causal: true, mode, ..case4([2, 2, 3, 4], [2, 2, 5, 4], 6) });
    }
    // A bool mask, nonpad lengths (one giving a negative offset) and a window.
    let bools: Vec<bool> = (0..3 * 4 * 6).map(|i| i % 5 != 2).collect();
    let bmask = Tensor::from_bools(&[3, 4, 6], &bools).unwrap();
    check(&Case { mask: Some(bmask), nonpad: Some(vec![6, 2]), causal: true, mode: 3, ..case4([2, 3, 4, 8], [2, 3, 6, 8], 8) });
    check(&Case { window: (1, 2), ..case4([1, 1, 5, 3], [1, 1, 5, 3], 2) });
    check(&Case { window: (2, -1), causal: true, past: Some(3), ..case4([2, 2, 4, 4], [2, 1, 2, 4], 4) });
}

#[test]
fn blocked_f32_path_matches_the_reference_over_several_blocks() {
    // 70 query rows: blocks of 32 split across (batch, head) boundaries and threads.
    let mask = rand_f32(&[2, 1, 70, 75], 9);
    check(&Case { mask: Some(mask), scale: Some(0.125), ..case4([2, 3, 70, 16], [2, 3, 75, 16], 12) });
    // Grouped heads with a per-head mask and causal masking (the general bias path).
    let mask = rand_f32(&[4, 40, 40], 8);
    check(&Case { mask: Some(mask), causal: true, ..case4([1, 4, 40, 8], [1, 2, 40, 8], 8) });
    // A mask shorter than the keys (the rest masked), and one query row.
    check(&Case { mask: Some(rand_f32(&[33, 20], 3)), ..case4([1, 2, 33, 5], [1, 2, 37, 5], 3) });
    check(&Case { mask: Some(rand_f32(&[1, 50], 4)), ..case4([3, 1, 1, 8], [3, 1, 50, 8], 8) });
}

#[test]
fn three_d_inputs_are_split_into_heads() {
    let base = Case { q: vec![2, 4, 24], k: vec![2, 6, 24], v: vec![2, 6, 30], heads: Some((3, 3)), window: (-1, -1), ..Default::default() };
    check(&base);
    check(&Case { q: vec![2, 4, 72], heads: Some((9, 3)), causal: true, ..base.clone() });
    check(&Case { past: Some(5), mask: Some(rand_f32(&[4, 11], 7)), mode: 2, ..base.clone() });
    check(&Case { q: vec![1, 3, 33], k: vec![1, 129, 11], v: vec![1, 129, 7], heads: Some((3, 1)), softcap: 2.0, ..base });
}

#[test]
fn fully_masked_rows_are_zero() {
    let mask = Tensor::from_bools(&[2, 2], &[false, false, true, true]).unwrap();
    let q = rand_f32(&[1, 2, 2, 8], 1);
    let k = rand_f32(&[1, 2, 2, 8], 2);
    let v = rand_f32(&[1, 2, 2, 8], 3);
    let op = make("Attention", 19, &[("qk_matmul_output_mode", Attr::Int(3))], 4, 4).unwrap();
    let got = run(op.as_ref(), &as_inputs(&[Some(&q), Some(&k), Some(&v), Some(&mask)], &[]), &[]).unwrap();
    let y = got[0].to_f64_vec();
    assert!(y[..8].iter().all(|&x| x == 0.0) && y[8..16].iter().any(|&x| x != 0.0), "{y:?}");
    assert!(got[3].to_f64_vec()[..2].iter().all(|&x| x == 0.0));
}

#[test]
fn long_rows_use_lanes_in_wgsl() {
    // 30000 keys: three softmax passes need a workgroup of lanes per row.
    check(&Case { mode: 3, ..case4([1, 1, 2, 2], [1, 1, 30000, 2], 1) });
}

#[test]
fn bad_shapes_are_errors_that_say_what_was_expected() {
    let err = |attrs: &[(&str, Attr)], shapes: &[&[usize]]| {
        let op = make("Attention", 19, attrs, shapes.len(), 1).unwrap();
        let ts: Vec<Tensor> = shapes.iter().map(|s| rand_f32(s, 1)).collect();
        let ins: Vec<Option<&Tensor>> = ts.iter().map(Some).collect();
        run(op.as_ref(), &as_inputs(&ins, &[]), &[]).unwrap_err().to_string()
    };
    let heads = [("q_num_heads", Attr::Int(3)), ("kv_num_heads", Attr::Int(3))];
    assert!(err(&[], &[&[2, 4, 24], &[2, 6, 24], &[2, 6, 24]]).contains("q_num_heads"));
    assert!(err(&heads, &[&[2, 4, 25], &[2, 6, 24], &[2, 6, 24]]).contains("not a multiple"));
    assert!(err(&[], &[&[2, 3, 4, 8], &[2, 3, 6, 7], &[2, 3, 6, 8]]).contains("head size"));
    assert!(err(&[], &[&[2, 4, 4, 8], &[2, 3, 6, 8], &[2, 3, 6, 8]]).contains("grouped"));
    assert!(err(&[], &[&[2, 3, 4, 8], &[2, 3, 6, 8], &[2, 3, 6, 8], &[2, 4, 6]]).contains("broadcast"));
    assert!(err(&[], &[&[2, 3, 4, 8], &[2, 3, 6, 8], &[2, 3, 6, 8], &[4, 7]]).contains("exceeds"));
    assert!(make("Attention", 19, &[("qk_matmul_output_mode", Attr::Int(5))], 3, 1).unwrap_err().to_string().contains("qk_matmul_output_mode"));
}
