//! RandomUniform (values in `[low, high)`, default `[0, 1)`, of the `shape` attribute)
//! and RandomUniformLike (of its input's shape): a [`RandomFill`].
use super::fill::{float_dtype, shape_attr, Dist, RandomFill};
use super::generator::Seed;
use crate::{NodeSpec, Registry, Result};

fn parse(spec: &NodeSpec, like: bool) -> Result<RandomFill> {
    let (low, high) = (spec.float("low", 0.0)?, spec.float("high", 1.0)?);
    if !(low.is_finite() && high.is_finite() && low <= high) {
        return Err(spec.bad("high", format!("expected finite low <= high, found [{low}, {high})")));
    }
    Ok(RandomFill {
        name: if like { "RandomUniformLike" } else { "RandomUniform" },
        dist: Dist::Uniform { low, high },
        shape: if like { None } else { Some(shape_attr(spec)?) },
        dtype: float_dtype(spec)?,
        seed: Seed::parse(spec)?,
    })
}

pub(crate) fn register(r: &mut Registry) {
    r.register("", "RandomUniform", |spec| Ok(Box::new(parse(spec, false)?)));
    r.register("", "RandomUniformLike", |spec| Ok(Box::new(parse(spec, true)?)));
}

#[cfg(test)]
mod tests {
    use crate::testing::*;
    use kiln_graph::{Attr, DType};

    fn uniform(seed: Option<f32>) -> Case {
        let c = Case::new("RandomUniform").attrs(&[("shape", ints(&[40, 50])), ("low", Attr::Float(-2.0)), ("high", Attr::Float(3.0))]);
        match seed {
            Some(s) => c.attr("seed", Attr::Float(s)),
            None => c,
        }
    }

    #[test]
    fn range_moments_and_seeds() {
        let a = uniform(Some(7.0)).run_cpu().unwrap();
        assert_eq!((a[0].dtype(), a[0].dims()), (DType::F32, &[40usize, 50][..]));
        let v = a[0].to_f64_vec();
        assert!(v.iter().all(|x| (-2.0..3.0).contains(x)));
        // Mean 0.5 and variance 25/12 of U(-2, 3); 2000 draws: standard error ~0.03.
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!((mean - 0.5).abs() < 0.15 && (var - 25.0 / 12.0).abs() < 0.2, "mean {mean} var {var}");
        assert_eq!(uniform(Some(7.0)).run_cpu().unwrap()[0].to_f64_vec(), v, "a seed repeats");
        assert_ne!(uniform(Some(8.0)).run_cpu().unwrap()[0].to_f64_vec(), v, "another seed differs");
        assert_ne!(uniform(None).run_cpu().unwrap()[0].to_f64_vec(), uniform(None).run_cpu().unwrap()[0].to_f64_vec(), "no seed: fresh");
    }

    #[test]
    fn like_takes_shape_and_dtype() {
        let x = rand(DType::F64, &[3, 4], 1);
        let y = Case::new("RandomUniformLike").input(x.clone()).attr("seed", Attr::Float(1.0)).run_cpu().unwrap();
        assert_eq!((y[0].dtype(), y[0].dims()), (DType::F64, &[3usize, 4][..]));
        let y = Case::new("RandomUniformLike").input(x).attr("dtype", Attr::Int(10)).attr("seed", Attr::Float(1.0)).run_cpu().unwrap();
        assert_eq!(y[0].dtype(), DType::F16);
        assert!(Case::new("RandomUniformLike").input(i64_vec(&[1, 2])).run_cpu().is_err(), "an int input needs dtype");
        assert!(Case::new("RandomUniform").run_cpu().is_err(), "shape is required");
        assert!(Case::new("RandomUniform").attr("shape", ints(&[2])).attr("dtype", Attr::Int(7)).run_cpu().is_err(), "int dtype");
    }
}
