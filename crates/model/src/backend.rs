//! The compute backends this project runs on, chosen at run time by name.
//!
//! Burn 0.22 has no backend type parameter: the backend is a property of the [`Device`] value,
//! so swapping backends is a match on a config string. wgpu is the crate's `wgpu` feature (on by
//! default): a build without it (the converter's core) names the backend and refuses it.

use std::fmt;
use std::str::FromStr;
#[cfg(feature = "wgpu")]
use std::sync::OnceLock;

use burn::tensor::Device;
#[cfg(feature = "wgpu")]
use burn::tensor::DeviceKind;

use crate::error::{ModelError, Result};

/// A backend by name, as configs and command lines spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// burn-ndarray, the reference CPU backend (deprecated in burn 0.22, removed in 0.23).
    Ndarray,
    /// burn-flex, the pure-Rust CPU backend that replaces ndarray.
    Flex,
    /// burn-wgpu on the default adapter (a GPU, or Mesa's lavapipe Vulkan driver on a CPU).
    Wgpu,
}

impl Backend {
    pub const ALL: [Backend; 3] = [Backend::Ndarray, Backend::Flex, Backend::Wgpu];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Ndarray => "ndarray",
            Backend::Flex => "flex",
            Backend::Wgpu => "wgpu",
        }
    }

    /// The device of this backend (for wgpu, of the given adapter kind). Fails with a clear
    /// message when wgpu has no adapter here, instead of panicking on first use.
    pub fn device(self, wgpu_kind: WgpuKind) -> Result<Device> {
        match self {
            #[allow(deprecated)]
            Backend::Ndarray => Ok(Device::ndarray()),
            Backend::Flex => Ok(Device::flex()),
            #[cfg(not(feature = "wgpu"))]
            Backend::Wgpu => {
                let _ = wgpu_kind;
                Err(ModelError::config(
                    "backend",
                    "wgpu",
                    "this build has no wgpu backend (the `wgpu` feature of the model crate)",
                ))
            }
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => {
                let adapters = wgpu_adapters();
                if adapters.is_empty() {
                    return Err(ModelError::config(
                        "backend",
                        "wgpu",
                        "no wgpu adapter on this machine (on a CPU-only Linux machine install Mesa's lavapipe: apt-get install mesa-vulkan-drivers)",
                    ));
                }
                Ok(Device::wgpu(wgpu_kind.into()))
            }
        }
    }

    /// Whether [`Backend::device`] can succeed on this machine.
    pub fn is_available(self) -> bool {
        self != Backend::Wgpu || !wgpu_adapters().is_empty()
    }

    /// The backends that have a device here.
    pub fn available() -> Vec<Backend> {
        Self::ALL.into_iter().filter(|b| b.is_available()).collect()
    }

    /// The backends checks run on: every available one. With `REQUIRE_WGPU=1` in the environment
    /// (CI sets it after installing lavapipe) a missing wgpu adapter is an error, not a skip.
    pub fn for_checks() -> Result<Vec<Backend>> {
        let available = Self::available();
        if !available.contains(&Backend::Wgpu) && std::env::var("REQUIRE_WGPU").is_ok_and(|v| v == "1") {
            return Err(ModelError::config(
                "backend",
                "wgpu",
                "REQUIRE_WGPU=1 but no wgpu adapter was found (install mesa-vulkan-drivers)",
            ));
        }
        Ok(available)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|b| b.name() == s).ok_or_else(|| {
            ModelError::config("backend", format!("{s:?}"), "expected one of \"ndarray\", \"flex\", \"wgpu\"")
        })
    }
}

/// Which wgpu adapter to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WgpuKind {
    /// wgpu's choice: a discrete GPU if any, else an integrated one, else a CPU adapter.
    #[default]
    Default,
    DiscreteGpu(usize),
    IntegratedGpu(usize),
    /// A CPU adapter such as lavapipe.
    Cpu,
}

#[cfg(feature = "wgpu")]
impl From<WgpuKind> for DeviceKind {
    fn from(kind: WgpuKind) -> Self {
        match kind {
            WgpuKind::Default => DeviceKind::default(),
            WgpuKind::DiscreteGpu(i) => DeviceKind::DiscreteGpu(i),
            WgpuKind::IntegratedGpu(i) => DeviceKind::IntegratedGpu(i),
            WgpuKind::Cpu => DeviceKind::Cpu,
        }
    }
}

impl FromStr for WgpuKind {
    type Err = ModelError;

    /// `default`, `cpu`, `discrete` / `discrete:N`, `integrated` / `integrated:N`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            ModelError::config(
                "wgpu_device",
                format!("{s:?}"),
                "expected \"default\", \"cpu\", \"discrete[:N]\" or \"integrated[:N]\"",
            )
        };
        let (name, index) = match s.split_once(':') {
            Some((name, index)) => (name, index.parse().map_err(|_| bad())?),
            None => (s, 0),
        };
        match name {
            "default" => Ok(WgpuKind::Default),
            "cpu" => Ok(WgpuKind::Cpu),
            "discrete" => Ok(WgpuKind::DiscreteGpu(index)),
            "integrated" => Ok(WgpuKind::IntegratedGpu(index)),
            _ => Err(bad()),
        }
    }
}

/// The names of the wgpu adapters on this machine, asked once per process (none in a build
/// without the `wgpu` feature).
#[cfg(not(feature = "wgpu"))]
pub fn wgpu_adapters() -> &'static [String] {
    &[]
}

/// The names of the wgpu adapters on this machine, asked once per process.
#[cfg(feature = "wgpu")]
pub fn wgpu_adapters() -> &'static [String] {
    static ADAPTERS: OnceLock<Vec<String>> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        use burn::backend::wgpu::wgpu;
        let backends = wgpu::Backends::all();
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapters = pollster::block_on(instance.enumerate_adapters(backends));
        let names = adapters.iter().map(|a| {
            let info = a.get_info();
            format!("{} ({:?}, {:?})", info.name, info.device_type, info.backend)
        });
        let names = names.collect();
        // Instances are kept alive for the whole process: some Vulkan loaders crash when
        // instances are destroyed while another thread creates one.
        std::mem::forget(adapters);
        std::mem::forget(instance);
        names
    })
}
