//! Shared by the integration tests: the fixture directory and the backends to run on (test values
//! come from `kernels::testing`).
#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;

use model::Backend;

pub fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../datasets/reference")
}

/// ndarray and flex always; wgpu where an adapter exists (required when REQUIRE_WGPU=1).
pub fn backends() -> Vec<Backend> {
    let backends = Backend::for_checks().unwrap();
    if !backends.contains(&Backend::Wgpu) {
        eprintln!("note: no wgpu adapter here; wgpu cases skipped");
    }
    backends
}
