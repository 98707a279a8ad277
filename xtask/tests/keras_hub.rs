//! KerasHub's models (`datasets/keras-hub/`, made by keras-hub 0.32.0 on keras 3.15.1): each
//! backbone family the converter reads and three task models, flattened by `cargo xtask flatten
//! --import hub.py` with none of KerasHub's layers left, run in Burn within 1e-5 of Keras'
//! outputs on every backend. Needs `python3` with keras-hub (CI installs it and sets
//! REQUIRE_KERAS=1; elsewhere a machine without it skips these cases, saying so).

mod support;

use std::path::PathBuf;

use model::TensorFile;
use support::{differences_on_every_backend, probed};

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../datasets/keras-hub")
}

#[test]
fn keras_hub_models_flatten_and_match_keras_on_every_backend() {
    if !support::python_has("keras_hub", "REQUIRE_KERAS", "KerasHub cases") {
        return;
    }
    let dir = models_dir();
    let stems = probed(&dir);
    assert!(stems.len() >= 18, "the KerasHub fixtures are missing: {stems:?}");
    let out = support::scratch("keras-hub", "flatten");
    let mut failures = Vec::new();
    for stem in &stems {
        let probe = TensorFile::read(&dir.join(format!("{stem}.probe.safetensors"))).unwrap();
        let flat = out.join(format!("{stem}.flat.keras"));
        let stdout = support::flatten(&dir, stem, &dir.join("hub.py"), &probe, &flat);
        assert!(!stdout.contains("kept "), "{stem}: a KerasHub layer was left:\n{stdout}");
        failures.extend(differences_on_every_backend(stem, &flat, &probe));
    }
    std::fs::remove_dir_all(&out).ok();
    assert!(failures.is_empty(), "{failures:#?}");
}
