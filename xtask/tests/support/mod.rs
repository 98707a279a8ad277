//! What the flattening tests share: whether `python3` has the modules a case needs, a scratch
//! folder, `cargo xtask flatten`, and a flattened file run in Burn on every backend against the
//! probe Keras wrote.

#![allow(dead_code)] // each test file uses its own part

use std::path::{Path, PathBuf};
use std::process::Command;

use keras::{DynTensor, KerasModel};
use model::{Backend, TensorFile, WgpuKind};

pub const TOLERANCE: f32 = 1e-5;

/// Whether `python3` imports `module`; a missing module fails the test where `required` (an
/// environment variable) is `1`, and is otherwise a skip that says so.
pub fn python_has(module: &str, required: &str, cases: &str) -> bool {
    let found =
        Command::new("python3").args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var(required).as_deref() != Ok("1"), "{required}=1 but python3 cannot import {module}");
        eprintln!("note: python3 cannot import {module} here; the {cases} are skipped");
    }
    found
}

/// A folder under the system's temporary folder, empty.
pub fn scratch(prefix: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kmha-{prefix}-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The stems of the `.probe.safetensors` files in `dir`, sorted.
pub fn probed(dir: &Path) -> Vec<String> {
    let mut stems: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".probe.safetensors").map(str::to_string))
        .collect();
    stems.sort();
    stems
}

/// `cargo xtask flatten DIR/STEM.keras --import IMPORT` with the options the probe's metadata
/// `flatten` names; the output, after checking that it succeeded and printed its check.
pub fn flatten(dir: &Path, stem: &str, import: &Path, probe: &TensorFile, flat: &Path) -> String {
    let options: Vec<String> =
        probe.metadata.get("flatten").map(|o| serde_json::from_str(o).expect("a JSON list")).unwrap_or_default();
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("flatten")
        .arg(dir.join(format!("{stem}.keras")))
        .arg("--import")
        .arg(import)
        .arg("--out")
        .arg(flat)
        .args(&options)
        .output()
        .expect("xtask runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stem}: flatten failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("max |flattened - original| ="), "{stem}: no check printed:\n{stdout}");
    stdout
}

/// The flattened model `flat` on the probe's inputs on every backend with a device: one line per
/// output that differs from the probe's `expected.<output>` by more than [`TOLERANCE`].
pub fn differences_on_every_backend(stem: &str, flat: &Path, probe: &TensorFile) -> Vec<String> {
    let mut failures = Vec::new();
    for backend in Backend::for_checks().unwrap() {
        let device = backend.device(WgpuKind::default()).unwrap();
        let model = KerasModel::from_file(flat, &device).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let inputs: Vec<DynTensor> = model
            .inputs()
            .iter()
            .map(|i| {
                let tensor = probe
                    .tensors
                    .get(&format!("inputs.{}", i.name))
                    .unwrap_or_else(|_| panic!("{stem}: no {}", i.name));
                DynTensor::from_host(tensor, &device).unwrap()
            })
            .collect();
        let outputs = model.forward(inputs, false).unwrap_or_else(|e| panic!("{stem} on {}: {e}", backend.name()));
        for (name, output) in model.output_names().iter().zip(outputs) {
            let want = probe.tensors.get(&format!("expected.{name}")).unwrap_or_else(|_| panic!("{stem}: no {name}"));
            let got = output.tensor.to_host();
            let diff = if got.shape == want.shape {
                got.data.iter().zip(&want.data).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
            } else {
                f32::INFINITY
            };
            eprintln!("{stem} on {}: {name} max |diff| {diff:.2e}", backend.name());
            if diff.is_nan() || diff > TOLERANCE {
                failures.push(format!("{stem} on {}: {name} differs by {diff}", backend.name()));
            }
        }
    }
    failures
}
