//! Neural-network ops: convolution (data gradient as ConvTranspose, weight gradient
//! by kiln.ConvWeightGrad), max pooling
//! (kiln.MaxPoolGrad), average pooling, softmax and log-softmax.
//!
//! BatchNormalization in training mode and LayerNormalization are lowered to
//! primitives before differentiation (`lower.rs`), so they need no rule here.
use super::{axis, input, int_attr, ints_attr, unsupported, Rule};
use crate::autodiff::emit::Emit;
use crate::autodiff::Result;
use kiln_graph::{Attr, Node, ValueId};

pub(super) const RULES: &[(&str, Rule)] = &[
    ("Conv", conv),
    ("MaxPool", max_pool),
    ("GlobalAveragePool", global_average_pool),
    ("AveragePool", average_pool),
    ("Softmax", softmax),
    ("LogSoftmax", log_softmax),
];

fn ints(v: &[usize]) -> Attr {
    Attr::Ints(v.iter().map(|&x| x as i64).collect())
}

/// Conv's geometry with every attribute made explicit.
struct ConvGeometry {
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    /// begin pads then end pads, as ONNX.
    pads: Vec<usize>,
    group: usize,
}

fn conv_geometry(e: &Emit, n: &Node) -> Result<ConvGeometry> {
    let w = e.dims(input(n, 1));
    let sp = w.len() - 2;
    let kernel = w[2..].to_vec();
    let get = |name: &str, default: usize, len: usize| -> Vec<usize> {
        ints_attr(n, name).map(|v| v.iter().map(|&x| x as usize).collect()).unwrap_or_else(|| vec![default; len])
    };
    let (strides, dilations) = (get("strides", 1, sp), get("dilations", 1, sp));
    let pads = resolved_pads(n, &e.dims(input(n, 0))[2..], &kernel, &strides, &dilations)?;
    Ok(ConvGeometry { kernel, strides, dilations, pads, group: int_attr(n, "group", 1) as usize })
}

/// The explicit pads (begin then end) of a window op over spatial dims `input`:
/// `pads`, or what `auto_pad` SAME_UPPER / SAME_LOWER / VALID makes of them (the
/// output `ceil(input / stride)` for SAME, the odd pad at the end for UPPER).
fn resolved_pads(n: &Node, input: &[usize], kernel: &[usize], strides: &[usize], dilations: &[usize]) -> Result<Vec<usize>> {
    let sp = input.len();
    let auto_pad = match n.attr("auto_pad") {
        Some(Attr::String(s)) => s.clone(),
        _ => "NOTSET".into(),
    };
    match auto_pad.as_str() {
        "NOTSET" => Ok(ints_attr(n, "pads").map(|v| v.iter().map(|&x| x.max(0) as usize).collect()).unwrap_or_else(|| vec![0; 2 * sp])),
        "VALID" => Ok(vec![0; 2 * sp]),
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut pads = vec![0; 2 * sp];
            for i in 0..sp {
                let out = input[i].div_ceil(strides[i].max(1));
                let span = (kernel[i].max(1) - 1) * dilations[i] + 1;
                let total = ((out.max(1) - 1) * strides[i] + span).saturating_sub(input[i]);
                let small = total / 2;
                (pads[i], pads[i + sp]) = if auto_pad == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
            }
            Ok(pads)
        }
        other => Err(unsupported(n, format!("auto_pad '{other}'"))),
    }
}

