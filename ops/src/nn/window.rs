//! Sliding-window geometry shared by Conv, ConvTranspose and the pooling ops: the
//! `kernel_shape`, `strides`, `dilations`, `pads` and `auto_pad` attributes, and the
//! output-size rules (including pooling's `ceil_mode`). Geometry is always resolved to
//! three spatial dims (D, H, W): 1-D and 2-D windows get leading dims of size 1, so
//! kernels have one code path.
use crate::{NodeSpec, OpError, Result};

/// The `auto_pad` attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AutoPad {
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

impl AutoPad {
    pub(crate) fn parse(spec: &NodeSpec) -> Result<AutoPad> {
        Ok(match spec.string("auto_pad", "NOTSET")?.as_str() {
            "NOTSET" | "" => AutoPad::NotSet,
            "SAME_UPPER" => AutoPad::SameUpper,
            "SAME_LOWER" => AutoPad::SameLower,
            "VALID" => AutoPad::Valid,
            other => {
                return Err(spec.bad("auto_pad", format!("expected NOTSET, SAME_UPPER, SAME_LOWER or VALID, found '{other}'")))
            }
        })
    }
}

/// Window attributes as written in the node (lengths checked against the input rank
/// when resolved).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WindowAttrs {
    pub kernel: Option<Vec<usize>>,
    pub strides: Option<Vec<usize>>,
    pub dilations: Option<Vec<usize>>,
    /// `[begin_0, begin_1, .., end_0, end_1, ..]`.
    pub pads: Option<Vec<i64>>,
    pub auto_pad: AutoPad,
}

fn positive(spec: &NodeSpec, name: &str) -> Result<Option<Vec<usize>>> {
    match spec.ints_opt(name)? {
        None => Ok(None),
        Some(v) => {
            if let Some(bad) = v.iter().find(|&&x| x < 1) {
                return Err(spec.bad(name, format!("values must be >= 1, found {bad}")));
            }
            Ok(Some(v.into_iter().map(|x| x as usize).collect()))
        }
    }
}

impl WindowAttrs {
    pub(crate) fn parse(spec: &NodeSpec) -> Result<WindowAttrs> {
        let pads = spec.ints_opt("pads")?;
        if let Some(p) = &pads {
            if p.len() % 2 != 0 {
                return Err(spec.bad("pads", format!("expected an even number of values, found {}", p.len())));
            }
        }
        Ok(WindowAttrs {
            kernel: positive(spec, "kernel_shape")?,
            strides: positive(spec, "strides")?,
            dilations: positive(spec, "dilations")?,
            pads,
            auto_pad: AutoPad::parse(spec)?,
        })
    }

    /// Per-dim values of an attribute list, checked to have `n` entries.
    fn per_dim<T: Copy>(name: &str, v: &Option<Vec<T>>, n: usize, default: T) -> Result<Vec<T>> {
        match v {
            None => Ok(vec![default; n]),
            Some(v) if v.len() == n => Ok(v.clone()),
            Some(v) => Err(OpError::Attr {
                attr: name.into(),
                what: format!("expected {n} values (one per spatial dim), found {}", v.len()),
            }),
        }
    }

    pub(crate) fn strides(&self, n: usize) -> Result<Vec<usize>> {
        Self::per_dim("strides", &self.strides, n, 1)
    }

    pub(crate) fn dilations(&self, n: usize) -> Result<Vec<usize>> {
        Self::per_dim("dilations", &self.dilations, n, 1)
    }

    pub(crate) fn kernel(&self, n: usize, from_weights: Option<&[usize]>) -> Result<Vec<usize>> {
        match (&self.kernel, from_weights) {
            (Some(k), Some(w)) if k.as_slice() != w => Err(OpError::Attr {
                attr: "kernel_shape".into(),
                what: format!("{k:?} differs from the weights' spatial dims {w:?}"),
            }),
            (None, Some(w)) => Ok(w.to_vec()),
            (None, None) => Err(OpError::Attr { attr: "kernel_shape".into(), what: "is required".into() }),
            (k, _) => Self::per_dim("kernel_shape", k, n, 1),
        }
    }

