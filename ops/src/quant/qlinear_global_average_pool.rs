//! QLinearGlobalAveragePool (com.microsoft, attribute `channels_last`): the mean of each
//! channel's plane of 8-bit data, requantized. As MLAS computes it: the plane's sum in
//! i32 (wrapping), minus `x_zero_point * image_size`, times `x_scale / (y_scale *
//! image_size)` in f32, rounded half to even, clamped around y's zero point. The same
//! integer path serves QLinearAveragePool when its window covers the whole unpadded
//! image ([`global_average`], [`global_average_wgsl`]).
use super::qlinear::{self, bounds, check_scalar, check_zero_point, QParams, MS_DOMAIN, Q8, SCALE};
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::{self, Binding, Dispatch, WgslKernel, WgslProgram};
use crate::{Arg, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

/// Where the planes of a pooled tensor lie: `batch * channels` planes of `image`
/// elements, channel-major (NCHW) or channel-minor (NHWC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Planes {
    pub batch: usize,
    pub channels: usize,
    pub image: usize,
    pub channels_last: bool,
}

/// Output `p` (plane `n * channels + c`) of the global average goes to index `p`: for
/// NCHW the output is `[N, C, 1...]`, for NHWC `[N, 1..., C]`, both in that order.
pub(super) fn global_average(x: &Tensor, planes: Planes, xq: QParams, yq: QParams, out: &mut Tensor) -> Result<()> {
    let signed = match x.dtype() {
        kiln_graph::DType::U8 => false,
        kiln_graph::DType::I8 => true,
        d => return Err(OpError::Unsupported(format!("quantized data of dtype {d}"))),
    };
    let range = bounds(out.dtype());
    let scale = xq.scale / (yq.scale * planes.image as f32);
    let bias = xq.zp.wrapping_mul(planes.image as i32).wrapping_neg();
    let (image, c) = (planes.image, planes.channels);
    let mut y = vec![bias; planes.batch * c];
    if planes.channels_last {
        // Pixel by pixel: each adds its run of channels (vectorised), in cache order.
        let bytes = x.bytes();
        for (n, sums) in y.chunks_exact_mut(c).enumerate() {
            for px in bytes[n * image * c..(n + 1) * image * c].chunks_exact(c) {
                if signed {
                    sums.iter_mut().zip(px).for_each(|(s, &b)| *s = s.wrapping_add(b as i8 as i32));
                } else {
                    sums.iter_mut().zip(px).for_each(|(s, &b)| *s = s.wrapping_add(b as i32));
                }
            }
        }
        y.iter_mut().for_each(|o| *o = qlinear::requantize(*o as f32 * scale, yq.zp, range));
    } else {
        let v = qlinear::ints(x)?;
        cpu::par_chunks_mut(&mut y, 1, image, |first, part| {
            for (k, o) in part.iter_mut().enumerate() {
                let plane = &v[(first + k) * image..(first + k + 1) * image];
                let sum = plane.iter().fold(*o, |s, &x| s.wrapping_add(x));
                *o = qlinear::requantize(sum as f32 * scale, yq.zp, range);
            }
        });
    }
    qlinear::write_ints(out, &y)
}

/// Lanes of a workgroup that sums one plane.
const LANES: u32 = 64;

