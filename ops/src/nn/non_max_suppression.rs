//! NonMaxSuppression (opset 10/11): per batch and class, boxes in order of decreasing
//! score (equal scores: lower box index first; NaN scores last) are selected unless
//! their IoU with a box already selected for that class exceeds `iou_threshold`, up to
//! `max_output_boxes_per_class` (omitted: 0, so nothing is selected); with a
//! `score_threshold`, only boxes scoring strictly above it are candidates. Output:
//! `selected_indices` i64 `[count, 3]` of (batch, class, box), batch-major, then class,
//! then in selection order. `center_point_box` 0: boxes are two corners
//! `[y1, x1, y2, x2]` in either order; 1: `[x_center, y_center, width, height]`.
//!
//! The geometry is computed in f32 in the order onnxruntime computes it (its boundary
//! cases, `IoU == threshold` keeps the box, depend on that), and boxes whose
//! intersection, areas or union are not positive never suppress each other.
//! `iou_threshold` must lie in [0, 1], as onnxruntime requires.
//!
//! Like NonZero, the output shape depends on the input values: inference needs every
//! value (constants, or graph inputs the session binds by value; a known
//! `max_output_boxes_per_class` of 0 or less gives `[0, 3]` without them), and the CPU
//! kernel computes the selection from the values it is given and replaces its output
//! with a tensor of the size it found. There is no GPU kernel.
use crate::cpu::{self, CpuKernel};
use crate::op::{expect_dtype, required};
use crate::wgsl::WgslKernel;
use crate::{Arg, NodeSpec, Op, OpError, Registry, Result, TensorType};
use kiln_graph::{DType, Tensor};

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];
const INTS: &[DType] = &[DType::I64, DType::I32, DType::I16, DType::I8, DType::U64, DType::U32, DType::U16, DType::U8];

#[derive(Debug)]
pub struct NonMaxSuppression {
    /// `[x_center, y_center, width, height]` boxes (else corners).
    center_point_box: bool,
}

/// The scalar inputs, read from their values.
#[derive(Clone, Copy, Debug)]
struct Limits {
    max_per_class: usize,
    iou: f32,
    score: Option<f32>,
}

/// One box's extent and area, as onnxruntime derives them.
#[derive(Clone, Copy, Debug)]
struct Extent {
    x_min: f32,
    x_max: f32,
    y_min: f32,
    y_max: f32,
    area: f32,
}

/// The boxes a class kept so far, a column per coordinate, so that testing a candidate
/// against all of them is one loop the compiler vectorises.
#[derive(Default)]
struct Kept {
    x_min: Vec<f32>,
    x_max: Vec<f32>,
    y_min: Vec<f32>,
    y_max: Vec<f32>,
    area: Vec<f32>,
}

impl Kept {
    fn clear(&mut self) {
        for v in [&mut self.x_min, &mut self.x_max, &mut self.y_min, &mut self.y_max, &mut self.area] {
            v.clear();
        }
    }

    fn len(&self) -> usize {
        self.area.len()
    }

    fn push(&mut self, e: &Extent) {
        self.x_min.push(e.x_min);
        self.x_max.push(e.x_max);
        self.y_min.push(e.y_min);
        self.y_max.push(e.y_max);
        self.area.push(e.area);
    }

    /// Whether any kept box suppresses `e` ([`Extent::overlaps`], lane by lane), 16
    /// kept boxes at a time (compiled for AVX2 where the CPU has it).
    fn suppresses(&self, e: &Extent, threshold: f32) -> bool {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::has_avx2() {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(kept: &Kept, e: &Extent, threshold: f32) -> bool {
                kept.suppresses_body(e, threshold)
            }
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe { avx2(self, e, threshold) };
        }
        self.suppresses_body(e, threshold)
    }

    #[inline(always)]
    fn suppresses_body(&self, e: &Extent, threshold: f32) -> bool {
        const STEP: usize = 16;
        let n = self.len();
        let mut j0 = 0;
        while j0 < n {
            let j1 = (j0 + STEP).min(n);
            let (x0, x1, y0, y1, area) = (&self.x_min[j0..j1], &self.x_max[j0..j1], &self.y_min[j0..j1], &self.y_max[j0..j1], &self.area[j0..j1]);
            let mut hit = false;
            for i in 0..area.len() {
                hit |= e.overlaps(&Extent { x_min: x0[i], x_max: x1[i], y_min: y0[i], y_max: y1[i], area: area[i] }, threshold);
            }
            if hit {
                return true;
            }
            j0 = j1;
        }
        false
    }
}

