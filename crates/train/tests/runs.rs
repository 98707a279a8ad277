//! Whole runs on the tiny config: resume after an interruption ends with the same weights, every
//! artifact is written, and exports reproduce their probe in the fixture format.

use std::path::{Path, PathBuf};

use burn::module::Module;
use model::fixture::{self, Fixture};
use model::{Backend, TensorFile};
use train::config::RunConfig;
use train::export::{Format, export};
use train::run::{RunOptions, train};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kmha-runs-test-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}

fn tiny(overrides: &[&str]) -> RunConfig {
    let path = train::paths::repo_root().join("configs/tiny.toml");
    RunConfig::load(Some(&path), &overrides.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
}

fn options(runs: &Path, resume: bool, stop_after: Option<usize>) -> RunOptions {
    RunOptions {
        runs_dir: runs.to_path_buf(),
        data_dir: runs.join("data"),
        resume,
        stop_after,
        progress: false,
        stop_on_divergence: false,
    }
}

fn final_weights(runs: &Path, name: &str) -> model::WeightMap {
    TensorFile::read(&runs.join(name).join("weights.safetensors")).unwrap().tensors
}

#[test]
fn interrupted_and_resumed_runs_end_with_the_same_weights_on_cpu_backends() {
    for backend in [Backend::Ndarray, Backend::Flex] {
        for kind in ["keras", "projected"] {
            let runs = scratch(&format!("resume-{backend}-{kind}"));
            let config = tiny(&[&format!("backend={backend}"), &format!("model.kind={kind}"), "name=run"]);
            let whole = train(&config, &options(&runs, false, None)).unwrap().expect("runs to the end");
            let uninterrupted = final_weights(&runs, "run");

            // Stop mid-epoch (step 5 of 16, between checkpoints at 3 and 6), then resume twice.
            assert!(train(&config, &options(&runs, false, Some(5))).unwrap().is_none());
            assert!(train(&config, &options(&runs, true, Some(4))).unwrap().is_none());
            let resumed = train(&config, &options(&runs, true, None)).unwrap().expect("resumed to the end");
            assert!(resumed.resumed);
            assert_eq!(resumed.steps, whole.steps);
            assert_eq!(final_weights(&runs, "run"), uninterrupted, "{backend} {kind}: resumed weights differ");
            std::fs::remove_dir_all(&runs).ok();
        }
    }
}

#[test]
fn a_run_writes_config_metrics_checkpoints_model_and_summary() {
    let runs = scratch("artifacts");
    let summary = train(&tiny(&["name=a"]), &options(&runs, false, None)).unwrap().unwrap();
    let dir = runs.join("a");
    for file in ["config.toml", "steps.csv", "epochs.csv", "model.bpk", "weights.safetensors", "summary.json"] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    let steps = std::fs::read_to_string(dir.join("steps.csv")).unwrap();
    assert_eq!(steps.lines().count(), 1 + summary.steps, "a header and one row per step");
    assert_eq!(std::fs::read_to_string(dir.join("epochs.csv")).unwrap().lines().count(), 1 + 2);
    assert!(summary.test_loss.is_finite() && summary.valid_loss.is_finite());
    assert!(summary.per_position_floor > 5.0 * summary.bayes_floor);
    let reloaded = RunConfig::load(Some(&dir.join("config.toml")), &[]).unwrap();
    assert_eq!(reloaded, tiny(&["name=a"]), "the saved config rebuilds the run");
    let checkpoints: Vec<_> = std::fs::read_dir(dir.join("checkpoints")).unwrap().collect();
    assert!(!checkpoints.is_empty() && checkpoints.len() <= 2, "the newest two checkpoints are kept");
    std::fs::remove_dir_all(&runs).ok();
}

#[test]
fn keras_and_torch_exports_of_both_models_reproduce_their_probe() {
    let runs = scratch("export");
    for kind in ["keras", "projected"] {
        let config = tiny(&[&format!("model.kind={kind}"), &format!("name={kind}")]);
        train(&config, &options(&runs, false, None)).unwrap().unwrap();
        for format in [Format::Keras, Format::Torch] {
            let path = export(&runs.join(kind), format, None, &runs.join("data")).unwrap();
            let fixture = Fixture::read(&path).unwrap();
            let checks = fixture::run(&fixture, "flex", &Backend::Flex.device(Default::default()).unwrap()).unwrap();
            assert!(!checks.is_empty());
            for check in checks {
                assert!(check.passed, "{kind} -> {format:?}: {check}");
            }
        }
        // The burnpack loads into a fresh Burn module and reproduces the probe beside it.
        let burnpack = export(&runs.join(kind), Format::Burn, None, &runs.join("data")).unwrap();
        let device = Backend::Flex.device(Default::default()).unwrap();
        let loaded = config.model_spec().init(&device).unwrap().try_load_file(&burnpack).unwrap();
        let probe =
            TensorFile::read(&PathBuf::from(format!("{}.probe.safetensors", burnpack.display()))).unwrap().tensors;
        let x = probe.get("inputs.x").unwrap().to_tensor::<3>("x", &device).unwrap();
        let ours = model::HostTensor::from_tensor(loaded.forward(x, None, false).unwrap());
        let check = fixture::compare(kind, "flex", "burnpack", &ours, probe.get("outputs.output").unwrap(), 1e-6);
        assert!(check.passed, "{check}");
    }
    // A run can start from an export (init_from), in either vocabulary of its own model, and from
    // the .keras / .weights.h5 files Keras opens: the same start, so the same trained losses.
    let mut losses = Vec::new();
    for (i, file) in ["keras.safetensors", "keras.keras", "keras.weights.h5"].into_iter().enumerate() {
        let init = runs.join("keras/export").join(file);
        let config = tiny(&[&format!("name=from-export-{i}"), &format!("model.init_from=\"{}\"", init.display())]);
        losses.push(train(&config, &options(&runs, false, None)).unwrap().unwrap().test_loss);
    }
    assert!(losses.iter().all(|&l| l == losses[0]), "{losses:?}");
    // The projected model starts from the Keras archive through the exact Keras -> projected mapping.
    let init = runs.join("keras/export/keras.keras");
    let config = tiny(&[
        "name=projected-from-keras",
        "model.kind=projected",
        &format!("model.init_from=\"{}\"", init.display()),
    ]);
    train(&config, &options(&runs, false, None)).unwrap().unwrap();
    std::fs::remove_dir_all(&runs).ok();
}
