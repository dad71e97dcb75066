//! What passes share while a pipeline runs: the registry of the ops (custom ones
//! included) and the value types, inferred once.
//!
//! A value's type is a property of the value: a pass that rewrites the graph keeps the
//! type of every value it keeps. So the types inferred at the first request stay valid
//! for the whole pipeline; values that passes add later take the type they were
//! declared with (`Graph::add_value`), or their weight's type, or stay unknown.
use kiln_graph::{Graph, ValueType};
use kiln_ops::Registry;

pub struct PassContext<'r> {
    registry: &'r Registry,
    types: Option<Vec<Option<ValueType>>>,
    inferences: usize,
}

impl<'r> PassContext<'r> {
    pub fn new(registry: &'r Registry) -> PassContext<'r> {
        PassContext { registry, types: None, inferences: 0 }
    }

    /// The context of the built-in ops.
    pub fn builtin() -> PassContext<'static> {
        PassContext::new(Registry::builtin())
    }

    pub fn registry(&self) -> &'r Registry {
        self.registry
    }

    /// The type of every value of `g`, as far as symbolic inference reaches
    /// ([`kiln_ops::infer::value_types`]).
    pub fn types(&mut self, g: &Graph) -> &[Option<ValueType>] {
        let PassContext { registry, types, inferences } = self;
        let types = types.get_or_insert_with(|| {
            *inferences += 1;
            kiln_ops::infer::value_types(g, registry)
        });
        for v in types.len()..g.values.len() {
            let declared = g.values[v].ty.clone();
            let weight = g.initializers.get(&v).map(|t| ValueType::new(t.dtype(), kiln_graph::Shape::fixed(t.dims())));
            types.push(declared.or(weight));
        }
        types
    }

    /// How many times the whole graph was inferred (once per pipeline that needs types).
    pub fn inferences(&self) -> usize {
        self.inferences
    }
}
