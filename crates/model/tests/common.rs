//! Shared by the integration tests: the fixture directory, the backends to run on, test values.
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

/// Deterministic values in [-1, 1) from a 64-bit LCG, independent of any backend's rng.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
