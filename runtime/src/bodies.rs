//! Control-flow bodies as GPU work. In a session with a GPU, the If, Loop and Scan
//! kernels (which drive their loops on the host) run each body application through
//! [`GpuBodies`]: the body graph compiled for the same GPU context (a session, which
//! plans each input signature and keeps a bounded number of plans), one per body and
//! input ranks, built on first use. An application uploads the body's inputs, runs
//! the body's plan (one submit where it is all GPU work) and reads back its outputs,
//! among them a Loop's condition. Bodies over sequences, optionals
//! or strings stay on the host (those values live there). A run's statistics count
//! the kernels and submits of the bodies it ran ([`RunBodies`]).
use kiln_graph::{DType, Dim, Graph, Shape, Tensor, ValueType};
use kiln_ops::{BodyRunner, OpError, Registry};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A body compiled for the device: runs on named inputs, returning its outputs and the
/// kernels and submits it launched (a session, which `session` supplies, so that this
/// module does not depend on it).
pub(crate) trait CompiledBody: Send + Sync {
    fn run(&self, feeds: &[(&str, &Tensor)]) -> crate::Result<(Vec<Tensor>, usize, usize)>;
}

/// Compiles a body graph (inputs typed) for the device.
pub(crate) type Compile = Box<dyn Fn(Graph, Option<Registry>) -> crate::Result<Box<dyn CompiledBody>> + Send + Sync>;

/// A body graph (its address while the entry keeps it alive) and its inputs' dtypes
/// and ranks.
type Key = (usize, Vec<(DType, usize)>);

pub(crate) struct GpuBodies {
    /// The device's name, for errors.
    device: String,
    compile: Compile,
    registry: Option<Registry>,
    compiled: Mutex<HashMap<Key, Arc<(Arc<Graph>, Box<dyn CompiledBody>)>>>,
}

impl GpuBodies {
    pub fn new(device: String, compile: Compile, registry: Option<Registry>) -> GpuBodies {
        GpuBodies { device, compile, registry, compiled: Mutex::default() }
    }

    /// `graph` compiled for inputs of these dtypes and ranks, every dim symbolic: one
    /// session serves every shape (a loop whose carried values grow plans per shape
    /// inside it, as any session does, instead of opening a session per iteration),
    /// and shapes the body declares are not enforced, as on the host.
    fn compiled(&self, graph: &Arc<Graph>, kinds: Vec<(DType, usize)>) -> crate::Result<Arc<(Arc<Graph>, Box<dyn CompiledBody>)>> {
        let key = (Arc::as_ptr(graph) as usize, kinds);
        if let Some(s) = self.compiled.lock().map_err(|_| crate::error::poisoned())?.get(&key) {
            return Ok(s.clone());
        }
        let mut g = (**graph).clone();
        for (j, (&v, &(dtype, rank))) in g.inputs.clone().iter().zip(&key.1).enumerate() {
            let dims: Vec<Dim> = (0..rank).map(|a| Dim::Sym(format!("body_input{j}_{a}"))).collect();
            g.values[v].ty = Some(ValueType::new(dtype, Shape(dims)));
        }
        let built = Arc::new((graph.clone(), (self.compile)(g, self.registry.clone())?));
        Ok(self.compiled.lock().map_err(|_| crate::error::poisoned())?.entry(key).or_insert(built).clone())
    }
}

/// One run's use of [`GpuBodies`]: the kernels and submits its body applications
/// launched, added to the run's own.
pub(crate) struct RunBodies<'a> {
    bodies: &'a GpuBodies,
    pub kernels: AtomicUsize,
    pub submits: AtomicUsize,
}

impl<'a> RunBodies<'a> {
    pub fn new(bodies: &'a GpuBodies) -> RunBodies<'a> {
        RunBodies { bodies, kernels: AtomicUsize::new(0), submits: AtomicUsize::new(0) }
    }

    /// Runs `f` with this runner installed; returns its result and the kernels and
    /// submits of the bodies it ran.
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> (R, usize, usize) {
        let r = kiln_ops::with_body_runner(self, f);
        (r, self.kernels.load(Ordering::Relaxed), self.submits.load(Ordering::Relaxed))
    }
}

impl BodyRunner for RunBodies<'_> {
    fn run(&self, graph: &Arc<Graph>, inputs: &[&Tensor]) -> kiln_ops::Result<Option<Vec<Tensor>>> {
        if inputs.iter().any(|t| t.composite().is_some() || t.dtype() == DType::String) {
            return Ok(None);
        }
        let b = self.bodies;
        let kinds = inputs.iter().map(|t| (t.dtype(), t.rank())).collect();
        let fail = |e: crate::RuntimeError| OpError::invalid(format!("on {}: {e}", b.device));
        let c = b.compiled(graph, kinds).map_err(fail)?;
        let names: Vec<&str> = graph.inputs.iter().map(|&v| graph.values[v].name.as_str()).collect();
        let feeds: Vec<(&str, &Tensor)> = names.into_iter().zip(inputs.iter().copied()).collect();
        let (outs, kernels, submits) = c.1.run(&feeds).map_err(fail)?;
        self.kernels.fetch_add(kernels, Ordering::Relaxed);
        self.submits.fetch_add(submits, Ordering::Relaxed);
        Ok(Some(outs))
    }
}
