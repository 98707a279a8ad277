//! Shared by the integration tests: the fixture directory and the backends to run on.

#![allow(dead_code)]

use std::path::PathBuf;

use model::Backend;

pub fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../datasets/reference")
}

/// ndarray and flex always; wgpu where an adapter exists. With `REQUIRE_WGPU=1` (set by CI, which
/// installs lavapipe) a missing adapter is a failure, not a skip.
pub fn backends() -> Vec<Backend> {
    let mut backends = vec![Backend::Ndarray, Backend::Flex];
    if Backend::Wgpu.is_available() {
        backends.push(Backend::Wgpu);
    } else if std::env::var("REQUIRE_WGPU").is_ok_and(|v| v == "1") {
        panic!("REQUIRE_WGPU=1 but no wgpu adapter was found (install mesa-vulkan-drivers)");
    } else {
        eprintln!("note: no wgpu adapter here; wgpu cases skipped");
    }
    backends
}