fn conv(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let (x, w) = (input(n, 0), input(n, 1));
    let dy = dy[0].unwrap();
    let g = conv_geometry(e, n)?;
    let (xd, dyd) = (e.dims(x), e.dims(dy));
    let sp = xd.len() - 2;
    let dx = if need[0] {
        // ConvTranspose of dY by the same filter, padded out to X's size.
        let out_pad: Vec<usize> = (0..sp)
            .map(|i| {
                let full = (dyd[i + 2] - 1) * g.strides[i] + (g.kernel[i] - 1) * g.dilations[i] + 1;
                (xd[i + 2] + g.pads[i] + g.pads[i + sp]).saturating_sub(full)
            })
            .collect();
        let attrs = [
            ("strides", ints(&g.strides)),
            ("dilations", ints(&g.dilations)),
            ("pads", ints(&g.pads)),
            ("group", Attr::Int(g.group as i64)),
            ("output_padding", ints(&out_pad)),
        ];
        Some(e.op("ConvTranspose", &[dy, w], &attrs)?)
    } else {
        None
    };
    let dw = if need[1] {
        let mut attrs = vec![
            ("kernel_shape", ints(&g.kernel)),
            ("strides", ints(&g.strides)),
            ("dilations", ints(&g.dilations)),
            ("pads", ints(&g.pads)),
            ("group", Attr::Int(g.group as i64)),
        ];
        attrs.retain(|(_, v)| !matches!(v, Attr::Ints(x) if x.is_empty()));
        Some(e.node("kiln", "ConvWeightGrad", &[Some(x), Some(dy)], &attrs, 1)?[0])
    } else {
        None
    };
    let db = if need.get(2).copied().unwrap_or(false) {
        let axes: Vec<usize> = std::iter::once(0).chain(2..xd.len()).collect();
        Some(e.reduce_sum(dy, &axes, false)?)
    } else {
        None
    };
    Ok(vec![dx, dw, db])
}

/// The gradient goes to each window's maximum: kiln.MaxPoolGrad finds it again from X.
fn max_pool(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    // storage_order orders the Indices output only, which has no gradient.
    let attrs: Vec<(&str, Attr)> = n.attrs.iter().filter(|(k, _)| k.as_str() != "storage_order").map(|(k, v)| (k.as_str(), v.clone())).collect();
    let dx = e.node("kiln", "MaxPoolGrad", &[Some(input(n, 0)), dy[0]], &attrs, 1)?[0];
    Ok(vec![Some(dx)])
}