/// The WGSL of [`global_average`]: one workgroup per plane, its lanes summing strided
/// parts in i32 (exact in any order), then one lane requantizing. Scales and zero
/// points are inputs 1 to 4.
pub(super) fn global_average_wgsl(label: &str, inputs: &[Option<Arg>], planes: Planes, out: &TensorType) -> Result<WgslProgram> {
    let per_lane = planes.image.div_ceil(LANES as usize);
    if per_lane > wgsl::MAX_LOOP_ITERATIONS {
        return Err(OpError::Unsupported(format!("{label} over planes of {} elements on the GPU (at most {})", planes.image, LANES as usize * wgsl::MAX_LOOP_ITERATIONS)));
    }
    let d = out.dtype;
    let mut p = qlinear::WgslParams::new();
    let (sx, zx) = (p.scale(inputs, 1, "sx")?, p.zero_point(inputs, 2, "zx")?);
    let (sy, zy) = (p.scale(inputs, 3, "sy")?, p.zero_point(inputs, 4, "zy")?);
    let mut decl = vec![("x".to_string(), wgsl::elem(d), true)];
    let mut bindings = vec![Binding::Input(0)];
    for (name, i, ty) in p.buffers {
        decl.push((name, ty, true));
        bindings.push(Binding::Input(i));
    }
    decl.push(("y".into(), wgsl::elem(d), false));
    bindings.push(Binding::Output(0));
    let decl: Vec<(&str, &str, bool)> = decl.iter().map(|(n, t, r)| (n.as_str(), *t, *r)).collect();
    let count = planes.batch * planes.channels;
    let gx = count.clamp(1, wgsl::MAX_GROUPS as usize);
    let gy = count.div_ceil(gx).max(1);
    let (base, step) = if planes.channels_last {
        (format!("(o / {c}u) * {}u + o % {c}u", planes.image * planes.channels, c = planes.channels), planes.channels)
    } else {
        (format!("o * {}u", planes.image), 1)
    };
    let (lo, hi) = bounds(d);
    let image = planes.image;
    let source = format!(
        "{}{}var<workgroup> part: array<i32, {LANES}>;\n\
         @compute @workgroup_size({LANES})\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{\n\
         \x20   let o = wid.x + wid.y * {gx}u;\n    if (o >= {count}u) {{ return; }}\n\
         \x20   let base = {base};\n    var s = 0i;\n\
         \x20   for (var j = lid.x; j < {image}u; j += {LANES}u) {{ s += i32(x[base + j * {step}u]); }}\n\
         \x20   part[lid.x] = s;\n    workgroupBarrier();\n\
         \x20   for (var w = {}u; w > 0u; w = w >> 1u) {{\n\
         \x20       if (lid.x < w) {{ part[lid.x] += part[lid.x + w]; }}\n        workgroupBarrier();\n    }}\n\
         \x20   if (lid.x == 0u) {{\n\
         \x20       let scale = q_div({sx}, {sy} * {});\n\
         \x20       let sum = part[0] - {zx} * {image}i;\n\
         \x20       y[o] = {}(q_requantize(f32(sum) * scale, {zy}, {lo}i, {hi}i));\n    }}\n}}\n",
        wgsl::declare(&decl),
        qlinear::WGSL_REQUANTIZE,
        LANES / 2,
        wgsl::literal("f32", image as f64),
        wgsl::elem(d),
    );
    let dispatch = Dispatch { label: label.into(), source, entry_point: "main".into(), workgroups: [gx as u32, gy as u32, 1], bindings };
    Ok(WgslProgram::single(dispatch))
}

#[derive(Debug)]
pub(super) struct QLinearGlobalAveragePool {
    channels_last: bool,
}

impl QLinearGlobalAveragePool {
    fn planes(&self, x: &[usize]) -> Result<Planes> {
        if x.len() < 3 {
            return Err(OpError::input(0, format!("expected rank 3 or more (N, C and spatial dims), got shape {x:?}")));
        }
        let (channels, spatial) = if self.channels_last { (x[x.len() - 1], &x[1..x.len() - 1]) } else { (x[1], &x[2..]) };
        Ok(Planes { batch: x[0], channels, image: spatial.iter().product(), channels_last: self.channels_last })
    }
}

impl crate::Op for QLinearGlobalAveragePool {
    fn name(&self) -> &str {
        "QLinearGlobalAveragePool"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        let d = expect_dtype(inputs, 0, &Q8)?;
        for (i, zero) in [(1, false), (2, true), (3, false), (4, true)] {
            if zero { check_zero_point(inputs, i, d)? } else { check_scalar(inputs, i, &SCALE, false)? }
        }
        let x = required(inputs, 0)?.dims();
        self.planes(x)?;
        let spatial = if self.channels_last { 1..x.len() - 1 } else { 2..x.len() };
        let dims: Vec<usize> = x.iter().enumerate().map(|(k, &v)| if spatial.contains(&k) { 1 } else { v }).collect();
        Ok(vec![TensorType::new(d, dims)])
    }

    fn overwrites_outputs(&self) -> bool {
        true
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for QLinearGlobalAveragePool {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let x = cpu::input(inputs, 0)?;
        global_average(x, self.planes(x.dims())?, QParams::of(inputs, 1, 2)?, QParams::of(inputs, 3, 4)?, &mut outputs[0])
    }
}

impl WgslKernel for QLinearGlobalAveragePool {
    fn params(&self, _: &[Option<Arg>], _: &[TensorType]) -> Vec<wgsl::TuneParam> {
        vec![]
    }

    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], _tune: &TuneValues) -> Result<WgslProgram> {
        global_average_wgsl("QLinearGlobalAveragePool", inputs, self.planes(required(inputs, 0)?.dims())?, &outputs[0])
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register(MS_DOMAIN, "QLinearGlobalAveragePool", |spec| {
        Ok(Box::new(QLinearGlobalAveragePool { channels_last: spec.int("channels_last", 0)? != 0 }))
    });
}

