//! Where the project keeps its data and results, relative to the repository root.

use std::path::PathBuf;

/// The repository root (the workspace this crate was built in).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap_or_else(|_| PathBuf::from("."))
}

/// The fixtures made with the real Keras and PyTorch.
pub fn reference_dir() -> PathBuf {
    repo_root().join("datasets/reference")
}

/// The cache of the task's generated data (ignored by git).
pub fn task_data_dir() -> PathBuf {
    repo_root().join("datasets/task")
}
