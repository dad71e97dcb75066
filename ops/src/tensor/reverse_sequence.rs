//! ReverseSequence: for each batch entry `b` (along `batch_axis`), reverses the first
//! `sequence_lens[b]` elements along `time_axis` and copies the rest. Lengths outside
//! `0..=time` are an error on the CPU; the GPU kernel clamps them into that range.
use crate::broadcast::strides;
use crate::cpu::{self, CpuKernel};
use crate::op::required;
use crate::wgsl::{self, Binding, WgslKernel, WgslProgram};
use crate::{Arg, Op, OpError, Registry, Result, TensorType, TuneValues};
use kiln_graph::Tensor;

#[derive(Debug)]
pub struct ReverseSequence {
    batch_axis: i64,
    time_axis: i64,
}

impl ReverseSequence {
    /// (batch axis, time axis).
    fn plan(&self, inputs: &[Option<Arg>]) -> Result<(usize, usize)> {
        let (x, lens) = (required(inputs, 0)?, required(inputs, 1)?);
        if x.rank() < 2 {
            return Err(OpError::input(0, format!("the input must have rank >= 2, found shape {:?}", x.dims())));
        }
        let (b, t) = (self.batch_axis, self.time_axis);
        if !(0..=1).contains(&b) || !(0..=1).contains(&t) || b == t {
            return Err(OpError::invalid(format!("batch_axis ({b}) and time_axis ({t}) must be 0 and 1 in some order")));
        }
        if !lens.dtype().is_int() || lens.dims() != [x.dims()[b as usize]] {
            return Err(OpError::input(1, format!("sequence_lens must be integers of shape [{}], found {}", x.dims()[b as usize], lens.ty)));
        }
        Ok((b as usize, t as usize))
    }
}

impl Op for ReverseSequence {
    fn name(&self) -> &str {
        "ReverseSequence"
    }

    fn infer(&self, inputs: &[Option<Arg>]) -> Result<Vec<TensorType>> {
        self.plan(inputs)?;
        Ok(vec![required(inputs, 0)?.ty.clone()])
    }

    fn cpu(&self) -> Option<&dyn CpuKernel> {
        Some(self)
    }

    fn wgsl(&self) -> Option<&dyn WgslKernel> {
        Some(self)
    }
}

impl CpuKernel for ReverseSequence {
    fn run(&self, inputs: &[Option<&Tensor>], outputs: &mut [Tensor]) -> Result<()> {
        let (ba, ta) = super::common::tensor_args(inputs, |a| self.plan(a))?;
        let (x, lens) = (cpu::input(inputs, 0)?, cpu::input(inputs, 1)?.to_i64_vec()?);
        let dims = x.dims();
        let time = dims[ta];
        if let Some((b, &l)) = lens.iter().enumerate().find(|(_, &l)| l < 0 || l as usize > time) {
            return Err(OpError::input(1, format!("sequence_lens[{b}] = {l} is outside 0..={time} (the time dim)")));
        }
        let st = strides(dims);
        let es = x.dtype().size();
        let src = x.bytes();
        let dst = outputs[0].bytes_mut();
        for e in 0..x.len() {
            let (b, t) = ((e / st[ba]) % dims[ba], (e / st[ta]) % time);
            let l = lens[b] as usize;
            let s = if t < l { e - t * st[ta] + (l - 1 - t) * st[ta] } else { e };
            dst[e * es..(e + 1) * es].copy_from_slice(&src[s * es..(s + 1) * es]);
        }
        Ok(())
    }
}

impl WgslKernel for ReverseSequence {
    fn generate(&self, inputs: &[Option<Arg>], outputs: &[TensorType], tune: &TuneValues) -> Result<WgslProgram> {
        let (ba, ta) = self.plan(inputs)?;
        let dims = &outputs[0].dims;
        let st = strides(dims);
        let ty = wgsl::elem(outputs[0].dtype);
        let time = dims[ta];
        let body = format!(
            "let b = (i / {sb}u) % {nb}u;\n    let t = (i / {stt}u) % {time}u;\n    \
             let l = u32(clamp(lens[b], 0i, {time}i));\n    var s = i;\n    \
             if (t < l) {{ s = i - t * {stt}u + (l - 1u - t) * {stt}u; }}\n    dst[i] = src[s];",
            sb = st[ba],
            nb = dims[ba].max(1),
            stt = st[ta],
            time = time.max(1)
        );
        let buffers = [("src", ty, true), ("lens", "i32", true), ("dst", ty, false)];
        let b = vec![Binding::Input(0), Binding::Input(1), Binding::Output(0)];
        let wg = tune.get(&wgsl::workgroup_param());
        Ok(WgslProgram::single(wgsl::simple_kernel("ReverseSequence", outputs[0].len(), wg, &buffers, b, "", &body)))
    }
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "ReverseSequence", |spec| {
        Ok(Box::new(ReverseSequence { batch_axis: spec.int("batch_axis", 1)?, time_axis: spec.int("time_axis", 0)? }))
    });
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::Attr;

    #[test]
    fn reverses_prefixes_on_either_axis() {
        // time_axis 0, batch_axis 1 (defaults): x [4 time, 3 batch, 2]
        let x = iota_f32(&[4, 3, 2]);
        let op = make("ReverseSequence", 10, &[], 2, 1).unwrap();
        let lens = i64s(&[3], &[4, 0, 2]);
        let got = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&lens)], &[]), &[]).unwrap().remove(0).to_f64_vec();
        let xv = x.to_f64_vec();
        for t in 0..4 {
            for b in 0..3 {
                let l = [4usize, 0, 2][b];
                let s = if t < l { l - 1 - t } else { t };
                for c in 0..2 {
                    assert_eq!(got[(t * 3 + b) * 2 + c], xv[(s * 3 + b) * 2 + c], "t {t} b {b}");
                }
            }
        }
        let op = make("ReverseSequence", 10, &[("batch_axis", Attr::Int(0)), ("time_axis", Attr::Int(1))], 2, 1).unwrap();
        let x = iota_i64(&[2, 3]);
        let got = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[2], &[3, 2]))], &[]), &[]).unwrap();
        assert_eq!(got[0], i64s(&[2, 3], &[2, 1, 0, 4, 3, 5]));
        let e = run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[2], &[4, 0]))], &[]), &[]).unwrap_err().to_string();
        assert!(e.contains("sequence_lens[0] = 4 is outside 0..=3"), "{e}");
        assert!(run(op.as_ref(), &as_inputs(&[Some(&x), Some(&i64s(&[3], &[1, 1, 1]))], &[]), &[]).is_err());
    }
}
