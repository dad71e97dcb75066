//! [`Registry`]: (domain, op type) -> op factory, and [`canonical_domain`], the one
//! spelling of ONNX domains every layer uses.

use crate::{NodeSpec, Op, OpError, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

/// Builds an op from a node (parses and checks its attributes).
pub type OpFactory = Arc<dyn Fn(&NodeSpec) -> Result<Box<dyn Op>> + Send + Sync>;

/// Maps (domain, op type) to op factories. [`Registry::builtin`] holds Kiln's operator
/// library; applications clone it and [`Registry::register`] their custom ops.
#[derive(Clone, Default)]
pub struct Registry {
    factories: BTreeMap<(String, String), OpFactory>,
}

/// The canonical spelling of an ONNX domain: the default domain may be written "" or
/// "ai.onnx" and is always "" here; other domains are kept as they are.
pub fn canonical_domain(domain: &str) -> &str {
    if domain == "ai.onnx" {
        ""
    } else {
        domain
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registry({} ops)", self.factories.len())
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Kiln's built-in operators (shared, built once).
    pub fn builtin() -> &'static Registry {
        static BUILTIN: OnceLock<Registry> = OnceLock::new();
        BUILTIN.get_or_init(|| {
            let mut r = Registry::new();
            crate::control::register(&mut r);
            crate::elementwise::register(&mut r);
            crate::linalg::register(&mut r);
            crate::ml::register(&mut r);
            crate::nn::register(&mut r);
            crate::quant::register(&mut r);
            crate::reduce::register(&mut r);
            crate::rnn::register(&mut r);
            crate::sequence::register(&mut r);
            crate::random::register(&mut r);
            crate::collective::register(&mut r);
            crate::signal::register(&mut r);
            crate::tensor::register(&mut r);
            crate::text::register(&mut r);
            crate::training::register(&mut r);
            crate::fused::register(&mut r);
            r
        })
    }

    /// Registers (or replaces) the factory of `op_type` in `domain`.
    pub fn register<F>(&mut self, domain: &str, op_type: &str, factory: F)
    where
        F: Fn(&NodeSpec) -> Result<Box<dyn Op>> + Send + Sync + 'static,
    {
        self.factories.insert((canonical_domain(domain).to_string(), op_type.to_string()), Arc::new(factory));
    }

    pub fn supports(&self, domain: &str, op_type: &str) -> bool {
        self.factories.contains_key(&(canonical_domain(domain).to_string(), op_type.to_string()))
    }

    /// Creates the op for a node.
    pub fn create(&self, spec: &NodeSpec) -> Result<Box<dyn Op>> {
        let key = (canonical_domain(&spec.node.domain).to_string(), spec.node.op_type.clone());
        match self.factories.get(&key) {
            Some(f) => f(spec),
            None => Err(OpError::Unsupported(format!(
                "no operator '{}' in domain '{}'",
                spec.node.op_type,
                if key.0.is_empty() { "ai.onnx" } else { &key.0 }
            ))),
        }
    }

    /// All registered (domain, op type) pairs, sorted.
    pub fn op_types(&self) -> impl Iterator<Item = (&str, &str)> {
        self.factories.keys().map(|(d, o)| (d.as_str(), o.as_str()))
    }
}
