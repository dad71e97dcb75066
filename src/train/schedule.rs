//! Learning-rate schedules: linear warmup, then constant, step, cosine or polynomial
//! decay. Computed on the host in f64 for each step and fed to the training graph.
use std::str::FromStr;

#[derive(Clone, Debug, PartialEq)]
pub enum Decay {
    Constant,
    /// Multiply by `gamma` every `every` steps.
    Step { every: u64, gamma: f64 },
    /// Half a cosine from the base rate down to `min` over the steps after warmup.
    Cosine { min: f64 },
    /// `(base - end) * (1 - t/T)^power + end` over the steps after warmup.
    Polynomial { power: f64, end: f64 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub base: f64,
    /// Steps of linear warmup from `base / warmup` to `base`.
    pub warmup: u64,
    pub decay: Decay,
    /// The total number of steps (cosine and polynomial decay end there).
    pub total: u64,
}

impl Schedule {
    pub fn constant(lr: f64) -> Schedule {
        Schedule { base: lr, warmup: 0, decay: Decay::Constant, total: 0 }
    }

    /// The learning rate of step `step` (1 for the first).
    pub fn lr(&self, step: u64) -> f64 {
        let t = step.saturating_sub(1);
        if t < self.warmup {
            return self.base * (t + 1) as f64 / self.warmup as f64;
        }
        let u = (t - self.warmup) as f64;
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        match self.decay {
            Decay::Constant => self.base,
            Decay::Step { every, gamma } => self.base * gamma.powi(((t - self.warmup) / every.max(1)) as i32),
            Decay::Cosine { min } => min + (self.base - min) * 0.5 * (1.0 + (std::f64::consts::PI * (u / span).min(1.0)).cos()),
            Decay::Polynomial { power, end } => end + (self.base - end) * (1.0 - (u / span).min(1.0)).powf(power),
        }
    }
}

impl FromStr for Decay {
    type Err = String;

    /// `constant`, `step:EVERY:GAMMA`, `cosine[:MIN_LR]`, `poly:POWER[:END_LR]`.
    fn from_str(s: &str) -> Result<Decay, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let num = |i: usize, what: &str| -> Result<f64, String> {
            parts.get(i).ok_or_else(|| format!("schedule '{s}' needs {what}"))?.parse::<f64>().map_err(|_| format!("schedule '{s}': {what} must be a number"))
        };
        let opt = |i: usize, what: &str, default: f64| if parts.len() > i { num(i, what) } else { Ok(default) };
        let d = match parts[0] {
            "constant" if parts.len() == 1 => Decay::Constant,
            "step" if parts.len() == 3 => {
                let every = num(1, "a step count")?;
                if every < 1.0 || every.fract() != 0.0 {
                    return Err(format!("schedule '{s}': the step count must be a positive integer"));
                }
                Decay::Step { every: every as u64, gamma: num(2, "a factor")? }
            }
            "cosine" if parts.len() <= 2 => Decay::Cosine { min: opt(1, "a minimum rate", 0.0)? },
            "poly" if parts.len() <= 3 => Decay::Polynomial { power: num(1, "a power")?, end: opt(2, "an end rate", 0.0)? },
            _ => return Err(format!("unknown schedule '{s}' (expected constant, step:EVERY:GAMMA, cosine[:MIN_LR] or poly:POWER[:END_LR])")),
        };
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_decay() {
        let s = Schedule { base: 1.0, warmup: 4, decay: "cosine".parse().unwrap(), total: 14 };
        assert_eq!([s.lr(1), s.lr(2), s.lr(4)], [0.25, 0.5, 1.0]);
        assert_eq!(s.lr(5), 1.0);
        assert!((s.lr(10) - 0.5).abs() < 1e-12, "halfway down the cosine");
        assert!(s.lr(14) < 0.03 && s.lr(100) == 0.0);
        let st = Schedule { base: 0.1, warmup: 0, decay: "step:10:0.5".parse().unwrap(), total: 100 };
        assert_eq!([st.lr(10), st.lr(11), st.lr(21)], [0.1, 0.05, 0.025]);
        let p = Schedule { base: 1.0, warmup: 0, decay: "poly:2:0.1".parse().unwrap(), total: 10 };
        assert!((p.lr(6) - (0.1 + 0.9 * 0.25)).abs() < 1e-12);
        assert!("step:0:1".parse::<Decay>().is_err() && "linear".parse::<Decay>().unwrap_err().contains("unknown schedule"));
    }
}