/// Each input element gets the gradients of the windows over it, each divided by its
/// window's divisor: a depthwise ConvTranspose of `dy / divisor` by a kernel of ones.
/// The divisors are AveragePool's own (taps inside X, or inside X and its explicit pads
/// with count_include_pad), known from the shapes; windows that ceil_mode adds hang
/// over the end, where the transposed convolution crops them.
fn average_pool(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let x = input(n, 0);
    let (xd, dtype) = (e.dims(x), e.dtype(x));
    let dy = dy[0].unwrap();
    let dyd = e.dims(dy);
    let sp = xd.len() - 2;
    let kernel: Vec<usize> = ints_attr(n, "kernel_shape").unwrap_or_default().iter().map(|&k| k as usize).collect();
    if kernel.len() != sp {
        return Err(unsupported(n, format!("kernel_shape {kernel:?} for {sp} spatial dims")));
    }
    let get = |name: &str, default: usize, len: usize| -> Vec<usize> { ints_attr(n, name).map(|v| v.iter().map(|&x| x as usize).collect()).unwrap_or_else(|| vec![default; len]) };
    let (strides, dilations) = (get("strides", 1, sp), get("dilations", 1, sp));
    let mut pads = resolved_pads(n, &xd[2..], &kernel, &strides, &dilations)?;
    let include_pad = int_attr(n, "count_include_pad", 0) != 0;
    // Per dim and output coordinate: the taps the average counts.
    let counts: Vec<Vec<usize>> = (0..sp)
        .map(|i| {
            let (pb, pe) = (pads[i] as i64, pads[i + sp] as i64);
            let (lo, hi) = if include_pad { (-pb, xd[i + 2] as i64 + pe) } else { (0, xd[i + 2] as i64) };
            (0..dyd[i + 2])
                .map(|o| (0..kernel[i]).filter(|&k| (lo..hi).contains(&((o * strides[i]) as i64 - pb + (k * dilations[i]) as i64))).count())
                .collect()
        })
        .collect();
    let out: Vec<usize> = dyd[2..].to_vec();
    let inv: Vec<f64> = (0..out.iter().product::<usize>())
        .map(|flat| {
            let mut rem = flat;
            let mut count = 1;
            for i in (0..sp).rev() {
                count *= counts[i][rem % out[i]];
                rem /= out[i];
            }
            if count == 0 { 0.0 } else { 1.0 / count as f64 }
        })
        .collect();
    let mut inv_dims = vec![1, 1];
    inv_dims.extend(&out);
    let inv = e.constant(kiln_graph::Tensor::from_f64(dtype, &inv_dims, &inv).map_err(|err| unsupported(n, err.to_string()))?);
    let scaled = e.mul(dy, inv)?;
    let mut wdims = vec![xd[1], 1];
    wdims.extend(&kernel);
    let one = e.scalar(1.0, dtype);
    let w = e.expand(one, &wdims)?;
    // The end pad grows over the windows ceil_mode adds, so that the transposed
    // convolution comes back to X's size.
    let mut out_pad = vec![0; sp];
    for i in 0..sp {
        let full = (dyd[i + 2] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1;
        pads[i + sp] = pads[i + sp].max(full.saturating_sub(xd[i + 2] + pads[i]));
        out_pad[i] = (xd[i + 2] + pads[i] + pads[i + sp]).saturating_sub(full);
    }
    let attrs = [
        ("strides", ints(&strides)),
        ("dilations", ints(&dilations)),
        ("pads", ints(&pads)),
        ("group", Attr::Int(xd[1] as i64)),
        ("output_padding", ints(&out_pad)),
    ];
    Ok(vec![Some(e.op("ConvTranspose", &[scaled, w], &attrs)?)])
}

fn global_average_pool(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    let xd = e.dims(input(n, 0));
    let plane: usize = xd[2..].iter().product();
    let s = e.scale(dy[0].unwrap(), 1.0 / plane as f64)?;
    Ok(vec![Some(e.expand(s, &xd)?)])
}

/// Softmax's and LogSoftmax's output and output gradient, as the axis they normalise
/// over sees them (for opset < 13, which coerces to 2-D, reshaped to 2-D), that axis,
/// and the output's dims.
fn softmax_operands(e: &mut Emit, n: &Node, dy: &[Option<ValueId>]) -> Result<(usize, ValueId, ValueId, Vec<usize>)> {
    let dims = e.dims(n.outputs[0]);
    let r = dims.len();
    let (y, g) = (n.outputs[0], dy[0].unwrap());
    if e.graph.opset() >= 13 {
        return Ok((axis(int_attr(n, "axis", -1), r), y, g, dims));
    }
    let a = axis(int_attr(n, "axis", 1), r);
    let flat = [dims[..a].iter().product(), dims[a..].iter().product()];
    Ok((1, e.reshape(y, &flat)?, e.reshape(g, &flat)?, dims))
}

fn softmax(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    // dx = y (dy - sum(dy y))
    let (ax, y, g, dims) = softmax_operands(e, n, dy)?;
    let p = e.mul(g, y)?;
    let s = e.reduce_sum(p, &[ax], true)?;
    let d = e.sub(g, s)?;
    let dx = e.mul(y, d)?;
    Ok(vec![Some(e.reshape(dx, &dims)?)])
}

fn log_softmax(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], _: &[bool]) -> Result<Vec<Option<ValueId>>> {
    // dx = dy - softmax * sum(dy)
    let (ax, y, g, dims) = softmax_operands(e, n, dy)?;
    let s = e.reduce_sum(g, &[ax], true)?;
    let p = e.op("Exp", &[y], &[])?;
    let ps = e.mul(p, s)?;
    let dx = e.sub(g, ps)?;
    Ok(vec![Some(e.reshape(dx, &dims)?)])
}
