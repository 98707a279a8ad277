//! Whole Keras models (`datasets/keras-models/`, made by the real keras 3.15.1): every probe's
//! outputs reproduced at 1e-5 on every backend, and bad files refused with their name.

mod common;

use std::path::PathBuf;

use model::keras::{DynTensor, KerasModel};
use model::{ModelError, TensorFile};

const TOLERANCE: f32 = 1e-5;

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../datasets/keras-models")
}

/// The models with a probe, by stem.
fn probed_models() -> Vec<String> {
    let mut stems: Vec<String> = std::fs::read_dir(models_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".probe.safetensors").map(str::to_string))
        .collect();
    stems.sort();
    stems
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// At most the tolerance, and not NaN.
fn within(diff: f32) -> bool {
    diff.is_finite() && diff <= TOLERANCE
}

/// Runs one model's probe on `device`; `Err` names the first node that differs from Keras.
fn check(stem: &str, backend: model::Backend) -> Result<f32, String> {
    let device = backend.device(model::WgpuKind::default()).map_err(|e| e.to_string())?;
    let dir = models_dir();
    let model = KerasModel::from_file(&dir.join(format!("{stem}.keras")), &device).map_err(|e| e.to_string())?;
    let probe = TensorFile::read(&dir.join(format!("{stem}.probe.safetensors"))).map_err(|e| e.to_string())?;
    let inputs = model
        .inputs()
        .iter()
        .map(|input| {
            let host = probe.tensors.get(&format!("inputs.{}", input.name)).map_err(|e| e.to_string())?;
            DynTensor::from_host(host, &device).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let run = model.run(inputs, false, true).map_err(|e| e.to_string())?;
    let mut worst = 0.0f32;
    for (name, output) in model.output_names().iter().zip(&run.outputs) {
        let want = probe.tensors.get(&format!("expected.{name}")).map_err(|e| e.to_string())?;
        let got = output.tensor.to_host();
        let diff = if got.shape == want.shape { max_difference(&got.data, &want.data) } else { f32::INFINITY };
        worst = worst.max(diff);
        if !within(diff) {
            // Name the first node that differs from Keras' own, the place to look.
            let first = run.nodes.iter().find_map(|(label, value)| {
                let keras = probe.tensors.get(&format!("nodes.{label}")).ok()?;
                let ours = value.tensor.to_host();
                let d = if ours.shape == keras.shape { max_difference(&ours.data, &keras.data) } else { f32::INFINITY };
                (!within(d)).then(|| format!("{label}: {d} (shape {:?} vs Keras {:?})", ours.shape, keras.shape))
            });
            return Err(format!(
                "{stem} on {}: output {name} differs by {diff} (shape {:?} vs {:?}); first differing node: {}",
                backend.name(),
                got.shape,
                want.shape,
                first.unwrap_or_else(|| "none of the recorded nodes".into())
            ));
        }
    }
    Ok(worst)
}

#[test]
fn every_probed_model_matches_keras_on_every_backend() {
    let stems = probed_models();
    assert!(stems.len() >= 10, "the fixtures are missing: {stems:?}");
    let mut failures = Vec::new();
    for backend in common::backends() {
        for stem in &stems {
            match check(stem, backend) {
                Ok(diff) => eprintln!("{stem} on {}: max |diff| {diff:.2e}", backend.name()),
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

fn load_error(file: &str) -> String {
    let device = model::Backend::Ndarray.device(model::WgpuKind::default()).unwrap();
    match KerasModel::from_file(&models_dir().join(file), &device) {
        Ok(_) => panic!("{file} was accepted"),
        Err(e @ ModelError::File { .. }) => e.to_string(),
        Err(other) => panic!("{file}: not a file error: {other}"),
    }
}

#[test]
fn unsupported_layers_are_refused_with_their_name_and_class() {
    let lambda = load_error("lambda_layer.keras");
    assert!(lambda.contains("(Lambda, called on ") && lambda.contains("--layer"), "{lambda}");
    let custom = load_error("custom_layer.keras");
    assert!(custom.contains("custom layer"), "{custom}");
}

#[test]
fn damaged_archives_are_one_line_errors_naming_the_file() {
    for (file, says) in [
        ("truncated.keras", "zip"),
        ("cycle.keras", "cycle"),
        ("dangling.keras", "does not have"),
        ("bad_weight_shape.keras", "shape"),
        ("missing_weights.keras", "no saved variables"),
    ] {
        let error = load_error(file);
        assert!(error.contains(file), "{file}: {error}");
        assert!(error.contains(says), "{file}: expected {says:?} in {error}");
        assert!(!error.contains('\n'), "{file}: {error}");
    }
}

#[test]
fn a_burnpack_of_each_model_loads_and_still_matches_keras() {
    let device = model::Backend::Flex.device(model::WgpuKind::default()).unwrap();
    let dir = std::env::temp_dir().join(format!("kmha-bpk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for stem in probed_models() {
        let source = KerasModel::from_file(&models_dir().join(format!("{stem}.keras")), &device).unwrap();
        let path = dir.join(format!("{stem}.bpk"));
        source.save_burnpack(&path).unwrap();
        let back = KerasModel::from_file(&path, &device).unwrap();
        assert_eq!(back.saved_variables().names().count(), source.saved_variables().names().count(), "{stem}");
        let probe = TensorFile::read(&models_dir().join(format!("{stem}.probe.safetensors"))).unwrap();
        let inputs: Vec<_> =
            back.inputs().iter().map(|i| probe.tensors.get(&format!("inputs.{}", i.name)).unwrap().clone()).collect();
        for (name, got) in back.output_names().iter().zip(back.predict(&inputs, &device).unwrap()) {
            let want = probe.tensors.get(&format!("expected.{name}")).unwrap();
            let diff = max_difference(&got.data, &want.data);
            assert!(got.shape == want.shape && within(diff), "{stem}: {name} differs by {diff} after the burnpack");
        }
    }
    let error = KerasModel::from_file(&models_dir().join("small.probe.safetensors"), &device).unwrap_err().to_string();
    assert!(error.contains("neither a .keras archive"), "{error}");
    std::fs::remove_dir_all(&dir).ok();
}
