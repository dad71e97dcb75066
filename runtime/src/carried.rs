//! State a session carries from one run to the next: each variable pairs a graph input
//! with the graph output that replaces it after every run (a training step's
//! parameters and optimizer slots, a decoder's cache). [`crate::Session::run_carried`]
//! binds the inputs and takes the outputs back itself. On a GPU whose plan runs the
//! whole graph in one submit, the state stays in device buffers between runs and is read
//! back only when asked for ([`Carried::get`]); otherwise it lives on the host.
use crate::gpu::Resident;
use crate::error::poisoned;
use crate::{Result, RuntimeError};
use kiln_graph::Tensor;
use std::sync::Mutex;

/// Where a variable's current value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fresh {
    /// The host tensor (the device copy, if any, is older).
    Host,
    /// The device buffer (the host tensor is older).
    Device,
    /// Both hold it.
    Both,
}

pub struct Carried {
    /// (input name, output name) of each variable.
    pub(crate) names: Vec<(String, String)>,
    /// (graph input index, graph output index) of each variable.
    pub(crate) pairs: Vec<(usize, usize)>,
    /// The values (behind a lock, so that reading them back needs no `&mut`).
    pub(crate) slots: Mutex<Slots>,
}

pub(crate) struct Slots {
    /// The last value the host has seen; bound in place of the input when the device
    /// holds a newer one (only its type is read then).
    pub host: Vec<Tensor>,
    pub fresh: Vec<Fresh>,
    pub device: Option<Resident>,
}

impl Carried {
    pub(crate) fn new(names: Vec<(String, String)>, pairs: Vec<(usize, usize)>, initial: Vec<Tensor>) -> Carried {
        let fresh = vec![Fresh::Host; initial.len()];
        Carried { names, pairs, slots: Mutex::new(Slots { host: initial, fresh, device: None }) }
    }

    /// The variables' input names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|(i, _)| i.as_str())
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.names.iter().position(|(i, _)| i == name).ok_or_else(|| RuntimeError::UnknownInput {
            name: name.to_string(),
            expected: self.names.iter().map(|(i, _)| format!("'{i}'")).collect::<Vec<_>>().join(", "),
        })
    }

    pub(crate) fn lock(&self) -> Result<std::sync::MutexGuard<'_, Slots>> {
        self.slots.lock().map_err(|_| poisoned())
    }

    /// The current value of a variable, by input name (read back from the device when
    /// it is newer there).
    pub fn get(&self, name: &str) -> Result<Tensor> {
        let k = self.index(name)?;
        let mut s = self.lock()?;
        s.sync_host(k)?;
        Ok(s.host[k].clone())
    }

    /// Every variable's current value, in order.
    pub fn values(&self) -> Result<Vec<Tensor>> {
        let mut s = self.lock()?;
        (0..s.host.len()).map(|k| s.sync_host(k).map(|_| s.host[k].clone())).collect()
    }

    /// Replaces a variable's value (same dtype and dims); it goes to the device with the
    /// next run.
    pub fn set(&self, name: &str, value: Tensor) -> Result<()> {
        let k = self.index(name)?;
        let mut s = self.lock()?;
        let old = &s.host[k];
        if value.dtype() != old.dtype() || value.dims() != old.dims() {
            return Err(RuntimeError::InputMismatch { name: name.to_string(), expected: format!("{}{:?}", old.dtype(), old.dims()), got: format!("{}{:?}", value.dtype(), value.dims()) });
        }
        s.host[k] = value;
        s.fresh[k] = Fresh::Host;
        Ok(())
    }

    /// Whether device buffers hold the current values (state that stays on a GPU
    /// between runs; a copy may be on the host too).
    pub fn on_device(&self) -> bool {
        self.lock().is_ok_and(|s| s.device.is_some() && !s.fresh.contains(&Fresh::Host))
    }
}

impl Slots {
    pub(crate) fn sync_host(&mut self, k: usize) -> Result<()> {
        if self.fresh[k] == Fresh::Device {
            let dev = self.device.as_ref().ok_or_else(|| RuntimeError::Gpu("carried state marked on a device that is gone".into()))?;
            self.host[k] = dev.download(k)?;
            self.fresh[k] = Fresh::Both;
        }
        Ok(())
    }

    /// Brings every value to the host and drops the device copies (the next run is not
    /// a resident one).
    pub(crate) fn to_host(&mut self) -> Result<()> {
        for k in 0..self.host.len() {
            self.sync_host(k)?;
        }
        self.device = None;
        self.fresh.iter_mut().for_each(|f| *f = Fresh::Host);
        Ok(())
    }
}
