//! RandomNormal (`mean` + `scale` * N(0, 1), defaults 0 and 1, of the `shape`
//! attribute) and RandomNormalLike (of its input's shape): a [`RandomFill`].
use super::fill::{float_dtype, shape_attr, Dist, RandomFill};
use super::generator::Seed;
use crate::{NodeSpec, Registry, Result};

fn parse(spec: &NodeSpec, like: bool) -> Result<RandomFill> {
    let (mean, scale) = (spec.float("mean", 0.0)?, spec.float("scale", 1.0)?);
    if !(mean.is_finite() && scale.is_finite()) {
        return Err(spec.bad("scale", format!("expected finite mean and scale, found {mean} and {scale}")));
    }
    Ok(RandomFill {
        name: if like { "RandomNormalLike" } else { "RandomNormal" },
        dist: Dist::Normal { mean, scale },
        shape: if like { None } else { Some(shape_attr(spec)?) },
        dtype: float_dtype(spec)?,
        seed: Seed::parse(spec)?,
    })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "RandomNormal", |spec| Ok(Box::new(parse(spec, false)?)));
    r.register("", "RandomNormalLike", |spec| Ok(Box::new(parse(spec, true)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType};

    #[test]
    fn moments_and_seeds() {
        let case = Case::new("RandomNormal").attrs(&[("shape", ints(&[100, 100])), ("mean", Attr::Float(2.0)), ("scale", Attr::Float(0.5)), ("seed", Attr::Float(3.0))]);
        let v = case.run_cpu().unwrap()[0].to_f64_vec();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        // 10000 draws of N(2, 0.25): standard errors 0.005 (mean) and 0.0035 (variance).
        assert!((mean - 2.0).abs() < 0.025 && (var - 0.25).abs() < 0.02, "mean {mean} var {var}");
        assert_eq!(case.run_cpu().unwrap()[0].to_f64_vec(), v, "a seed repeats");
        let like = Case::new("RandomNormalLike").input(rand(DType::F16, &[2, 5], 1)).run_cpu().unwrap();
        assert_eq!((like[0].dtype(), like[0].dims()), (DType::F16, &[2usize, 5][..]));
        assert!(Case::new("RandomNormal").attr("shape", ints(&[2, -1])).run_cpu().is_err());
    }
}
