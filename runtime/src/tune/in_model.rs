//! The model-level check of a tuning's CPU choices. The tuner times each kernel alone,
//! over and over, with its data in cache: a choice with larger packed weights (the
//! transformed filters of a Winograd convolution are four times the plain ones) can
//! win there and lose in the model, where each layer's weights come from memory. So a
//! choice that differs from the defaults is kept only where its node also runs faster
//! inside the model: per-node times of profiled runs of the whole model with the
//! choices and with the defaults, alternated ([`crate::Session::tune`] measures them).
use super::report::KeyReport;
use super::tuner::TIE;
use std::collections::HashMap;

/// A choice that loses in the model: its key's index and the seconds per run of its
/// node with the choices and with the defaults.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Losing {
    pub index: usize,
    pub with: f64,
    pub without: f64,
}

/// Of `keys[candidates]`, those whose node is not faster by more than [`TIE`] with the
/// choices (`with`, seconds by node name) than with the defaults (`without`); a node
/// missing from either profile is not judged.
pub(crate) fn losing_choices(keys: &[KeyReport], candidates: &[usize], with: &HashMap<String, f64>, without: &HashMap<String, f64>) -> Vec<Losing> {
    candidates
        .iter()
        .filter_map(|&index| {
            let node = &keys[index].node;
            let (&w, &wo) = (with.get(node)?, without.get(node)?);
            (w > wo * (1.0 - TIE)).then_some(Losing { index, with: w, without: wo })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(node: &str) -> KeyReport {
        KeyReport::pending(format!("key of {node}"), "summary".into(), node.into(), "cpu".into())
    }

    #[test]
    fn choices_that_do_not_pay_in_the_model_lose() {
        let keys = [key("a"), key("b"), key("c"), key("d"), key("e")];
        let with: HashMap<String, f64> = [("a", 1.0), ("b", 2.0), ("c", 0.985), ("d", 0.5)].into_iter().map(|(n, t)| (n.to_string(), t)).collect();
        let without: HashMap<String, f64> = [("a", 1.5), ("b", 1.5), ("c", 1.0), ("e", 1.0)].into_iter().map(|(n, t)| (n.to_string(), t)).collect();
        // a pays; b is slower with its choice; c gains less than a tie; d and e are
        // missing from one profile; key 3 is not a candidate either way.
        let losing = losing_choices(&keys, &[0, 1, 2, 4], &with, &without);
        assert_eq!(losing, vec![Losing { index: 1, with: 2.0, without: 1.5 }, Losing { index: 2, with: 0.985, without: 1.0 }]);
    }
}