impl Extent {
    fn of(b: &[f32], center: bool) -> Extent {
        let (x_min, x_max, y_min, y_max) = if center {
            let (hw, hh) = (b[2] / 2.0, b[3] / 2.0);
            (b[0] - hw, b[0] + hw, b[1] - hh, b[1] + hh)
        } else {
            (b[1].min(b[3]), b[1].max(b[3]), b[0].min(b[2]), b[0].max(b[2]))
        };
        Extent { x_min, x_max, y_min, y_max, area: (x_max - x_min) * (y_max - y_min) }
    }

    /// Whether `self` and `other` overlap by more than `threshold` (IoU): no
    /// intersection, an empty one, an empty box or union never do. Written without
    /// branches, so that [`Kept::suppresses`] vectorises.
    #[inline(always)]
    fn overlaps(&self, other: &Extent, threshold: f32) -> bool {
        let (ix_min, ix_max) = (self.x_min.max(other.x_min), self.x_max.min(other.x_max));
        let (iy_min, iy_max) = (self.y_min.max(other.y_min), self.y_max.min(other.y_max));
        let inter = (ix_max - ix_min) * (iy_max - iy_min);
        let union = self.area + other.area - inter;
        (ix_max > ix_min) & (iy_max > iy_min) & (inter > 0.0) & (self.area > 0.0) & (other.area > 0.0) & (union > 0.0) & (inter / union > threshold)
    }
}

/// (batches, classes, boxes) after checking the shapes of boxes and scores.
fn layout(boxes: &[usize], scores: &[usize]) -> Result<(usize, usize, usize)> {
    if boxes.len() != 3 || boxes[2] != 4 {
        return Err(OpError::input(0, format!("NonMaxSuppression's boxes must have shape [batches, boxes, 4], found {boxes:?}")));
    }
    if scores.len() != 3 || scores[0] != boxes[0] || scores[2] != boxes[1] {
        return Err(OpError::input(
            1,
            format!("NonMaxSuppression's scores must have shape [batches = {}, classes, boxes = {}], found {scores:?}", boxes[0], boxes[1]),
        ));
    }
    Ok((boxes[0], scores[1], boxes[1]))
}

/// The one value of scalar input `i` (a 0-d or one-element tensor).
fn scalar(t: &Tensor, i: usize, what: &str) -> Result<f64> {
    if t.len() != 1 {
        return Err(OpError::input(i, format!("NonMaxSuppression's {what} must be a scalar, found shape {:?}", t.dims())));
    }
    Ok(t.to_f64_vec()[0])
}

/// The limits from the values of inputs 2..5 (`None` for omitted ones).
fn limits(max: Option<&Tensor>, iou: Option<&Tensor>, score: Option<&Tensor>) -> Result<Limits> {
    let max_per_class = match max {
        None => 0,
        Some(t) => {
            if t.len() != 1 {
                return Err(OpError::input(2, format!("NonMaxSuppression's max_output_boxes_per_class must be a scalar, found shape {:?}", t.dims())));
            }
            // Unsigned dtypes read as their i64 bit pattern: clamp huge ones, not wrap.
            let v = t.to_i64_vec()?[0];
            if !t.dtype().is_signed() && v < 0 { usize::MAX } else { v.max(0).try_into().unwrap_or(usize::MAX) }
        }
    };
    let iou = match iou {
        None => 0.0,
        Some(t) => scalar(t, 3, "iou_threshold")? as f32,
    };
    if !(0.0..=1.0).contains(&iou) {
        return Err(OpError::input(3, format!("NonMaxSuppression's iou_threshold must be in [0, 1], found {iou}")));
    }
    let score = score.map(|t| scalar(t, 4, "score_threshold").map(|v| v as f32)).transpose()?;
    Ok(Limits { max_per_class, iou, score })
}

