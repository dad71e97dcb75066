//! The devices every cross-device test runs on: the CPU and each GPU adapter wgpu
//! finds (Vulkan, GL, ... each its own device). Without any adapter the tests fail:
//! CI has lavapipe, so a missing adapter is a broken setup, never a reason to skip.
use kiln_graph::{Graph, Tensor};
use kiln_runtime::{DeviceChoice, Session, SessionOptions};
use std::sync::OnceLock;

/// One device a test runs on.
#[derive(Clone, Debug)]
pub struct TestDevice {
    /// `cpu`, or `gpu:N NAME (BACKEND)`: what failures and expectation patterns name.
    pub label: String,
    pub choice: DeviceChoice,
    /// WGSL computes every float dtype in f32 (f64 data is converted at the edges).
    pub computes_in_f32: bool,
}

impl TestDevice {
    /// Runs `graph` once in a new session on this device.
    pub fn run(&self, graph: Graph, feeds: &[(String, Tensor)]) -> kiln_runtime::Result<Vec<Tensor>> {
        let s = Session::new(graph, SessionOptions::device(self.choice.clone()))?;
        let refs: Vec<(&str, &Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t)).collect();
        s.run(&refs)
    }

    pub fn is_cpu(&self) -> bool {
        self.choice == DeviceChoice::Cpu
    }
}

/// The CPU, then every GPU adapter in `kiln devices` order. `KILN_TEST_DEVICES`
/// (comma-separated, case-insensitive substrings of the labels, e.g. `cpu,vulkan`)
/// narrows the list for a local run. Panics when no GPU adapter exists at all.
pub fn devices() -> &'static [TestDevice] {
    static DEVICES: OnceLock<Vec<TestDevice>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        gpu_env();
        let report = kiln_runtime::list_devices();
        assert!(
            !report.adapters.is_empty(),
            "no GPU adapter was found: GPU tests fail rather than skip (on Linux without a GPU install Mesa's lavapipe: \
             apt-get install -y mesa-vulkan-drivers libvulkan1)"
        );
        let mut all = vec![TestDevice { label: "cpu".into(), choice: DeviceChoice::Cpu, computes_in_f32: false }];
        for a in &report.adapters {
            all.push(TestDevice {
                label: format!("gpu:{} {} ({})", a.index, a.name, a.backend),
                choice: DeviceChoice::Adapter(format!("gpu:{}", a.index)),
                computes_in_f32: true,
            });
        }
        match std::env::var("KILN_TEST_DEVICES") {
            Ok(filter) if !filter.trim().is_empty() => {
                let pats: Vec<String> = filter.split(',').map(|p| p.trim().to_lowercase()).filter(|p| !p.is_empty()).collect();
                let kept: Vec<TestDevice> = all.into_iter().filter(|d| pats.iter().any(|p| d.label.to_lowercase().contains(p))).collect();
                assert!(!kept.is_empty(), "KILN_TEST_DEVICES={filter} matches no device");
                eprintln!("KILN_TEST_DEVICES={filter}: testing on {:?}", kept.iter().map(|d| &d.label).collect::<Vec<_>>());
                kept
            }
            _ => all,
        }
    })
}

/// Quiets Mesa's warning about XDG_RUNTIME_DIR once per process.
pub fn gpu_env() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
            let d = std::env::temp_dir().join("kiln-xdg");
            let _ = std::fs::create_dir_all(&d);
            std::env::set_var("XDG_RUNTIME_DIR", d);
        }
    });
}