    /// Explicit pads as (begin, end) per dim; zeros when absent.
    pub(crate) fn explicit_pads(&self, n: usize) -> Result<(Vec<i64>, Vec<i64>)> {
        let p = Self::per_dim("pads", &self.pads, 2 * n, 0)?;
        Ok((p[..n].to_vec(), p[n..].to_vec()))
    }

    /// Resolves the window for a forward sliding window (Conv and pools) over the input
    /// spatial dims `input`. `ceil_mode` is pooling's output rounding.
    pub(crate) fn resolve(&self, input: &[usize], kernel: &[usize], ceil_mode: bool) -> Result<Geometry> {
        let n = input.len();
        if n == 0 || n > 3 {
            return Err(OpError::Unsupported(format!("{n} spatial dims (1 to 3 are supported)")));
        }
        let strides = self.strides(n)?;
        let dilations = self.dilations(n)?;
        let (mut begin, mut end) = self.explicit_pads(n)?;
        let mut output = vec![0usize; n];
        for d in 0..n {
            let span = ((kernel[d] - 1) * dilations[d] + 1) as i64;
            let (inp, s) = (input[d] as i64, strides[d] as i64);
            match self.auto_pad {
                AutoPad::SameUpper | AutoPad::SameLower => {
                    let out = (inp + s - 1) / s;
                    let total = ((out - 1) * s + span - inp).max(0);
                    let small = total / 2;
                    (begin[d], end[d]) =
                        if self.auto_pad == AutoPad::SameUpper { (small, total - small) } else { (total - small, small) };
                    output[d] = out as usize;
                    continue;
                }
                AutoPad::Valid => (begin[d], end[d]) = (0, 0),
                AutoPad::NotSet => {}
            }
            if begin[d] < 0 || end[d] < 0 {
                return Err(OpError::Attr { attr: "pads".into(), what: "negative pads are not supported".into() });
            }
            let room = inp + begin[d] + end[d] - span;
            if room < 0 {
                return Err(OpError::invalid(format!(
                    "spatial dim {d}: the window ({span} with dilation) is larger than the padded input ({})",
                    inp + begin[d] + end[d]
                )));
            }
            let mut out = if ceil_mode { (room + s - 1) / s + 1 } else { room / s + 1 };
            // The last window must start inside the input or its leading padding.
            if ceil_mode && (out - 1) * s >= inp + begin[d] {
                out -= 1;
            }
            output[d] = out as usize;
        }
        Ok(Geometry::new(input, &output, kernel, &strides, &dilations, &begin, &end))
    }
}

/// A resolved window over three spatial dims (D, H, W).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Number of real spatial dims (1..=3).
    pub rank: usize,
    pub input: [usize; 3],
    pub output: [usize; 3],
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub dilation: [usize; 3],
    pub pad_begin: [i64; 3],
    pub pad_end: [i64; 3],
}

impl Geometry {
    pub(crate) fn new(
        input: &[usize],
        output: &[usize],
        kernel: &[usize],
        stride: &[usize],
        dilation: &[usize],
        pad_begin: &[i64],
        pad_end: &[i64],
    ) -> Geometry {
        let n = input.len();
        let lead = 3 - n;
        let mut g = Geometry {
            rank: n,
            input: [1; 3],
            output: [1; 3],
            kernel: [1; 3],
            stride: [1; 3],
            dilation: [1; 3],
            pad_begin: [0; 3],
            pad_end: [0; 3],
        };
        for d in 0..n {
            g.input[lead + d] = input[d];
            g.output[lead + d] = output[d];
            g.kernel[lead + d] = kernel[d];
            g.stride[lead + d] = stride[d];
            g.dilation[lead + d] = dilation[d];
            g.pad_begin[lead + d] = pad_begin[d];
            g.pad_end[lead + d] = pad_end[d];
        }
        g
    }

    /// The real output spatial dims.
    pub(crate) fn output_dims(&self) -> Vec<usize> {
        self.output[3 - self.rank..].to_vec()
    }

    pub(crate) fn input_size(&self) -> usize {
        self.input.iter().product()
    }

    pub(crate) fn output_size(&self) -> usize {
        self.output.iter().product()
    }

    pub(crate) fn kernel_size(&self) -> usize {
        self.kernel.iter().product()
    }