/// The selected (batch, class, box) triples, flattened.
fn select(boxes: &Tensor, scores: &Tensor, lim: Limits, center: bool) -> Result<Vec<i64>> {
    let (batches, classes, n) = layout(boxes.dims(), scores.dims())?;
    let mut out = vec![];
    if lim.max_per_class == 0 || n == 0 {
        return Ok(out);
    }
    let to_f32 = |t: &Tensor| -> Vec<f32> {
        match t.as_slice::<f32>() {
            Ok(v) => v.to_vec(),
            Err(_) => t.to_f64_vec().into_iter().map(|v| v as f32).collect(),
        }
    };
    let (bv, sv) = (to_f32(boxes), to_f32(scores));
    let mut order: Vec<usize> = Vec::with_capacity(n);
    let mut kept = Kept::default();
    for b in 0..batches {
        let extents: Vec<Extent> = (0..n).map(|k| Extent::of(&bv[(b * n + k) * 4..][..4], center)).collect();
        for c in 0..classes {
            let s = &sv[(b * classes + c) * n..][..n];
            order.clear();
            order.extend((0..n).filter(|&k| lim.score.is_none_or(|t| s[k] > t)));
            // Decreasing score, NaN last, equal scores by index (a total order: the
            // unstable sort, which needs no buffer, gives the one result).
            order.sort_unstable_by(|&p, &q| {
                let by_score = match (s[p].is_nan(), s[q].is_nan()) {
                    (false, false) => s[q].partial_cmp(&s[p]).unwrap_or(std::cmp::Ordering::Equal),
                    (a, b) => a.cmp(&b),
                };
                by_score.then(p.cmp(&q))
            });
            kept.clear();
            for &k in &order {
                if kept.len() >= lim.max_per_class {
                    break;
                }
                if !kept.suppresses(&extents[k], lim.iou) {
                    kept.push(&extents[k]);
                    out.extend([b as i64, c as i64, k as i64]);
                }
            }
        }
    }
    Ok(out)
}

/// The input types `infer` checks before it needs any value.
fn check_types(inputs: &[Option<Arg>]) -> Result<()> {
    expect_dtype(inputs, 0, FLOATS)?;
    expect_dtype(inputs, 1, FLOATS)?;
    layout(required(inputs, 0)?.dims(), required(inputs, 1)?.dims())?;
    let opt = |i: usize| inputs.get(i).copied().flatten();
    if opt(2).is_some() {
        expect_dtype(inputs, 2, INTS)?;
    }
    for i in [3, 4] {
        if opt(i).is_some() {
            expect_dtype(inputs, i, FLOATS)?;
        }
    }
    Ok(())
}

impl Op for NonMaxSuppression {
    fn name(&self) -> &str {
        "NonMaxSuppression"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        check_types(inputs)?;
        let opt = |i: usize| inputs.get(i).copied().flatten();
        let what = "the value of every input of NonMaxSuppression (its output shape depends on them)";
        let value = |i: usize| -> Result<Option<&Tensor>> {
            match opt(i) {
                None => Ok(None),
                Some(a) => a.value.map(Some).ok_or_else(|| OpError::NeedsValue { index: i, what: what.into() }),
            }
        };
        let lim = limits(value(2)?, value(3)?, value(4)?)?;
        let count = if lim.max_per_class == 0 {
            0
        } else {
            let missing = |i: usize| OpError::input(i, "required input is missing");
            let (b, s) = (value(0)?.ok_or_else(|| missing(0))?, value(1)?.ok_or_else(|| missing(1))?);
            select(b, s, lim, self.center_point_box)?.len() / 3
        };
        Ok(vec![TensorType::new(DType::I64, vec![count, 3])])
    }

    /// The selection itself, once: its length is the output type.
    fn eval_to_infer(&self, inputs: &[Option<Arg>]) -> Option<Result<Vec<Tensor>>> {
        let values: Vec<Option<&Tensor>> = inputs.iter().map(|a| a.and_then(|a| a.value)).collect();
        if inputs.iter().zip(&values).any(|(a, v)| a.is_some() && v.is_none()) {
            return None;
        }
        if let Err(e) = check_types(inputs) {
            return Some(Err(e));
        }
        let mut out = vec![Tensor::zeros(DType::I64, &[0, 3])];
        Some(CpuKernel::run(self, &values, &mut out).map(|()| out))
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        None
    }
}

