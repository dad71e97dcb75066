//! kiln.AllReduce: every worker's output is the sum of every worker's input, so the
//! gradient of input i on a worker is the sum over workers of the gradients reaching
//! output i there: an all-reduce of the output gradients, one message as the forward.
use super::Rule;
use crate::autodiff::emit::Emit;
use crate::autodiff::parallel::all_reduce;
use crate::autodiff::Result;
use kiln_graph::{Node, ValueId};

pub(super) const RULES: &[(&str, Rule)] = &[("AllReduce", all_reduce_rule)];

fn all_reduce_rule(e: &mut Emit, n: &Node, dy: &[Option<ValueId>], need: &[bool]) -> Result<Vec<Option<ValueId>>> {
    // Every worker runs the same graph, so the same outputs have no gradient
    // everywhere; zeros keep the message whole all the same.
    let parts: Vec<ValueId> = dy.iter().zip(&n.outputs).map(|(d, &o)| e.or_zeros(*d, o)).collect::<Result<_>>()?;
    let summed = all_reduce(e, &parts, false)?;
    Ok(summed.into_iter().zip(need).map(|(s, &want)| want.then_some(s)).collect())
}
