//! keras.io's attention examples whose models hold custom layers (`datasets/keras-io/`, made by
//! keras 3.15.1 with the examples' own classes): `cargo xtask flatten` re-traces them with the
//! real Keras, and the flattened file runs in Burn within 1e-5 of Keras' outputs on every
//! backend; a custom layer that cannot be traced is kept, named with the reason, and refused by
//! `convert`. Needs `python3` with Keras 3 (CI installs it and sets REQUIRE_KERAS=1; elsewhere a
//! machine without it skips these cases, saying so).

use std::path::{Path, PathBuf};
use std::process::Command;

use keras::{DynTensor, KerasModel};
use model::{Backend, TensorFile, WgpuKind};

const TOLERANCE: f32 = 1e-5;

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../datasets/keras-io")
}

/// The examples with a probe, by stem.
fn examples() -> Vec<String> {
    let mut stems: Vec<String> = std::fs::read_dir(examples_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".probe.safetensors").map(str::to_string))
        .collect();
    stems.sort();
    stems
}

/// Whether `python3` imports Keras; a missing Keras fails the test where REQUIRE_KERAS=1.
fn keras_available() -> bool {
    let found = Command::new("python3").args(["-c", "import keras"]).output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("REQUIRE_KERAS").as_deref() != Ok("1"),
            "REQUIRE_KERAS=1 but python3 cannot import keras"
        );
        eprintln!("note: python3 cannot import keras here; the keras.io flattening cases are skipped");
    }
    found
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kmha-keras-io-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `cargo xtask flatten` on one example, with the options its probe names; the flattened path.
/// An example whose probe names a layer to keep (`kept`: "Class: reason") must print that layer
/// as kept with that reason; every other must keep none.
fn flatten(stem: &str, probe: &TensorFile, out: &Path) -> PathBuf {
    let dir = examples_dir();
    let options: Vec<String> =
        probe.metadata.get("flatten").map(|o| serde_json::from_str(o).expect("a JSON list")).unwrap_or_default();
    let flat = out.join(format!("{stem}.flat.keras"));
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("flatten")
        .arg(dir.join(format!("{stem}.keras")))
        .arg("--import")
        .arg(dir.join(format!("{stem}.py")))
        .arg("--out")
        .arg(&flat)
        .args(&options)
        .output()
        .expect("xtask runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stem}: flatten failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("max |flattened - original| ="), "{stem}: no check printed:\n{stdout}");
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
        for backend in Backend::for_checks().unwrap() {
            let device = backend.device(WgpuKind::default()).unwrap();
            let model = KerasModel::from_file(&flat, &device).unwrap_or_else(|e| panic!("{stem}: {e}"));
            let inputs: Vec<DynTensor> = model
                .inputs()
                .iter()
                .map(|i| {
                    DynTensor::from_host(probe.tensors.get(&format!("inputs.{}", i.name)).unwrap(), &device).unwrap()
                })
                .collect();
            let outputs = model.forward(inputs, false).unwrap_or_else(|e| panic!("{stem} on {}: {e}", backend.name()));
            for (name, output) in model.output_names().iter().zip(outputs) {
                let want =
                    probe.tensors.get(&format!("expected.{name}")).unwrap_or_else(|_| panic!("{stem}: no {name}"));
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