impl CpuKernel for NonMaxSuppression {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (boxes, scores) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?);
        let opt = |i: usize| inputs.get(i).copied().flatten();
        let lim = limits(opt(2), opt(3), opt(4))?;
        let selected = select(boxes, scores, lim, self.center_point_box)?;
        outputs[0] = Tensor::from_slice(&[selected.len() / 3, 3], &selected)?;
        Ok(())
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "NonMaxSuppression", |spec: &NodeSpec| {
        let center_point_box = match spec.int("center_point_box", 0)? {
            0 => false,
            1 => true,
            v => return Err(spec.bad("center_point_box", format!("must be 0 (corners) or 1 (center and size), found {v}"))),
        };
        Ok(Box::new(NonMaxSuppression { center_point_box }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, Tensor};

    /// 2 batches, 10 boxes on a quarter grid, 3 classes of scores in eighths (many
    /// ties, overlaps and zero scores).
    const BOXES: [f32; 80] = [
        3.75, 2.5, 2.5, 3.5, 2.25, 3.0, 3.25, 0.75, 0.0, 1.0, 1.0, 3.25, 3.5, 0.0, 1.75, 3.25, 0.5, 3.0, 0.25, 1.75, 3.25, 1.0, 1.25, 1.0, 2.75, 1.0,
        3.75, 1.75, 1.75, 2.0, 2.25, 2.0, 2.0, 3.75, 3.0, 3.0, 2.75, 2.25, 1.25, 3.75, 1.75, 0.75, 3.25, 0.5, 3.25, 2.25, 0.25, 0.0, 1.75, 0.0, 0.5, 2.0,
        3.75, 1.75, 3.0, 3.5, 3.25, 2.5, 1.75, 2.0, 1.0, 1.75, 1.5, 0.75, 3.75, 0.0, 0.25, 0.75, 3.75, 2.75, 3.5, 0.75, 2.75, 1.25, 1.75, 0.0, 2.25,
        3.25, 2.5, 0.5,
    ];
    const SCORES: [f32; 60] = [
        0.5, 0.25, 0.875, 0.875, 0.125, 0.5, 0.875, 0.75, 0.625, 0.625, 0.0, 0.625, 0.375, 0.0, 0.125, 0.5, 0.625, 0.5, 0.5, 0.75, 0.625, 0.25, 0.625,
        0.5, 0.0, 0.0, 0.625, 0.375, 0.5, 0.25, 0.125, 0.125, 0.375, 0.75, 0.375, 0.375, 0.5, 0.875, 0.375, 0.5, 0.375, 0.5, 0.375, 0.625, 0.5, 0.625,
        0.875, 0.125, 0.5, 0.375, 0.25, 0.125, 0.0, 0.375, 0.75, 0.0, 0.375, 0.875, 0.875, 0.125,
    ];

    /// Runs the op twice: folded (every value known to inference) and as a kernel at
    /// run time (given an output of the wrong size, which it replaces); both must agree.
    fn nms(center: i64, boxes: &Tensor, scores: &Tensor, max: Option<i64>, iou: Option<f32>, score: Option<f32>) -> crate::Result<Tensor> {
        let mut case = Case::new("NonMaxSuppression").opset(11).attr("center_point_box", Attr::Int(center)).constant(boxes.clone()).constant(scores.clone());
        for t in [max.map(|m| i64s(&[1], &[m])), iou.map(|v| f32s(&[1], &[v])), score.map(|v| f32s(&[], &[v]))] {
            case = match t {
                Some(t) => case.constant(t),
                None => case.omitted(),
            };
        }
        let folded = case.run_cpu().map(|mut o| o.remove(0));
        let op = case.op()?;
        let tensors: Vec<Option<&Tensor>> = case.inputs.iter().map(Input::tensor).collect();
        let mut outs = vec![Tensor::zeros(kiln_graph::DType::I64, &[7, 3])];
        let run_time = op.cpu().unwrap().run(&tensors, &mut outs).map(|_| outs.remove(0));
        match (&folded, &run_time) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "folded and run-time selections differ"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            _ => panic!("folded {folded:?} but at run time {run_time:?}"),
        }
        folded
    }

    /// Expected selections computed by onnxruntime 1.32 on BOXES and SCORES.
    #[test]
    fn selections_match_onnxruntime() {
        let boxes = f32s(&[2, 10, 4], &BOXES);
        let scores = f32s(&[2, 3, 10], &SCORES);
        /// (center_point_box, max per class, IoU threshold, score threshold, selection).
        type Expected = (i64, i64, f32, Option<f32>, &'static [i64]);
        #[rustfmt::skip]
        let cases: [Expected; 5] = [
            (0, 3, 0.3, None, &[0, 0, 2, 0, 0, 3, 0, 0, 6, 0, 1, 9, 0, 1, 1, 0, 1, 6, 0, 2, 0, 0, 2, 2, 0, 2, 6, 1, 0, 7, 1, 0, 3, 1, 0, 6, 1, 1, 6, 1, 1, 3, 1, 1, 5, 1, 2, 7, 1, 2, 8, 1, 2, 4]),
            (0, 100, 0.0, Some(0.25), &[0, 0, 2, 0, 0, 3, 0, 0, 7, 0, 0, 5, 0, 1, 9, 0, 1, 6, 0, 1, 5, 0, 1, 7, 0, 1, 2, 0, 2, 0, 0, 2, 2, 0, 2, 6, 0, 2, 7, 1, 0, 7, 1, 0, 6, 1, 0, 4, 1, 0, 5, 1, 1, 6, 1, 1, 3, 1, 1, 5, 1, 2, 7, 1, 2, 8, 1, 2, 4]),
            (0, 2, 0.6, Some(0.5), &[0, 0, 2, 0, 0, 3, 0, 1, 9, 0, 1, 1, 0, 2, 0, 0, 2, 2, 1, 0, 7, 1, 0, 3, 1, 1, 6, 1, 1, 3, 1, 2, 7, 1, 2, 8]),
            (1, 100, 0.0, Some(0.25), &[0, 0, 2, 0, 0, 3, 0, 0, 8, 0, 1, 9, 0, 1, 2, 0, 2, 0, 0, 2, 2, 1, 0, 7, 1, 0, 6, 1, 0, 2, 1, 0, 5, 1, 0, 8, 1, 1, 6, 1, 1, 5, 1, 1, 1, 1, 1, 4, 1, 1, 8, 1, 1, 0, 1, 2, 7, 1, 2, 8, 1, 2, 6]),
            // IoU threshold 1: nothing is suppressed, the order alone (ties by index).
            (0, 100, 1.0, None, &[0, 0, 2, 0, 0, 3, 0, 0, 6, 0, 0, 7, 0, 0, 8, 0, 0, 9, 0, 0, 0, 0, 0, 5, 0, 0, 1, 0, 0, 4, 0, 1, 9, 0, 1, 1, 0, 1, 6, 0, 1, 5, 0, 1, 7, 0, 1, 8, 0, 1, 2, 0, 1, 4, 0, 1, 0, 0, 1, 3, 0, 2, 0, 0, 2, 2, 0, 2, 6, 0, 2, 3, 0, 2, 8, 0, 2, 7, 0, 2, 1, 0, 2, 9, 0, 2, 4, 0, 2, 5, 1, 0, 7, 1, 0, 3, 1, 0, 6, 1, 0, 9, 1, 0, 2, 1, 0, 4, 1, 0, 5, 1, 0, 8, 1, 0, 0, 1, 0, 1, 1, 1, 6, 1, 1, 3, 1, 1, 5, 1, 1, 1, 1, 1, 4, 1, 1, 8, 1, 1, 0, 1, 1, 2, 1, 1, 9, 1, 1, 7, 1, 2, 7, 1, 2, 8, 1, 2, 4, 1, 2, 3, 1, 2, 6, 1, 2, 0, 1, 2, 1, 1, 2, 9, 1, 2, 2, 1, 2, 5]),
        ];
        for (center, max, iou, score, want) in cases {
            let got = nms(center, &boxes, &scores, Some(max), Some(iou), score).unwrap();
            assert_eq!(got, i64s(&[want.len() / 3, 3], want), "center {center} max {max} iou {iou} score {score:?}");
        }
    }

    #[test]
    fn boundaries_match_onnxruntime() {
        let one = |b: &[f32], s: &[f32]| (f32s(&[1, b.len() / 4, 4], b), f32s(&[1, 1, s.len()], s));
        // IoU exactly 1/3 (in f32) at threshold 1/3 keeps both boxes.
        let (b, s) = one(&[0.0, 0.0, 1.0, 1.0, 0.0, 0.5, 1.0, 1.5], &[0.9, 0.8]);
        assert_eq!(nms(0, &b, &s, Some(3), Some(1.0 / 3.0), None).unwrap().dims(), &[2, 3]);
        // Scores equal to the threshold are dropped; disjoint boxes survive IoU 0;
        // equal scores go by index.
        let (b, s) = one(&[0.0, 0.0, 1.0, 1.0, 0.0, 2.0, 1.0, 3.0, 0.0, 4.0, 1.0, 5.0, 0.0, 6.0, 1.0, 7.0], &[0.5, 0.9, 0.9, 0.7]);
        assert_eq!(nms(0, &b, &s, Some(10), Some(0.0), Some(0.5)).unwrap(), i64s(&[3, 3], &[0, 0, 1, 0, 0, 2, 0, 0, 3]));
        // Zero-area boxes never suppress; flipped corners are normalised.
        let (b, s) = one(&[0.0; 8], &[0.9, 0.8]);
        assert_eq!(nms(0, &b, &s, Some(3), Some(0.0), None).unwrap().dims(), &[2, 3]);
        let (b, s) = one(&[1.0, 1.0, 0.0, 0.0, 1.0, 1.1, 0.0, 0.1], &[0.9, 0.8]);
        assert_eq!(nms(0, &b, &s, Some(3), Some(0.5), None).unwrap(), i64s(&[1, 3], &[0, 0, 0]));
        // Centre format: IoU 0.9/1.1 > 0.5 suppresses the second box.
        let (b, s) = one(&[0.5, 0.5, 1.0, 1.0, 0.6, 0.5, 1.0, 1.0], &[0.9, 0.8]);
        assert_eq!(nms(1, &b, &s, Some(3), Some(0.5), None).unwrap(), i64s(&[1, 3], &[0, 0, 0]));
        // No (or a non-positive) limit selects nothing; a huge one everything.
        let (b, s) = one(&[0.0, 0.0, 1.0, 1.0, 0.0, 2.0, 1.0, 3.0], &[0.9, 0.8]);
        assert_eq!(nms(0, &b, &s, None, None, None).unwrap().dims(), &[0, 3]);
        assert_eq!(nms(0, &b, &s, Some(-1), Some(0.5), None).unwrap().dims(), &[0, 3]);
        assert_eq!(nms(0, &b, &s, Some(i64::MAX), Some(0.5), None).unwrap().dims(), &[2, 3]);
        // NaN scores rank last (onnxruntime's order for them depends on its heap).
        let (b, s2) = one(&[0.0, 0.0, 1.0, 1.0, 0.0, 2.0, 1.0, 3.0, 0.0, 4.0, 1.0, 5.0], &[f32::NAN, 0.2, 0.9]);
        assert_eq!(nms(0, &b, &s2, Some(5), Some(0.5), None).unwrap(), i64s(&[3, 3], &[0, 0, 2, 0, 0, 1, 0, 0, 0]));
        // Empty inputs.
        assert_eq!(nms(0, &f32s(&[1, 0, 4], &[]), &f32s(&[1, 2, 0], &[]), Some(3), Some(0.5), None).unwrap().dims(), &[0, 3]);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let b = f32s(&[1, 2, 4], &[0.0, 0.0, 1.0, 1.0, 0.0, 2.0, 1.0, 3.0]);
        let s = f32s(&[1, 1, 2], &[0.9, 0.8]);
        let err = |r: crate::Result<Tensor>| r.unwrap_err().to_string();
        for iou in [1.5f32, -0.5, f32::NAN] {
            let e = err(nms(0, &b, &s, Some(3), Some(iou), None));
            assert!(e.contains("iou_threshold must be in [0, 1]"), "{e}");
        }
        let e = err(nms(0, &f32s(&[2, 4], &[0.0; 8]), &s, Some(3), None, None));
        assert!(e.contains("boxes must have shape [batches, boxes, 4]"), "{e}");
        let e = err(nms(0, &b, &f32s(&[1, 1, 3], &[0.0; 3]), Some(3), None, None));
        assert!(e.contains("scores must have shape [batches = 1, classes, boxes = 2]"), "{e}");
        let case = Case::new("NonMaxSuppression").opset(11).constant(b.clone()).constant(s.clone()).constant(i64s(&[2], &[3, 4]));
        let e = case.run_cpu().unwrap_err().to_string();
        assert!(e.contains("max_output_boxes_per_class must be a scalar"), "{e}");
        // Inference needs the values.
        let op = make("NonMaxSuppression", 11, &[], 3, 1).unwrap();
        let e = run(op.as_ref(), &as_inputs(&[Some(&b), Some(&s), Some(&i64s(&[1], &[3]))], &[2]), &[]).unwrap_err().to_string();
        assert!(e.contains("must be known"), "{e}");
        // A known limit of 0 needs no values.
        let got = run(op.as_ref(), &as_inputs(&[Some(&b), Some(&s), Some(&i64s(&[1], &[0]))], &[2]), &[]).unwrap();
        assert_eq!(got[0].dims(), &[0, 3]);
        assert!(op.wgsl().is_none());
        assert!(make("NonMaxSuppression", 11, &[("center_point_box", Attr::Int(2))], 2, 1).is_err());
    }
}
