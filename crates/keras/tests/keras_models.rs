//! Whole Keras models (`datasets/keras-models/`, made by the real keras 3.15.1): every probe's
//! outputs reproduced at 1e-5 on every backend, and bad files refused with their name.

use std::path::PathBuf;

use keras::{DynTensor, KerasModel};
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

/// ndarray and flex always; wgpu where an adapter exists (required when REQUIRE_WGPU=1).
fn backends() -> Vec<model::Backend> {
    let backends = model::Backend::for_checks().unwrap();
    if !backends.contains(&model::Backend::Wgpu) {
        eprintln!("note: no wgpu adapter here; wgpu cases skipped");
    }
    backends
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
    for backend in backends() {
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
    // A user's class named as a built-in one is the user's: `make_keras_models>Dense` is no Dense.
    let named = load_error("custom_dense.keras");
    assert!(named.contains("custom layer") && named.contains("make_keras_models>Dense"), "{named}");
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

#[test]
fn batch_normalization_updates_its_moving_statistics_in_training() {
    let device = model::Backend::Flex.device(model::WgpuKind::default()).unwrap();
    let model = KerasModel::from_file(&models_dir().join("sequential.keras"), &device).unwrap();
    let probe = TensorFile::read(&models_dir().join("sequential.probe.safetensors")).unwrap();
    let spec =
        model.graph.layers.iter().position(|l| l.class_name == "BatchNormalization").expect("a BatchNormalization");
    let name = model.graph.layers[spec].name.clone();
    let momentum = model.graph.layers[spec].config["momentum"].as_f64().unwrap() as f32;
    let before = model.keras_variables();
    let input =
        DynTensor::from_host(probe.tensors.get(&format!("inputs.{}", model.inputs()[0].name)).unwrap(), &device)
            .unwrap();
    let run = model.run(vec![input], true, true).unwrap();
    // The batch's moments of the normalization's input, [B, L, C] over B and L.
    let node = model.graph.nodes.iter().position(|n| n.layer == spec).unwrap();
    let source = model.graph.nodes[node].args[0].ports()[0].node;
    let x = run.nodes[source].1.tensor.to_host();
    let channels = *x.shape.last().unwrap();
    let rows = x.data.len() / channels;
    let mean: Vec<f32> =
        (0..channels).map(|c| (0..rows).map(|r| x.data[r * channels + c]).sum::<f32>() / rows as f32).collect();
    let after = model.keras_variables();
    let (old, new) =
        (before.get(&format!("{name}/moving_mean")).unwrap(), after.get(&format!("{name}/moving_mean")).unwrap());
    for (c, batch_mean) in mean.iter().enumerate() {
        let want = old.data[c] * momentum + batch_mean * (1.0 - momentum);
        assert!((new.data[c] - want).abs() <= 1e-5, "channel {c}: {} vs {want}", new.data[c]);
    }
    // Inference leaves them alone.
    let input =
        DynTensor::from_host(probe.tensors.get(&format!("inputs.{}", model.inputs()[0].name)).unwrap(), &device)
            .unwrap();
    model.run(vec![input], false, false).unwrap();
    assert_eq!(model.keras_variables().get(&format!("{name}/moving_mean")).unwrap().data, new.data);
}

/// A random walk to one value of a JSON document, replaced by `with`.
fn mutate(value: &mut serde_json::Value, path_choice: &mut impl FnMut(usize) -> usize, with: serde_json::Value) {
    let mut at = value;
    loop {
        let children = match at {
            serde_json::Value::Array(items) => items.len(),
            serde_json::Value::Object(map) => map.len(),
            _ => 0,
        };
        // Stop here with probability 1/4, or at a leaf.
        if children == 0 || path_choice(4) == 0 {
            break;
        }
        let pick = path_choice(children);
        at = match at {
            serde_json::Value::Array(items) => &mut items[pick],
            serde_json::Value::Object(map) => map.values_mut().nth(pick).unwrap(),
            _ => unreachable!(),
        };
    }
    *at = with;
}

#[test]
fn damaged_graphs_are_errors_not_panics() {
    use std::io::{Read, Write};
    let device = model::Backend::Ndarray.device(model::WgpuKind::default()).unwrap();
    let dir = std::env::temp_dir().join(format!("kmha-graph-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mutations: usize = std::env::var("KERAS_GRAPH_MUTATIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(150);
    let mut lcg = kernels::testing::Lcg::from_state(0x5eed_9a4f);
    let mut next = move |n: usize| (lcg.next_u64() >> 33) as usize % n.max(1);
    let (mut loaded, mut refused) = (0, 0);
    for stem in ["text_classifier", "two_in_two_out", "nested", "zoo_ops"] {
        let source = models_dir().join(format!("{stem}.keras"));
        let mut archive = zip::ZipArchive::new(std::fs::File::open(&source).unwrap()).unwrap();
        let mut members = Vec::new();
        for i in 0..archive.len() {
            let mut file = archive.by_index(i).unwrap();
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).unwrap();
            members.push((file.name().to_string(), bytes));
        }
        let config: serde_json::Value =
            serde_json::from_slice(&members.iter().find(|(n, _)| n == "config.json").unwrap().1).unwrap();
        let probe = TensorFile::read(&models_dir().join(format!("{stem}.probe.safetensors"))).unwrap();
        for _ in 0..mutations {
            let mut damaged = config.clone();
            for _ in 0..1 + next(3) {
                let replacement = match next(7) {
                    0 => serde_json::Value::Null,
                    1 => serde_json::json!(-1),
                    2 => serde_json::json!(1_000_000_007u64),
                    3 => serde_json::json!("input_layer"),
                    4 => serde_json::json!([]),
                    5 => serde_json::json!(["tokens", 0, 0]),
                    _ => {
                        serde_json::json!({ "class_name": "__keras_tensor__", "config": { "keras_history": ["dense", 3, 1] } })
                    }
                };
                mutate(&mut damaged, &mut next, replacement);
            }
            let path = dir.join(format!("{stem}.keras"));
            let mut writer = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
            for (name, bytes) in &members {
                writer.start_file(name.as_str(), zip::write::SimpleFileOptions::default()).unwrap();
                let bytes = if name == "config.json" { serde_json::to_vec(&damaged).unwrap() } else { bytes.clone() };
                writer.write_all(&bytes).unwrap();
            }
            writer.finish().unwrap();
            match KerasModel::from_file(&path, &device) {
                Err(error) => {
                    refused += 1;
                    assert!(
                        error.to_string().contains(&path.display().to_string()),
                        "{stem}: error without the file: {error}"
                    );
                }
                Ok(model) => {
                    loaded += 1;
                    // Whatever the damage left runnable runs or is an error; it never panics.
                    let inputs: Option<Vec<_>> = model
                        .inputs()
                        .iter()
                        .map(|i| probe.tensors.get(&format!("inputs.{}", i.name)).ok().cloned())
                        .collect();
                    if let Some(inputs) = inputs {
                        let _ = model.predict(&inputs, &device);
                    }
                }
            }
        }
    }
    eprintln!("damaged graphs: {loaded} loaded, {refused} refused");
    assert!(refused > 0 && loaded + refused == 4 * mutations);
    std::fs::remove_dir_all(&dir).ok();
}
