//! keras.io's attention examples whose models hold custom layers (`datasets/keras-io/`, made by
//! keras 3.15.1 with the examples' own classes): `cargo xtask flatten` re-traces them with the
//! real Keras, and the flattened file runs in Burn within 1e-5 of Keras' outputs on every
//! backend; a custom layer that cannot be traced is kept, named with the reason, and refused by
//! `convert`. Needs `python3` with Keras 3 (CI installs it and sets REQUIRE_KERAS=1; elsewhere a
//! machine without it skips these cases, saying so).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use model::TensorFile;
use support::{differences_on_every_backend, probed};

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../datasets/keras-io")
}

/// The examples with a probe, by stem.
fn examples() -> Vec<String> {
    probed(&examples_dir())
}

/// Whether `python3` imports Keras; a missing Keras fails the test where REQUIRE_KERAS=1.
fn keras_available() -> bool {
    support::python_has("keras", "REQUIRE_KERAS", "keras.io flattening cases")
}

fn scratch(name: &str) -> PathBuf {
    support::scratch("keras-io", name)
}

/// `cargo xtask flatten` on one example, with the options its probe names; the flattened path.
/// An example whose probe names a layer to keep (`kept`: "Class: reason") must print that layer
/// as kept with that reason; every other must keep none.
fn flatten(stem: &str, probe: &TensorFile, out: &Path) -> PathBuf {
    let dir = examples_dir();
    let flat = out.join(format!("{stem}.flat.keras"));
    let stdout = support::flatten(&dir, stem, &dir.join(format!("{stem}.py")), probe, &flat);
    match probe.metadata.get("kept") {
        Some(kept) => {
            let (class, reason) = kept.split_once(": ").expect("kept: `Class: reason`");
            let line = stdout.lines().find(|l| l.starts_with("kept ") && l.contains(&format!("({class})")));
            assert!(line.is_some_and(|l| l.contains(reason)), "{stem}: {class} not kept with `{reason}`:\n{stdout}");
        }
        None => assert!(!stdout.contains("kept "), "{stem}: a custom layer was left:\n{stdout}"),
    }
    flat
}

/// `convert` of a flattened file that kept a custom layer: exit status 1, the class named, no file.
fn assert_refused(stem: &str, flat: &Path, class: &str, out: &Path) {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("convert")
        .arg(flat)
        .args(["--to", "torch", "--out"])
        .arg(out.join(format!("{stem}.port")))
        .output()
        .expect("xtask runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stem}: {stderr}");
    assert!(stderr.contains(&format!("({class}, ")) && stderr.contains("custom layer"), "{stem}: {stderr}");
    assert!(!out.join(format!("{stem}.port.py")).exists(), "{stem}: a refused conversion wrote a file");
}

#[test]
fn keras_io_custom_layer_examples_flatten_and_match_keras_on_every_backend() {
    if !keras_available() {
        return;
    }
    let stems = examples();
    assert!(!stems.is_empty(), "the keras.io fixtures are missing");
    let out = scratch("flatten");
    let mut failures = Vec::new();
    for stem in &stems {
        let probe = TensorFile::read(&examples_dir().join(format!("{stem}.probe.safetensors"))).unwrap();
        let flat = flatten(stem, &probe, &out);
        if let Some(kept) = probe.metadata.get("kept") {
            assert_refused(stem, &flat, kept.split(':').next().unwrap_or_default(), &out);
            continue;
        }
        failures.extend(differences_on_every_backend(stem, &flat, &probe));
    }
    std::fs::remove_dir_all(&out).ok();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Before flattening, `convert` refuses every example's custom layer or subclassed model by
/// name, says which command reads it, and writes nothing; an example without classes of its own
/// (MobileViT, TabTransformer) or whose one class is a functional model keeping `Functional.call`
/// (the BERT MLM's `MaskedLanguageModel`) converts as it is.
#[test]
fn custom_layers_and_models_are_refused_with_the_flatten_command() {
    let out = scratch("refuse");
    for stem in examples() {
        let probe = TensorFile::read(&examples_dir().join(format!("{stem}.probe.safetensors"))).unwrap();
        let custom = probe.metadata.get("custom_classes").is_some_and(|c| !c.is_empty());
        let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .arg("convert")
            .arg(examples_dir().join(format!("{stem}.keras")))
            .args(["--to", "torch", "--out"])
            .arg(out.join("port"))
            .output()
            .expect("xtask runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !custom {
            assert!(output.status.success(), "{stem}: {stderr}");
            std::fs::remove_file(out.join("port.py")).ok();
            continue;
        }
        assert_eq!(output.status.code(), Some(1), "{stem}: {stderr}");
        let named = stderr.contains("is a custom layer") || stderr.contains("a subclassed model");
        assert!(named && stderr.contains("cargo xtask flatten"), "{stem}: {stderr}");
        assert!(!out.join("port.py").exists(), "{stem}: a refused conversion wrote a file");
    }
    std::fs::remove_dir_all(&out).ok();
}