#[cfg(test)]
mod tests {
    use crate::quant::qlinear::test_util::*;
    use kiln_graph::{Attr, Tensor};

    /// onnxruntime 1.32's outputs for the same inputs.
    #[test]
    fn matches_onnxruntime() {
        let x = u8s(&[2, 3, 4, 5], &[78, 141, 210, 123, 251, 90, 237, 151, 184, 60, 151, 205, 226, 222, 247, 32, 199, 119, 175, 70, 3, 21, 249, 229, 77, 110, 61, 37, 219, 172, 19, 51, 144, 230, 254, 55, 156, 8, 44, 51, 113, 88, 186, 120, 86, 231, 160, 178, 190, 86, 228, 4, 78, 40, 1, 255, 22, 117, 209, 176, 219, 13, 127, 8, 49, 216, 18, 150, 5, 79, 238, 81, 79, 22, 198, 44, 127, 6, 5, 214, 2, 119, 109, 32, 165, 189, 252, 50, 236, 15, 36, 153, 222, 229, 189, 6, 106, 206, 135, 48, 174, 23, 178, 4, 92, 75, 240, 186, 167, 126, 73, 218, 242, 55, 62, 80, 122, 66, 103, 250]);
        let c = ms("QLinearGlobalAveragePool").input(x).constant(f(0.05)).constant(u8s(&[], &[100])).constant(f(0.02)).constant(u8s(&[], &[20]));
        let y = c.run_cpu().unwrap().remove(0);
        assert_eq!((y.dims(), ints(&y)), (&[2usize, 3, 1, 1][..], vec![166, 44, 91, 7, 82, 87]));
        // Channels last, int8, parameters at run time.
        let x = i8s(&[1, 3, 3, 4], &[-34, 112, 0, -41, 111, -17, 70, -48, 127, 63, 96, -118, -101, -111, 8, -25, 122, -66, -85, 88, -51, 61, -54, 11, -108, 41, 106, 49, 97, 71, 17, 109, -6, -90, 14, 32]);
        let c = ms("QLinearGlobalAveragePool").attr("channels_last", Attr::Int(1)).input(x).input(f(0.1)).input(i8s(&[], &[-7])).input(f(0.013)).input(i8s(&[], &[5]));
        let y = c.run_cpu().unwrap().remove(0);
        assert_eq!((y.dims(), ints(&y)), (&[1usize, 1, 1, 4][..], vec![127, 114, 127, 108]));
    }

    /// Channels-last sums (pixel by pixel) equal channels-first ones (plane by plane) on
    /// the same values, batched, both signs of 8 bits.
    #[test]
    fn channels_last_equals_channels_first() {
        let (n, c, hw) = (2, 5, 7);
        let vals: Vec<i64> = (0..n * c * hw).map(|i| ((i * 97 + 31) % 256) as i64).collect();
        for signed in [false, true] {
            let wrap = |v: i64| if signed { v - 128 } else { v };
            let first: Vec<i64> = vals.iter().map(|&v| wrap(v)).collect();
            let last: Vec<i64> = (0..n * hw * c).map(|i| first[(i / (hw * c)) * c * hw + (i % c) * hw + (i / c) % hw]).collect();
            let t = |dims: &[usize], v: &[i64]| if signed { i8s(dims, &v.iter().map(|&x| x as i8).collect::<Vec<_>>()) } else { u8s(dims, &v.iter().map(|&x| x as u8).collect::<Vec<_>>()) };
            let z = |v: i64| t(&[], &[v]);
            let run = |x: Tensor, cl: i64| ms("QLinearGlobalAveragePool").attr("channels_last", Attr::Int(cl)).input(x).constant(f(0.01)).constant(z(3)).constant(f(0.02)).constant(z(-1 + !signed as i64)).run_cpu().unwrap().remove(0);
            let (a, b) = (run(t(&[n, c, 1, hw], &first), 0), run(t(&[n, 1, hw, c], &last), 1));
            assert_eq!(ints(&a), ints(&b), "signed {signed}");
            assert!(ints(&a).iter().collect::<std::collections::BTreeSet<_>>().len() > 3, "the case has varied outputs: {:?}", ints(&a));
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let c = ms("QLinearGlobalAveragePool").input(u8s(&[2, 3], &[0; 6])).constant(f(0.1)).constant(u8s(&[], &[0])).constant(f(0.1)).constant(u8s(&[], &[0]));
        assert!(c.run_cpu().unwrap_err().to_string().contains("rank 3"));
    }
}