    /// WGSL constant declarations of the geometry: input `ID IH IW`, output `OD OH OW`,
    /// kernel `KD KH KW`, strides `SD SH SW`, dilations `DD DH DW` (u32) and leading pads
    /// `PD PH PW` (i32).
    pub(crate) fn wgsl_consts(&self) -> String {
        let mut s = String::new();
        for (names, v) in [
            (["ID", "IH", "IW"], self.input),
            (["OD", "OH", "OW"], self.output),
            (["KD", "KH", "KW"], self.kernel),
            (["SD", "SH", "SW"], self.stride),
            (["DD", "DH", "DW"], self.dilation),
        ] {
            for d in 0..3 {
                s += &format!("const {}: u32 = {}u;\n", names[d], v[d]);
            }
        }
        for (d, name) in ["PD", "PH", "PW"].iter().enumerate() {
            s += &format!("const {name}: i32 = {};\n", self.pad_begin[d]);
        }
        s
    }

    /// Output positions `o` (in `0..output[d]`) whose tap `k` lands inside the input:
    /// `0 <= o*stride - pad_begin + k*dilation < input`.
    pub(crate) fn valid_outputs(&self, d: usize, k: usize) -> (usize, usize) {
        let off = k as i64 * self.dilation[d] as i64 - self.pad_begin[d];
        let s = self.stride[d] as i64;
        let lo = if off >= 0 { 0 } else { (-off + s - 1) / s };
        let last = self.input[d] as i64 - 1 - off;
        let hi = if last < 0 { 0 } else { (last / s + 1).min(self.output[d] as i64) };
        (lo.min(hi) as usize, hi.max(0) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(kernel: &[usize], strides: &[usize], pads: &[i64], auto_pad: AutoPad) -> WindowAttrs {
        WindowAttrs {
            kernel: Some(kernel.to_vec()),
            strides: Some(strides.to_vec()),
            dilations: None,
            pads: if pads.is_empty() { None } else { Some(pads.to_vec()) },
            auto_pad,
        }
    }

    #[test]
    fn output_sizes_follow_onnx_rules() {
        // test_maxpool_2d_ceil: 4x4, k3, s2, ceil -> 2x2; floor -> 1x1.
        let a = attrs(&[3, 3], &[2, 2], &[], AutoPad::NotSet);
        assert_eq!(a.resolve(&[4, 4], &[3, 3], true).unwrap().output_dims(), vec![2, 2]);
        assert_eq!(a.resolve(&[4, 4], &[3, 3], false).unwrap().output_dims(), vec![1, 1]);
        // SAME_LOWER puts the extra pad first.
        let a = attrs(&[2, 2], &[1, 1], &[], AutoPad::SameLower);
        let g = a.resolve(&[5, 5], &[2, 2], false).unwrap();
        assert_eq!((g.output_dims(), g.pad_begin, g.pad_end), (vec![5, 5], [0, 1, 1], [0, 0, 0]));
        let a = attrs(&[3], &[2], &[], AutoPad::SameUpper);
        let g = a.resolve(&[6], &[3], false).unwrap();
        assert_eq!((g.output_dims(), g.pad_begin[2], g.pad_end[2]), (vec![3], 0, 1));
        // ceil_mode never starts a window in the trailing padding.
        let a = attrs(&[2], &[2], &[1, 1], AutoPad::NotSet);
        assert_eq!(a.resolve(&[4], &[2], true).unwrap().output_dims(), vec![3]);
        assert!(attrs(&[5], &[1], &[], AutoPad::NotSet).resolve(&[3], &[5], false).is_err());
    }

    #[test]
    fn valid_outputs_are_exact() {
        let a = WindowAttrs { dilations: Some(vec![2]), ..attrs(&[3], &[2], &[3, 1], AutoPad::NotSet) };
        let g = a.resolve(&[9], &[3], false).unwrap();
        for k in 0..3 {
            let (lo, hi) = g.valid_outputs(2, k);
            for o in 0..g.output[2] {
                let i = o as i64 * 2 - 3 + k as i64 * 2;
                assert_eq!((0..9).contains(&i), (lo..hi).contains(&o), "k={k} o={o}");
            }
        }
    }
}
