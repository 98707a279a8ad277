//! The Python wheel (`pyproject.toml`, `crates/python`, `python/keras2torch/`): its pytest suite
//! (`python/tests/`) run against the built wheel installed in a virtual environment, never the
//! source tree. `.ci/run` builds the wheel with maturin, installs it in the environment named by
//! KERAS2TORCH_VENV (with torch, Keras and TensorFlow) and sets REQUIRE_WHEEL=1; elsewhere, without
//! that environment, the case is skipped, saying so. The narrower-instruction-set passes of CI
//! (KERNELS_ISA) skip it: it tests the package, whose kernels run the widest set.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_installed_wheel_passes_its_python_tests() {
    let venv = std::env::var_os("KERAS2TORCH_VENV").map(PathBuf::from);
    let python = venv.as_ref().map(|v| v.join("bin/python")).filter(|p| p.exists());
    let Some(python) = python else {
        assert!(
            std::env::var("REQUIRE_WHEEL").as_deref() != Ok("1"),
            "REQUIRE_WHEEL=1 but KERAS2TORCH_VENV names no virtual environment with the wheel installed"
        );
        eprintln!("note: no KERAS2TORCH_VENV with the wheel installed (see .ci/run); the wheel's tests are skipped");
        return;
    };
    if std::env::var_os("KERNELS_ISA").is_some() {
        eprintln!("note: KERNELS_ISA is set: the wheel's tests run in the default pass only");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    path = std::env::join_paths(
        std::iter::once(python.parent().unwrap().to_path_buf()).chain(std::env::split_paths(&path)),
    )
    .expect("PATH entries join");
    let output = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "python/tests"])
        .current_dir(&root)
        .env("PATH", path) // the wheel's `keras2torch` command
        .output()
        .expect("the virtual environment's python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "pytest failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    eprintln!("{}", stdout.lines().last().unwrap_or_default());
}
